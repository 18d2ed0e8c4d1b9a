"""The metrics of issue 44 against values worked out by hand on tiny models, and against the
anchors that Quantus's parity tests (tests/test_metrics_quantus.py) do not cover:

- MST-C is in Quantus's HEAD only (added 2026-08, after 0.6.0): hand-worked values, and
  values that HEAD's ``MSTC`` gave on fixed maps (reproduced by the ``__main__`` block
  below with HEAD's package on the path);
- ARCC and its parts, and the confidence changes of pytorch-grad-cam 1.5.7
  (``pytorch_grad_cam.metrics``): pytorch-grad-cam is not a dependency, so its values on a
  fixed tiny model are recorded here as constants, made by this file's ``__main__`` block
  (``PYTHONPATH=<grad-cam 1.5.7 installed --no-deps> python tests/test_metrics_more.py``);
- xplique 1.5's Average Drop, Increase and Gain (TensorFlow): its formulas, read from its
  source (``xplique/metrics/fidelity.py``), recomputed in numpy on the same model.

Everything runs on models of a few hundred weights and 4 x 4 to 16 x 16 images.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
import torch
from torch import nn

import explain
from conftest import ModelState, hook_count
from explain import Explanation, metrics
from explain.hooks import preserved_state

X = torch.arange(1.0, 17.0).view(1, 1, 4, 4)


def linear(weights, bias=None) -> nn.Module:
    """A model whose class-c logit is sum(weights[c] * image) (+ bias[c])."""
    weights = torch.as_tensor(weights, dtype=torch.float32)
    model = nn.Sequential(nn.Flatten(), nn.Linear(weights[0].numel(), weights.shape[0], bias=bias is not None))
    with torch.no_grad():
        model[1].weight.copy_(weights.reshape(weights.shape[0], -1))
        if bias is not None:
            model[1].bias.copy_(torch.as_tensor(bias, dtype=torch.float32))
    return model.eval()


class MapExplainer(explain.Explainer):
    """An explainer whose maps are ``fn(images, targets)``; it records the images it explains."""

    def __init__(self, model, fn):
        super().__init__(model)
        self.fn, self.calls = fn, []

    def __call__(self, images, targets=None, *, topk=None):
        with preserved_state(self.model), torch.no_grad():
            logits = self.model(images)
        targets = logits.argmax(1) if targets is None else torch.as_tensor(targets).expand(len(images))
        self.calls.append(images.clone())
        return Explanation(maps=self.fn(images, targets), raw_layers={}, logits=logits, targets=targets, method="test")


def close(actual, expected, tol=1e-5):
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float64).flatten(),
                               torch.as_tensor(expected, dtype=torch.float64).flatten(), rtol=tol, atol=tol,
                               equal_nan=True)


# --- axiomatic ----------------------------------------------------------------------------


def test_completeness_of_linear_attributions():
    """f = w . x (no bias): gradient x input and integrated gradients from 0 are exactly
    complete, sum_i w_i x_i = f(x) - f(0); the raw attributions, not the scaled maps, are
    summed. A map twice too large is 100 % off."""
    w = torch.randn(3, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    model = linear(w)
    x = torch.rand(2, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    for method in (explain.InputXGradient(model, reduction="sum"), explain.IntegratedGradients(model)):
        result = method(x, topk=2)
        score = metrics.completeness(model, x, result)
        assert score.values.shape == (2, 2) and (score.values < 1e-4).all() and score.extra["complete"].all()
        expected = (w[result.targets] * x[:, None]).flatten(2).sum(2)
        close(score.extra["difference"], expected, 1e-4)
    targets = torch.tensor([0, 2])
    twice = 2 * (w[targets] * x).sum(1)
    score = metrics.completeness(model, x, twice, targets)
    close(score.values, [1.0, 1.0], 1e-5)
    assert not score.extra["complete"].any()
    # The probability instead of the logit, and a baseline of ones: f(x) - f(1).
    score = metrics.completeness(model, x, twice, targets, score="probability", baseline=1.0)
    with torch.no_grad():
        p = model(x).softmax(1)[[0, 1], targets] - model(torch.ones_like(x)).softmax(1)[[0, 1], targets]
    close(score.extra["difference"], p)


def test_completeness_of_a_constant_model_is_nan():
    model = linear(torch.zeros(2, 1, 4, 4), bias=[1.0, 0.0])
    score = metrics.completeness(model, X, torch.zeros(1, 4, 4), torch.tensor([0]))
    assert math.isnan(score.values.item()) and score.extra["complete"].item() == 1.0


def region_logits(pixels) -> nn.Module:
    """Class 0's logit is the sum of the listed pixels; class 1's is 0."""
    weights = torch.zeros(2, 1, 4, 4)
    weights[0].view(-1)[list(pixels)] = 1.0
    return linear(weights)


def test_non_sensitivity_by_hand():
    """The model reads pixels 0 and 5; the map gives relevance to pixels 0 and 3. Pixel by
    pixel: pixel 5 is sensitive with zero relevance, pixel 3 relevant but insensitive: 2.
    Two pixels at a time, runs of the zero pixels (1 2 | 4 5 | 6 7 | ...) and of the
    relevant ones (0 3): the run 4 5 moves the score, so pixels 4 and 5 count as sensitive
    (2 misses); the run 0 3 moves it too, so pixel 3 counts as sensitive (no miss)."""
    model = region_logits([0, 5])
    maps = torch.zeros(1, 4, 4)
    maps.view(-1)[[0, 3]] = torch.tensor([1.0, 0.3])
    one = metrics.non_sensitivity(model, X, maps, torch.tensor([0]), step=1, score="logit")
    assert (one.values.item(), one.extra["zero_but_sensitive"].item(),
            one.extra["relevant_but_insensitive"].item()) == (2.0, 1.0, 1.0)
    two = metrics.non_sensitivity(model, X, maps, torch.tensor([0]), step=2, score="logit")
    assert (two.extra["zero_but_sensitive"].item(), two.extra["relevant_but_insensitive"].item()) == (2.0, 0.0)
    # Relevance below eps times the largest counts as zero: 1e-6 on pixel 5 is still "zero".
    maps.view(-1)[5] = 1e-6
    assert metrics.non_sensitivity(model, X, maps, torch.tensor([0]), step=1, score="logit").values.item() == 2.0
    # The default step is a row's worth: 4 pixels here; the count of forwards follows.
    calls = []
    handle = model.register_forward_hook(lambda m, i, o: calls.append(len(o)))
    try:
        metrics.non_sensitivity(model, X, maps, torch.tensor([0]), batch_size=64)
    finally:
        handle.remove()
    assert sum(calls) == 1 + math.ceil(13 / 4) + math.ceil(3 / 4)  # the intact image, 4 + 1 runs


def test_input_invariance_by_hand_and_the_model_put_back():
    """Kindermans et al.'s finding on a network whose first layer has a bias and one
    without (the bias is added for the test and taken away after), and a zero-padded
    convolution (its border is made exact too): gradients are invariant to the shift,
    gradient x input and integrated gradients from 0 are not. The model is as it was."""
    torch.manual_seed(0)
    for first in (nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.Conv2d(3, 4, 3)):
        model = nn.Sequential(first, nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(16, 3)).eval()
        x = torch.rand(3, 3, 8, 8)
        state = ModelState(model)
        for method, invariant in ((explain.Saliency(model), True), (explain.InputXGradient(model), False),
                                  (explain.IntegratedGradients(model), False)):
            score = metrics.input_invariance(method, x, method(x), batch_size=2)
            assert score.values.tolist() == [float(invariant)] * 3, type(method).__name__
            assert (score.extra["output_change"] < 1e-5).all()
            assert ((score.extra["difference"] > 1e-3) != invariant).all()
        state.assert_unchanged()
        assert model[0].bias is None or model[0].bias.shape == (4,)


def test_input_invariance_puts_the_model_back_after_an_error():
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 2, bias=False)).eval()
    state = ModelState(model)

    def fails(images, targets):
        raise RuntimeError("explainer failed")

    explainer = MapExplainer(model, lambda images, targets: images[:, 0])
    explanation = explainer(X)
    explainer.fn = fails
    with pytest.raises(RuntimeError, match="explainer failed"):
        metrics.input_invariance(explainer, X, explanation)
    state.assert_unchanged()
    assert model[1].bias is None and hook_count(model) == 0
    with pytest.raises(ValueError, match="shift must be a non-zero number"):
        metrics.input_invariance(explainer, X, explanation, shift=0)


# --- complexity -------------------------------------------------------------------------


def test_effective_complexity_by_hand():
    maps = torch.tensor([[[1.0, 0.5], [1e-6, 0.0]], [[0.0, 0.0], [0.0, 0.0]]])
    score = metrics.effective_complexity(maps)
    assert score.values.tolist() == [2.0, 0.0] and score.extra["share"].tolist() == [0.5, 0.0]
    assert metrics.effective_complexity(maps, eps=1e-7).values.tolist() == [3.0, 0.0]


def test_mst_c_by_hand():
    """Four salient pixels, a 2 x 2 square: hull area 1 (q_s = 1), spanning tree 3 (q_c = 4 / 3);
    two salient pixels on a line: no area, so sqrt(A) is the diagonal, sqrt(8^2 + 8^2);
    spanning tree 3 (the pixels 3 apart): q_c = 2 / 3. Scaled: times the diagonal and 100,
    so the two-pixel map scores 2 / 3 * 100. A flat map selects every pixel."""
    maps = torch.zeros(3, 8, 8)
    maps[0, 2:4, 2:4] = 1.0
    maps[1, 1, 1], maps[1, 1, 4] = 1.0, 0.5
    maps[2] = 1.0
    plain = metrics.mst_c(maps[:2], threshold=98, scale=False)  # above 62 of the 64 values
    diagonal = math.hypot(8, 8)
    close(plain.values, [4 / 3, (1 / diagonal) * (2 / 3)])
    close(plain.extra["spread"], [1.0, 1 / diagonal])
    close(plain.extra["points"], [4, 2])
    close(metrics.mst_c(maps[1:2], threshold=98).values, [2 / 3 * 100], 1e-4)
    # Every pixel of the 8 x 8 grid: hull 7 x 7, tree of 63 unit edges.
    close(metrics.mst_c(maps[2:3], scale=False).values, [(1 / 7) * (64 / 63)])
    # All zero: 0; one salient pixel: NaN.
    single = torch.zeros(2, 4, 4)
    single[1, 0, 0] = 1.0
    values = metrics.mst_c(single, threshold=95).values
    assert values[0] == 0 and math.isnan(values[1])
    with pytest.raises(ValueError, match=r"threshold must be a percentile in \[0, 100\)"):
        metrics.mst_c(maps, threshold=100)


#: Quantus HEAD's MSTC (commit 85bc29d, 2026-08-20) on the maps of ``mst_c_maps()``, with its
#: defaults (threshold 80, k 20, scaled) and with threshold=50, k=3: made by this file's
#: ``__main__`` block with HEAD's package (``git archive HEAD quantus``) first on the path.
MST_C_HEAD = {
    "default": [94.1351469539056, 96.48966961786361, 92.67319413425788, 275.883691185767, 314.4584069352715],
    "threshold 50, k 3": [138.56710648543492, 137.7527427929538, 137.08979469732938, 179.01216511708756, 178.63243908428026],
}


def mst_c_maps() -> torch.Tensor:
    """Three uniform random maps and two smooth ones (bilinear from 3 x 3), 24 x 24."""
    generator = torch.Generator().manual_seed(0)
    noisy = torch.rand(3, 24, 24, generator=generator)
    smooth = nn.functional.interpolate(torch.rand(2, 1, 3, 3, generator=generator), size=(24, 24),
                                       mode="bilinear")[:, 0]
    return torch.cat([noisy, smooth])


def test_mst_c_equals_quantus_head():
    maps = mst_c_maps()
    close(metrics.mst_c(maps).values, MST_C_HEAD["default"], 1e-5)
    close(metrics.mst_c(maps, threshold=50.0, k=3).values, MST_C_HEAD["threshold 50, k 3"], 1e-5)


# --- across images: sufficiency and consistency --------------------------------------------


class ClassFromPixel(nn.Module):
    """A 3-class model whose top class is the image's first pixel (0, 1 or 2)."""

    def forward(self, x):
        return -(torch.arange(3.0) - x[:, :1, 0, 0]).abs()


