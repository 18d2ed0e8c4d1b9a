"""The methods of explain.methods against plain reference implementations of their papers.

Every reference below is written from the formula in the method's docstring (and paper),
with straightforward loops: one forward pass per channel, per mask or per ablation, the whole
model re-run each time, gradients by plain autograd through hooks written here. Nothing is
taken from explain's own code. The references run on tiny seeded models (two convolutions on
16 x 16 inputs, a global-average-pooling + linear head); explain's ``res.raw`` (the map at the
layer's resolution, after the final ReLU where the method has one) must equal them to 1e-4.
A few cases are also worked out by hand, with the numbers in comments.

Methods with randomness (SS-CAM, Random-CAM) are checked by their structure instead:
repeatability, independence of ``batch_size``, and their noise-free limits.
"""

import copy
import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn

import explain
from conftest import ModelState

ATOL = RTOL = 1e-4
LAYER = "3"  # the ReLU after the second convolution of tiny_cnn: an (N, C, 8, 8) output


def close(actual, expected, atol=ATOL, rtol=RTOL):
    """actual == expected to ``atol`` relative to the peak of ``expected`` (raw maps of tiny
    random models are often far below 1, where a plain 1e-4 would prove little)."""
    actual, expected = actual.double(), expected.double()
    peak = float(expected.abs().max()) if expected.numel() else 0.0
    if peak > 0:
        actual, expected = actual / peak, expected / peak
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol)


def tiny_cnn(seed=0, channels=6, classes=5, inplace=False):
    """conv -> ReLU -> conv(stride 2) -> ReLU -> global average pooling -> linear."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(),
        nn.Conv2d(4, channels, 3, stride=2, padding=1), nn.ReLU(inplace=inplace),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, classes),
    ).eval()


def images(n=2, size=16, seed=1):
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------
# Plain reference machinery
# ---------------------------------------------------------------------------------------


def layer_output(model, layer, x):
    """(activation of ``layer``, model output) for x, by one forward hook."""
    store = {}

    def hook(module, args, output):
        store["a"] = output.detach().clone()  # before any in-place op after the layer

    handle = model.get_submodule(layer).register_forward_hook(hook)
    try:
        with torch.no_grad():
            out = model(x)
    finally:
        handle.remove()
    return store["a"], out.detach()


def layer_gradient(model, layer, x, score):
    """(A, dS/dA, logits) with S = score(logits) (one value per image), by plain autograd: the
    layer's output is replaced by a leaf tensor, and the rest of the model gets a copy of it."""
    store = {}

    def hook(module, args, output):
        leaf = output.detach().clone().requires_grad_()
        store["a"] = leaf
        return leaf * 1

    handle = model.get_submodule(layer).register_forward_hook(hook)
    try:
        with torch.enable_grad():
            logits = model(x)
            (gradient,) = torch.autograd.grad(score(logits).sum(), store["a"])
    finally:
        handle.remove()
    return store["a"].detach(), gradient, logits.detach()


def logit_of(targets):
    return lambda logits: logits[torch.arange(len(targets)), torch.tensor(targets)]


def ablated_output(model, layer, x, channel):
    """The model output with ``channel`` of ``layer``'s output set to zero (whole model re-run)."""

    def hook(module, args, output):
        output = output.clone()
        output[:, channel] = 0
        return output

    handle = model.get_submodule(layer).register_forward_hook(hook)
    try:
        with torch.no_grad():
            return model(x)
    finally:
        handle.remove()


def weighted_sum(weights, activation):
    """sum_k w_k A^k for one image: weights (C,), activation (C, h, w)."""
    total = torch.zeros(activation.shape[1:], dtype=torch.float64)
    for k in range(activation.shape[0]):
        total += float(weights[k]) * activation[k].double()
    return total


def gradcam_reference(a, g):
    """Grad-CAM terms for one image: a_k A^k, a_k = mean_ij G^k_ij. Returns (C, h, w)."""
    return torch.stack([g[k].mean() * a[k] for k in range(a.shape[0])])


def gradcam_plus_plus_reference(a, d1, d2, d3):
    """Grad-CAM++ for one image from A and the first three derivatives: (h, w), before ReLU.
    w_k = sum_ij alpha_ij ReLU(d1_ij), alpha = d2 / (2 d2 + sum_ab A_ab d3), 0 where 0 / 0."""
    weights = []
    for k in range(a.shape[0]):
        total = 0.0
        for (i, j), first in np.ndenumerate(d1[k].double().numpy()):
            denominator = 2 * float(d2[k, i, j]) + float(a[k].double().sum()) * float(d3[k, i, j])
            alpha = 0.0 if denominator == 0 else float(d2[k, i, j]) / denominator
            total += alpha * max(first, 0.0)
        weights.append(total)
    return weighted_sum(weights, a)


