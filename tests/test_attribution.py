"""The attribution methods (explain.methods.gradient_attribution / perturbation_attribution)
against direct captum calls and hand-computed values.

- Parity: every captum-backed method gives the numbers of the captum call it wraps, made
  here directly on the same inputs, targets, settings and seeds.
- Properties worked out by hand: IG and DeepLift completeness, guided backprop and
  deconvolution through ReLU6 on a hand-weighted 1x1-conv network, Guided Grad-CAM as a
  product, channel reductions, percentile normalisation, baselines.
- The library's promises: internal batches give the same numbers and bound memory,
  seeded runs repeat and leave the caller's random stream alone, targets behave as for the
  CAMs, degenerate inputs give zero maps (never NaN), and the model is left as it was, also
  under no_grad / inference_mode and after an exception mid-call.

Tiny seeded models (16 x 16 or 32 x 32 inputs) keep it fast; the bundled EfficientNet-Lite0
(ReLU6) is used only for DeepLift completeness and guided-vs-plain gradients.
"""

import copy
import subprocess
import sys
import textwrap
import warnings

import captum.attr as ca
import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn

import explain
from conftest import CHEAP, BackwardFails, ModelState
from explain.catalogue import method_class
from explain.baselines import make_baselines, seeded
from explain.methods.attribution_base import normalize_maps, reduce_channels
from explain.methods.gradient_attribution import is_relu_like
from explain.superpixels import superpixels

# Every attribution that runs a captum method, in listing order.
METHODS = tuple(name for name in explain.method_names()
                if method_class(name).family in ("gradient attribution", "perturbation attribution")
                and "captum" in method_class(name).runs_on)
GRADIENT_METHODS = tuple(name for name in METHODS if method_class(name).backward)
# Deconvolution passes ReLU(gradient) back whatever the forward pass did: it is not zero
# where the network is off (see test_deconvolution_ignores_the_forward_pass).
MASKED_METHODS = tuple(m for m in METHODS if m != "deconv")

# The cheap settings, with what this file's 16 x 16 and 32 x 32 inputs need: window 8 suits both.
CHEAP = {
    **CHEAP, "smoothgrad": {"n_samples": 3}, "vargrad": {"n_samples": 3}, "ig": {"n_steps": 4},
    "gradientshap": {"n_samples": 4, "n_baselines": 2}, "occlusion": {"window": 8, "stride": 8},
    "lime": {"n_samples": 6, "n_segments": 8}, "kernelshap": {"n_samples": 6, "n_segments": 8},
    "ablation": {"n_segments": 8}, "shapley-sampling": {"n_samples": 1, "n_segments": 8},
}


def tiny_cnn(seed=0, *, inplace=False, bias=True, classes=5):
    """conv -> ReLU -> conv(stride 2) -> ReLU -> global average pooling -> linear: only
    nn.ReLU activations, where captum's own rules apply. The head is scaled by 30 so that
    the scores move by more than LIME's Lasso penalty (alpha 0.01) when superpixels go."""
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1, bias=bias), nn.ReLU(inplace=inplace),
        nn.Conv2d(4, 6, 3, stride=2, padding=1, bias=bias), nn.ReLU(inplace=inplace),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, classes, bias=bias),
    ).eval()
    with torch.no_grad():
        model[6].weight.mul_(30.0)
    return model


def images(n=2, size=16, seed=1):
    """Smooth random images: 4 x 4 Gaussian noise upsampled bilinearly. (SLIC, at the few
    segments used here, merges the segments of pixel noise into one.)"""
    coarse = torch.randn(n, 3, 4, 4, generator=torch.Generator().manual_seed(seed))
    return F.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)