def test_sufficiency_and_consistency_by_hand():
    """Images 0 and 1 are class 0, image 2 class 1, image 3 class 2. Maps 0, 1 and 2 are
    the same, map 3 far from them: image 0's neighbours are 1 (same class) and 2 (not):
    0.5; image 2's are 0 and 1, neither of its class: 0; image 3 has none: NaN. Consistency
    with labels from the peak cell: maps 0 to 2 peak in the top-left cell, map 3 in the
    bottom-right, the same answer."""
    model = ClassFromPixel()
    images = torch.zeros(4, 1, 4, 4)
    images[2, 0, 0, 0], images[3, 0, 0, 0] = 1.0, 2.0
    maps = torch.zeros(4, 4, 4)
    maps[:3, 0, 0] = 1.0
    maps[:3, 0, 1] = 0.5
    maps[3, 3, 3] = 1.0
    maps += torch.linspace(0, 1e-3, 16).view(4, 4)  # every pixel varies a little
    targets = torch.tensor([0, 0, 1, 2])
    for metric in (metrics.sufficiency, lambda *a: metrics.consistency(*a, grid=2)):
        score = metric(model, images, maps, targets)
        close(score.values, [0.5, 0.5, 0.0, float("nan")])
        close(score.extra["neighbours"], [2, 2, 2, 0])
    # Consistency with a discretisation of one's own: all in one label.
    score = metrics.consistency(model, images, maps, targets, discretise=lambda maps: torch.zeros(len(maps)))
    close(score.values, [1 / 3, 1 / 3, 0.0, 0.0])
    with pytest.raises(ValueError, match="one label per map"):
        metrics.consistency(model, images, maps, targets, discretise=lambda maps: torch.zeros(2))


