"""AttnLRP by its reference implementation, lxt 2.1 (Achtibat et al., ICML 2024), on the tiny
transformers of tests/test_attnlrp.py, for the parity tests there.

    python tests/lxt_reference.py OUT.npz      # lxt on PYTHONPATH (pip install --no-deps lxt)
    python tests/lxt_reference.py --print      # the constants of test_attnlrp.py

lxt patches classes process-wide (torch's nn.GELU, nn.LayerNorm, nn.MultiheadAttention, the
attention functions of transformers), so it runs in a process of its own. Its rules, as it
applies them:

- torchvision's ViT: lxt's own patch map for it (``lxt.efficient.models.vit_torch.cp_LRP``):
  the identity rule on GELU, layer norms with the standard deviation detached, and CP-LRP in
  the attention (queries and keys detached) -- explain's ``AttnLRP(attention="cp")``;
- Hugging Face's ViT: lxt's AttnLRP patches for Hugging Face models (``layer_norm_forward``,
  ``non_linear_forward`` on the GELU, ``wrap_attention_forward`` on the eager attention: the
  gradients of queries and keys divided by 4, of values by 2) -- explain's ``AttnLRP()``.
  lxt 2.1's ``patch_attention`` replaces transformers' attention registry with a dict, which
  transformers 5 no longer takes, so the eager attention function is wrapped directly.

The relevance is the input times its gradient, as lxt computes it.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
import torchvision
from torch import nn

CLASSES = 5


def filled(model: nn.Module, seed: int) -> nn.Module:
    """``model`` in float64, eval mode, every parameter drawn from a seeded generator
    (N(0, 0.3^2); layer-norm weights 1 + N(0, 0.1^2)), the same on every machine."""
    generator = torch.Generator().manual_seed(seed)
    model = model.double().eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator, dtype=torch.float64)
            norm = parameter.dim() == 1 and ("norm" in name or ".ln" in name or name.startswith("ln"))
            parameter.copy_(1 + 0.1 * noise if norm and name.endswith("weight") else 0.3 * noise)
    return model


def torchvision_vit() -> nn.Module:
    model = torchvision.models.VisionTransformer(32, 8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32,
                                                 num_classes=CLASSES)
    return filled(model, 1)


def hf_vit() -> nn.Module:
    import transformers

    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=16, num_hidden_layers=2,
                                    num_attention_heads=2, intermediate_size=32, num_labels=CLASSES)
    return filled(transformers.ViTForImageClassification(config), 2)


def images() -> torch.Tensor:
    return torch.randn((2, 3, 32, 32), generator=torch.Generator().manual_seed(3), dtype=torch.float64)


def _logits(output) -> torch.Tensor:
    return output.logits if hasattr(output, "logits") else output


def _relevance(model: nn.Module) -> np.ndarray:
    """Each image's top class, by the input times its gradient through lxt's patches."""
    x = images().requires_grad_()
    logits = _logits(model(x))
    top = logits.argmax(1)
    logits.gather(1, top[:, None]).sum().backward()
    return (x * x.grad).detach().numpy()


def _lxt_packages() -> None:
    """lxt.efficient's and lxt.efficient.models' packages without their ``__init__``: that
    imports every model lxt patches, and its BERT module a helper transformers 5 removed."""
    import importlib.util
    import types
    from pathlib import Path

    spec = importlib.util.find_spec("lxt")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("lxt is not installed: pip install --no-deps lxt")
    root = Path(next(iter(spec.submodule_search_locations)))
    for name, folder in (("lxt.efficient", root / "efficient"), ("lxt.efficient.models", root / "efficient" / "models")):
        package = types.ModuleType(name)
        package.__path__ = [str(folder)]
        sys.modules[name] = package


def patch_lxt_torchvision() -> None:
    """lxt's CP-LRP patches of torchvision's ViT (and of every nn.LayerNorm, nn.GELU)."""
    _lxt_packages()
    from lxt.efficient.models.vit_torch import cp_LRP

    for target, patch in cp_LRP.items():  # lxt.efficient.monkey_patch(vision_transformer) does this
        assert patch(target)


def patch_lxt_hf() -> None:
    """lxt's AttnLRP patches of Hugging Face's ViT: layer norms, GELU, the eager attention."""
    from functools import partial

    _lxt_packages()
    import transformers.activations as activations
    import transformers.models.vit.modeling_vit as modeling_vit
    from lxt.efficient.patches import layer_norm_forward, non_linear_forward, patch_method, wrap_attention_forward

    assert patch_method(layer_norm_forward, nn.LayerNorm) or nn.LayerNorm.forward is layer_norm_forward
    assert partial(patch_method, non_linear_forward, keep_original=True)(activations.GELUActivation)
    modeling_vit.eager_attention_forward = wrap_attention_forward(modeling_vit.eager_attention_forward)


def lxt_relevances() -> dict[str, np.ndarray]:
    patch_lxt_torchvision()
    results = {"torchvision-cp": _relevance(torchvision_vit())}
    patch_lxt_hf()
    model = hf_vit()
    model.config._attn_implementation = "eager"
    results["hf-attnlrp"] = _relevance(model)
    return results


def patch_sums(relevance: np.ndarray) -> np.ndarray:
    """(N, 4, 4): each 8 x 8 patch's relevance, summed over channels and pixels."""
    return relevance.reshape(relevance.shape[0], 3, 4, 8, 4, 8).sum(axis=(1, 3, 5))


if __name__ == "__main__":
    found = lxt_relevances()
    if sys.argv[1:] == ["--print"]:
        np.set_printoptions(precision=10, floatmode="fixed", linewidth=110)
        for key, value in found.items():
            print(key, repr(patch_sums(value)))
    else:
        np.savez(sys.argv[1], **found)