def signed_first_component(terms):
    """First principal component of one image's (h*w, C) matrix of ``terms`` (C, h, w),
    centred per channel, signed so that it correlates positively with the channel sum."""
    c, h, w = terms.shape
    x = terms.reshape(c, h * w).T.double().numpy()
    centred = x - x.mean(axis=0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    projection = centred @ vt[0]
    evidence = x.sum(axis=1)
    if np.dot(projection - projection.mean(), evidence - evidence.mean()) < 0:
        projection = -projection
    return torch.from_numpy(projection.reshape(h, w))


def kernel_pca_reference(activation, gamma=None, coef0=1.0):
    """First sigmoid-kernel principal component of one image's centred (h*w, C) matrix, as
    scikit-learn's KernelPCA(n_components=1, kernel='sigmoid').fit_transform computes it:
    K = tanh(gamma X X^T + coef0), centred in feature space, projection sqrt(l1) v1.
    Signed to agree with the channel sum. (Checked against scikit-learn in a scratch script.)"""
    c, h, w = activation.shape
    x = activation.reshape(c, h * w).T.double().numpy()
    centred = x - x.mean(axis=0)
    gamma = 1.0 / c if gamma is None else gamma
    kernel = np.tanh(gamma * centred @ centred.T + coef0)
    n = kernel.shape[0]
    ones = np.full((n, n), 1.0 / n)
    kernel = kernel - ones @ kernel - kernel @ ones + ones @ kernel @ ones
    values, vectors = np.linalg.eigh(kernel)
    projection = vectors[:, -1] * math.sqrt(max(values[-1], 0.0))
    evidence = x.sum(axis=1)
    if np.dot(projection - projection.mean(), evidence - evidence.mean()) < 0:
        projection = -projection
    return torch.from_numpy(projection.reshape(h, w))


def score_mask(channel, size):
    """Score-CAM's mask: the channel upsampled to the input size (bilinear, align_corners=False)
    and min-max scaled to [0, 1]; None for a constant channel."""
    up = F.interpolate(channel[None, None].float(), size=size, mode="bilinear", align_corners=False)[0, 0]
    low, high = up.min(), up.max()
    if high == low:
        return None
    return (up - low) / (high - low)


def score_cam_reference(model, layer, x, targets, *, path=(1.0,), weighting="probability"):
    """Score-CAM (path = (1,)) and IS-CAM (path = the mask's cumulative coefficients):
    w_k = mean over the path of softmax(f(x * coef * H^k))_c, one forward per channel and
    coefficient; constant channels get 0 (or, with channel-softmax, the score of an all-zero
    mask, and the channel logits go through a softmax over channels)."""
    activation, _ = layer_output(model, layer, x)
    size = tuple(x.shape[-2:])
    maps = []
    for i, c in enumerate(targets):
        scores = []
        for k in range(activation.shape[1]):
            mask = score_mask(activation[i, k], size)
            if mask is None:
                if weighting == "probability":
                    scores.append(0.0)
                    continue
                mask = torch.zeros(size)
            values = []
            for coefficient in path:
                with torch.no_grad():
                    out = model(x[i:i + 1] * (coefficient * mask))[0]
                values.append(float(out.softmax(0)[c]) if weighting == "probability" else float(out[c]))
            scores.append(sum(values) / len(values))
        weights = torch.tensor(scores, dtype=torch.float64)
        if weighting == "channel-softmax":
            weights = weights.softmax(0)
        maps.append(torch.relu(weighted_sum(weights, activation[i])))
    return torch.stack(maps)


def ablation_weights_reference(model, layer, x, targets):
    """(N, C) Ablation-CAM weights (y_c - y_c^k) / y_c, the whole model re-run per channel."""
    activation, logits = layer_output(model, layer, x)
    weights = torch.zeros(len(targets), activation.shape[1], dtype=torch.float64)
    for i, c in enumerate(targets):
        y = float(logits[i, c])
        for k in range(activation.shape[1]):
            y_k = float(ablated_output(model, layer, x[i:i + 1], k)[0, c])
            weights[i, k] = 0.0 if y == 0 else (y - y_k) / y
    return weights, activation


def ablation_cam_reference(model, layer, x, targets):
    weights, activation = ablation_weights_reference(model, layer, x, targets)
    return torch.stack([torch.relu(weighted_sum(weights[i], activation[i])) for i in range(len(targets))])


def top_classes(model, x):
    with torch.no_grad():
        return model(x).argmax(1).tolist()


# ---------------------------------------------------------------------------------------
# CAM
# ---------------------------------------------------------------------------------------


class IdentityHead(nn.Module):
    """layer = identity on an (N, 2, 1, 2) input, then global average pooling and fc."""

    def __init__(self, weight, bias):
        super().__init__()
        self.layer = nn.Identity()
        self.fc = nn.Linear(2, 2)
        with torch.no_grad():
            self.fc.weight.copy_(torch.tensor(weight))
            self.fc.bias.copy_(torch.tensor(bias))

    def forward(self, x):
        return self.fc(self.layer(x).mean(dim=(2, 3)))


# A^0 = [1, -2], A^1 = [3, 4] on a 1 x 2 grid, used by several hand-worked cases.
HAND_A = torch.tensor([[[[1.0, -2.0]], [[3.0, 4.0]]]])


def test_cam_by_hand():
    # W = [[1, 2], [-1, -0.5]], b = [0.3, -1]:
    # class 0: 1 * [1, -2] + 2 * [3, 4] = [7, 6]
    # class 1: -1 * [1, -2] - 0.5 * [3, 4] = [-2.5, 0]: CAM has no final ReLU, the -2.5 stays.
    model = IdentityHead([[1.0, 2.0], [-1.0, -0.5]], [0.3, -1.0])
    cam = explain.CAM(model, "layer")
    close(cam(HAND_A.clone(), targets=0).raw.flatten(), torch.tensor([7.0, 6.0]))
    close(cam(HAND_A.clone(), targets=1).raw.flatten(), torch.tensor([-2.5, 0.0]))


def test_cam_matches_reference_without_relu():
    model = tiny_cnn(seed=2)
    x = images(3)
    targets = [0, 3, 4]
    activation, _ = layer_output(model, LAYER, x)
    weight = model[6].weight.detach()
    expected = torch.stack([weighted_sum(weight[c], activation[i]) for i, c in enumerate(targets)])
    res = explain.CAM(model, LAYER)(x, targets=targets)
    close(res.raw, expected)
    assert (res.raw < 0).any(), "the reference has negative values that a final ReLU would remove"


def two_layer_head():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 5),
    ).eval()


def nonlinear_head():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Tanh(), nn.Linear(4, 5),
    ).eval()


@pytest.mark.parametrize("make", [two_layer_head, nonlinear_head], ids=["vgg-like-two-linear", "tanh-before-fc"])
def test_cam_refuses_a_head_that_is_not_gap_plus_linear(make):
    model = make()
    state = ModelState(model)
    with pytest.raises(ValueError, match="linear") as error:
        explain.CAM(model, "1")(images(2))
    assert "Grad-CAM" in str(error.value)  # names a method that applies
    state.assert_unchanged()


# ---------------------------------------------------------------------------------------
# Eigen-CAM, KPCA-CAM, FEM, Random-CAM
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("layer", ["2", LAYER])
def test_eigencam_matches_reference(layer):
    model = tiny_cnn(seed=3)
    x = images(3)
    activation, _ = layer_output(model, layer, x)
    expected = torch.stack([torch.relu(signed_first_component(a)) for a in activation])
    close(explain.EigenCAM(model, layer)(x).raw, expected)


def negated_copy(model, conv_index=2):
    """The same model with the target convolution's output negated (weights and bias)."""
    other = copy.deepcopy(model)
    with torch.no_grad():
        other[conv_index].weight.neg_()
        other[conv_index].bias.neg_()
    return other


def test_eigencam_sign_follows_the_activations_not_the_solver():
    # Negating A negates both the centred matrix and the evidence (the channel sum), so the
    # signed projection p negates too: the maps are ReLU(p) and ReLU(-p), whose difference is p.
    model = tiny_cnn(seed=4)
    x = images(2)
    plain = explain.EigenCAM(model, "2")(x).raw
    negated = explain.EigenCAM(negated_copy(model), "2")(x).raw
    activation, _ = layer_output(model, "2", x)
    signed = torch.stack([signed_first_component(a) for a in activation])
    close(plain - negated, signed)
    assert ((plain > 0) & (negated > 0)).sum() == 0


def test_eigencam_ignores_per_channel_offsets():
    # Centring removes a constant added to a channel, and the sign rule correlates with the
    # centred channel sum, so a new bias on the target convolution changes nothing.
    model = tiny_cnn(seed=5)
    shifted = copy.deepcopy(model)
    with torch.no_grad():
        shifted[2].bias.add_(torch.linspace(-3, 3, 6))
    x = images(2)
    close(explain.EigenCAM(shifted, "2")(x).raw, explain.EigenCAM(model, "2")(x).raw)