def test_across_images_the_other_targets_of_an_image_are_not_neighbours():
    """A topk explanation: two targets per image, the same map for both; they are not each
    other's neighbours (they would always share the image's class)."""
    model = ClassFromPixel()
    images = torch.zeros(2, 1, 4, 4)
    images[1, 0, 0, 0] = 1.0
    maps = torch.rand(2, 1, 4, 4, generator=torch.Generator().manual_seed(0)).expand(2, 2, 4, 4).clone()
    targets = torch.tensor([[0, 1], [1, 0]])
    score = metrics.consistency(model, images, maps.clone(), targets, discretise=lambda maps: torch.zeros(len(maps)))
    assert score.values.shape == (2, 2)
    close(score.values, [[0.0, 0.0], [0.0, 0.0]])
    close(score.extra["neighbours"], [[2, 2], [2, 2]])


# --- localisation -------------------------------------------------------------------------


def test_focus_by_hand():
    """Six images, two per class (classes from the first pixel). An explainer whose map
    marks the bright pixels, on images bright for class 0 and dark otherwise, puts
    everything on the class's two quadrants for class 0 (1.0), and for the other classes
    nothing on theirs (0.0); a flat map gives half; a class with one image has no mosaic
    (NaN)."""
    model = ClassFromPixel()
    images = torch.zeros(6, 1, 8, 8)
    images[:2] += 5.0
    images[:, 0, 0, 0] = torch.tensor([0.0, 0.0, 1.0, 1.0, 2.0, 2.0])
    bright = MapExplainer(model, lambda x, t: (x[:, 0] > 3).float() * (t == 0).view(-1, 1, 1))
    score = metrics.focus(bright, images, bright(images))
    close(score.values, [1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    flat = MapExplainer(model, lambda x, t: torch.ones(len(x), 8, 8))
    close(metrics.focus(flat, images, flat(images)).values, [0.5] * 6)
    # The mosaics hold the class's two images in two quadrants, shrunk to 4 x 4.
    made, shows, valid = metrics.mosaics(images, images[:, 0, 0, 0].long(), images[:, 0, 0, 0].long())
    assert valid.all() and shows.sum(1).tolist() == [2] * 6
    lonely = images[:5]
    assert torch.isnan(metrics.focus(flat, lonely, flat(lonely)).values[4])
    # The same seed, the same mosaics; another seed, others.
    again = metrics.focus(bright, images, bright(images), seed=1)
    close(again.values, score.values)
    with pytest.raises(ValueError, match="labels must give one class per image"):
        metrics.focus(flat, images, flat(images), labels=torch.tensor([0, 1]))


def test_auc_by_hand():
    maps = torch.tensor([[[3.0, 1.0], [2.0, 0.0]], [[1.0, 1.0], [1.0, 1.0]], [[0.0, 2.0], [1.0, 3.0]]])
    masks = torch.tensor([[[True, False], [False, False]]] * 3)
    # Map 0: the region's pixel outranks all 3 others; map 1: all tied (half); map 2: none.
    close(metrics.auc(maps, masks).values, [1.0, 0.5, 0.0])
    # Pixel 0 and 2 in the region of map 0: 3 and 2 against 1 and 0: 1.0; against map 2's
    # values 0 and 1 the others have 2 and 3: 0.0.
    both = torch.tensor([[[True, False], [True, False]]] * 3)
    close(metrics.auc(maps, both).values, [1.0, 0.5, 0.0])
    empty, full = torch.zeros(1, 2, 2, dtype=torch.bool), torch.ones(1, 2, 2, dtype=torch.bool)
    assert torch.isnan(metrics.auc(maps[:1], empty).values).all()
    assert torch.isnan(metrics.auc(maps[:1], full).values).all()


def test_attribution_localisation_by_hand():
    maps = torch.tensor([[[3.0, 1.0], [0.0, -4.0]]])
    box = torch.tensor([[[True, True], [False, False]]])
    score = metrics.attribution_localisation(maps, box)
    close(score.values, [1.0])  # all the positive relevance is in the box
    close(score.extra["share"], [0.5])
    close(metrics.attribution_localisation(maps, box, magnitude=True).values, [0.5])
    close(metrics.attribution_localisation(maps, box, magnitude=True, weighted=True).values, [1.0])
    close(metrics.relevance_mass(maps, box).values, score.values)


def test_topk_of_the_map_metrics_of_issue_44():
    maps = torch.rand(2, 3, 8, 8)
    boxes = torch.tensor([[0, 0, 4, 4], [2, 2, 8, 6]])
    for metric in (metrics.auc, metrics.attribution_localisation):
        together = metric(maps, boxes).values
        assert together.shape == (2, 3)
        for j in range(3):
            close(together[:, j], metric(maps[:, j], boxes).values)
    for metric in (metrics.effective_complexity, metrics.mst_c):
        together = metric(maps).values
        assert together.shape == (2, 3)
        for j in range(3):
            close(together[:, j], metric(maps[:, j]).values)


# --- pytorch-grad-cam: ARCC, coherency, the confidence changes -----------------------------


def arcc_setup():
    """A linear model of 16 x 16 colour images whose class 0 reads a 4 x 4 block alone (the
    other 4 classes: a bias), 4 images brighter there by different amounts, and an
    explainer whose map is the class's gradient x input (the block) plus a twentieth of
    the image's brightness, scaled to [0, 1]: tie-free maps that point at what the model
    reads, a fixed function of the input, so that the same maps reach both libraries."""
    weights = torch.zeros(5, 3, 16, 16)
    weights[0, :, 6:10, 6:10] = 0.08
    model = linear(weights, bias=[0.0, 2.0, 2.0, 2.0, 2.0])
    images = torch.rand(4, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    images[:, :, 6:10, 6:10] += torch.tensor([1.0, 0.6, 0.3, 1.2]).view(-1, 1, 1, 1)

    def relevance(x, targets):
        m = (weights[targets] * x).sum(1) + 0.05 * x.mean(1)
        low, high = m.flatten(1).amin(1).view(-1, 1, 1), m.flatten(1).amax(1).view(-1, 1, 1)
        return (m - low) / (high - low)

    explainer = MapExplainer(model, relevance)
    with torch.no_grad():
        targets = model(images).argmax(1)
    return model, images, explainer, targets


#: pytorch-grad-cam 1.5.7 on ``arcc_setup()``, with ``ClassifierOutputSoftmaxTarget`` and the
#: explainer's maps as the CAMs (its ``base_method`` the same explainer), ROAD's noise set to 0
#: (``NoisyLinearImputer``'s default patched): ``ARCC(road_percentiles=[20, 40, 60, 80])``,
#: its ``Complexity``, ``Coherency``, ``ROADCombined`` (times 2, clipped, as ARCC uses it), and
#: ``CamMultImageConfidenceChange``, ``DropInConfidence`` and ``IncreaseInConfidence``. Made by
#: this file's ``__main__`` block.
GRADCAM_REFERENCE = {
    "arcc": [0.885698676109314, 0.7643356323242188, 0.4752644896507263, 0.9180960059165955],
    "complexity": [0.08456559479236603, 0.10394704341888428, 0.10456574708223343, 0.08628755062818527],
    "coherency": [0.9952937364578247, 0.9935559630393982, 0.9875373840332031, 0.9973442554473877],
    "road": [0.7751635313034058, 0.5547893047332764, 0.23906981945037842, 0.8543118238449097],
    "change": [-0.14543288946151733, -0.16229182481765747, -0.150906041264534, -0.05660170316696167],
    "drop": [0.14543288946151733, 0.16229182481765747, 0.150906041264534, 0.05660170316696167],
    "increase": [0.0, 0.0, 0.0, 0.0],
}


def test_arcc_equals_pytorch_grad_cam():
    model, images, explainer, targets = arcc_setup()
    explanation = explainer(images, targets)
    score = metrics.arcc(explainer, images, explanation, noise=0.0)
    for name in ("complexity", "coherency", "road"):
        close(score.extra[name], GRADCAM_REFERENCE[name], 1e-4)
    close(score.values, GRADCAM_REFERENCE["arcc"], 1e-4)
    assert score.curves["morf"].shape == (4, 4) and score.steps.tolist() == [20, 40, 60, 80]
    # The parts by hand: the complexity is the map's mean, coherency (rho + 1) / 2.
    close(score.extra["complexity"], explanation.maps.flatten(1).mean(1))
    coherent = metrics.coherency(explainer, images, explanation)
    close(coherent.values, score.extra["coherency"])
    close(coherent.values, (coherent.extra["correlation"] + 1) / 2)
    harmonic = 3 / (1 / score.extra["coherency"] + 1 / (1 - score.extra["complexity"]) + 1 / score.extra["road"])
    close(score.values, harmonic, 1e-4)


def test_arcc_noise_is_seeded_and_batching_changes_nothing():
    model, images, explainer, targets = arcc_setup()
    explanation = explainer(images, targets)
    state = ModelState(model)
    a = metrics.arcc(explainer, images, explanation, batch_size=1, seed=3)
    b = metrics.arcc(explainer, images, explanation, batch_size=64, seed=3)
    close(a.values, b.values, 1e-5)
    c = metrics.arcc(explainer, images, explanation, seed=4)
    assert not torch.allclose(a.curves["morf"], c.curves["morf"])
    state.assert_unchanged()
    with pytest.raises(ValueError, match="percentages must lie strictly between 0 and 100"):
        metrics.arcc(explainer, images, explanation, percentages=(0, 50))


def test_average_drop_against_pytorch_grad_cam():
    """pytorch-grad-cam multiplies the input by the CAM, as explain; its confidence change
    is O - Y (explain's ``extra["change"]``), DropInConfidence max(0, Y - O) (not divided by
    Y), IncreaseInConfidence [O > Y] (explain's increase / 100)."""
    model, images, explainer, targets = arcc_setup()
    score = metrics.average_drop(model, images, explainer(images, targets))
    close(score.extra["change"], GRADCAM_REFERENCE["change"], 1e-5)
    close((-score.extra["change"]).clamp_min(0), GRADCAM_REFERENCE["drop"], 1e-5)
    close(score.extra["increase"] / 100, GRADCAM_REFERENCE["increase"], 0)
    y = score.extra["probability"]
    close(score.values, 100 * torch.as_tensor(GRADCAM_REFERENCE["drop"]) / y, 1e-3)


def xplique_average_metrics(model, images, maps, targets):
    """xplique 1.5's AverageDropMetric, AverageIncreaseMetric and AverageGainMetric with
    ``activation="softmax"``, their formulas from its source, in numpy (float32 masks as its
    TensorFlow code): the mask |a| min-max scaled per map with 1e-8, the input multiplied
    by it, then relu(base - after) / (base + 1e-8), [after > base] and
    relu(after - base) / (1 - base + 1e-8)."""
    a = np.abs(maps.numpy().astype(np.float32))
    low, high = a.min((1, 2), keepdims=True), a.max((1, 2), keepdims=True)
    mask = (a - low) / (high - low + np.float32(1e-8))
    with torch.no_grad():
        base = model(images).softmax(1)[torch.arange(len(images)), targets].double().numpy()
        masked = images * torch.from_numpy(mask)[:, None]
        after = model(masked).softmax(1)[torch.arange(len(images)), targets].double().numpy()
    drop = np.maximum(base - after, 0) / (base + 1e-8)
    increase = (after > base).astype(np.float64)
    gain = np.maximum(after - base, 0) / (1 - base + 1e-8)
    return drop, increase, gain


@pytest.mark.parametrize("signed", [False, True])
def test_average_drop_gain_and_increase_against_xplique(signed):
    """With ``mask="minmax"`` explain's three are xplique's times 100 (the 1e-8 in its
    denominators aside); on maps that already span [0, 1] the default ``"clip"`` masks the
    same way."""
    model, images, explainer, targets = arcc_setup()
    maps = explainer(images, targets).maps
    if signed:
        maps = maps * 4 - 1.5
    drop, increase, gain = xplique_average_metrics(model, images, maps, targets)
    ours = metrics.average_drop(model, images, maps, targets, mask="minmax")
    close(ours.values / 100, drop, 1e-5)
    close(ours.extra["increase"] / 100, increase, 0)
    close(ours.extra["gain"] / 100, gain, 1e-5)
    if not signed:
        close(metrics.average_drop(model, images, maps, targets).values, ours.values, 1e-4)
    with pytest.raises(ValueError, match="unknown mask 'soft'; use one of clip, minmax"):
        metrics.average_drop(model, images, maps, targets, mask="soft")


# --- the reference values -------------------------------------------------------------------


def _gradcam_reference() -> dict:
    """GRADCAM_REFERENCE, from pytorch-grad-cam (``pip install --no-deps grad-cam==1.5.7
    ttach`` into a folder on PYTHONPATH; its other requirements are explain's)."""
    import pytorch_grad_cam
    from pytorch_grad_cam.metrics import arcc as gc_arcc
    from pytorch_grad_cam.metrics import road as gc_road
    from pytorch_grad_cam.metrics.cam_mult_image import (
        CamMultImageConfidenceChange,
        DropInConfidence,
        IncreaseInConfidence,
    )
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputSoftmaxTarget

    init = gc_road.NoisyLinearImputer.__init__
    gc_road.NoisyLinearImputer.__init__ = lambda self, noise=0.0, weighting=gc_road.neighbors_weights: init(
        self, 0.0, weighting)
    model, images, explainer, targets = arcc_setup()
    cams = explainer(images, targets).maps.numpy()
    wanted = [ClassifierOutputSoftmaxTarget(int(t)) for t in targets]

    def base_method(input_tensor, targets):
        return explainer(input_tensor, torch.as_tensor([t.category for t in targets])).maps.numpy()

    out = {"version": getattr(pytorch_grad_cam, "__version__", "1.5.7")}
    out["arcc"] = gc_arcc.ARCC(base_method, road_percentiles=[20, 40, 60, 80])(images, cams, wanted, model)
    out["complexity"] = gc_arcc.Complexity()(cams)
    out["coherency"] = gc_arcc.Coherency()(images, cams, wanted, model, base_method)
    out["road"] = (gc_road.ROADCombined(percentiles=[20, 40, 60, 80])(images, cams, wanted, model) * 2).clip(0, 1)
    out["change"] = CamMultImageConfidenceChange()(images, cams, wanted, model)
    out["drop"] = DropInConfidence()(images, cams, wanted, model)
    out["increase"] = IncreaseInConfidence()(images, cams, wanted, model)
    return {k: (np.asarray(v, dtype=np.float64).ravel().tolist() if k != "version" else v) for k, v in out.items()}


def _quantus_head_reference() -> dict:
    import quantus

    maps = np.abs(mst_c_maps().numpy().astype(np.float64))
    default = quantus.MSTC(disable_warnings=True).evaluate_batch(a_batch=maps)
    small = quantus.MSTC(threshold=50.0, k=3, disable_warnings=True).evaluate_batch(a_batch=maps)
    return {"default": [float(v) for v in default], "threshold 50, k 3": [float(v) for v in small]}


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "gradcam"
    print(_gradcam_reference() if which == "gradcam" else _quantus_head_reference())