def captum(attribution, *args, **kwargs):
    """A direct captum call, its own announcements silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return attribution.attribute(*args, **kwargs).detach()


def make(name, model, **options):
    return method_class(name)(model, **{**CHEAP.get(name, {}), **options})


def score(model, x, ids):
    with torch.no_grad():
        return model(x).gather(1, torch.as_tensor(ids).view(-1, 1)).squeeze(1)


IDS = torch.tensor([1, 3])


# ---------------------------------------------------------------------------------------
# 1. Parity with direct captum calls
# ---------------------------------------------------------------------------------------

def test_saliency_matches_captum():
    model, x = tiny_cnn(), images()
    expected = captum(ca.Saliency(model), x, target=IDS, abs=False)
    res = explain.Saliency(model)(x, IDS)
    assert res.raw.shape == (2, 3, 16, 16) and res.targets.tolist() == [1, 3]
    torch.testing.assert_close(res.raw, expected)
    assert expected.abs().max() > 0


def test_inputxgradient_matches_captum_and_is_input_times_gradient():
    model, x = tiny_cnn(), images()
    expected = captum(ca.InputXGradient(model), x, target=IDS)
    res = explain.InputXGradient(model)(x, IDS)
    torch.testing.assert_close(res.raw, expected)
    torch.testing.assert_close(res.raw, x * captum(ca.Saliency(model), x, target=IDS, abs=False))


@pytest.mark.parametrize("method", ["gausslegendre", "riemann_trapezoid"])
def test_integrated_gradients_matches_captum(method):
    model, x = tiny_cnn(), images()
    expected = captum(ca.IntegratedGradients(model), x, baselines=torch.zeros_like(x), target=IDS,
                      n_steps=12, method=method, internal_batch_size=7)
    res = explain.IntegratedGradients(model, n_steps=12, method=method, internal_batch_size=7)(x, IDS)
    torch.testing.assert_close(res.raw, expected)


@pytest.mark.parametrize("name, cls", [("smoothgrad", explain.SmoothGrad), ("vargrad", explain.VarGrad)])
def test_noise_tunnel_matches_captum_for_one_image(name, cls):
    model, x = tiny_cnn(), images(1)
    res = cls(model, n_samples=6, noise_level=0.2, seed=7, internal_batch_size=4)(x, [2])
    stdev = 0.2 * (x.max() - x.min()).item()  # sigma relative to the image's own range
    with torch.random.fork_rng():
        torch.manual_seed(7)
        expected = captum(ca.NoiseTunnel(ca.Saliency(model)), x, nt_type=name, nt_samples=6,
                          nt_samples_batch_size=4, stdevs=stdev, target=torch.tensor([2]), abs=False)
    torch.testing.assert_close(res.raw, expected)
    assert expected.abs().max() > 0
    if name == "vargrad":
        assert (res.raw >= 0).all()


def test_smoothgrad_noise_is_relative_to_each_images_range():
    """Two images of very different ranges: each gets its own stdev, and its noise from a
    stream seeded for it alone."""
    model = tiny_cnn()
    x = torch.cat([images(1, seed=1), 5 * images(1, seed=2)])
    res = explain.SmoothGrad(model, n_samples=5, noise_level=0.1, seed=3)(x, IDS)
    tunnel = ca.NoiseTunnel(ca.Saliency(model))
    expected = []
    for i in range(2):
        with torch.random.fork_rng():
            torch.manual_seed(3)
            expected.append(captum(tunnel, x[i:i + 1], nt_type="smoothgrad", nt_samples=5, nt_samples_batch_size=64,
                                   stdevs=0.1 * (x[i].max() - x[i].min()).item(), target=IDS[i:i + 1], abs=False))
    torch.testing.assert_close(res.raw, torch.cat(expected))


RANDOM = [("smoothgrad", {"n_samples": 4}), ("vargrad", {"n_samples": 4}), ("ig", {"baseline": "noise", "n_steps": 4}),
          ("gradientshap", {"n_samples": 4, "n_baselines": 3}), ("deepliftshap", {"n_baselines": 3}),
          ("occlusion", {"baseline": "noise", "window": 4, "stride": 4}), ("lime", {"n_samples": 16, "n_segments": 6}),
          ("kernelshap", {"n_samples": 16, "n_segments": 6}), ("ablation", {"baseline": "noise", "n_segments": 6})]


@pytest.mark.parametrize("name, options", RANDOM, ids=[name for name, _ in RANDOM])
def test_a_seeded_images_map_does_not_depend_on_its_batch(name, options):
    """In the CLI a batch holds whichever images are pending: an image's map must be the
    same alone, second in a batch, or with another neighbour."""
    model, x = tiny_cnn(), images(3)
    alone = make(name, model, seed=2, **options)(x[1:2], [IDS[1]]).raw
    in_batch = make(name, model, seed=2, **options)(x[:2], IDS).raw[1]
    other = make(name, model, seed=2, **options)(torch.stack([x[2], x[1]]), IDS).raw[1]
    torch.testing.assert_close(in_batch[None], alone)
    torch.testing.assert_close(other[None], alone)
    assert alone.abs().max() > 0


def test_occlusion_matches_captum():
    model, x = tiny_cnn(), images()
    expected = captum(ca.Occlusion(model), x, sliding_window_shapes=(3, 4, 4), strides=(3, 2, 2),
                      baselines=torch.zeros_like(x), target=IDS, perturbations_per_eval=5)
    res = explain.Occlusion(model, window=4, stride=2, internal_batch_size=10)(x, IDS)
    torch.testing.assert_close(res.raw, expected)
    assert expected.abs().max() > 0


def test_feature_ablation_matches_captum_with_the_same_superpixels():
    model, x = tiny_cnn(), images()
    mask = superpixels(x, n_segments=8)
    assert mask.shape == (2, 1, 16, 16) and mask.dtype == torch.long
    for m in mask:  # contiguous ids 0..M-1, several segments
        assert m.unique().tolist() == list(range(int(m.max()) + 1)) and m.max() >= 2
    expected = captum(ca.FeatureAblation(model), x, baselines=torch.zeros_like(x), target=IDS, feature_mask=mask)
    res = explain.FeatureAblation(model, n_segments=8)(x, IDS)
    torch.testing.assert_close(res.raw, expected)
    # each pixel carries its superpixel's value: constant within a segment
    for i in range(2):
        for s in mask[i].unique():
            values = res.raw[i][mask[i].expand(3, -1, -1) == s]
            assert torch.allclose(values, values[0].expand_as(values))


@pytest.mark.parametrize("baseline", ["zeros", "tensor"])
def test_deeplift_matches_captum_on_a_relu_model(baseline):
    model, x = tiny_cnn(), images()
    base = torch.zeros_like(x) if baseline == "zeros" else images(2, seed=5) * 0.5
    expected = captum(ca.DeepLift(model), x, baselines=base, target=IDS)
    res = explain.DeepLift(model, baseline="zeros" if baseline == "zeros" else base)(x, IDS)
    torch.testing.assert_close(res.raw, expected)


def test_deepliftshap_matches_captum_with_explicit_baselines():
    model, x = tiny_cnn(), images()
    distribution = images(4, seed=9) * 0.7
    expected = captum(ca.DeepLiftShap(model), x, baselines=distribution, target=IDS)
    res = explain.DeepLiftShap(model, baseline=distribution, internal_batch_size=1000)(x, IDS)
    torch.testing.assert_close(res.raw, expected)


@pytest.mark.parametrize("stdevs", [0.0, 0.1])
def test_gradientshap_matches_captum_with_explicit_baselines_and_seed(stdevs):
    """captum draws the baselines and the path coefficients from numpy's global stream,
    the input noise from torch's: explain seeds both, and so does the direct call here."""
    model, x = tiny_cnn(), images(1)
    distribution = images(3, seed=9) * 0.7
    np.random.seed(5)
    res = explain.GradientShap(model, baseline=distribution, n_samples=8, stdevs=stdevs, seed=5,
                               internal_batch_size=64)(x, [4])
    np.random.seed(5)
    with torch.random.fork_rng():
        torch.manual_seed(5)
        expected = captum(ca.GradientShap(model), x, baselines=distribution, n_samples=8, stdevs=stdevs,
                          target=torch.tensor([4]))
    torch.testing.assert_close(res.raw, expected)
    assert expected.abs().max() > 0


@pytest.mark.parametrize("name, captum_cls", [("lime", ca.Lime), ("kernelshap", ca.KernelShap)])
def test_lime_and_kernelshap_match_captum_with_the_same_mask_and_seed(name, captum_cls):
    model, x = tiny_cnn(), images()
    mask = superpixels(x, n_segments=6)
    res = method_class(name)(model, n_segments=6, n_samples=24, seed=11, internal_batch_size=8)(x, IDS)
    expected = []
    for i in range(len(x)):  # each image on its own seeded stream
        with torch.random.fork_rng():
            torch.manual_seed(11)
            expected.append(captum(captum_cls(model), x[i:i + 1], baselines=torch.zeros_like(x[i:i + 1]),
                                   target=IDS[i:i + 1], feature_mask=mask[i:i + 1], n_samples=24,
                                   perturbations_per_eval=8))
    expected = torch.cat(expected)
    torch.testing.assert_close(res.raw, expected)
    assert expected.abs().max() > 0