def test_kpcacam_matches_kernel_pca_reference():
    model = tiny_cnn(seed=6)
    x = images(2)
    activation, _ = layer_output(model, LAYER, x)
    expected = torch.stack([torch.relu(kernel_pca_reference(a)) for a in activation])
    res = explain.KPCACAM(model, LAYER)(x)
    close(res.raw, expected)
    assert res.raw.amax() > 0


def test_kpcacam_with_a_linear_kernel_is_eigencam():
    # K = X X^T has eigenvectors u1 = X v1 / s1 with eigenvalue s1^2, so sqrt(l1) u1 = X v1.
    model = tiny_cnn(seed=7)
    x = images(2)
    close(explain.KPCACAM(model, "2", kernel="linear")(x).raw, explain.EigenCAM(model, "2")(x).raw)


class IdentityFlat(nn.Module):
    """layer = identity on the input; head = linear on the flattened layer."""

    def __init__(self, features, classes=2):
        super().__init__()
        self.layer = nn.Identity()
        self.head = nn.Linear(features, classes, bias=False)

    def forward(self, x):
        return self.head(self.layer(x).flatten(1))


def test_fem_threshold_by_hand():
    # Channel 0 = [0, 0, 0, 4]: mean 1, population variance (1 + 1 + 1 + 9) / 4 = 3.
    #   k = 1.6: threshold 1 + 1.6 sqrt(3) = 3.77 < 4, so w_0 = 1/4. (The sample standard
    #   deviation, sqrt(12 / 3) = 2, would give 1 + 3.2 = 4.2 > 4 and w_0 = 0.)
    # Channel 1 = [1, 2, 3, 4]: mean 2.5, population std sqrt(1.25) = 1.118,
    #   threshold 2.5 + 1.6 * 1.118 = 4.29 > 4, so w_1 = 0.
    # Map: 1/4 * [0, 0, 0, 4] = [0, 0, 0, 1].
    a = torch.tensor([[[[0.0, 0.0, 0.0, 4.0]], [[1.0, 2.0, 3.0, 4.0]]]])
    model = IdentityFlat(8)
    close(explain.FEM(model, "layer", k=1.6)(a.clone(), targets=0).raw.flatten(), torch.tensor([0.0, 0.0, 0.0, 1.0]))
    # With the default k = 2 nothing passes on 4 locations: the largest z-score of n values
    # is sqrt(n - 1) = sqrt(3) < 2, so every weight and the map are 0.
    assert explain.FEM(model, "layer")(a.clone(), targets=0).raw.abs().max() == 0


def test_fem_matches_reference():
    model = tiny_cnn(seed=8, channels=8)
    x = images(3)
    activation, _ = layer_output(model, "2", x)
    expected = []
    for a in activation:
        weights = []
        for channel in a.double():
            mean = channel.mean()
            std = ((channel - mean) ** 2).mean().sqrt()  # population standard deviation
            weights.append(float((channel > mean + 2 * std).double().mean()))
        expected.append(torch.relu(weighted_sum(weights, a)))
    res = explain.FEM(model, "2")(x)
    close(res.raw, torch.stack(expected))
    assert res.raw.amax() > 0


def random_cam_weights(seed, n=3, channels=16, topk=None):
    """Random-CAM's channel weights, read off its maps. Channel k is +1 at location 2k and -1
    at 2k + 1 (identity layer), so the map there is ReLU(w_k) and ReLU(-w_k): their difference
    is w_k."""
    a = torch.zeros(n, channels, 1, 2 * channels)
    for k in range(channels):
        a[:, k, 0, 2 * k], a[:, k, 0, 2 * k + 1] = 1.0, -1.0
    model = IdentityFlat(channels * 2 * channels, classes=3)
    raw = explain.RandomCAM(model, "layer", seed=seed)(a, targets=0 if topk is None else None, topk=topk).raw
    raw = raw.reshape(*raw.shape[:-2], channels, 2)
    return raw[..., 0] - raw[..., 1]


def test_randomcam_weights_are_uniform_in_minus_one_one_and_repeatable():
    weights = random_cam_weights(seed=11, n=4, channels=32)  # (4, 32)
    assert weights.abs().max() <= 1
    assert weights.min() < -0.8 and weights.max() > 0.8 and weights.mean().abs() < 0.2
    assert torch.equal(weights, random_cam_weights(seed=11, n=4, channels=32))
    assert not torch.allclose(weights, random_cam_weights(seed=12, n=4, channels=32))
    assert not torch.allclose(weights[0], weights[1])  # drawn per image
    unseeded = random_cam_weights(seed=None)
    assert unseeded.abs().max() <= 1 and not torch.equal(unseeded, random_cam_weights(seed=None))
    per_target = random_cam_weights(seed=11, topk=2)  # (3, 2, 16): drawn per target too
    assert per_target.shape == (3, 2, 16) and not torch.allclose(per_target[:, 0], per_target[:, 1])
    # A seed's first target draws what it draws alone, and no other seed's draws.
    assert torch.equal(per_target[:, 0], random_cam_weights(seed=11, channels=16))
    assert not torch.allclose(per_target[:, 1], random_cam_weights(seed=12, channels=16))


# ---------------------------------------------------------------------------------------
# Score-CAM, IS-CAM, SS-CAM
# ---------------------------------------------------------------------------------------


def test_scorecam_by_hand():
    # Identity layer on x = A: A^0 = [1, -2] gives the mask H^0 = [1, 0]; A^1 = [3, 4] gives
    # H^1 = [0, 1]. Head rows: class 0 = [1, 0, 0, 1], class 1 = [0, 1, 1, 0] on flatten(x).
    # x * H^0 = [[1, 0], [3, 0]] -> logits [1 + 0, 0 + 3] = [1, 3], p_0 = 1 / (1 + e^2)
    # x * H^1 = [[0, -2], [0, 4]] -> logits [0 + 4, -2 + 0] = [4, -2], p_0 = 1 / (1 + e^-6)
    model = IdentityFlat(4)
    with torch.no_grad():
        model.head.weight.copy_(torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 0.0]]))
    w0, w1 = 1 / (1 + math.exp(2)), 1 / (1 + math.exp(-6))
    expected = [w0 * 1 + w1 * 3, w0 * -2 + w1 * 4]  # [3.1118, 3.7517]
    close(explain.ScoreCAM(model, "layer")(HAND_A.clone(), targets=0).raw.flatten(), torch.tensor(expected))
    # channel-softmax: the class-0 logits of the masked images, 1 and 4, go through a softmax
    # over the channels: w = [e^1, e^4] / (e^1 + e^4).
    s0, s1 = math.exp(1) / (math.exp(1) + math.exp(4)), math.exp(4) / (math.exp(1) + math.exp(4))
    got = explain.ScoreCAM(model, "layer", weighting="channel-softmax")(HAND_A.clone(), targets=0).raw.flatten()
    close(got, torch.tensor([s0 * 1 + s1 * 3, s0 * -2 + s1 * 4]))


