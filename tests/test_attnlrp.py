"""AttnLRP (explain.AttnLRP): its rules against values worked out by hand, the relevance it
hands to the pixels accounted for to the last share on torchvision's, timm's and Hugging
Face's transformers (float64), parity with lxt (the paper's reference implementation), the
models it refuses, and hygiene."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
import torchvision
from torch import nn

import explain
from conftest import ModelState, hook_count
from explain.methods.relevance.attention_rules import IdentityRule, SoftmaxRecord, UniformRule, layer_norm_rule
from explain.methods.relevance.attnlrp import attnlrp_rules

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lxt_reference as reference  # noqa: E402  (the tiny models and images lxt ran on)

# --- the rules by hand ---------------------------------------------------------------------


def relevance_through(function, x: torch.Tensor, relevance: torch.Tensor) -> torch.Tensor:
    """The relevance of ``x`` given that of ``function(x)``: x times the modified gradient
    of the output, whose incoming gradient is relevance / output (R = z g)."""
    x = x.detach().requires_grad_()
    y = function(x)
    (gradient,) = torch.autograd.grad(y, x, relevance / y)
    return x.detach() * gradient


def test_softmax_rule_by_hand():
    # Proposition 3.1: R_i = x_i (R'_i - s_i sum_j R'_j), the softmax's own gradient times x.
    x = torch.tensor([[1.0, -2.0, 0.5]], dtype=torch.float64)
    r = torch.tensor([[0.3, 0.2, -0.1]], dtype=torch.float64)
    s = torch.exp(x) / torch.exp(x).sum()
    expected = x * (r - s * r.sum())
    torch.testing.assert_close(relevance_through(lambda t: t.softmax(-1), x, r), expected)
    # not conservative: the rule's bias term keeps the rest
    assert not math.isclose(expected.sum().item(), r.sum().item(), abs_tol=1e-3)


def test_uniform_rule_on_products_by_hand():
    # z = a b: each factor half of R_z (Proposition 3.2); z = A B: LRP-epsilon over the sum of
    # products, then half of each product's share to each factor (Proposition 3.3).
    a, b = torch.tensor([2.0, -3.0], dtype=torch.float64), torch.tensor([0.5, 4.0], dtype=torch.float64)
    r = torch.tensor([1.0, 6.0], dtype=torch.float64)
    got = relevance_through(lambda t: UniformRule.apply(t, 2.0) * UniformRule.apply(b, 2.0), a, r)
    torch.testing.assert_close(got, r / 2)
    A = torch.tensor([[1.0, 2.0], [0.5, -1.0]], dtype=torch.float64)
    B = torch.tensor([[3.0, -1.0], [2.0, 1.0]], dtype=torch.float64)
    R = torch.tensor([[2.0, 1.0], [-1.0, 3.0]], dtype=torch.float64)
    Z = A @ B
    expected = torch.zeros_like(A)
    for i in range(2):
        for j in range(2):
            expected[i, j] = sum(0.5 * A[i, j] * B[j, k] / Z[i, k] * R[i, k] for k in range(2))
    torch.testing.assert_close(relevance_through(lambda t: UniformRule.apply(t, 2.0) @ B, A, R), expected)


def test_layer_norm_and_identity_rules_by_hand():
    x = torch.tensor([[1.0, 3.0, -2.0, 0.5]], dtype=torch.float64)
    w = torch.tensor([1.5, -0.5, 2.0, 1.0], dtype=torch.float64)
    b = torch.tensor([0.1, 0.2, -0.3, 0.0], dtype=torch.float64)
    r = torch.tensor([[0.4, -0.2, 1.0, 0.3]], dtype=torch.float64)
    y = layer_norm_rule(x, (-1,), w, b, 1e-5)
    torch.testing.assert_close(y, F.layer_norm(x, (4,), w, b, 1e-5))  # the same values
    # std a constant: R_z = (z w / std) / y R_y (the bias keeps b / y), then LRP-epsilon over
    # the centring z = x - mean(x): R_x_i = x_i (R_z_i / z_i - mean_j R_z_j / z_j)
    z = x - x.mean()
    std = (z.pow(2).mean() + 1e-5).sqrt()
    r_z = z * w / std / y * r
    expected = x * (r_z / z - (r_z / z).mean())
    torch.testing.assert_close(relevance_through(lambda t: layer_norm_rule(t, (-1,), w, b, 1e-5), x, r), expected)
    assert math.isclose(expected.sum().item(), r_z.sum().item(), rel_tol=1e-12)  # the centring conserves
    # the identity rule: the activation passes each unit's relevance on whole
    torch.testing.assert_close(relevance_through(lambda t: IdentityRule.apply(t, F.gelu), x, r), r)
    torch.testing.assert_close(IdentityRule.apply(x, F.gelu), F.gelu(x))


class TinyAttention(nn.Module):
    """Tokens are the pixels of a (N, C, 1, T) image; one head of self-attention, summed over
    the tokens, then a linear head without bias."""

    def __init__(self, channels=2, classes=2):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(channels, channels, bias=False) for _ in range(3))
        self.head = nn.Linear(channels, classes, bias=False)

    def forward(self, x):
        tokens = x.flatten(2).transpose(1, 2)
        heads = [layer(tokens)[:, None] for layer in (self.q, self.k, self.v)]
        return self.head(F.scaled_dot_product_attention(*heads)[:, 0].sum(1))


def tiny_by_hand(model: TinyAttention, x: torch.Tensor, c: int, cp: bool) -> torch.Tensor:
    """The relevance of the pixels of one image (1, C, 1, T) for class c, by the paper's
    formulas in explicit sums (no gradients)."""
    X = x[0, :, 0].T  # (T, C)
    Wq, Wk, Wv, H = (m.weight.detach() for m in (model.q, model.k, model.v, model.head))
    Q, K, V = X @ Wq.T, X @ Wk.T, X @ Wv.T
    S = Q @ K.T / math.sqrt(X.shape[1])
    A = S.softmax(-1)
    O = A @ V
    p = O.sum(0)
    r_o = O * H[c] * p / p  # head: R_p = p_d H_cd (LRP-0, sums to z_c); sum over tokens: O_td / p_d R_p
    r_a = 0.5 * torch.einsum("ts,sd,td->ts", A, V, r_o / O)
    r_v = (1.0 if cp else 0.5) * torch.einsum("ts,sd,td->sd", A, V, r_o / O)
    r_x = torch.einsum("tc,dc,td->tc", X, Wv, r_v / V)
    if not cp:
        r_s = S * (r_a - A * r_a.sum(-1, keepdim=True))  # the softmax rule
        scaled = r_s / S / math.sqrt(X.shape[1])
        r_q = 0.5 * torch.einsum("td,sd,ts->td", Q, K, scaled)
        r_k = 0.5 * torch.einsum("td,sd,ts->sd", Q, K, scaled)
        r_x = r_x + torch.einsum("tc,dc,td->tc", X, Wq, r_q / Q) + torch.einsum("tc,dc,td->tc", X, Wk, r_k / K)
    return r_x.T[None, :, None]


@pytest.mark.parametrize("attention", ["attnlrp", "cp"])
def test_tiny_attention_by_hand(attention):
    model = TinyAttention().double().eval()
    x = torch.randn(1, 2, 1, 3, dtype=torch.float64)
    result = explain.AttnLRP(model, attention=attention)(x)
    c = result.targets.item()
    torch.testing.assert_close(result.raw, tiny_by_hand(model, x, c, attention == "cp"), rtol=1e-9, atol=1e-12)
    if attention == "cp":  # no bias anywhere and no softmax rule: the pixels get the score
        assert math.isclose(result.raw.sum().item(), result.logits[0, c].item(), rel_tol=1e-9)


# --- the relevance accounted for on real architectures --------------------------------------

# Parameters that enter additively, so that they keep a share of the relevance.
ADDITIVE = ("bias", "cls_token", "class_token", "pos_embed", "pos_embedding", "position_embeddings", "dist_token",
            "relative_position_bias_table")


def timm_model(name, seed, **config):
    return reference.filled(timm.create_model(name, pretrained=False, num_classes=reference.CLASSES, **config), seed)


ARCHITECTURES = {
    "torchvision-vit": (reference.torchvision_vit, 32),
    "hf-vit": (reference.hf_vit, 32),
    "timm-vit": (lambda: timm_model("vit_tiny_patch16_224", 3, depth=2, img_size=32, patch_size=8, embed_dim=16,
                                    num_heads=2), 32),
    "timm-deit-distilled": (lambda: timm_model("deit_tiny_distilled_patch16_224", 4, depth=1, img_size=32,
                                               patch_size=8, embed_dim=16, num_heads=2), 32),
    "timm-beit": (lambda: timm_model("beit_base_patch16_224", 5, depth=1, img_size=32, patch_size=8, embed_dim=16,
                                     num_heads=2), 32),
    "timm-swin": (lambda: timm_model("swin_tiny_patch4_window7_224", 6, depths=(2, 1), num_heads=(2, 2),
                                     embed_dim=8, img_size=32, window_size=4), 32),
}


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_relevance_accounted_for_to_the_last_share(name):
    # The pixels' relevance plus the shares AttnLRP's rules leave to the additive terms
    # (biases, tokens, position embeddings and biases: p dS/dp) and to each softmax's bias
    # (what the attention weights had, sum A dS/dA, less what the logits got, sum L dS/dL)
    # is the score, exactly: every step between the image and the score carries a rule.
    make, size = ARCHITECTURES[name]
    model = make()
    x = torch.randn(2, 3, size, size, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    logits = reference._logits(model(x)).detach()
    top = logits.argmax(1)
    result = explain.AttnLRP(model)(x)
    additive = [p for n, p in model.named_parameters() if n.split(".")[-1].endswith(ADDITIVE)]
    record = SoftmaxRecord()
    inputs = x.clone().requires_grad_()
    with attnlrp_rules(model, record=record):
        score = reference._logits(model(inputs)).gather(1, top[:, None]).sum()
        grads = torch.autograd.grad(score, [inputs, *additive, *record.logits, *record.weights])
    g_x, g_p = grads[0], grads[1 : 1 + len(additive)]
    g_l, g_w = grads[1 + len(additive) : 1 + len(additive) + len(record.logits)], grads[-len(record.weights) :]
    shares = sum((p * g).sum() for p, g in zip(additive, g_p))
    softmax_bias = sum((w * g).sum() - (lo * gl).sum() for w, g, lo, gl in zip(record.weights, g_w, record.logits, g_l))
    torch.testing.assert_close(result.raw, (x * g_x).detach(), rtol=1e-9, atol=1e-12)
    total = result.raw.sum() + shares + softmax_bias
    assert math.isclose(total.item(), logits.gather(1, top[:, None]).sum().item(), rel_tol=1e-9), name
    assert torch.equal(result.targets, top)


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_pixels_relevance_is_the_score_without_additive_terms(name):
    # Every additive term that does not depend on the input zeroed (biases, tokens, position
    # embeddings and biases): under CP-LRP every rule conserves, and the pixels' relevance
    # is the score to 1e-9 of it (float64); under AttnLRP the score less what the softmax
    # rule's bias keeps (which is not zero: the rule does not conserve on its own).
    make, size = ARCHITECTURES[name]
    model = make()
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            if parameter_name.split(".")[-1].endswith(ADDITIVE):
                parameter.zero_()
    x = torch.randn(2, 3, size, size, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    cp = explain.AttnLRP(model, attention="cp")(x)
    scores = cp.logits.gather(1, cp.targets[:, None]).squeeze(1)
    torch.testing.assert_close(cp.raw.flatten(1).sum(1), scores, rtol=1e-9, atol=1e-12)
    attnlrp = explain.AttnLRP(model)(x)
    record = SoftmaxRecord()
    inputs = x.clone().requires_grad_()
    with attnlrp_rules(model, record=record):
        score = reference._logits(model(inputs)).gather(1, attnlrp.targets[:, None]).sum()
        grads = torch.autograd.grad(score, [*record.logits, *record.weights])
    half = len(record.logits)
    softmax_bias = sum((w * g).sum() - (lo * gl).sum()
                       for w, g, lo, gl in zip(record.weights, grads[half:], record.logits, grads[:half]))
    assert abs(softmax_bias.item()) > 1e-6 * scores.abs().sum().item(), name
    total = attnlrp.raw.sum() + softmax_bias
    assert math.isclose(total.item(), scores.sum().item(), rel_tol=1e-9), name


# --- parity with lxt, the reference implementation ---------------------------------------

# Each 8 x 8 patch's relevance (summed over channels) on reference.images(), each image's top
# class, by lxt 2.1: `python tests/lxt_reference.py --print` (lxt on PYTHONPATH); lxt is no
# dependency of the suite (it pulls bitsandbytes and open_clip): benchmarks/bench_attnlrp.py
# runs it live beside explain.
LXT_PATCH_SUMS = {
    "torchvision-cp": [
        [[-0.0154733004, 0.1334154565, -0.0514438849, -0.1139539146],
         [0.0988614100, -0.0341025270, -0.0163531992, 0.0189076291],
         [-0.0327783785, 0.0257779731, 0.1213658054, 0.0938689635],
         [-0.0143684335, -0.0144415526, 0.3804481187, -0.1218988202]],
        [[-0.1256172155, 0.0666099662, 0.1204914957, 0.0556021522],
         [-0.0380077598, 0.1401889886, -0.3739059250, 0.0235833065],
         [0.0816411253, -0.1819035830, 0.0374491815, 0.0378712895],
         [0.0242198622, 0.0257750694, 0.0239899298, -0.0204856267]],
    ],
    "hf-attnlrp": [
        [[-4.9176079673e-02, -3.1722885995e-02, -1.2306362160e-01, -2.5345083761e-02],
         [3.3434350689e-01, -4.1257310604e-02, 1.3508496843e-01, 6.6361650737e-02],
         [-7.1851285514e-02, 1.3581562320e-01, 1.2649634817e-01, 9.2511575409e-02],
         [-3.3685515388e-01, 2.4037696776e-01, -1.1130424710e-01, -2.1240791890e-03]],
        [[1.1216414670e-02, -2.7187382272e-01, -7.6046481325e-02, -1.6257318082e-02],
         [1.6141410070e-04, 3.9930428180e-02, 1.8158459160e-01, 2.7097514348e-02],
         [2.4701117154e-01, -2.7145973459e-02, -1.6048855335e-02, -6.6402179453e-02],
         [1.3326761713e-01, -8.2384160373e-03, -6.8627132257e-02, 1.6283766332e-01]],
    ],
}


def ours() -> dict[str, np.ndarray]:
    x = reference.images()
    return {
        "torchvision-cp": explain.AttnLRP(reference.torchvision_vit(), attention="cp")(x).raw.numpy(),
        "hf-attnlrp": explain.AttnLRP(reference.hf_vit())(x).raw.numpy(),
    }


@pytest.fixture(scope="module")
def our_relevance():
    return ours()


def test_parity_with_lxt_recorded(our_relevance):
    # CP-LRP on torchvision's ViT (lxt's own patch map for it) and AttnLRP on Hugging Face's
    # (lxt's AttnLRP patches): the same rules, so the same values in float64, to 1e-9 of the
    # largest; on Hugging Face's to 1e-6 of it, where its eager attention (which lxt patches)
    # takes the softmax in float32.
    for key, expected in LXT_PATCH_SUMS.items():
        tolerance = (1e-6 if key.startswith("hf") else 1e-9) * np.abs(expected).max()
        np.testing.assert_allclose(reference.patch_sums(our_relevance[key]), expected, rtol=0, atol=tolerance,
                                   err_msg=key)


# --- what it refuses, and hygiene ----------------------------------------------------------


class FunctionalGELU(nn.Module):
    """A ViT-like block whose activation is called as a function: no module for the rule."""

    def __init__(self):
        super().__init__()
        self.attention = TinyAttention(3, 4)

    def forward(self, x):
        return self.attention(F.gelu(x))


def test_refusals_name_the_reason():
    x = torch.randn(1, 3, 32, 32)
    with pytest.raises(explain.NotApplicable, match="no attention layer.*use lrp"):
        explain.AttnLRP(torchvision.models.resnet18(num_classes=3).eval())(x)
    swin = torchvision.models.SwinTransformer([4, 4], 8, [2], [2], [4, 4], num_classes=3).eval()  # swin_t's modules
    with pytest.raises(explain.NotApplicable, match="Bmm.*torchvision's Swin.*shifted_window_attention"):
        explain.AttnLRP(swin)(x)
    with pytest.raises(explain.NotApplicable, match="no rule for steps.*: Gelu"):
        explain.AttnLRP(FunctionalGELU())(torch.randn(1, 3, 1, 4))
    with pytest.raises(ValueError, match="unknown attention rule 'softmax'; use one of attnlrp, cp"):
        explain.AttnLRP(FunctionalGELU(), attention="softmax")
    with pytest.raises(ValueError, match="a single image; add the batch dimension"):
        explain.AttnLRP(FunctionalGELU())(torch.randn(3, 1, 4))
    with pytest.raises(ValueError, match="class"):
        explain.AttnLRP(reference.hf_vit().float())(x, targets=99)


def test_the_model_is_left_as_it_was():
    model = reference.torchvision_vit().float().train()
    model.heads.head.weight.requires_grad_(False)
    model.conv_proj.weight.grad = torch.ones_like(model.conv_proj.weight)  # a gradient the user left
    state = ModelState(model)
    kernel, norm = F.scaled_dot_product_attention, F.layer_norm
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        result = explain.AttnLRP(model)(x, topk=2)
    assert result.raw.shape == (2, 2, 3, 32, 32) and torch.isfinite(result.raw).all()
    again = explain.AttnLRP(model)(x, lambda output: output[:, 1] - output[:, 0])  # a callable target
    assert again.targets.tolist() == [-1, -1]
    state.assert_unchanged()
    # an error in the middle of the backward pass
    def fail(gradient):
        raise RuntimeError("backward failed")

    model.heads.register_forward_hook(lambda module, args, output: output.register_hook(fail) and None)
    with pytest.raises(RuntimeError, match="backward failed"):
        explain.AttnLRP(model)(x)
    model.heads._forward_hooks.clear()
    state.assert_unchanged()
    assert hook_count(model) == 0 and "forward" not in vars(model.encoder.ln)
    assert F.scaled_dot_product_attention is kernel and F.layer_norm is norm
    assert torch.backends.mha.get_fastpath_enabled()


def test_registered_and_listed():
    assert explain.method_class("attnlrp") is explain.AttnLRP
    assert "attnlrp" in explain.method_names()