@pytest.mark.parametrize("ours, theirs", [(explain.GuidedBackprop, ca.GuidedBackprop),
                                          (explain.Deconvolution, ca.Deconvolution)])
def test_guided_backprop_and_deconvolution_match_captum_on_a_relu_model(ours, theirs):
    model, x = tiny_cnn(), images()
    expected = captum(theirs(model), x, target=IDS)
    torch.testing.assert_close(ours(model)(x, IDS).raw, expected)
    # and they are not the plain gradient
    assert not torch.allclose(expected, captum(ca.Saliency(model), x, target=IDS, abs=False))


# ---------------------------------------------------------------------------------------
# 2. Completeness
# ---------------------------------------------------------------------------------------

def test_integrated_gradients_completeness():
    model, x = tiny_cnn(), images()
    res = explain.IntegratedGradients(model, n_steps=128)(x, IDS)
    delta = score(model, x, IDS) - score(model, torch.zeros_like(x), IDS)
    assert (delta.abs() > 1e-2).all()
    torch.testing.assert_close(res.raw.sum(dim=(1, 2, 3)), delta, rtol=0.01, atol=0.0)


def test_deeplift_completeness_on_the_relu6_bundled_model_where_captums_fails(bundled, photos):
    model, _, _ = bundled
    x = photos[1][:2]
    state = ModelState(model)
    res = explain.DeepLift(model)(x)
    ids = res.targets
    delta = score(model, x, ids) - score(model, torch.zeros_like(x), ids)
    assert (delta.abs() > 1).all()
    torch.testing.assert_close(res.raw.sum(dim=(1, 2, 3)), delta, rtol=0.05, atol=0.0)
    # captum's own DeepLift knows no ReLU6 rule (it takes the gradient there): it misses by far.
    plain = captum(ca.DeepLift(model), x, baselines=torch.zeros_like(x), target=ids).sum(dim=(1, 2, 3))
    assert ((plain - delta).abs() > 0.05 * delta.abs()).all(), (plain, delta)
    state.assert_unchanged()


# ---------------------------------------------------------------------------------------
# 3. Guided backprop and deconvolution beyond nn.ReLU
# ---------------------------------------------------------------------------------------

def test_guided_backprop_on_the_relu6_bundled_model_is_not_the_plain_gradient(bundled, photos):
    model, _, _ = bundled
    x = photos[1][:1]
    gradient = explain.Saliency(model)(x)
    guided = explain.GuidedBackprop(model)(x)
    assert torch.equal(guided.targets, gradient.targets)
    difference = (guided.raw - gradient.raw).abs().max()
    assert difference > 0.1 * gradient.raw.abs().max()
    # captum's GuidedBackprop hooks nn.ReLU only: on a ReLU6 network it is the plain gradient
    theirs = captum(ca.GuidedBackprop(model), x, target=gradient.targets)
    torch.testing.assert_close(theirs, gradient.raw)


def relu6_net():
    """x (2 channels) -> 1x1 conv -> ReLU6 -> 1x1 conv -> ReLU6 -> 1x1 conv -> mean over pixels:
    every pixel is its own little MLP, with fixed weights."""
    net = nn.Sequential(nn.Conv2d(2, 3, 1), nn.ReLU6(), nn.Conv2d(3, 3, 1), nn.ReLU6(), nn.Conv2d(3, 2, 1),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten()).eval()
    weights = [
        ([[2.0, -1.0], [1.0, 1.0], [-1.0, 3.0]], [0.5, -1.0, 0.25]),
        ([[1.0, -2.0, 1.0], [0.5, 1.0, -1.0], [-1.0, 1.0, 2.0]], [0.1, 1.0, -0.5]),
        ([[1.0, -1.0, 2.0], [-2.0, 1.0, 1.0]], [0.0, 0.0]),
    ]
    with torch.no_grad():
        for conv, (w, b) in zip((net[0], net[2], net[4]), weights):
            conv.weight.copy_(torch.tensor(w)[:, :, None, None])
            conv.bias.copy_(torch.tensor(b))
    return net, [torch.tensor(w) for w, _ in weights], [torch.tensor(b) for _, b in weights]


def hand_backward(x, target, rule):
    """The backward pass of relu6_net through its two ReLU6 by hand, for one image (2, H, W).

    rule "plain": g * 1[0 < z < 6]; "guided": ReLU(g * 1[0 < z < 6]); "deconv": ReLU(g).
    Returns the input attribution and the two pre-activations z1, z2."""
    _, (w1, w2, w3), (b1, b2, _) = relu6_net()
    z1 = torch.einsum("jc,chw->jhw", w1, x) + b1[:, None, None]
    z2 = torch.einsum("kj,jhw->khw", w2, z1.clamp(0, 6)) + b2[:, None, None]
    m1, m2 = ((z1 > 0) & (z1 < 6)).float(), ((z2 > 0) & (z2 < 6)).float()
    hw = x.shape[1] * x.shape[2]
    g2 = (w3[target] / hw)[:, None, None].expand_as(z2)  # dS/da2: the mean over pixels

    def through(g, mask):
        return {"plain": g * mask, "guided": F.relu(g * mask), "deconv": F.relu(g)}[rule]

    g1 = torch.einsum("kj,khw->jhw", w2, through(g2, m2))
    return torch.einsum("jc,jhw->chw", w1, through(g1, m1)), (z1, z2)


@pytest.mark.parametrize("target", [0, 1])
def test_guided_backprop_and_deconvolution_through_relu6_by_hand(target):
    net, _, _ = relu6_net()
    x = torch.linspace(-4.1, 3.9, 32).reshape(1, 2, 4, 4)
    plain, (z1, z2) = hand_backward(x[0], target, "plain")
    guided, _ = hand_backward(x[0], target, "guided")
    deconv, _ = hand_backward(x[0], target, "deconv")
    # the example reaches all three regions of ReLU6 and no kink exactly
    for z in (z1, z2):
        assert (z < 0).any() and ((z > 0) & (z < 6)).any() and (z > 6).any()
        assert not ((z == 0) | (z == 6)).any()
    assert not torch.allclose(guided, plain) and not torch.allclose(deconv, plain)

    torch.testing.assert_close(explain.Saliency(net)(x, target).raw[0], plain)
    torch.testing.assert_close(explain.GuidedBackprop(net)(x, target).raw[0], guided)
    torch.testing.assert_close(explain.Deconvolution(net)(x, target).raw[0], deconv)
    # captum's versions see no nn.ReLU here and return the plain gradient
    torch.testing.assert_close(captum(ca.GuidedBackprop(net), x, target=target)[0], plain)