@pytest.mark.parametrize("weighting", ["probability", "channel-softmax"])
@pytest.mark.parametrize("layer", ["2", LAYER])
def test_scorecam_matches_reference(weighting, layer):
    model = tiny_cnn(seed=9)
    x = images(2)
    targets = [1, 4]
    expected = score_cam_reference(model, layer, x, targets, weighting=weighting)
    res = explain.ScoreCAM(model, layer, weighting=weighting, batch_size=5)(x, targets=targets)
    close(res.raw, expected)
    assert res.raw.amax() > 0


@pytest.mark.parametrize("weighting", ["probability", "channel-softmax"])
def test_iscam_matches_reference(weighting):
    model = tiny_cnn(seed=10)
    x = images(2)
    n = 3
    path = [sum(j / n for j in range(1, i + 1)) for i in range(1, n + 1)]  # [1/3, 1, 2]
    expected = score_cam_reference(model, LAYER, x, [2, 0], path=path, weighting=weighting)
    res = explain.ISCAM(model, LAYER, n_samples=n, weighting=weighting)(x, targets=[2, 0])
    close(res.raw, expected)


@pytest.mark.parametrize("weighting", ["probability", "channel-softmax"])
def test_sscam_without_noise_is_scorecam(weighting):
    model = tiny_cnn(seed=11)
    x = images(2)
    sscam = explain.SSCAM(model, LAYER, n_samples=1, noise=0.0, weighting=weighting)(x, targets=[3, 1])
    scorecam = explain.ScoreCAM(model, LAYER, weighting=weighting)(x, targets=[3, 1])
    close(sscam.raw, scorecam.raw, atol=1e-6, rtol=1e-6)


def test_sscam_is_repeatable_and_its_seed_matters():
    model = tiny_cnn(seed=12)
    x = images(2)

    def run(seed):
        return explain.SSCAM(model, LAYER, n_samples=3, noise=1.0, seed=seed)(x, targets=[0, 2]).raw

    first = run(seed=5)
    assert torch.equal(first, run(seed=5))
    assert not torch.allclose(first, run(seed=6))
    # Averaging probabilities keeps every weight in [0, 1], so the map is at most sum_k A^k.
    activation, _ = layer_output(model, LAYER, x)
    assert (first <= activation.sum(1) + 1e-6).all()
    # An image's noise is its own: explained alone or beside another, its map is the same.
    alone = explain.SSCAM(model, LAYER, n_samples=3, noise=1.0, seed=5)(x[1:], targets=[2]).raw
    close(alone[0], first[1], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------
# Ablation-CAM
# ---------------------------------------------------------------------------------------


def test_ablationcam_by_hand():
    # Identity layer and a bias-free linear head: zeroing channel k removes exactly its
    # contribution, so y_c^k = y_c - sum_ij W_c,kij A^k_ij. Class 0 = [1, 0, 0, 1]:
    # channel 0 contributes 1 * 1 + 0 * -2 = 1, channel 1 0 * 3 + 1 * 4 = 4, y_0 = 5;
    # w = [1/5, 4/5]; map 0.2 * [1, -2] + 0.8 * [3, 4] = [2.6, 2.8].
    model = IdentityFlat(4)
    with torch.no_grad():
        model.head.weight.copy_(torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 0.0]]))
    close(explain.AblationCAM(model, "layer")(HAND_A.clone(), targets=0).raw.flatten(), torch.tensor([2.6, 2.8]))


@pytest.mark.parametrize("layer", ["2", LAYER])
def test_ablationcam_split_path_matches_whole_model_reference(layer):
    model = tiny_cnn(seed=13)
    x = images(2)
    cam = explain.AblationCAM(model, layer, batch_size=4)
    assert cam.replay(layer).split
    res = cam(x, targets=[1, 3])
    close(res.raw, ablation_cam_reference(model, layer, x, [1, 3]))
    assert res.raw.amax() > 0


class Branchy(nn.Module):
    """Data-dependent Python control flow in the parent's forward: torch.fx cannot trace it."""

    def __init__(self, inplace=False):
        super().__init__()
        torch.manual_seed(14)
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 6, 3, stride=2, padding=1)
        self.relu = nn.ReLU(inplace=inplace)
        self.fc = nn.Linear(6, 5)

    def forward(self, x):
        if x.sum() > -1e9:  # always true, but only known at run time
            x = torch.relu(self.conv1(x))
        return self.fc(self.relu(self.conv2(x)).mean(dim=(2, 3)))


@pytest.mark.parametrize("inplace", [False, True], ids=["relu", "inplace-relu-after-layer"])
def test_ablationcam_fallback_path_matches_whole_model_reference(inplace):
    model = Branchy(inplace).eval()
    x = images(2)
    cam = explain.AblationCAM(model, "conv2", batch_size=4)
    assert not cam.replay("conv2").split
    with pytest.warns(RuntimeWarning, match="could not be split at 'conv2'.*runs the whole model"):
        res = cam(x, targets=[0, 2])
    close(res.raw, ablation_cam_reference(model, "conv2", x, [0, 2]))


@pytest.mark.parametrize("layer", ["2", "0"])
def test_ablationcam_split_path_with_inplace_relu_after_layer(layer):
    # A convolution followed by ReLU(inplace=True), as in VGG: the replayed ReLU must not
    # change the captured activations, which the map is made of.
    model = tiny_cnn(seed=15, inplace=True)
    model[1].inplace = True
    x = images(2)
    cam = explain.AblationCAM(model, layer)
    res = cam(x, targets=[4, 1])
    assert cam.replay(layer).split
    close(res.raw, ablation_cam_reference(model, layer, x, [4, 1]))


@pytest.mark.parametrize(
    "layer, size",
    [("layer1.0.conv2", 64), ("layer2.0.bn2", 64)],  # bn2: then `out += identity` (downsampled)
)
def test_ablationcam_inside_a_residual_block(layer, size):
    # The replay needs the block's input (the skip branch) from before the layer.
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).eval()
    x = torch.randn(1, 3, size, size)
    cam = explain.AblationCAM(model, layer)
    res = cam(x, targets=[3])
    assert cam.replay(layer).split, cam.replay(layer).reason
    close(res.raw, ablation_cam_reference(model, layer, x, [3]), atol=1e-4, rtol=1e-3)
    assert res.raw.amax() > 0


