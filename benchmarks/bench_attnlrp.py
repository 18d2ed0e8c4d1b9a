"""AttnLRP against lxt 2.1, its reference implementation, in one run: the relevance's
agreement (Pearson correlation, largest difference) and the time of a call, median of
``--repeats`` after a warm-up, as ratios within the run.

    PYTHONPATH=.:LXT_DIR .venv/bin/python benchmarks/bench_attnlrp.py [--repeats 5] [--batch 2]

Hugging Face's ViT with random weights (nothing is downloaded; 224 x 224, patch 16, width
192, 4 layers, 3 heads, float32): explain's ``AttnLRP`` first, then lxt's patches (which
change classes process-wide, so they come after): the eager attention wrapped by
``wrap_attention_forward``, layer norms and GELU patched, the relevance the input times its
gradient. Also the conservation of both, the pixels' relevance over the score, and a plain
forward and input-gradient pass as the baseline. lxt is not a dependency:
``pip install --no-deps --target DIR lxt`` and put DIR on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import lxt_reference as reference  # noqa: E402

import explain  # noqa: E402


def model(batch: int):
    import transformers

    config = transformers.ViTConfig(image_size=224, patch_size=16, hidden_size=192, num_hidden_layers=4,
                                    num_attention_heads=3, intermediate_size=768, num_labels=10)
    vit = reference.filled(transformers.ViTForImageClassification(config), 2).float()
    vit.config._attn_implementation = "eager"
    x = torch.randn((batch, 3, 224, 224), generator=torch.Generator().manual_seed(3))
    return vit, x


def median_time(function, repeats: int) -> float:
    function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def gradient_times_input(vit, x, targets):
    inputs = x.clone().requires_grad_()
    vit(inputs).logits.gather(1, targets[:, None]).sum().backward()
    return (inputs * inputs.grad).detach()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    vit, x = model(args.batch)
    explainer = explain.AttnLRP(vit)
    ours = explainer(x)
    targets, scores = ours.targets, ours.logits.gather(1, ours.targets[:, None]).squeeze(1)
    t_ours = median_time(lambda: explainer(x, targets.tolist()), args.repeats)
    t_plain = median_time(lambda: gradient_times_input(vit, x, targets), args.repeats)
    reference.patch_lxt_hf()
    theirs = gradient_times_input(vit, x, targets)
    t_lxt = median_time(lambda: gradient_times_input(vit, x, targets), args.repeats)
    a, b = ours.raw.numpy().ravel(), theirs.numpy().ravel()
    print(f"torch {torch.__version__}, {args.batch} images 224 x 224, HF ViT width 192 x 4 layers, float32")
    print(f"correlation with lxt {np.corrcoef(a, b)[0, 1]:.8f}, largest difference / largest "
          f"{np.abs(a - b).max() / np.abs(b).max():.2e}")
    for name, relevance in (("explain", ours.raw), ("lxt", theirs)):
        sums = relevance.flatten(1).sum(1)
        print(f"{name}: pixels' relevance / score {[round(v, 4) for v in (sums / scores).tolist()]}")
    print(f"median s: explain {t_ours:.3f}, lxt {t_lxt:.3f}, plain gradient x input {t_plain:.3f}; "
          f"explain / lxt {t_ours / t_lxt:.2f}, explain / plain {t_ours / t_plain:.2f}")


if __name__ == "__main__":
    main()