def test_is_relu_like():
    for module in (nn.ReLU(), nn.ReLU6(), nn.SiLU(), nn.GELU(), nn.Hardswish(), nn.LeakyReLU()):
        assert is_relu_like(module), module
    for module in (nn.Sigmoid(), nn.Tanh(), nn.Conv2d(1, 1, 1), nn.Identity()):
        assert not is_relu_like(module), module


# ---------------------------------------------------------------------------------------
# 4. Guided Grad-CAM
# ---------------------------------------------------------------------------------------

def test_guided_gradcam_is_guided_backprop_times_upsampled_gradcam():
    model, x = tiny_cnn(), images()
    layer = "3"  # the ReLU after the stride-2 convolution: (N, 6, 8, 8)
    cam = explain.GradCAM(model, layer)(x, IDS).raw
    # Grad-CAM by hand: ReLU(sum_k mean(G_k) A_k) at that layer
    activations = model[:4](x).detach().requires_grad_()
    logits = model[4:](activations)
    gradients, = torch.autograd.grad(logits.gather(1, IDS[:, None]).sum(), activations)
    torch.testing.assert_close(cam, F.relu((gradients.mean(dim=(2, 3), keepdim=True) * activations).sum(1)).detach())
    assert cam.shape == (2, 8, 8) and (cam > 0).any() and (cam == 0).any()

    guided = explain.GuidedBackprop(model)(x, IDS).raw
    expected = guided * F.interpolate(cam[:, None], size=(16, 16), mode="bilinear", align_corners=False)
    res = explain.GuidedGradCAM(model, target_layer=layer)(x, IDS)
    torch.testing.assert_close(res.raw, expected)
    assert res.layers == ("input",) and res.raw.shape == (2, 3, 16, 16)
    assert expected.abs().max() > 0


# ---------------------------------------------------------------------------------------
# 5. Seeds and the caller's random stream
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["lime", "kernelshap"])
def test_lime_and_kernelshap_are_deterministic_with_a_seed(name):
    model, x = tiny_cnn(), images()
    cls = method_class(name)
    first = cls(model, n_segments=6, n_samples=16, seed=1)(x, IDS).raw
    again = cls(model, n_segments=6, n_samples=16, seed=1)(x, IDS).raw
    other = cls(model, n_segments=6, n_samples=16, seed=2)(x, IDS).raw
    # Equal up to rounding: the inner batches' size is measured, and may differ between calls.
    assert torch.allclose(first, again, atol=1e-6)
    assert not torch.allclose(first, other, atol=1e-6)


@pytest.mark.parametrize("name, options", [
    ("lime", {}), ("kernelshap", {}), ("smoothgrad", {}), ("vargrad", {}), ("gradientshap", {}),
    ("deepliftshap", {}), ("ig", {"baseline": "noise"}), ("occlusion", {"baseline": "noise"}),
])
def test_a_seeded_call_leaves_the_callers_random_stream_untouched(name, options):
    """(numpy's stream, which captum's GradientShap uses, is seeded by hand here: see
    test_gradientshap_is_reproducible_with_a_seed.)"""
    model, x = tiny_cnn(), images()
    before = torch.get_rng_state()
    np.random.seed(0)
    first = make(name, model, seed=4, **options)(x, IDS).raw
    assert torch.equal(torch.get_rng_state(), before)
    torch.rand(10)  # the caller's stream moves on; the seeded call does not care
    np.random.seed(0)
    assert torch.equal(make(name, model, seed=4, **options)(x, IDS).raw, first)


def test_gradientshap_is_reproducible_with_a_seed():
    model, x = tiny_cnn(), images(1)
    distribution = images(3, seed=9)
    numpy_before = np.random.get_state()[1].copy()
    first = explain.GradientShap(model, baseline=distribution, n_samples=8, seed=5)(x, [4]).raw
    numpy_after = np.random.get_state()[1].copy()
    again = explain.GradientShap(model, baseline=distribution, n_samples=8, seed=5)(x, [4]).raw
    assert torch.equal(first, again)
    assert np.array_equal(numpy_before, numpy_after)


def test_kernelshap_with_a_single_superpixel():
    """SLIC merges pixel noise into one segment; the one segment's Shapley value is
    f(x) - f(baseline), the same for every pixel: a constant, so a zero map (as LIME and
    Feature Ablation give)."""
    model, x = tiny_cnn(), torch.rand(1, 3, 16, 16)
    assert superpixels(x, 8).max() == 0
    assert torch.equal(explain.FeatureAblation(model, n_segments=8)(x).maps, torch.zeros(1, 16, 16))
    assert torch.equal(explain.KernelShap(model, n_segments=8, n_samples=6)(x).maps, torch.zeros(1, 16, 16))


def test_seed_none_draws_from_the_callers_stream():
    model, x = tiny_cnn(), images()
    torch.manual_seed(123)
    first = explain.Lime(model, n_segments=6, n_samples=16, seed=None)(x, IDS).raw
    moved = torch.get_rng_state()
    torch.manual_seed(123)
    again = explain.Lime(model, n_segments=6, n_samples=16, seed=None)(x, IDS).raw
    assert torch.equal(first, again)
    torch.manual_seed(123)
    assert not torch.equal(moved, torch.get_rng_state())


# ---------------------------------------------------------------------------------------
# 6. Degenerate inputs: zero maps, never NaN
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", MASKED_METHODS)
def test_zero_image_gives_zero_maps(name):
    """At x = 0 every pre-activation of a bias-free ReLU network is 0, where ReLU's
    gradient is 0: all gradients vanish; every perturbation (zeros, or noise in a range of
    width 0) leaves the image, and so the score, unchanged."""
    model, x = tiny_cnn(bias=False), torch.zeros(2, 3, 16, 16)
    res = make(name, model)(x, IDS)
    assert torch.isfinite(res.raw).all() and torch.isfinite(res.maps).all()
    assert res.maps.shape == (2, 16, 16)
    assert torch.equal(res.maps, torch.zeros_like(res.maps)), res.maps.abs().max()