# ---------------------------------------------------------------------------------------
# SmoothGrad-CAM++, Shapley-CAM, Finer-CAM
# ---------------------------------------------------------------------------------------


def test_smoothgradcampp_without_noise_is_gradcampp():
    model = tiny_cnn(seed=16)
    x = images(2)
    smooth = explain.SmoothGradCAMPlusPlus(model, LAYER, n_samples=2, noise=0.0)(x, targets=[0, 4])
    plain = explain.GradCAMPlusPlus(model, LAYER)(x, targets=[0, 4])
    close(smooth.raw, plain.raw, atol=1e-6, rtol=1e-5)
    a, g, _ = layer_gradient(model, LAYER, x, logit_of([0, 4]))
    expected = torch.stack(
        [torch.relu(gradcam_plus_plus_reference(a[i], g[i], g[i] ** 2, g[i] ** 3)) for i in range(2)]
    )
    close(plain.raw, expected)


@pytest.mark.parametrize("layer", ["1", LAYER])
def test_smoothgradcampp_matches_reference(layer):
    model = tiny_cnn(seed=17)
    x = images(2)
    targets = top_classes(model, x)  # the targets of the images as given
    n, noise, seed = 3, 0.3, 7
    generator = torch.Generator().manual_seed(seed)
    moments = [0, 0, 0]
    for _ in range(n):
        noisy = x + noise * torch.randn(x.shape, generator=generator)
        _, g, _ = layer_gradient(model, layer, noisy, logit_of(targets))
        for p in range(3):
            moments[p] = moments[p] + g.double() ** (p + 1) / n
    a, _ = layer_output(model, layer, x)  # A from the image as given
    expected = torch.stack(
        [torch.relu(gradcam_plus_plus_reference(a[i], moments[0][i], moments[1][i], moments[2][i])) for i in range(2)]
    )
    res = explain.SmoothGradCAMPlusPlus(model, layer, n_samples=n, noise=noise, seed=seed)(x)
    assert res.targets.tolist() == targets
    close(res.raw, expected)
    assert res.raw.amax() > 0


def smooth_head_cnn():
    """A Softplus and a 1x1 convolution after the target layer: the Hessian is not zero."""
    torch.manual_seed(18)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 6, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(6, 6, 1), nn.Softplus(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 5),
    ).eval()


def shapley_reference(model, x, targets, rest):
    """Shapley-CAM at model[3]: w_k = mean_ij (G - H A / 2), with G = dS/dA and H A the
    Hessian-vector product from torch.autograd.functional.hvp; S = y_c (+ log softmax_c)."""
    head = model[4:]
    a, _ = layer_output(model, LAYER, x)
    rows, ids = torch.arange(len(targets)), torch.tensor(targets)

    def score(activation):
        logits = head(activation)
        s = logits[rows, ids]
        if rest:
            s = s + logits.log_softmax(1)[rows, ids]
        return s.sum()

    _, hessian_times_a = torch.autograd.functional.hvp(score, a, v=a)
    with torch.enable_grad():
        leaf = a.clone().requires_grad_()
        (g,) = torch.autograd.grad(score(leaf), leaf)
    maps = []
    for i in range(len(targets)):
        weights = [float((g[i, k] - 0.5 * hessian_times_a[i, k]).mean()) for k in range(a.shape[1])]
        maps.append(torch.relu(weighted_sum(weights, a[i])))
    return torch.stack(maps)


def test_shapleycam_on_a_piecewise_linear_head_without_rest_is_gradcam():
    model = tiny_cnn(seed=19)
    x = images(2)
    for layer in ("1", LAYER):
        a, g, _ = layer_gradient(model, layer, x, logit_of([2, 3]))
        expected = torch.stack([torch.relu(gradcam_reference(a[i], g[i]).sum(0)) for i in range(2)])
        close(explain.ShapleyCAM(model, layer, rest=False)(x, targets=[2, 3]).raw, expected)


@pytest.mark.parametrize("make, rest", [(tiny_cnn, True), (smooth_head_cnn, False), (smooth_head_cnn, True)])
def test_shapleycam_matches_hessian_reference(make, rest):
    model = make()
    x = images(2)
    expected = shapley_reference(model, x, [1, 4], rest)
    res = explain.ShapleyCAM(model, LAYER, rest=rest)(x, targets=[1, 4])
    close(res.raw, expected)
    # the second-order term matters: the map is not Grad-CAM's of the same score
    gradcam_only = shapley_reference_without_hessian(model, x, [1, 4], rest)
    assert (expected - gradcam_only).abs().max() > 1e-3 * expected.abs().max()


def shapley_reference_without_hessian(model, x, targets, rest):
    def score(logits):
        rows, ids = torch.arange(len(targets)), torch.tensor(targets)
        s = logits[rows, ids]
        return s + logits.log_softmax(1)[rows, ids] if rest else s

    a, g, _ = layer_gradient(model, LAYER, x, score)
    return torch.stack([torch.relu(gradcam_reference(a[i], g[i]).sum(0)) for i in range(len(targets))])


def finer_score(targets, alpha, ranks=(1, 2, 3)):
    """sum_d p_d (y_c - alpha y_d) / sum_d p_d over the classes d at ranks 1..3 of |y - y_c|
    (c itself is rank 0), p = softmax(y), all differentiated."""

    def score(logits):
        values = []
        for i, c in enumerate(targets):
            row = logits[i]
            y = row.detach().tolist()
            order = sorted(range(len(y)), key=lambda j: -1.0 if j == c else abs(y[j] - y[c]))  # stable
            p = row.softmax(0)
            similar = [order[r] for r in ranks]
            numerator = sum(p[d] * (row[c] - alpha * row[d]) for d in similar)
            values.append(numerator / sum(p[d] for d in similar))
        return torch.stack(values)

    return score


@pytest.mark.parametrize("alpha", [1.0, 0.6])
def test_finercam_matches_reference(alpha):
    model = tiny_cnn(seed=20, classes=7)
    x = images(3)
    targets = [0, 6, 3]
    a, g, _ = layer_gradient(model, LAYER, x, finer_score(targets, alpha))
    expected = torch.stack([torch.relu(gradcam_reference(a[i], g[i]).sum(0)) for i in range(3)])
    res = explain.FinerCAM(model, LAYER, alpha=alpha)(x, targets=targets)
    close(res.raw, expected)
    # other comparison ranks and a LayerCAM base: ReLU(G) * A summed over channels
    a, g, _ = layer_gradient(model, LAYER, x, finer_score(targets, alpha, ranks=(2, 5)))
    expected = torch.relu((torch.relu(g) * a).sum(1))
    res = explain.FinerCAM(model, LAYER, alpha=alpha, comparison=(2, 5), base="layercam")(x, targets=targets)
    close(res.raw, expected)


# ---------------------------------------------------------------------------------------
# FullGrad
# ---------------------------------------------------------------------------------------


def bn_cnn():
    torch.manual_seed(21)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
        nn.Conv2d(4, 5, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(5), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(5, 3),
    )
    with torch.no_grad():
        for bn in (model[1], model[4]):
            bn.running_mean.normal_()
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.normal_()
            bn.bias.normal_()
    return model.eval()


def fullgrad_reference(model, x, targets):
    """The authors' FullGrad: psi(grad_x * x) + sum over biased layers of psi(grad_out * b),
    psi = abs, min-max over (C, H, W) per image (eps 1e-6), bilinear (align_corners=True)
    resize to the input size, channel sum; BN's bias is beta - gamma mu / sqrt(var + eps)."""
    biased = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Conv2d) and module.bias is not None:
            biased[name] = module.bias.detach()
        elif isinstance(module, nn.BatchNorm2d):
            biased[name] = module.bias.detach() - module.weight.detach() * module.running_mean / torch.sqrt(
                module.running_var + module.eps)
    names = list(biased)
    outputs, handles = {}, []
    for name in names:
        handles.append(model.get_submodule(name).register_forward_hook(
            lambda m, a, o, name=name: outputs.__setitem__(name, o)))
    try:
        with torch.enable_grad():
            leaf = x.clone().requires_grad_()
            logits = model(leaf)
            score = logits[torch.arange(len(targets)), torch.tensor(targets)].sum()
            grads = torch.autograd.grad(score, [leaf, *(outputs[name] for name in names)])
    finally:
        for handle in handles:
            handle.remove()

    def psi(values):
        values = values.abs()
        flat = values.flatten(1)
        low = flat.min(1).values[:, None, None, None]
        values = values - low
        high = values.flatten(1).max(1).values[:, None, None, None]
        values = values / (high + 1e-6)
        return F.interpolate(values, size=x.shape[-2:], mode="bilinear", align_corners=True)

    total = psi(grads[0] * x).sum(1)
    for gradient, name in zip(grads[1:], names):
        bias = biased[name]
        total = total + psi(gradient * bias[None, :, None, None]).sum(1)
    return total


def test_fullgrad_matches_authors_reference():
    model = bn_cnn()
    x = images(2)
    res = explain.FullGrad(model)(x, targets=[2, 0])
    assert res.layers == ("input+biases",)
    close(res.raw, fullgrad_reference(model, x, [2, 0]))
    top = explain.FullGrad(model)(x, topk=2)
    for j in range(2):
        close(top.raw[:, j], fullgrad_reference(model, x, top.targets[:, j].tolist()))


# ---------------------------------------------------------------------------------------
# eigen_smooth and aug_smooth
# ---------------------------------------------------------------------------------------


def eigen_reference(terms, relu=True):
    maps = torch.stack([signed_first_component(t) for t in terms])
    return torch.relu(maps) if relu else maps


def test_eigen_smooth_is_the_principal_component_of_the_terms():
    model = tiny_cnn(seed=22)
    x = images(2)
    targets = [1, 2]
    a, g, _ = layer_gradient(model, LAYER, x, logit_of(targets))
    close(explain.GradCAM(model, LAYER, eigen_smooth=True)(x, targets=targets).raw,
          eigen_reference(torch.stack([gradcam_reference(a[i], g[i]) for i in range(2)])))
    weight = model[6].weight.detach()
    close(explain.CAM(model, LAYER, eigen_smooth=True)(x, targets=targets).raw,  # no final ReLU
          eigen_reference(torch.stack([weight[c][:, None, None] * a[i] for i, c in enumerate(targets)]), relu=False))
    weights, activation = ablation_weights_reference(model, LAYER, x, targets)
    close(explain.AblationCAM(model, LAYER, eigen_smooth=True)(x, targets=targets).raw,
          eigen_reference(weights[:, :, None, None] * activation.double()))


def test_eigen_smooth_for_scorecam():
    # w_k = softmax(f(x * H^k))_c by the reference loop, then the component of w_k A^k.
    model = tiny_cnn(seed=23)
    x = images(1)
    activation, _ = layer_output(model, LAYER, x)
    weights = []
    for k in range(activation.shape[1]):
        mask = score_mask(activation[0, k], (16, 16))
        with torch.no_grad():
            weights.append(0.0 if mask is None else float(model(x * mask).softmax(1)[0, 3]))
    terms = torch.tensor(weights, dtype=torch.float64)[None, :, None, None] * activation.double()
    close(explain.ScoreCAM(model, LAYER, eigen_smooth=True)(x, targets=3).raw, eigen_reference(terms))


def test_eigen_smooth_is_refused_where_the_map_is_no_channel_sum():
    model = tiny_cnn()
    for method in ("eigencam", "eigengradcam"):
        with pytest.raises(ValueError, match="eigen_smooth"):
            explain.explainer(method, model, target_layer=LAYER, eigen_smooth=True)
    for method in ("kpcacam", "fullgrad"):  # no such option at all
        with pytest.raises((TypeError, ValueError)):
            explain.explainer(method, model, eigen_smooth=True)


def scaled(maps):
    """Each map min-max scaled to [0, 1]; a constant map carries no evidence and becomes 0."""
    flat = maps.flatten(-2)
    low, high = flat.amin(-1, keepdim=True), flat.amax(-1, keepdim=True)
    span = high - low
    return torch.where(span > 0, (flat - low) / torch.where(span > 0, span, 1.0), 0.0).reshape(maps.shape)


@pytest.mark.parametrize("method, kwargs", [
    ("gradcam", {}), ("scorecam", {}), ("ablationcam", {}), ("eigencam", {}), ("fem", {}),
    ("smoothgradcam++", {"n_samples": 2}),
])
@pytest.mark.parametrize("topk", [None, 2])
def test_aug_smooth_is_the_mean_of_the_augmented_maps(method, kwargs, topk):
    model = tiny_cnn(seed=24)
    x = images(2)
    plain_cam = explain.explainer(method, model, target_layer=LAYER, **kwargs)
    plain = plain_cam(x, topk=topk)
    total = torch.zeros_like(plain.maps)
    for flip in (False, True):
        for scale in (0.9, 1.0, 1.1):
            augmented = x.flip(-1) if flip else x
            if scale != 1.0:
                augmented = F.interpolate(augmented, scale_factor=scale, mode="bilinear", align_corners=False)
            maps = plain_cam(augmented, plain.targets).maps
            maps = maps if maps.dim() == 4 else maps[:, None]
            maps = F.interpolate(maps, size=(16, 16), mode="bilinear", align_corners=False)
            maps = maps.flip(-1) if flip else maps
            total += maps.reshape(total.shape)
    res = explain.explainer(method, model, target_layer=LAYER, aug_smooth=True, **kwargs)(x, topk=topk)
    close(res.maps, scaled(total / 6), atol=1e-5, rtol=1e-5)
    assert torch.equal(res.targets, plain.targets)
    close(res.raw, plain.raw, atol=0, rtol=0)