def blind_cnn():
    """A first bias of -100 keeps every ReLU off for any input within [-10, 10] (27 inputs
    of weights below 1/sqrt(27) each): the output is the last bias, whatever the image."""
    model = tiny_cnn()
    with torch.no_grad():
        model[0].bias.fill_(-100.0)
    return model


@pytest.mark.parametrize("name", MASKED_METHODS)
def test_model_blind_to_its_input_gives_zero_maps(name):
    model, x = blind_cnn(), images()
    assert x.abs().max() < 10
    with torch.no_grad():
        assert torch.equal(model(x), model(torch.zeros_like(x)))
    res = make(name, model)(x, IDS)
    assert torch.isfinite(res.maps).all() and torch.isfinite(res.raw).all()
    assert torch.equal(res.maps, torch.zeros_like(res.maps)), res.maps.abs().max()


def test_deconvolution_ignores_the_forward_pass():
    """Deconvolution passes ReLU(gradient) through every ReLU, whatever its input: on a
    network of convolutions, ReLUs and pooling its result depends on the weights only,
    not on the image nor on the biases, and so is not zero on the blind network."""
    x = images()
    blind = explain.Deconvolution(blind_cnn())(x, IDS).raw
    normal = explain.Deconvolution(tiny_cnn())(images(seed=7), IDS).raw
    torch.testing.assert_close(blind, normal)
    assert blind.abs().max() > 0


# ---------------------------------------------------------------------------------------
# 7. Channel reductions and normalisation
# ---------------------------------------------------------------------------------------

def test_channel_reductions_by_hand():
    # one image, C = 3, 1 x 2: pixel 0 has channels (3, -4, 0), pixel 1 has (1, 2, -2)
    a = torch.tensor([[[[3.0, 1.0]], [[-4.0, 2.0]], [[0.0, -2.0]]]])
    expected = {"abs-sum": [7.0, 5.0], "sum": [-1.0, 1.0], "max-abs": [4.0, 2.0], "l2": [5.0, 3.0]}
    for reduction, values in expected.items():
        out = reduce_channels(a, reduction)
        assert out.shape == (1, 1, 2)
        torch.testing.assert_close(out, torch.tensor([[values]]))
        # with topk the channels are the third dimension from the end: (N, k, C, H, W)
        stacked = reduce_channels(torch.stack([a, 2 * a], dim=1), reduction)
        torch.testing.assert_close(stacked, torch.tensor([[[values], [[2 * v for v in values]]]]))
    with pytest.raises(ValueError, match="unknown reduction 'mean'.*abs-sum"):
        reduce_channels(a, "mean")


def test_normalize_maps_clips_at_the_percentile():
    ramp = torch.arange(1.0, 101.0).reshape(1, 10, 10)  # 1..100: the 90th percentile is 90
    out = normalize_maps(ramp, 90.0).flatten()
    torch.testing.assert_close(out[:90], torch.arange(1.0, 91.0) / 90.0)
    assert (out[90:] == 1.0).all()
    torch.testing.assert_close(normalize_maps(ramp, 100.0), ramp / 100.0)
    # signed: magnitudes sorted 0, 1, 2, 2, 4, 8; the 50th percentile (3rd of 6) is 2
    signed = torch.tensor([[[-4.0, -2.0, 0.0], [1.0, 2.0, 8.0]]])
    torch.testing.assert_close(normalize_maps(signed, 50.0), torch.tensor([[[-1.0, -1.0, 0.0], [0.5, 1.0, 1.0]]]))
    # a single hot pixel (percentile 0): scaled by the maximum
    sparse = torch.zeros(1, 10, 10)
    sparse[0, 3, 4] = 5.0
    assert torch.equal(normalize_maps(sparse), sparse / 5.0)


def test_normalize_maps_constant_maps_become_zeros():
    maps = torch.stack([torch.full((4, 4), 3.0), torch.zeros(4, 4), torch.full((4, 4), -2.0), torch.rand(4, 4)])
    out = normalize_maps(maps)
    assert torch.equal(out[:3], torch.zeros(3, 4, 4))
    assert out[3].max() == 1.0  # each map is scaled on its own
    assert torch.isfinite(out).all()
    for bad in (0.0, -5.0, 100.5):
        with pytest.raises(ValueError, match="clip_percentile"):
            normalize_maps(maps, bad)


def test_sum_reduction_gives_signed_maps_with_negative_evidence():
    """Score = mean over pixels of (x_0 - x_1): on the left half channel 0 is 1, on the right
    channel 1 is 0.5, so InputXGradient is +1/HW on the left and -0.5/HW on the right."""
    net = nn.Sequential(nn.Conv2d(2, 1, 1, bias=False), nn.AdaptiveAvgPool2d(1), nn.Flatten()).eval()
    with torch.no_grad():
        net[0].weight.copy_(torch.tensor([1.0, -1.0])[None, :, None, None])
    x = torch.zeros(1, 2, 4, 4)
    x[0, 0, :, :2] = 1.0
    x[0, 1, :, 2:] = 0.5
    signed = explain.InputXGradient(net, reduction="sum")(x, 0)
    assert signed.signed
    expected = torch.tensor([1.0, 1.0, -0.5, -0.5]).expand(1, 4, 4)
    torch.testing.assert_close(signed.maps, expected)
    assert signed.maps.min() >= -1 and signed.maps.max() <= 1
    unsigned = explain.InputXGradient(net)(x, 0)
    assert not unsigned.signed
    torch.testing.assert_close(unsigned.maps, expected.abs())
    # on a real (tiny) network the signed saliency has both signs too, within [-1, 1]
    res = explain.Saliency(tiny_cnn(), reduction="sum")(images(), IDS)
    assert res.signed and (res.maps < 0).any() and (res.maps > 0).any()
    assert res.maps.min() >= -1 and res.maps.max() <= 1


# ---------------------------------------------------------------------------------------
# 8. Baselines
# ---------------------------------------------------------------------------------------

def test_make_baselines_zeros_number_and_tensors():
    x = images(2, 8)
    assert torch.equal(make_baselines(x), torch.zeros_like(x))
    assert torch.equal(make_baselines(x, "zeros"), torch.zeros_like(x))
    assert torch.equal(make_baselines(x, 0.5), torch.full_like(x, 0.5))
    assert torch.equal(make_baselines(x, -1), torch.full_like(x, -1.0))
    means = torch.tensor([0.1, 0.2, 0.3])[:, None, None]  # one colour, broadcast
    out = make_baselines(x, means)
    assert out.shape == x.shape and torch.equal(out[1, 2], torch.full((8, 8), 0.3))
    with pytest.raises(ValueError, match=r"shape \(4, 1, 1\) does not broadcast"):
        make_baselines(x, torch.zeros(4, 1, 1))
    with pytest.raises(ValueError, match="unknown baseline 'mean'.*zeros, blur, noise"):
        make_baselines(x, "mean")
    with pytest.raises(ValueError, match="unknown baseline"):
        explain.IntegratedGradients(tiny_cnn(), baseline="black")