# ---------------------------------------------------------------------------------------
# Cost: batch size, memory, exact shortcuts
# ---------------------------------------------------------------------------------------

PERTURBATION = [
    ("scorecam", {}),
    ("iscam", {"n_samples": 3}),
    ("sscam", {"n_samples": 3, "noise": 0.5}),
    ("ablationcam", {}),
]


@pytest.mark.parametrize("method, kwargs", PERTURBATION, ids=[m for m, _ in PERTURBATION])
def test_maps_do_not_depend_on_batch_size(method, kwargs):
    model = tiny_cnn(seed=25, channels=12)
    x = images(2)
    raws = [explain.explainer(method, model, target_layer=LAYER, batch_size=b, **kwargs)(x, topk=2).raw
            for b in (1, 7, 64)]
    assert raws[0].amax() > 0
    for raw in raws[1:]:
        close(raw, raws[0], atol=1e-5, rtol=1e-5)


def record_batch_sizes(model):
    """Largest batch dimension each module's input had, through forward pre-hooks."""
    largest = {}

    def hook(module, args):
        largest[module] = max(largest.get(module, 0), args[0].shape[0])

    handles = [m.register_forward_pre_hook(hook) for m in model.children()]
    return largest, handles


@pytest.mark.parametrize("method, kwargs", PERTURBATION, ids=[m for m, _ in PERTURBATION])
def test_batch_size_bounds_the_perturbed_batches(method, kwargs):
    # A deterministic proxy for peak memory: no module ever sees more than batch_size rows
    # (beyond the images themselves, 2 here).
    model = tiny_cnn(seed=26, channels=12)
    largest, handles = record_batch_sizes(model)
    try:
        explain.explainer(method, model, target_layer=LAYER, batch_size=4, **kwargs)(images(2))
    finally:
        for handle in handles:
            handle.remove()
    assert max(largest.values()) == 4  # batched, and never beyond batch_size
    assert largest[model[6]] == 4


def model_with_dead_channels():
    """tiny_cnn with 12 channels at the target layer: 8 of them (0, 3, 4, 7, 8, 9, 10, 11) are
    all zero (zero filters; 8 has a negative bias, cut by the ReLU), channel 5 duplicates 1."""
    model = tiny_cnn(seed=27, channels=12)
    with torch.no_grad():
        conv = model[2]
        for k in (0, 3, 4, 7, 8, 9, 10, 11):
            conv.weight[k] = 0
            conv.bias[k] = -1.0 if k == 8 else 0.0
        conv.weight[5] = conv.weight[1]
        conv.bias[5] = conv.bias[1]
    return model


CHANNELS, DEAD, DUPLICATES = 12, 8, 1


def test_scorecam_runs_no_masked_pass_for_constant_channels():
    model = model_with_dead_channels()
    x = images(2)
    rows = []
    handle = model[0].register_forward_pre_hook(lambda m, args: rows.append(args[0].shape[0]))
    try:
        res = explain.ScoreCAM(model, LAYER, batch_size=64)(x, targets=[0, 1])
    finally:
        handle.remove()
    activation, _ = layer_output(model, LAYER, x)
    assert (activation.flatten(2).amax(2) == 0).sum(1).tolist() == [DEAD, DEAD]
    # one pass of the 2 images, then one masked image per distinct non-constant channel
    assert sum(rows) == 2 + 2 * (CHANNELS - DEAD - DUPLICATES)
    close(res.raw, score_cam_reference(model, LAYER, x, [0, 1]))


@pytest.mark.parametrize("fallback", [False, True], ids=["split", "fallback"])
def test_ablationcam_does_not_ablate_all_zero_channels(fallback):
    if fallback:
        class Wrapped(nn.Module):  # untraceable parent: whole forward passes
            def __init__(self):
                super().__init__()
                self.net = model_with_dead_channels()

            def forward(self, x):
                return self.net(x) if x.sum() > -1e9 else -self.net(x)

        model, layer = Wrapped().eval(), "net.3"
        after = model.net[4]
    else:
        model, layer = model_with_dead_channels(), LAYER
        after = model[4]
    x = images(2)
    zero_counts = []

    def hook(module, args):
        zero_counts.extend((args[0].flatten(2).abs().amax(2) == 0).sum(1).tolist())

    handle = after.register_forward_pre_hook(hook)
    try:
        cam = explain.AblationCAM(model, layer, batch_size=16)  # no passes to measure the fastest batch
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = cam(x, targets=[2, 4])
    finally:
        handle.remove()
    assert [str(w.message).startswith("the model could not be split") for w in caught] == [True] * fallback
    assert cam.replay(layer).split == (not fallback)
    # Rows with one more zero channel than the images have are the ablations: one per image
    # and non-zero channel. The other rows are unperturbed; were the 8 zero channels ablated
    # too, there would be at least 2 * 8 of them.
    assert zero_counts.count(DEAD + 1) == 2 * (CHANNELS - DEAD)
    assert zero_counts.count(DEAD) < 2 * DEAD
    assert set(zero_counts) == {DEAD, DEAD + 1}
    close(res.raw, ablation_cam_reference(model, layer, x, [2, 4]))


# ---------------------------------------------------------------------------------------
# Hook hygiene, in-place ops after the layer, targets, explain_together
# ---------------------------------------------------------------------------------------


class Block(nn.Module):
    """A ResNet basic block: bn1 is followed by ReLU(inplace=True), bn2 by `out += x`."""

    def __init__(self, channels, inplace=True):
        super().__init__()
        self.inplace = inplace
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=inplace)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.inplace:
            out += x
        else:
            out = out + x
        return self.relu(out)


class ResNetish(nn.Module):
    def __init__(self, inplace=True):
        super().__init__()
        torch.manual_seed(28)
        self.stem = nn.Conv2d(3, 6, 3, stride=2, padding=1)
        self.bn = nn.BatchNorm2d(6)
        self.block = Block(6, inplace)
        self.fc = nn.Linear(6, 5)
        with torch.no_grad():
            for bn in (self.bn, self.block.bn1, self.block.bn2):
                bn.running_mean.uniform_(-0.5, 0.5)
                bn.running_var.uniform_(0.5, 2.0)
                bn.weight.uniform_(0.5, 1.5)
                bn.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return self.fc(self.block(torch.relu(self.bn(self.stem(x)))).mean(dim=(2, 3)))

    def set_inplace(self, inplace):
        self.block.inplace = inplace
        self.block.relu.inplace = inplace
        return self


NEW_METHODS = {
    "cam": {}, "eigencam": {}, "kpcacam": {}, "fem": {}, "randomcam": {"seed": 3},
    "scorecam": {}, "sscam": {"n_samples": 2}, "iscam": {"n_samples": 2}, "ablationcam": {},
    "smoothgradcam++": {"n_samples": 2}, "shapleycam": {}, "finercam": {}, "fullgrad": {},
}


def make_cam(method, model, layer="block.bn2"):
    if method == "fullgrad":
        layer = None
    elif method == "cam":
        layer = "block"  # CAM needs the pooled layer
    return explain.explainer(method, model, target_layer=layer, **NEW_METHODS[method])


def grad_mode(name):
    return {"grad": torch.enable_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}[name]()


@pytest.mark.parametrize("mode", ["grad", "no_grad", "inference_mode"])
@pytest.mark.parametrize("method", list(NEW_METHODS))
def test_model_is_left_as_found_after_success_and_after_an_error(method, mode):
    model = ResNetish().train()  # train mode: the call must use eval and restore train
    model.block.conv1.weight.requires_grad_(False)
    model.fc.weight.grad = torch.ones_like(model.fc.weight)
    state = ModelState(model)
    x = images(2)
    with grad_mode(mode):
        res = make_cam(method, model)(x, targets=[0, 2])
    assert torch.isfinite(res.maps).all() and res.maps.shape == (2, 16, 16)
    state.assert_unchanged()

    calls = []

    def counting(logits):
        calls.append(1)
        return logits[:, 1]

    def raising(at):
        def target(logits):
            calls.append(1)
            if len(calls) == at:
                raise RuntimeError("boom")
            return logits[:, 1]

        return target

    if method in ("cam", "finercam"):  # class logits only: refused mid-call
        with grad_mode(mode), pytest.raises(ValueError, match="callable"):
            make_cam(method, model)(x, targets=counting)
        state.assert_unchanged()
        return
    with grad_mode(mode):
        make_cam(method, model)(x, targets=counting)
    total = len(calls)
    state.assert_unchanged()
    for at in sorted({1, total // 2 + 1, total}):  # first call, middle, last (e.g. a perturbed pass)
        calls.clear()
        with grad_mode(mode), pytest.raises(RuntimeError, match="boom"):
            make_cam(method, model)(x, targets=raising(at))
        state.assert_unchanged()


@pytest.mark.parametrize("layer", ["block.bn1", "block.bn2"], ids=["then-inplace-relu", "then-inplace-add"])
@pytest.mark.parametrize("method", list(NEW_METHODS))
def test_inplace_ops_after_the_layer_change_no_map(method, layer):
    inplace = ResNetish().eval()
    plain = copy.deepcopy(inplace).set_inplace(False)
    x = images(2)
    expected = make_cam(method, plain, layer)(x, targets=[0, 3])
    got = make_cam(method, inplace, layer)(x, targets=[0, 3])
    close(got.raw, expected.raw, atol=1e-5, rtol=1e-5)
    close(got.maps, expected.maps, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("method", list(NEW_METHODS))
def test_topk_equals_each_class_explained_alone(method):
    model = tiny_cnn(seed=29)
    names = [f"class{i}" for i in range(5)]
    layer = None if method == "fullgrad" else LAYER
    cam = explain.explainer(method, model, target_layer=layer, class_names=names, **NEW_METHODS[method])
    x = images(2)
    top = cam(x, topk=2)
    assert top.maps.shape == (2, 2, 16, 16) and top.raw.shape[:2] == (2, 2)
    assert top.targets.tolist() == model(x).topk(2).indices.tolist()
    if method == "randomcam":  # random weights are drawn per target: only the shapes compare
        return
    for j in range(2):
        ids = top.targets[:, j].tolist()
        alone = cam(x, targets=ids)
        close(top.raw[:, j], alone.raw, atol=1e-5, rtol=1e-5)
        close(top.maps[:, j], alone.maps, atol=1e-5, rtol=1e-5)
        by_name = cam(x, targets=[names[i] for i in ids])
        close(by_name.raw, alone.raw, atol=0, rtol=0)
        assert by_name.target_names == [names[i] for i in ids]


@pytest.mark.parametrize("inplace", [False, True], ids=["relu", "inplace-relu-after-layer"])
def test_explain_together_shares_one_unperturbed_pass(inplace):
    model = tiny_cnn(seed=30, inplace=inplace)
    x = images(2)
    layer = "2" if inplace else LAYER  # with inplace: the conv, followed by ReLU(inplace=True)
    methods = ["gradcam", "scorecam", "ablationcam", "eigencam"] + ([] if inplace else ["cam"])
    unperturbed = []

    # Perturbation passes run the model too, on masked images (Score-CAM) or, split at the
    # layer, not through the model's forward at all (Ablation-CAM): count the model's
    # forward calls on exactly the given images.
    def hook(module, args):
        if args[0].shape == x.shape and torch.equal(args[0], x):
            unperturbed.append(1)

    alone = [explain.explainer(m, model, target_layer=layer)(x, targets=[1, 2]) for m in methods]
    handle = model.register_forward_pre_hook(hook)
    try:
        together = explain.explain_together([explain.explainer(m, model, target_layer=layer) for m in methods],
                                            x, targets=[1, 2])
    finally:
        handle.remove()
    assert len(unperturbed) == 1
    for a, t in zip(alone, together):
        assert a.method == t.method
        close(t.raw, a.raw, atol=1e-6, rtol=1e-6)
    # and each equals its reference
    a, g, _ = layer_gradient(model, layer, x, logit_of([1, 2]))
    close(together[0].raw, torch.relu(torch.stack([gradcam_reference(a[i], g[i]).sum(0) for i in range(2)])))
    close(together[1].raw, score_cam_reference(model, layer, x, [1, 2]))
    close(together[2].raw, ablation_cam_reference(model, layer, x, [1, 2]))


@pytest.mark.parametrize("name, layer", [("resnet18", "layer4"), ("efficientnet_b0", "bn2"),
                                         ("mobilenetv3_small_050", None)])
def test_cam_finds_the_linear_head_of_timm_cnns(name, layer):
    # timm's ResNet and EfficientNet end in global pooling and one linear layer; its
    # MobileNetV3 puts a 1x1 convolution and an activation between them, where CAM does not apply.
    import timm

    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=7).eval()
    x = images(2, size=64)
    cam = explain.CAM(model)
    if layer is None:
        with pytest.raises(ValueError, match="CAM needs a linear layer from the 288 channels of layer 'blocks'"):
            cam(x, targets=[1, 5])
        return
    res = cam(x, targets=[1, 5])
    assert res.layers == (layer,)
    activation, _ = layer_output(model, layer, x)
    weight = model.get_classifier().weight.detach()
    expected = torch.stack([torch.einsum("k,khw->hw", weight[c], activation[i]) for i, c in enumerate([1, 5])])
    close(res.raw, expected)