def test_make_baselines_blur():
    constant = torch.full((1, 3, 20, 20), 2.5)
    torch.testing.assert_close(make_baselines(constant, "blur"), constant)
    x = torch.randn(2, 3, 32, 32)
    blurred = make_baselines(x, "blur")
    assert blurred.shape == x.shape
    assert (blurred.var(dim=(2, 3)) < 0.5 * x.var(dim=(2, 3))).all()
    # the blur keeps each channel's mean roughly (reflection padding): colour, not detail
    torch.testing.assert_close(blurred.mean(dim=(2, 3)), x.mean(dim=(2, 3)), atol=0.1, rtol=0)
    assert (make_baselines(x, "blur", blur_sigma=0.5).var() > blurred.var())
    with pytest.raises(ValueError, match="blur_sigma"):
        make_baselines(x, "blur", blur_sigma=0.0)


def test_make_baselines_noise_lies_in_each_channels_range_and_is_seeded():
    x = images(2, 8)
    x[1, 2] *= 10  # a channel with a wider range
    with seeded(3, x.device):
        noise = make_baselines(x, "noise")
    low, high = x.amin(dim=(2, 3)), x.amax(dim=(2, 3))
    assert (noise.amin(dim=(2, 3)) >= low).all() and (noise.amax(dim=(2, 3)) <= high).all()
    assert noise[1, 2].std() > 5 * noise[1, 1].std()
    with seeded(3, x.device):
        assert torch.equal(make_baselines(x, "noise"), noise)
    with seeded(4, x.device):
        assert not torch.equal(make_baselines(x, "noise"), noise)


def test_integrated_gradients_with_a_blurred_baseline():
    model, x = tiny_cnn(), images(2, 32)
    zeros = explain.IntegratedGradients(model, n_steps=64)(x, IDS).raw
    blur = explain.IntegratedGradients(model, n_steps=64, baseline="blur")(x, IDS).raw
    assert (zeros - blur).abs().max() > 0.1 * zeros.abs().max()
    # completeness now holds against the blurred image
    delta = score(model, x, IDS) - score(model, make_baselines(x, "blur"), IDS)
    torch.testing.assert_close(blur.sum(dim=(1, 2, 3)), delta, rtol=0.02, atol=1e-4)


# ---------------------------------------------------------------------------------------
# 9. Internal batches: same numbers, bounded memory
# ---------------------------------------------------------------------------------------

def test_integrated_gradients_internal_batch_size_changes_nothing():
    model, x = tiny_cnn(), images()
    small = explain.IntegratedGradients(model, n_steps=20, internal_batch_size=8)(x, IDS).raw
    large = explain.IntegratedGradients(model, n_steps=20, internal_batch_size=1000)(x, IDS).raw
    torch.testing.assert_close(small, large)


def test_smoothgrad_internal_batch_size_changes_nothing():
    model, x = tiny_cnn(), images()
    small = explain.SmoothGrad(model, n_samples=7, seed=2, internal_batch_size=3)(x, IDS).raw
    large = explain.SmoothGrad(model, n_samples=7, seed=2, internal_batch_size=1000)(x, IDS).raw
    torch.testing.assert_close(small, large)


@pytest.mark.parametrize("targets", [{}, {"topk": 2}, {"targets": lambda out: out[:, 2] - out[:, 0]}],
                         ids=["top1", "topk", "callable"])
def test_deeplift_reads_its_targets_from_its_own_pass_or_resolves_them_for_batches(targets):
    """Up to internal_batch_size / 2 images run in one pass, which also reads the targets;
    more run in internal batches after one pass that resolves them: the same numbers."""
    model, x = tiny_cnn(), images(3)
    one_pass = explain.DeepLift(model)(x, **targets)
    batched = explain.DeepLift(model, internal_batch_size=2)(x, **targets)
    torch.testing.assert_close(batched.raw, one_pass.raw)
    assert torch.equal(batched.targets, one_pass.targets)
    torch.testing.assert_close(one_pass.logits, model(x).detach())
    if "targets" not in targets:  # completeness against the zero baseline, target by target
        ids = one_pass.targets.view(3, -1)
        raw = one_pass.raw.view(3, ids.shape[1], *x.shape[1:])
        with torch.no_grad():
            delta = model(x).gather(1, ids) - model(torch.zeros_like(x)).gather(1, ids)
        torch.testing.assert_close(raw.flatten(2).sum(2), delta, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["deeplift", "deepliftshap", "lrp"])
def test_check_runs_the_method_on_the_first_image_with_its_target(name):
    """These methods run once in check (what their rules refuse shows only in a full
    pass); one target per image is cut to the first image's, as the images are."""
    model, x = tiny_cnn(), images(3)
    checker = make(name, model) if name != "lrp" else explain.LRP(model)
    for targets in ([1, 2, 3], torch.tensor([1, 2, 3]), [[1, 2], [0, 1], [3, 4]], 2, None, lambda out: out[:, 0]):
        checker.check(x, targets)
    checker.check(x, topk=2)
    with pytest.raises(ValueError, match="out of range"):
        checker.check(x, [9, 1, 2])


def test_seed_must_be_a_numpy_seed():
    model = tiny_cnn()
    assert explain.SmoothGrad(model, seed=np.int64(3)).seed == 3
    for bad in (-1, 2**32, 1.5, True, "0"):
        with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*32\)"):
            explain.SmoothGrad(model, seed=bad)


@pytest.mark.parametrize("internal_batch_size", [1, 4, 6])
def test_deepliftshap_in_chunks_equals_unchunked(internal_batch_size):
    model, x = tiny_cnn(), images()
    distribution = images(5, seed=9)  # 5 baselines: the last chunk may hold one
    chunked = explain.DeepLiftShap(model, baseline=distribution, internal_batch_size=internal_batch_size)(x, IDS).raw
    whole = explain.DeepLiftShap(model, baseline=distribution, internal_batch_size=1000)(x, IDS).raw
    torch.testing.assert_close(chunked, whole)
    torch.testing.assert_close(whole, captum(ca.DeepLiftShap(model), x, baselines=distribution, target=IDS))


@pytest.mark.parametrize("name, options", [
    ("occlusion", {"window": 4, "stride": 4}), ("ablation", {"n_segments": 6}), ("deeplift", {}),
    ("lime", {"n_samples": 10, "n_segments": 6}),
])
def test_perturbation_batches_change_nothing(name, options):
    model, x = tiny_cnn(), images(3)
    ids = [0, 1, 2]
    one = make(name, model, internal_batch_size=1, **options)(x, ids).raw
    many = make(name, model, internal_batch_size=1000, **options)(x, ids).raw
    torch.testing.assert_close(one, many)


MEMORY_PROBE = """
import re, torch
from pathlib import Path
from torch import nn
import explain

def kib(field):
    return int(re.search(field + r":\\s+(\\d+)", Path("/proc/self/status").read_text())[1])

def growth(call):
    # The peak RSS since now, over the RSS now, in MiB: the kernel's high-water mark is reset
    # first (clear_refs 5), so memory that imports held and freed cannot hide the growth.
    Path("/proc/self/clear_refs").write_text("5")
    start = kib("VmRSS")
    call()
    return (kib("VmHWM") - start) / 1024

torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.Linear(4, 3)).eval()
x = torch.randn(1, 3, 224, 224)
batched = explain.IntegratedGradients(model, n_steps=200, internal_batch_size=8)
whole = explain.IntegratedGradients(model, n_steps=200, internal_batch_size=200)
whole(x[..., :16, :16])  # imports, allocator, captum: paid before the measurement
results = {}
print(growth(lambda: results.update(a=batched(x).raw)), growth(lambda: results.update(b=whole(x).raw)))
torch.testing.assert_close(results["a"], results["b"])
"""


def test_integrated_gradients_memory_is_bounded_by_internal_batch_size():
    """200 steps of a 224 x 224 image: each row's activations and gradients cost a few MB,
    so the whole expanded batch at once (internal_batch_size=200) grows the peak RSS by
    hundreds of MB; batches of 8 rows must not.

    Each call's growth is its peak RSS over the RSS before it, the kernel's high-water mark
    reset before each (``/proc/self/clear_refs``), so what imports or the other call held and
    freed cannot hide it. (One process rather than two: importing explain costs seconds.)"""
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(MEMORY_PROBE)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    batched, whole = map(float, result.stdout.split())
    assert whole > 200, (batched, whole)
    assert batched < 0.5 * whole, (batched, whole)


# ---------------------------------------------------------------------------------------
# 10. Targets
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["saliency", "ig", "deeplift", "occlusion"])
def test_topk_columns_equal_separate_calls(name):
    model, x = tiny_cnn(), images()
    res = make(name, model)(x, topk=2)
    assert res.maps.shape == (2, 2, 16, 16) and res.raw.shape == (2, 2, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(res.targets, model(x).topk(2, dim=1).indices)
    for j in range(2):
        single = make(name, model)(x, res.targets[:, j])
        torch.testing.assert_close(res.raw[:, j], single.raw)
        torch.testing.assert_close(res.maps[:, j], single.maps)
    assert not torch.allclose(res.raw[:, 0], res.raw[:, 1])
    assert res.probabilities.shape == (2, 2) and (res.probabilities[:, 0] >= res.probabilities[:, 1]).all()


def test_targets_by_class_name():
    model, x = tiny_cnn(), images()
    names = ["ant", "bee", "cat", "dog", "eel"]
    res = explain.Saliency(model, class_names=names)(x, "cat")
    torch.testing.assert_close(res.raw, explain.Saliency(model)(x, 2).raw)
    assert res.targets.tolist() == [2, 2] and res.target_names == ["cat", "cat"]
    res = explain.IntegratedGradients(model, n_steps=4, class_names=names)(x, ["bee", "eel"])
    assert res.targets.tolist() == [1, 4]
    with pytest.raises(ValueError, match="unknown class name"):
        explain.Saliency(model, class_names=names)(x, "cow")


@pytest.mark.parametrize("name", ["saliency", "ig", "guidedgradcam", "lime"])
def test_callable_target_equals_the_class_id(name):
    model, x = tiny_cnn(), images()
    by_callable = make(name, model)(x, lambda out: out[:, 3])
    by_id = make(name, model)(x, 3)
    torch.testing.assert_close(by_callable.raw, by_id.raw)
    assert by_callable.targets.tolist() == [-1, -1] and by_id.targets.tolist() == [3, 3]
    assert torch.isnan(by_callable.probabilities).all()


@pytest.mark.parametrize("name", ["saliency", "ig"])
def test_explicit_targets_and_probabilities(name):
    model, x = tiny_cnn(), images()
    res = make(name, model)(x, [4, 0])
    with torch.no_grad():
        logits = model(x)
    torch.testing.assert_close(res.logits, logits)
    assert res.targets.tolist() == [4, 0]
    probs = logits.softmax(dim=1)
    torch.testing.assert_close(res.probabilities, torch.stack([probs[0, 4], probs[1, 0]]))
    default = make(name, model)(x)
    assert torch.equal(default.targets, logits.argmax(dim=1))
    # the saliency of a class is that class's own gradient
    if name == "saliency":
        xr = x.clone().requires_grad_()
        expected, = torch.autograd.grad(model(xr).gather(1, torch.tensor([[4], [0]])).sum(), xr)
        torch.testing.assert_close(res.raw, expected)


# ---------------------------------------------------------------------------------------
# 11. Hygiene: the model as it was, whatever happens
# ---------------------------------------------------------------------------------------

def resnet18():
    torch.manual_seed(0)
    return torchvision.models.resnet18(num_classes=10).eval()


MODELS = {
    "resnet18": (resnet18, 32, {"guidedgradcam": {"target_layer": "layer3"}}),  # layer4 is 1 x 1
    "inplace": (lambda: tiny_cnn(inplace=True), 16, {}),
}


def module_attributes(model):
    return {name: set(vars(module)) for name, module in model.named_modules()}


@pytest.mark.parametrize("mode", ["plain", "no_grad", "inference_mode"])
@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("name", METHODS)
def test_model_is_unchanged_after_a_call(name, model_name, mode):
    build, size, extra = MODELS[model_name]
    model = build()
    model.train()  # the call runs in eval mode and must restore this
    next(model.parameters()).requires_grad_(False)  # and must restore mixed requires_grad flags
    state, attributes = ModelState(model), module_attributes(model)
    method = make(name, model, **extra.get(name, {}))
    np.random.seed(0)  # captum's GradientShap draws from numpy's stream
    if mode == "plain":
        res = method(images(1, size))
    elif mode == "no_grad":
        with torch.no_grad():
            res = method(images(1, size))
    else:
        with torch.inference_mode():
            res = method(images(1, size))
    state.assert_unchanged()
    assert module_attributes(model) == attributes
    assert res.maps.shape == (1, size, size) and torch.isfinite(res.maps).all()
    assert res.maps.max() > 0  # something was explained
    if mode != "plain":  # the grad mode changes nothing
        np.random.seed(0)
        torch.testing.assert_close(res.raw, method(images(1, size), res.targets).raw)


class Flaky(nn.Module):
    """The model, raising after its ``fail_at``-th forward pass has run."""

    def __init__(self, model, fail_at):
        super().__init__()
        self.model, self.fail_at, self.calls = model, fail_at, 0

    def forward(self, x):
        out = self.model(x)
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("flaky forward")
        return out


class RaisingTarget:
    """A callable target that raises on the ``fail_at``-th forward pass it sees (a pass may
    score its output more than once: calls on the same output count once)."""

    def __init__(self, fail_at):
        self.fail_at, self.passes, self.last = fail_at, 0, None

    def __call__(self, out):
        if out is not self.last:
            self.passes, self.last = self.passes + 1, out
        if self.passes == self.fail_at:
            raise RuntimeError("target failed")
        return out[:, 0]


@pytest.mark.parametrize("where", ["forward", "target"])
@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("name", METHODS)
def test_model_is_unchanged_after_an_exception_mid_call(name, model_name, where):
    build, size, _ = MODELS[model_name]
    inner = build()
    # a single-pass method's only forward pass runs inside captum; the others resolve the
    # targets first, so their second pass is the first inside captum
    fail_at = 1 if method_class(name).single_pass else 2
    model = Flaky(inner, fail_at) if where == "forward" else inner
    targets = RaisingTarget(fail_at) if where == "target" else None
    layer = {"resnet18": "layer3", "inplace": "3"}[model_name]
    options = {"target_layer": f"model.{layer}" if where == "forward" else layer} if name == "guidedgradcam" else {}
    state, attributes = ModelState(model), module_attributes(model)
    with pytest.raises(RuntimeError, match="flaky forward|target failed"):
        make(name, model, **options)(images(1, size), targets)
    state.assert_unchanged()
    assert module_attributes(model) == attributes


@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("name", GRADIENT_METHODS)
def test_model_is_unchanged_after_an_exception_during_backward(name, model_name):
    """DeepLift records every activation's input and output on the module during the
    forward pass and consumes them in the backward pass: a backward that fails half-way
    must still leave no attribute (nor hook) behind."""
    build, size, extra = MODELS[model_name]
    model = build()
    state, attributes = ModelState(model), module_attributes(model)
    with pytest.raises(RuntimeError, match="backward failed"):
        make(name, model, **extra.get(name, {}))(images(1, size), lambda out: BackwardFails.apply(out[:, 0]))
    state.assert_unchanged()
    assert module_attributes(model) == attributes
    # and the model still explains normally afterwards
    assert torch.isfinite(make(name, model, **extra.get(name, {}))(images(1, size)).maps).all()


def test_deeplift_on_resnet_reusing_its_relu_is_complete():
    """torchvision's BasicBlock calls its ReLU twice; explain's DeepLift still sums to the
    difference of the scores."""
    model, x = resnet18(), images(2, 32)
    res = explain.DeepLift(model)(x, IDS)
    delta = score(model, x, IDS) - score(model, torch.zeros_like(x), IDS)
    torch.testing.assert_close(res.raw.sum(dim=(1, 2, 3)), delta, rtol=0.01, atol=1e-4)


# ---------------------------------------------------------------------------------------
# 12. Bad input
# ---------------------------------------------------------------------------------------

def test_bad_settings_raise_clear_errors():
    model = tiny_cnn()
    with pytest.raises(ValueError, match="unknown reduction 'mean'; use one of abs-sum, sum, max-abs, l2"):
        explain.Saliency(model, reduction="mean")
    for bad in (0, 100.5, -1):
        with pytest.raises(ValueError, match=r"clip_percentile must be a number in \(0, 100\]"):
            explain.Saliency(model, clip_percentile=bad)
    with pytest.raises(ValueError, match="n_steps must be a positive int, got 0"):
        explain.IntegratedGradients(model, n_steps=0)
    for cls in (explain.IntegratedGradients, explain.SmoothGrad, explain.DeepLiftShap, explain.Occlusion):
        with pytest.raises(ValueError, match="internal_batch_size must be a positive int, got 0"):
            cls(model, internal_batch_size=0)
    with pytest.raises(ValueError, match="n_samples must be a positive int"):
        explain.Lime(model, n_samples=0)
    with pytest.raises(ValueError, match="baseline 'blur' is not a distribution"):
        explain.DeepLiftShap(model, baseline="blur")
    with pytest.raises(ValueError, match=r"baseline distribution must have shape \(B, 3, 16, 16\)"):
        explain.DeepLiftShap(model, baseline=torch.zeros(4, 3, 8, 8))(images(), IDS)


def test_occlusion_window_larger_than_the_image():
    model = tiny_cnn()
    with pytest.raises(ValueError, match=r"occlusion window \(20\) is larger than the images \(16 x 16\)"):
        explain.Occlusion(model, window=20)(images(), IDS)
    state = ModelState(model)
    explain.Occlusion(model, window=16)(images(), IDS)  # the whole image at once is fine
    state.assert_unchanged()


@pytest.mark.parametrize("method", ["smoothgrad", "vargrad", "gradientshap", "ig"])
def test_float16_models_take_the_float32_noise_and_baselines_captum_adds(method):
    model = torchvision.models.resnet18(num_classes=3).eval()
    images = torch.rand(1, 3, 32, 32)
    options = {"n_steps": 4} if method == "ig" else {"n_samples": 4}
    half = explain.explainer(method, copy.deepcopy(model).half(), **options)
    maps = half(images.half()).maps
    assert maps.shape == (1, 32, 32) and torch.isfinite(maps).all()
