"""explain.metrics against Quantus (0.6), the reference toolkit, for each metric both have.

Issue 12: on the same model, inputs, maps and settings, each of explain's metrics must equal
Quantus's within 1e-3 (tighter where both compute exactly the same thing), and a randomised
one must agree, with the same seed, within a stated tolerance. Where Quantus departs from
the metric's paper, explain follows the paper; the test then configures Quantus to the
paper's choice (through Quantus's own options: ``perturb_func``, ``similarity_func``,
``normalise_func``) and says so where it does. Skipped without the ``quantus`` extra
(``pip install explain[quantus]``); CI installs it.

Compared here: PixelFlipping, RegionPerturbation, IROF, ROAD, MaxSensitivity and
AvgSensitivity, LocalLipschitzEstimate, Continuity, RelativeInputStability,
RelativeOutputStability, RelativeRepresentationStability, MPRT (model parameter
randomisation), SmoothMPRT, EfficientMPRT, RandomLogit, PointingGame,
RelevanceMassAccuracy, RelevanceRankAccuracy, Sparseness and Complexity; and (issue 30)
Infidelity (with captum's ``infidelity`` too), FaithfulnessCorrelation, FaithfulnessEstimate,
Monotonicity, MonotonicityCorrelation, Selectivity and TopKIntersection.

Not compared, because Quantus 0.6 has no counterpart: deletion and insertion (Petsiuk et
al.'s RISE curves; Quantus has no insertion curve, and its deletion-like PixelFlipping is
compared instead), Average Drop / Increase in Confidence / Average Gain, the energy-based
pointing game (Score-CAM), the pointing game's 15-pixel tolerance, ROAD's LeRF curve and
the SSIM of model randomisation; the softmax and accuracy information curves (PAIR's
``saliency.metrics.pic`` is their reference: ``tests/test_metrics_pic.py``). Sensitivity-n is
not compared: Quantus's SensitivityN removes the most relevant features cumulatively rather
than random subsets (its attribution sums are read at its own ranked indices, which no option
replaces) and correlates across the images of a batch rather than across the subsets of one
image, so no configuration computes Ancona et al.'s test; ``tests/test_metrics.py`` checks it
against a loop reference.

Every map is a tie-free continuous one: explain sorts stably (ties in raster order) and
Quantus with numpy's default, unstable argsort, so on ties the two may legitimately rank
pixels differently. Models are tiny (one convolution, average pooling to 3 x 3, a linear
layer) and images 12 x 12 (16 x 16 for IROF), so the file runs in seconds.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

quantus = pytest.importorskip("quantus")

import explain  # noqa: E402
from explain import metrics  # noqa: E402

SIZE = 12  # 144 pixels: 12 pixels x 3 channels = 36 values divide it (PixelFlipping's step)
CLASSES = 10
EXACT = 1e-5  # float32 model passes in different batch layouts, the same arithmetic otherwise


# ---------------------------------------------------------------------------------------
# Shared set-up
# ---------------------------------------------------------------------------------------


def tiny_model(channels: int = 3, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(channels, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(3), nn.Flatten(), nn.Linear(72, CLASSES)
    )
    # Pooling to 3 x 3 (not 1 x 1) and larger output weights make the model's decision depend
    # on where the pixels are, with top-class probabilities of 0.25 to 0.9: a perturbation
    # moves the scores, and removing pixels changes the class (ROAD's accuracy falls).
    with torch.no_grad():
        model[4].weight.mul_(10)
    return model.eval()


def images(n: int = 4, channels: int = 3, seed: int = 1, uniform: bool = False, size: int = SIZE) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    shape = (n, channels, size, size)
    return torch.rand(shape, generator=generator) if uniform else torch.randn(shape, generator=generator)


def tie_free_maps(n: int = 4, seed: int = 2, signed: bool = False, size: int = SIZE) -> torch.Tensor:
    maps = torch.rand(n, size, size, generator=torch.Generator().manual_seed(seed))
    if signed:
        maps = 2 * maps - 1
    assert all(len(m.unique()) == m.numel() for m in maps), "the maps must be tie-free"
    return maps


def predicted(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(x).argmax(1)


def np_(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def a_batch(maps: torch.Tensor) -> np.ndarray:
    """Maps (N, H, W) as Quantus takes them: a float32 array (N, 1, H, W)."""
    return np_(maps[:, None].float())


def run_quantus(metric, **kwargs):
    """Call a Quantus metric on the CPU with its warnings silenced (it warns, e.g., whenever a
    perturbation leaves an image unchanged) and torch's random stream left as it was (MPRT
    reseeds it)."""
    with warnings.catch_warnings(), torch.random.fork_rng():
        warnings.simplefilter("ignore")
        return metric(device="cpu", **kwargs)


def assert_close(name: str, ours, theirs, atol: float) -> float:
    """|ours - theirs| <= atol everywhere; prints the largest difference (pytest -rP shows it)."""
    ours, theirs = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
    assert ours.shape == theirs.shape, (name, ours.shape, theirs.shape)
    assert np.isfinite(ours).all() and np.isfinite(theirs).all(), name
    difference = float(np.abs(ours - theirs).max())
    print(f"{name}: max |explain - quantus| = {difference:.3g} (tolerance {atol:g})")
    assert difference <= atol, f"{name}: max difference {difference:.3g} > {atol:g}\nours={ours}\nquantus={theirs}"
    return difference


class Recorder:
    """A forward hook that keeps every output of ``model``: what Quantus saw inside a call."""

    def __init__(self, model: nn.Module):
        self.outputs: list[torch.Tensor] = []
        self.handle = model.register_forward_hook(lambda module, args, out: self.outputs.append(out.detach().clone()))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.remove()


@pytest.fixture
def trapz():
    """numpy 2 removed ``np.trapz``, which Quantus 0.6 calls (IROF, AUCs): put it back for the
    test alone."""
    if hasattr(np, "trapz"):
        yield
        return
    np.trapz = np.trapezoid
    try:
        yield
    finally:
        del np.trapz


@pytest.fixture
def numpy_rng():
    """Quantus draws from numpy's global random stream (and RandomLogit reseeds it): leave it
    as it was."""
    state = np.random.get_state()
    yield
    np.random.set_state(state)


def quantus_explain_func(make_explainer):
    """An explainer of explain as Quantus's ``explain_func``: called with the (possibly
    randomised) model, float32 inputs and targets as numpy arrays, it returns the maps
    (n, 1, H, W) as a numpy array."""

    def explain_func(model, inputs, targets, **kwargs):
        inputs, targets = torch.as_tensor(np.asarray(inputs)), torch.as_tensor(np.asarray(targets)).long()
        explanation = make_explainer(model)(inputs, targets)
        return np_(explanation.maps[:, None])

    return explain_func


def saliency(model: nn.Module) -> explain.Saliency:
    # Non-negative maps (abs-sum over channels), each scaled by its own maximum.
    return explain.Saliency(model, clip_percentile=100.0)


# ---------------------------------------------------------------------------------------
# Faithfulness
# ---------------------------------------------------------------------------------------


def test_pixel_flipping(trapz):
    """Quantus flips single channel values (``features_in_step`` of them per step); with
    k * C values per step on a map broadcast to the channels, it flips k whole pixels, as
    Bach et al. and explain do. Its "black" baseline is each image's minimum over all
    channels, given to explain as a tensor. explain's curve starts at the intact image,
    Quantus's after the first step."""
    model, x, maps = tiny_model(), images(), tie_free_maps()
    y = predicted(model, x)
    k, channels = 12, x.shape[1]
    ours = metrics.pixel_flipping(model, x, maps, y, step=k, baseline=x.amin((1, 2, 3), keepdim=True),
                                  score="probability")
    curve = np_(ours.curves["pixel-flipping"])
    pf = quantus.PixelFlipping(features_in_step=k * channels, disable_warnings=True)
    theirs = np.array(run_quantus(pf, model=model, x_batch=np_(x), y_batch=np_(y), a_batch=a_batch(maps)))
    assert theirs.shape == (len(x), SIZE * SIZE // k)
    assert_close("PixelFlipping curve", curve[:, 1:], theirs, EXACT)
    # Quantus's AUC, trapz over its curve in steps: from explain's area on [0, 1] over the
    # curve from the intact image, less the first interval.
    pf_auc = quantus.PixelFlipping(features_in_step=k * channels, return_auc_per_sample=True, disable_warnings=True)
    auc = run_quantus(pf_auc, model=model, x_batch=np_(x), y_batch=np_(y), a_batch=a_batch(maps))
    steps = curve.shape[1] - 1
    derived = np_(ours.values) * steps - (curve[:, 0] + curve[:, 1]) / 2
    assert_close("PixelFlipping AUC", derived, auc, EXACT)


@pytest.mark.parametrize("patch_size, regions", [(4, 6), (5, 9), (3, 100)])
def test_region_perturbation(patch_size, regions):
    """Same grid (5 does not divide 12: both centre it, padding (1, 2)), same order, the
    image's minimum as the baseline and probabilities as the score. Quantus returns the
    drops f(x) - f(x_k) for k = 1..L; explain's curve has the k = 0 term (0) first, and its
    value is the paper's AOPC, sum / (L + 1). regions=100 exceeds the 16 patches: both stop
    at the last one."""
    model, x, maps = tiny_model(), images(), tie_free_maps()
    y = predicted(model, x)
    ours = metrics.region_perturbation(model, x, maps, y, patch_size=patch_size, regions=regions,
                                       baseline=x.amin((1, 2, 3), keepdim=True), score="probability")
    rp = quantus.RegionPerturbation(patch_size=patch_size, regions_evaluation=regions, disable_warnings=True)
    theirs = np.stack(run_quantus(rp, model=model, x_batch=np_(x), y_batch=np_(y), a_batch=a_batch(maps)))
    drops = np_(ours.curves["region-perturbation"])
    assert np.all(drops[:, 0] == 0)
    assert_close(f"RegionPerturbation drops (patch {patch_size}, {regions} regions)", drops[:, 1:], theirs, EXACT)
    aopc = theirs.sum(1) / (theirs.shape[1] + 1)
    assert_close(f"RegionPerturbation AOPC (patch {patch_size})", np_(ours.values), aopc, EXACT)


def test_irof(trapz):
    """The same SLIC segments (computed exactly as Quantus does and passed to explain), the
    same order (mean relevance per segment). Quantus fills a removed segment with the mean
    of the whole current batch (one number, drifting as segments are replaced, and
    dependent on which images share the batch); Rieger & Hansen fill with the image's mean,
    as explain does (per channel, of the original image): Quantus is given that fill as its
    ``perturb_func``. Then the curves (read off the model's outputs inside Quantus's call)
    agree, and Quantus's final number, AOC = n - trapz(curve in segment units, padded with
    zeros to the batch's largest n), follows from explain's curve."""
    from skimage.segmentation import slic

    # 16 x 16 images in [0, 1]: SLIC (100 segments asked) gives 29 to 35 segments of a few
    # pixels each, a different number per image.
    model, x, maps = tiny_model(), images(uniform=True, size=16), tie_free_maps(size=16)
    y = predicted(model, x)
    segments = np.stack([slic(np.moveaxis(image, 0, -1).astype("double"), start_label=0) for image in np_(x)])
    n = np.array([len(np.unique(s)) for s in segments])
    assert all(s.max() + 1 == k for s, k in zip(segments, n)), "SLIC's labels are 0..n-1"
    assert len(set(n)) > 1  # Quantus pads the shorter curves with zeros
    ours = metrics.irof(model, x, maps, y, segments=torch.as_tensor(segments), score="probability")
    curve = np_(ours.curves["irof"]).astype(np.float64)  # (N, L + 1): the intact image (1.0), then each removal
    longest = int(n.max())
    assert curve.shape == (len(x), longest + 1)

    means = np_(x.mean((2, 3), keepdim=True))

    def image_mean_fill(arr, mask, **kwargs):
        assert arr.shape == x.shape  # one batch: the means line up with the images
        return np.where(mask, means, arr).astype(arr.dtype)

    irof = quantus.IROF(perturb_func=image_mean_fill, return_aggregate=False, disable_warnings=True)
    with Recorder(model) as seen:
        theirs = np.array(run_quantus(irof, model=model, x_batch=np_(x), y_batch=np_(y), a_batch=a_batch(maps)))
    probabilities = torch.stack(seen.outputs[-(longest + 1):]).softmax(-1)[..., torch.arange(len(x)), y].T
    their_curve = np_(probabilities[:, 1:] / probabilities[:, :1])  # (N, L): Quantus's p_t / p_0
    valid = np.arange(longest)[None] < n[:, None]
    assert_close("IROF curve", curve[:, 1:][valid], their_curve[valid], EXACT)
    derived = n - np.trapezoid(np.where(valid, curve[:, 1:], 0.0), axis=1)
    assert_close("IROF Quantus AOC from explain's curve", derived, theirs, EXACT)
    # In explain's value (the area over the curve on [0, 1], from the intact image):
    # Quantus = n * value + (1 + r_1) / 2, less r_n / 2 where n is below the batch's longest.
    r_1, r_n = curve[:, 1], curve[np.arange(len(x)), n]
    from_value = n * np_(ours.values) + (1 + r_1) / 2 - np.where(n < longest, r_n / 2, 0.0)
    assert_close("IROF Quantus AOC from explain's value", from_value, theirs, EXACT)


def test_road():
    """MoRF, noise 0 (noisy linear imputation is then deterministic), a one-channel model
    (Quantus 0.6's ROAD indexes the channel-broadcast map with pixel indices and fails for
    C > 1). Quantus returns the accuracy per percentage, against the labels (here the
    predicted classes); explain's ``morf_accuracy`` curve averaged over images is that. The
    probabilities inside Quantus's call (read off the model) match explain's ``morf``
    curve too. Quantus has no LeRF curve."""
    model, x, maps = tiny_model(channels=1), images(n=6, channels=1), tie_free_maps(n=6)
    y = predicted(model, x)
    percentages = [10, 30, 50, 70, 90]  # 14.4, 43.2, 72, 100.8, 129.6 pixels: int() takes 14, 43, ...
    ours = metrics.road(model, x, maps, y, percentages=tuple(percentages), noise=0.0)
    road = quantus.ROAD(percentages=percentages, noise=0.0, disable_warnings=True)
    with Recorder(model) as seen:
        theirs = run_quantus(road, model=model, x_batch=np_(x), y_batch=np_(y), a_batch=a_batch(maps))
    assert list(theirs) == percentages
    accuracy = np_(ours.curves["morf_accuracy"]).mean(0)
    assert 0 < accuracy.min() < accuracy.max()  # removing pixels changes some classes
    assert_close("ROAD MoRF accuracy", accuracy, [theirs[p] for p in percentages], 1e-6)  # float32 means
    outputs = torch.stack(seen.outputs[-len(percentages):])  # (percentages, N, classes)
    hits = (outputs.argmax(-1) == y).T.float()
    assert_close("ROAD MoRF hits per image", np_(ours.curves["morf_accuracy"]), np_(hits), 0)
    probabilities = outputs.softmax(-1)[..., torch.arange(len(x)), y].T
    # explain's imputation solves the linear system iteratively (to 1e-5); Quantus exactly.
    assert_close("ROAD MoRF probability", np_(ours.curves["morf"]), np_(probabilities), 1e-4)
    # Quantus scores only the first batch; explain every image.
    road = quantus.ROAD(percentages=percentages, noise=0.0, disable_warnings=True)
    first = run_quantus(road, model=model, x_batch=np_(x), y_batch=np_(y), a_batch=a_batch(maps), batch_size=2)
    assert_close("ROAD first batch only", np_(ours.curves["morf_accuracy"][:2]).mean(0),
                 [first[p] for p in percentages], 1e-6)
    assert any(first[p] != theirs[p] for p in percentages)


# ---------------------------------------------------------------------------------------
# Robustness
# ---------------------------------------------------------------------------------------


class RecordingExplainer:
    """An explainer that keeps the images it is asked to explain (the noisy copies)."""

    def __init__(self, explainer):
        self.explainer, self.model, self.calls = explainer, explainer.model, []

    def __call__(self, images, targets=None, **options):
        self.calls.append(images.detach().clone())
        return self.explainer(images, targets, **options)


def sensitivity_metrics(n_samples, radius):
    """Quantus's two sensitivities with their own noise, uniform in [-radius, radius]."""
    return {
        "max": quantus.MaxSensitivity(nr_samples=n_samples, lower_bound=radius, disable_warnings=True),
        "average": quantus.AvgSensitivity(nr_samples=n_samples, lower_bound=radius, disable_warnings=True),
    }


def test_sensitivity_same_noise():
    """Given explain's noisy copies (recorded from explain's own call and handed to Quantus
    as its ``perturb_func``), Quantus's Max- and AvgSensitivity equal explain's: the
    distance ||Phi(x + d) - Phi(x)|| / ||Phi(x)|| with Phi(x) the given maps."""
    model, x = tiny_model(), images()
    explainer = RecordingExplainer(saliency(model))
    explanation = explainer.explainer(x)
    n_samples = 8
    ours = metrics.sensitivity(explainer, x, explanation, radius=0.2, n_samples=n_samples)
    noisy = torch.cat(explainer.calls).view(len(x), n_samples, -1)  # rows repeat each image n_samples times
    assert 0 < float((noisy - x.flatten(1)[:, None]).abs().max()) <= 0.2 + 1e-6

    for name, metric in (("max", quantus.MaxSensitivity), ("average", quantus.AvgSensitivity)):
        step = iter(range(n_samples))

        def explain_noise(arr, indices, **kwargs):
            return np_(noisy[:, next(step)])

        metric = metric(nr_samples=n_samples, perturb_func=explain_noise, disable_warnings=True)
        theirs = run_quantus(metric, model=model, x_batch=np_(x), y_batch=np_(explanation.targets),
                             a_batch=a_batch(explanation.maps), explain_func=quantus_explain_func(saliency))
        value = ours.values if name == "max" else ours.extra["average"]
        assert_close(f"{name} sensitivity, the same noise", np_(value), theirs, EXACT)


def test_sensitivity_without_noise(numpy_rng):
    """Radius 0: no perturbation, both exactly 0."""
    model, x = tiny_model(), images()
    explanation = saliency(model)(x)
    ours = metrics.sensitivity(saliency(model), x, explanation, radius=0.0, n_samples=3)
    assert torch.equal(ours.values, torch.zeros(len(x))) and torch.equal(ours.extra["average"], torch.zeros(len(x)))
    for name, metric in sensitivity_metrics(3, 0.0).items():
        theirs = run_quantus(metric, model=model, x_batch=np_(x), y_batch=np_(explanation.targets),
                             a_batch=a_batch(explanation.maps), explain_func=quantus_explain_func(saliency))
        assert np.array_equal(theirs, np.zeros(len(x))), (name, theirs)


def test_sensitivity_statistically(numpy_rng):
    """Quantus's own noise (numpy's global stream, seeded 0) against explain's (seed 0): the
    same distribution, uniform in [-0.2, 0.2] per input value, different draws. With 64
    samples each, the averages agree within 4 standard errors of their difference,
    4 * sd * sqrt(2 / 64), sd the spread of one image's distances over explain's samples
    (a 4-sigma band: about 1 in 16 000 to fail by chance). A maximum has no such error
    band: Quantus's must lie above the 90th percentile of explain's distances (the largest
    of 64 draws falls below it with probability 0.9 ** 64 = 0.1 %) and below their mean
    + 6 sd (beyond any 64-draw maximum seen over 5 seeds, at most 4.2 sd)."""
    model, x = tiny_model(), images()
    explainer = RecordingExplainer(saliency(model))
    explanation = explainer.explainer(x)
    n_samples = 64
    ours = metrics.sensitivity(explainer, x, explanation, radius=0.2, n_samples=n_samples, seed=0)
    # explain's distances, one per noisy copy, from the copies it explained.
    again = saliency(model)(torch.cat(explainer.calls), explanation.targets.repeat_interleave(n_samples)).maps
    distances = ((again.view(len(x), n_samples, -1) - explanation.maps.flatten(1)[:, None]).norm(dim=2)
                 / explanation.maps.flatten(1).norm(dim=1, keepdim=True))
    torch.testing.assert_close(distances.amax(1), ours.values)
    torch.testing.assert_close(distances.mean(1), ours.extra["average"])

    np.random.seed(0)
    theirs = {name: np.asarray(run_quantus(metric, model=model, x_batch=np_(x), y_batch=np_(explanation.targets),
                                           a_batch=a_batch(explanation.maps),
                                           explain_func=quantus_explain_func(saliency)))
              for name, metric in sensitivity_metrics(n_samples, 0.2).items()}
    tolerance = 4 * np_(distances.std(1)) * np.sqrt(2 / n_samples)
    difference = np.abs(np_(ours.extra["average"]) - theirs["average"])
    print(f"average sensitivity: |explain - quantus| = {difference.round(4)} (tolerance {tolerance.round(4)})")
    assert np.all(difference <= tolerance)
    low = np_(distances.quantile(0.9, dim=1))
    high = np_(distances.mean(1) + 6 * distances.std(1))
    print(f"max sensitivity: explain {np_(ours.values).round(4)}, quantus {theirs['max'].round(4)} "
          f"(band {low.round(4)} to {high.round(4)})")
    assert np.all((low <= theirs["max"]) & (theirs["max"] <= high))


def noise_from(noisy: torch.Tensor):
    """Quantus's ``perturb_func`` that hands out explain's neighbours, draw after draw:
    ``noisy`` (N, n_samples, C*H*W) as recorded from explain's own call."""
    step = iter(range(noisy.shape[1]))

    def perturb(arr, indices, **kwargs):
        return np_(noisy[:, next(step)])

    return perturb


def assert_relative(name: str, ours, theirs, rtol: float) -> float:
    """|ours - theirs| <= rtol * |theirs| everywhere: for values that span many orders of
    magnitude (the relative stabilities divide by 1e-6 where a map is 0)."""
    ours, theirs = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
    assert ours.shape == theirs.shape and np.isfinite(ours).all() and np.isfinite(theirs).all(), name
    difference = float(np.max(np.abs(ours - theirs) / np.abs(theirs)))
    print(f"{name}: max |explain - quantus| / |quantus| = {difference:.3g} (tolerance {rtol:g})")
    assert difference <= rtol, f"{name}: {difference:.3g} > {rtol:g}\nours={ours}\nquantus={theirs}"
    return difference


def explained_noise(metric, model, x, explanation, **options):
    """explain's ``metric`` on saliency maps, with the neighbours it explained (N, S, C*H*W)."""
    explainer = RecordingExplainer(saliency(model))
    ours = metric(explainer, x, explanation, **options)
    return ours, torch.cat(explainer.calls).view(len(x), options["n_samples"], -1)


@pytest.mark.parametrize("noise", ["uniform", "normal"])
def test_local_lipschitz_estimate_same_noise(noise):
    """Given explain's neighbours as its ``perturb_func``, Quantus's LocalLipschitzEstimate
    equals explain's max ||Phi(x) - Phi(x')||_2 / ||x - x'||_2. Quantus divides every map
    by the batch's largest value first (``normalise=True``), which changes the scale of a
    Lipschitz constant with the batch: given ``normalise=False``, it compares the maps as
    the explainer scales them, as the paper and explain do. (Its 1e-10 added to the
    denominator is below float32 resolution here.)"""
    model, x = tiny_model(), images()
    explanation = saliency(model)(x)
    ours, noisy = explained_noise(metrics.local_lipschitz_estimate, model, x, explanation, radius=0.1, noise=noise,
                                  n_samples=6)
    lle = quantus.LocalLipschitzEstimate(nr_samples=6, perturb_func=noise_from(noisy), normalise=False,
                                         disable_warnings=True)
    theirs = run_quantus(lle, model=model, x_batch=np_(x), y_batch=np_(explanation.targets),
                         a_batch=a_batch(explanation.maps), explain_func=quantus_explain_func(saliency))
    assert_close(f"LocalLipschitzEstimate ({noise}), the same noise", np_(ours.values), theirs, EXACT)


def test_continuity():
    """Quantus 0.6's Continuity walks the same horizontal shifts (nr_steps of
    (2W + 1) // nr_steps pixels from -W on, the image's minimum filling in) and takes the
    largest ||R(x) - R(x')||_1 / ||x - x'||_2. It includes the shift 0 (0 here: its map
    of x is recomputed in the same batch) and, by default, takes |R| scaled by the batch's
    largest value: given ``abs=False, normalise=False``, it compares the maps as they are,
    as Montavon et al. and explain do. 12 px wide: 25 // 6 = 4 pixels a step."""
    model, x = tiny_model(), images()
    explanation = saliency(model)(x)
    ours = metrics.continuity(saliency(model), x, explanation, steps=6)
    assert ours.steps.tolist() == [-8, -4, 4, 8, 12]
    continuity = quantus.Continuity(nr_steps=6, abs=False, normalise=False, disable_warnings=True)
    theirs = run_quantus(continuity, model=model, x_batch=np_(x), y_batch=np_(explanation.targets),
                         a_batch=a_batch(explanation.maps), explain_func=quantus_explain_func(saliency))
    assert_close("Continuity", np_(ours.values), theirs, EXACT)


STABILITIES = {
    "input": (metrics.relative_input_stability, lambda **kw: quantus.RelativeInputStability(**kw), {}),
    "output": (metrics.relative_output_stability, lambda **kw: quantus.RelativeOutputStability(**kw), {}),
    "representation": (metrics.relative_representation_stability,
                       lambda **kw: quantus.RelativeRepresentationStability(layer_names=["0"], **kw),
                       {"layer": "0"}),
}


@pytest.mark.parametrize("kind", list(STABILITIES))
def test_relative_stability_same_noise(kind):
    """Given explain's neighbours, Quantus's Relative{Input,Output,Representation}Stability
    equal explain's: max ||(e - e') / e|| / max(||(x - x') / x||, eps) (RIS; ROS: the
    logits' change, not relative; RRS: the first convolution's output, read by a hook in
    both), 1e-6 standing in where e, x or L is 0. Saliency maps are min-max scaled, so each
    has a zero: the values reach 1e5 and more, and are compared relatively (Quantus divides
    in float64, explain in float32). Noise of 0.01 changes no class here (checked), so
    that Quantus's NaN for an image with any neighbour of another class does not arise."""
    ours_metric, theirs_metric, options = STABILITIES[kind]
    model, x = tiny_model(), images()
    explanation = saliency(model)(x)
    ours, noisy = explained_noise(ours_metric, model, x, explanation, radius=0.01, n_samples=5, **options)
    assert ours.extra["kept"].tolist() == [5.0] * len(x)
    metric = theirs_metric(nr_samples=5, perturb_func=noise_from(noisy), disable_warnings=True)
    theirs = run_quantus(metric, model=model, x_batch=np_(x), y_batch=np_(explanation.targets),
                         a_batch=a_batch(explanation.maps), explain_func=quantus_explain_func(saliency))
    assert_relative(f"Relative{kind.capitalize()}Stability, the same noise", np_(ours.values), theirs, 1e-5)


def test_relative_input_stability_leaves_out_the_neighbours_of_another_class():
    """Agarwal et al. take the maximum over the neighbours that keep the class; Quantus
    (``return_nan_when_prediction_changes=True``, its default) gives NaN for an image as
    soon as one of its neighbours changes class. With noise of 1.0, some do: explain scores
    those images over the others, Quantus gives NaN."""
    model, x = tiny_model(), images()
    explanation = saliency(model)(x)
    ours, noisy = explained_noise(metrics.relative_input_stability, model, x, explanation, radius=1.0, n_samples=5)
    mixed = (ours.extra["kept"] > 0) & (ours.extra["kept"] < 5)
    assert mixed.any() and torch.isfinite(ours.values[mixed]).all()
    ris = quantus.RelativeInputStability(nr_samples=5, perturb_func=noise_from(noisy), disable_warnings=True)
    theirs = np.asarray(run_quantus(ris, model=model, x_batch=np_(x), y_batch=np_(explanation.targets),
                                    a_batch=a_batch(explanation.maps), explain_func=quantus_explain_func(saliency)))
    assert np.isnan(theirs[np_(ours.extra["kept"] < 5)]).all()
    every = np_(ours.extra["kept"] == 5)
    assert_relative("RelativeInputStability where every neighbour keeps the class", np_(ours.values)[every],
                    theirs[every], 1e-5)


# ---------------------------------------------------------------------------------------
# Randomisation
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("order", ["top_down", "bottom_up"])
def test_model_randomisation(order):
    """Cascading randomisation with seed 42 in both (``torch.manual_seed(43)`` before each
    layer's ``reset_parameters``): explain's Spearman curve per layer equals Quantus's
    MPRT per layer name. Quantus compares each randomised explanation with the given maps,
    as explain does; it first scores the given maps against a fresh explanation of the
    intact model ("original", 1 here), which explain has no use for. The maps are
    non-negative, so Quantus's ``abs=True`` changes nothing."""
    model, x = tiny_model(), images()
    explainer = saliency(model)
    explanation = explainer(x)
    layers = None if order == "top_down" else ["0", "4"]
    ours = metrics.model_randomisation(explainer, x, explanation, layers=layers, seed=42)
    mprt = quantus.MPRT(seed=42, layer_order=order, disable_warnings=True)
    theirs = run_quantus(mprt, model=model, x_batch=np_(x), y_batch=np_(explanation.targets),
                         a_batch=a_batch(explanation.maps), explain_func=quantus_explain_func(saliency))
    assert list(theirs) == ["original", *ours.step_labels]
    assert ours.step_labels == (("4", "0") if order == "top_down" else ("0", "4"))
    assert_close("MPRT original", theirs["original"], np.ones(len(x)), 1e-6)
    for j, layer in enumerate(ours.step_labels):
        assert_close(f"MPRT {order} layer {layer}", np_(ours.curves["spearman"][:, j]), theirs[layer], EXACT)


def test_random_logit(numpy_rng):
    """Seed 42 in both: the same random other classes. Quantus computes SSIM on the maps
    flattened to 1-D signals (its window runs across rows), Sixt et al. (and explain) on
    the 2-D maps; Quantus is given the 2-D SSIM (scikit-image's, 7 x 7 window, data range
    of both maps) as its ``similarity_func``, and per-map scaling, so that its
    normalisation (by the largest value of the whole batch by default) leaves explain's
    maps, already scaled per map, as they are."""
    from skimage.metrics import structural_similarity

    def ssim_2d(a, b, batched=True, **kwargs):
        assert batched
        scores = []
        for u, v in zip(a.reshape(-1, SIZE, SIZE).astype(np.float64), b.reshape(-1, SIZE, SIZE).astype(np.float64)):
            span = max(u.max(), v.max()) - min(u.min(), v.min())
            scores.append(structural_similarity(u, v, data_range=span))
        return np.array(scores)

    model, x = tiny_model(), images(n=6)
    explainer = saliency(model)
    explanation = explainer(x)
    ours = metrics.random_logit(explainer, x, explanation, seed=42)
    asked = []

    def make(model):
        def recorded(images, targets):
            asked.append(np_(targets))
            return saliency(model)(images, targets)

        return recorded

    rl = quantus.RandomLogit(num_classes=CLASSES, seed=42, similarity_func=ssim_2d,
                             normalise_func_kwargs={"normalise_axes": (1, 2, 3)}, disable_warnings=True)
    theirs = run_quantus(rl, model=model, x_batch=np_(x), y_batch=np_(explanation.targets),
                         a_batch=a_batch(explanation.maps), explain_func=quantus_explain_func(make))
    assert len(asked) == 1
    assert np.array_equal(np_(ours.extra["class"]).astype(int), asked[0])
    assert np.all(asked[0] != np_(explanation.targets))
    assert_close("RandomLogit (2-D SSIM)", np_(ours.values), theirs, EXACT)


def test_smooth_model_randomisation(monkeypatch):
    """Smooth MPRT, bottom up, seed 42 in both: each map the mean over 4 copies of the
    image, 3 with Gaussian noise of 0.1 x the image's range and the last without. Quantus
    draws its noise with ``np.random.randn`` and explains with ``quantus.explain`` (its
    ``explain_func`` is not called); the test hands it explain's draws (numpy's ``randn``
    replaced for the call by explain's draw s, in the order Quantus asks for them) and
    explain's explainer (``quantus.explain`` replaced). Then explain's Spearman curve per
    layer equals Quantus's SmoothMPRT per layer name; its "original" entry (a second
    smoothed map of the intact model against the first) is 1. Quantus sums the samples'
    maps one by one and explain adds them up in batches, so the means differ in the last
    float32 bit: within 1e-6, which changes no rank here."""
    from explain.metrics.base import draws

    model, x = tiny_model(), images()
    explainer = saliency(model)
    explanation = explainer(x)
    n_samples = 4
    ours = metrics.smooth_model_randomisation(explainer, x, explanation, n_samples=n_samples, seed=42)
    asked = iter(range(10**6))

    def randn(*shape):
        drawn = draws(42, [next(asked) % (n_samples - 1)], shape[1:], torch.device("cpu"), normal=True)
        return np_(drawn.expand(shape[0], *shape[1:]))

    def explain_with_ours(model, inputs, targets, **kwargs):
        inputs = torch.as_tensor(np.asarray(inputs))
        return np_(saliency(model)(inputs, torch.as_tensor(np.asarray(targets)).long()).maps[:, None])

    monkeypatch.setattr(np.random, "randn", randn)
    monkeypatch.setattr(quantus, "explain", explain_with_ours)
    smprt = quantus.SmoothMPRT(nr_samples=n_samples, noise_magnitude=0.1, seed=42, disable_warnings=True)
    theirs = run_quantus(smprt, model=model, x_batch=np_(x), y_batch=np_(explanation.targets), a_batch=None,
                         explain_func=quantus_explain_func(saliency))
    # Quantus drew 3 noises for each of its 4 smoothed maps (the given a_batch=None, the
    # "original" and one per layer): all explain's.
    assert next(asked) == 4 * (n_samples - 1)
    assert list(theirs) == ["original", *ours.step_labels] and ours.step_labels == ("0", "4")
    assert_close("SmoothMPRT original", theirs["original"], np.ones(len(x)), 1e-6)
    for j, layer in enumerate(ours.step_labels):
        assert_close(f"SmoothMPRT layer {layer}", np_(ours.curves["spearman"][:, j]), theirs[layer], 1e-6)


def test_efficient_model_randomisation():
    """Efficient MPRT, seed 42 in both: the rise of the maps' histogram entropy (100 bins,
    the paper's and Quantus's default) from the intact model to the fully randomised one,
    (H_random - H) / H. Quantus explains the intact model once more rather than using the
    given maps (the same saliency maps here); the fully random model does not depend on the
    order (each layer is reset after manual_seed(43))."""
    model, x = tiny_model(), images()
    explainer = saliency(model)
    explanation = explainer(x)
    ours = metrics.efficient_model_randomisation(explainer, x, explanation, seed=42)
    emprt = quantus.EfficientMPRT(seed=42, disable_warnings=True)
    theirs = run_quantus(emprt, model=model, x_batch=np_(x), y_batch=np_(explanation.targets),
                         a_batch=a_batch(explanation.maps), explain_func=quantus_explain_func(saliency))
    assert_close("EfficientMPRT", np_(ours.values), theirs, EXACT)


# ---------------------------------------------------------------------------------------
# Localisation and complexity: the map alone (and the region)
# ---------------------------------------------------------------------------------------


def regions(maps: torch.Tensor) -> torch.Tensor:
    """One box per image, of varied sizes; the first image's holds its maximum, the second's
    does not, so that the pointing game has hits and misses."""
    masks = torch.zeros(maps.shape, dtype=torch.bool)
    boxes = [(2, 9, 3, 10), (0, 5, 0, 12), (4, 10, 1, 7), (6, 12, 6, 12), (3, 4, 3, 11), (1, 11, 1, 11)]
    for i, (top, bottom, left, right) in enumerate(boxes[: len(maps)]):
        masks[i, top:bottom, left:right] = True
    peak = divmod(int(maps[0].argmax()), SIZE)
    masks[0, max(0, peak[0] - 1):peak[0] + 2, max(0, peak[1] - 1):peak[1] + 2] = True
    masks[1].view(-1)[maps[1].argmax()] = False
    return masks


def localisation(metric, maps, masks):
    x = np.zeros((len(maps), 3, SIZE, SIZE), np.float32)
    return np.asarray(run_quantus(metric, model=None, x_batch=x, y_batch=np.zeros(len(maps), int),
                                  a_batch=a_batch(maps), s_batch=a_batch(masks.float())), dtype=np.float64)


@pytest.mark.parametrize("signed", [False, True])
def test_pointing_game(signed):
    """explain with ``tolerance=0`` (Zhang et al. allow 15 pixels; Quantus has no
    tolerance) is Quantus's PointingGame."""
    maps = tie_free_maps(n=6, signed=signed)
    masks = regions(maps)
    ours = metrics.pointing_game(maps, masks, tolerance=0).values
    theirs = localisation(quantus.PointingGame(disable_warnings=True), maps, masks)
    assert 0 < ours.sum() < len(maps)  # hits and misses
    assert_close("PointingGame", np_(ours), theirs, 0)


def test_relevance_mass():
    """Non-negative maps: R_within / R_total, as in both."""
    maps = tie_free_maps(n=6)
    masks = regions(maps)
    ours = metrics.relevance_mass(maps, masks).values
    theirs = localisation(quantus.RelevanceMassAccuracy(disable_warnings=True), maps, masks)
    assert_close("RelevanceMassAccuracy", np_(ours), theirs, 1e-6)


def test_relevance_mass_signed():
    """Signed maps: Arras et al. count positive relevance only, as explain does; Quantus
    sums the signed values (the total may then be near 0 or negative, the share outside
    [0, 1]). Quantus is given the positive part through its ``normalise_func``."""
    maps = tie_free_maps(n=6, signed=True)
    masks = regions(maps)
    ours = metrics.relevance_mass(maps, masks).values
    positive = quantus.RelevanceMassAccuracy(normalise_func=lambda a, **kwargs: np.clip(a, 0, None),
                                             disable_warnings=True)
    assert_close("RelevanceMassAccuracy (signed maps, positive part)", np_(ours),
                 localisation(positive, maps, masks), 1e-6)
    signed = localisation(quantus.RelevanceMassAccuracy(normalise=False, disable_warnings=True), maps, masks)
    assert np.abs(np_(ours) - signed).max() > 1e-3  # Quantus's default departs from the paper


@pytest.mark.parametrize("signed", [False, True])
def test_relevance_rank(signed):
    maps = tie_free_maps(n=6, signed=signed)
    masks = regions(maps)
    ours = metrics.relevance_rank(maps, masks).values
    theirs = localisation(quantus.RelevanceRankAccuracy(disable_warnings=True), maps, masks)
    assert_close("RelevanceRankAccuracy", np_(ours), theirs, 1e-6)


def concentration(metric, maps):
    x = np.zeros((len(maps), 3, SIZE, SIZE), np.float32)
    return np.asarray(run_quantus(metric, model=None, x_batch=x, y_batch=np.zeros(len(maps), int),
                                  a_batch=a_batch(maps)), dtype=np.float64)


@pytest.mark.parametrize("signed", [False, True])
def test_sparseness(signed):
    """The Gini index of |a|. Quantus adds 1e-7 to every (max-scaled) value first, and
    works in float32: within 1e-5."""
    maps = tie_free_maps(n=6, signed=signed) ** 3  # less flat than uniform values
    ours = metrics.sparseness(maps).values
    theirs = concentration(quantus.Sparseness(disable_warnings=True), maps)
    assert_close("Sparseness", np_(ours), theirs, 1e-5)


@pytest.mark.parametrize("signed", [False, True])
def test_complexity(signed):
    """The entropy of |a| / sum |a| (natural log). Quantus adds 1e-12 inside the log and
    works in float32: within 1e-5."""
    maps = tie_free_maps(n=6, signed=signed) ** 3
    ours = metrics.complexity(maps).values
    theirs = concentration(quantus.Complexity(disable_warnings=True), maps)
    assert_close("Complexity", np_(ours), theirs, 1e-5)


# ---------------------------------------------------------------------------------------
# Issue 30: infidelity, sensitivity-n, faithfulness correlation and estimate, monotonicity
# and monotonicity correlation, selectivity, top-k intersection
# ---------------------------------------------------------------------------------------


class RecordingModel(nn.Module):
    """The model, keeping a copy of every batch explain's metric gives it: the perturbed
    images, in the order the metric made them (image by image, then column by column).
    The metric is given a ``batch_size``, so that no probe pass sizes its batches."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model, self.batches = model, []

    def forward(self, x):
        self.batches.append(x.detach().clone())
        return self.model(x)

    def copies(self, n: int) -> torch.Tensor:
        """The recorded copies as (n images, columns, C, H, W)."""
        every = torch.cat(self.batches)
        return every.view(n, len(every) // n, *every.shape[1:])


def replay(copies: torch.Tensor, columns):
    """A Quantus ``perturb_func`` that returns, call after call, explain's perturbed images
    of the next of ``columns`` (flattened as Quantus passes arrays), whatever Quantus asks."""
    order = iter(columns)

    def perturb_func(arr, indices=None, **kwargs):
        return np_(copies[:, next(order)]).reshape(arr.shape).astype(arr.dtype)

    return perturb_func


@pytest.mark.parametrize("normalise", [False, True])
def test_infidelity_with_the_same_squares(normalise):
    """Yeh et al.'s square removal with the binary perturbation I (the removed square's
    indicator), as the authors' code runs it for attributions. Quantus's Infidelity removes
    the squares of a grid cumulatively, multiplies the map by the input change x - x' and
    does not scale the map: it is given explain's squares through its ``perturb_func`` (one
    patch covering the image, so one perturbation per sample), a baseline of x - 1 (so that
    x - x' is the indicator) and the map divided by the channels it is broadcast over; then
    its value is explain's with ``normalise=False`` (Definition 2.3 as written). captum's
    ``infidelity`` (given the same squares) checks the optimal scaling, ``normalize=True``."""
    from captum.metrics import infidelity as captum_infidelity

    model, x, maps = tiny_model(), images(), tie_free_maps()
    y = predicted(model, x)
    channels, samples = x.shape[1], 6
    recorder = RecordingModel(model)
    ours = metrics.infidelity(recorder, x, maps, y, n_samples=samples, patch_sizes=[2, 3, 5], baseline=x - 1,
                              normalise=normalise, batch_size=5)
    copies = recorder.copies(len(x))
    squares = (copies[0, 1:] != x[0]).all(1)  # (samples, H, W): the same squares for every image
    assert squares.any((1, 2)).all() and torch.equal(squares, (copies[:, 1:] != x[:, None]).all(2)[1])
    if not normalise:
        infid = quantus.Infidelity(perturb_patch_sizes=[SIZE], n_perturb_samples=samples,
                                   perturb_func=replay(copies, range(1, samples + 1)), disable_warnings=True)
        theirs = run_quantus(infid, model=model, x_batch=np_(x), y_batch=np_(y), a_batch=a_batch(maps / channels))
        assert_close("Infidelity (the same squares, binary I)", np_(ours.values), theirs, 1e-5)

    def perturb_func(inputs):
        indicator = squares.repeat(len(x), 1, 1)[:, None].expand_as(inputs).float()
        return indicator, inputs - indicator

    attributions = (maps / channels)[:, None].expand_as(x).contiguous()
    theirs = captum_infidelity(model, perturb_func, x, attributions, target=y, n_perturb_samples=samples,
                               max_examples_per_batch=samples * len(x), normalize=normalise)
    assert_close("captum infidelity (the same squares)", np_(ours.values), np_(theirs), 1e-5)


def test_faithfulness_correlation_with_the_same_subsets(monkeypatch, numpy_rng):
    """Bhatt et al.'s subsets of pixels; Quantus draws single channel values with
    ``np.random.choice`` from numpy's global stream. Here its draws are explain's subsets
    (each pixel's three channel values), so that both remove the same pixels; its baseline
    is explain's zeros. Pearson over 20 runs."""
    model, x, maps = tiny_model(), images(), tie_free_maps(signed=True)
    y = predicted(model, x)
    runs, count = 20, 30
    ours = metrics.faithfulness_correlation(model, x, maps, y, subset=count, n_runs=runs, seed=3)
    from explain.metrics.faithfulness.perturbing import random_subsets

    subsets = random_subsets(3, list(range(runs)), torch.full((runs,), count), SIZE, SIZE, "cpu").flatten(1)
    pixels = [np.flatnonzero(np_(s)) for s in subsets]
    calls = iter(range(runs * len(x)))

    def choice(n, size, replace=True):
        p = pixels[next(calls) // len(x)]  # Quantus draws run by run, image by image
        return np.concatenate([p + c * SIZE * SIZE for c in range(3)])

    monkeypatch.setattr(np.random, "choice", choice)
    fc = quantus.FaithfulnessCorrelation(nr_runs=runs, subset_size=3 * count, perturb_baseline=0.0, normalise=False,
                                         return_aggregate=False, disable_warnings=True)
    theirs = run_quantus(fc, model=model, x_batch=np_(x), y_batch=np_(y), a_batch=a_batch(maps))
    assert_close("FaithfulnessCorrelation (the same subsets)", np_(ours.values), theirs, 1e-5)


def test_faithfulness_estimate():
    """Groups of k pixels of consecutive rank, each removed alone: Quantus with
    ``features_in_step`` = k * C (k whole pixels, as in the pixel-flipping test), baseline 0
    and softmax (Alvarez-Melis & Jaakkola's probability drops; Quantus reads logits by
    default)."""
    model, x, maps = tiny_model(), images(), tie_free_maps(signed=True)
    y = predicted(model, x)
    k = 12
    ours = metrics.faithfulness_estimate(model, x, maps, y, step=k)
    fe = quantus.FaithfulnessEstimate(features_in_step=3 * k, perturb_baseline=0.0, normalise=False,
                                      disable_warnings=True)
    theirs = run_quantus(fe, model=model, x_batch=np_(x), y_batch=np_(y), a_batch=a_batch(maps), softmax=True)
    assert_close("FaithfulnessEstimate", np_(ours.values), theirs, 1e-5)
    logits = metrics.faithfulness_estimate(model, x, maps, y, step=k, score="logit")
    fe = quantus.FaithfulnessEstimate(features_in_step=3 * k, perturb_baseline=0.0, normalise=False,
                                      disable_warnings=True)
    theirs = run_quantus(fe, model=model, x_batch=np_(x), y_batch=np_(y), a_batch=a_batch(maps))
    assert_close("FaithfulnessEstimate (logits)", np_(logits.values), theirs, 1e-5)


def test_monotonicity():
    """Arya et al. (AIX360's ``monotonicity_metric``) put the image's features back onto the
    baseline, least relevant first. Quantus 0.6's Monotonicity replaces the chosen features
    of its baseline image with the baseline again, so its image never changes and every
    curve is flat (always monotonic): it is given a ``perturb_func`` that puts the image's
    values back instead, ``abs=False`` (the paper orders by the signed relevance) and
    softmax (AIX360's probabilities). Then the probabilities it reads (recorded from the
    model) are explain's curve, and its verdicts explain's values."""
    model, x, maps = tiny_model(), images(n=6), tie_free_maps(n=6, signed=True)
    y = predicted(model, x)
    k = 12
    ours = metrics.monotonicity(model, x, maps, y, step=k)
    original = np_(x).reshape(len(x), -1)

    def put_back(arr, indices, **kwargs):
        out = arr.copy()
        rows = np.arange(len(arr))[:, None]
        out[rows, indices] = original[rows, indices]
        return out

    def quantus_monotonicity(perturb_func=None):
        mono = quantus.Monotonicity(features_in_step=3 * k, perturb_baseline=0.0, perturb_func=perturb_func,
                                    abs=False, normalise=False, disable_warnings=True)
        with Recorder(model) as seen:
            verdicts = run_quantus(mono, model=model, x_batch=np_(x), y_batch=np_(y), a_batch=a_batch(maps),
                                   softmax=True)
        return np.array(verdicts, dtype=float), torch.stack(seen.outputs)

    as_shipped, outputs = quantus_monotonicity()
    assert np.all(as_shipped == 1) and torch.equal(outputs[0], outputs[-1])  # the flat curve
    theirs, outputs = quantus_monotonicity(put_back)
    probabilities = outputs.softmax(-1)[..., torch.arange(len(x)), y].T
    assert_close("Monotonicity curve", np_(ours.curves["monotonicity"]), np_(probabilities), 1e-6)
    assert_close("Monotonicity", np_(ours.values), theirs, 0)


def test_monotonicity_correlation_with_the_same_noise():
    """Nguyen & Martinez's Spearman between a group's relevance magnitude and the mean squared
    change of the score under noise on it. Quantus fills a group with one uniform value in
    [0, 1) per image; given explain's noisy copies through its ``perturb_func`` (in its order:
    group after group, sample after sample), its values equal explain's (its division of
    the variance by f(x)^2 leaves the ranking as it is). Groups of k pixels by ascending
    magnitude in both (Quantus's ``abs=True``); probabilities in both."""
    model, x, maps = tiny_model(), images(), tie_free_maps(signed=True)
    assert all(len(m.abs().unique()) == m.numel() for m in maps)
    y = predicted(model, x)
    k, samples = 12, 4
    recorder = RecordingModel(model)
    ours = metrics.monotonicity_correlation(recorder, x, maps, y, step=k, n_samples=samples, seed=5, batch_size=7)
    copies = recorder.copies(len(x))
    groups = SIZE * SIZE // k
    assert copies.shape[1] == 1 + groups * samples
    mc = quantus.MonotonicityCorrelation(nr_samples=samples, features_in_step=3 * k, normalise=False,
                                         perturb_func=replay(copies, range(1, 1 + groups * samples)),
                                         disable_warnings=True)
    theirs = run_quantus(mc, model=model, x_batch=np_(x), y_batch=np_(y), a_batch=a_batch(maps))
    assert_close("MonotonicityCorrelation (the same noise)", np_(ours.values), theirs, 1e-6)


@pytest.mark.parametrize("patch_size", [4, 5])
def test_selectivity(patch_size):
    """The same grid (5 does not divide 12: both centre it), order and baseline (0), and the
    logit (Montavon et al.'s function value; Quantus reads the probability by default).
    Quantus's curve starts after the first removal, explain's at the intact image."""
    model, x, maps = tiny_model(), images(), tie_free_maps()
    y = predicted(model, x)
    ours = metrics.selectivity(model, x, maps, y, patch_size=patch_size)
    sel = quantus.Selectivity(patch_size=patch_size, perturb_baseline=0.0, normalise=False, disable_warnings=True)
    theirs = np.array(run_quantus(sel, model=model, x_batch=np_(x), y_batch=np_(y), a_batch=a_batch(maps),
                                  softmax=False))
    assert_close(f"Selectivity curve (patch {patch_size})", np_(ours.curves["selectivity"])[:, 1:], theirs, EXACT)


@pytest.mark.parametrize("k, concept_influence", [(10, False), (40, True), (143, False)])
def test_top_k_intersection(k, concept_influence):
    """Quantus refuses a k of the image's size or more (explain takes the whole map)."""
    maps = tie_free_maps(n=6, signed=True)
    masks = regions(maps)
    ours = metrics.top_k_intersection(maps, masks, k=k, concept_influence=concept_influence).values
    tki = quantus.TopKIntersection(k=k, concept_influence=concept_influence, normalise=False, disable_warnings=True)
    assert_close(f"TopKIntersection (k={k})", np_(ours), localisation(tki, maps, masks), 1e-6)


# ---------------------------------------------------------------------------------------
# Issue 44: completeness, non-sensitivity, input invariance, effective complexity,
# sufficiency, consistency, focus, AUC, attribution localisation; max-sensitivity again
# ---------------------------------------------------------------------------------------


def equal_peak_maps(n: int = 4, seed: int = 2, zeros: float = 0.0) -> torch.Tensor:
    """Tie-free maps in (0, 1], each reaching 1: Quantus's default normalisation divides
    every map by the batch's largest magnitude, explain by the map's own, which then agree;
    ``zeros`` of the pixels set to 0 (most of the rest far above 1e-5)."""
    maps = tie_free_maps(n, seed=seed)
    if zeros:
        generator = torch.Generator().manual_seed(seed + 1)
        maps = torch.where(torch.rand(maps.shape, generator=generator) < zeros, 0.0, maps)
    return maps / maps.flatten(1).amax(1).view(-1, 1, 1)


def test_completeness_sees_the_same_difference():
    """Quantus's Completeness returns ``sum(a) == f(x) - f(b)`` exactly (a float equality,
    False for any map not built to the bit); given an ``output_func`` that records its
    argument, it shows the f(x) - f(b) it computed: on one-channel images the same as
    explain's, on the logits, with Quantus's "black" baseline (each image's minimum) given
    to explain as a tensor. On colour images with one map per image Quantus replaces only
    the first H x W of the C x H x W values (its features are the map's pixels, indexed
    into the flattened image): the red channel alone."""
    for channels in (1, 3):
        model, x, maps = tiny_model(channels=channels), images(channels=channels), tie_free_maps(signed=True)
        y = predicted(model, x)
        black = x.amin((1, 2, 3), keepdim=True)
        ours = metrics.completeness(model, x, maps, y, baseline=black)
        seen = []

        def record(difference):
            seen.append(np.asarray(difference, dtype=np.float64))
            return difference

        found = run_quantus(quantus.Completeness(output_func=record, normalise=False, disable_warnings=True),
                            model=model, x_batch=np_(x), y_batch=np_(y), a_batch=a_batch(maps))
        assert not any(found) and not ours.extra["complete"].any()
        if channels == 1:
            assert_close("Completeness f(x) - f(black)", np_(ours.extra["difference"]), np.concatenate(seen), EXACT)
            assert_close("Completeness sum(a)", np_(ours.extra["sum"]), np_(maps.flatten(1).sum(1)), 1e-5)
        else:
            red_only = torch.cat([black.expand(-1, 1, SIZE, SIZE), x[:, 1:]], 1)
            theirs = metrics.completeness(model, x, maps, y, baseline=red_only).extra["difference"]
            assert_close("Completeness f(x) - f(red channel black)", np_(theirs), np.concatenate(seen), EXACT)
            assert float((theirs - ours.extra["difference"]).abs().max()) > 1
    # A map that is complete by construction: the difference spread evenly over the pixels.
    even = (ours.extra["difference"] / SIZE**2).view(-1, 1, 1).expand(-1, SIZE, SIZE)
    again = metrics.completeness(model, x, even, y, baseline=black)
    assert again.extra["complete"].all() and (again.values < 1e-4).all()


class MaskedInput(nn.Module):
    """A model that never sees the left third of its input: those pixels do not matter."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.register_buffer("keep", (torch.arange(SIZE) >= SIZE // 3).float().view(1, 1, 1, SIZE))

    def forward(self, x):
        return self.model(x * self.keep)


def test_non_sensitivity():
    """One-channel images, so that Quantus's features (input values) are explain's pixels;
    one pixel per step (Quantus 0.6's only correct ``features_in_step``), Quantus's
    "black" baseline, the softmax probability and eps = 1e-5 on both sides, and maps
    reaching 1 each (Quantus scales by the batch's largest). The model ignores the left
    third of the image and some pixels have zero relevance: both kinds of miss occur."""
    model = MaskedInput(tiny_model(channels=1)).eval()
    x = images(channels=1)
    maps = equal_peak_maps(zeros=0.3)
    y = predicted(model, x)
    ours = metrics.non_sensitivity(model, x, maps, y, step=1, baseline=x.amin((1, 2, 3), keepdim=True))
    theirs = run_quantus(quantus.NonSensitivity(features_in_step=1, disable_warnings=True),
                         model=model, x_batch=np_(x), y_batch=np_(y), a_batch=a_batch(maps))
    assert (ours.extra["zero_but_sensitive"] > 0).all() and (ours.extra["relevant_but_insensitive"] > 0).all()
    assert_close("NonSensitivity", np_(ours.values), theirs, 0)


@pytest.mark.parametrize("method", ["saliency", "inputxgrad"])
def test_input_invariance(method):
    """An unpadded first convolution, where Quantus's bias shift (one output value of a
    constant input) is exact: the shifted maps Quantus computes equal explain's, and so do
    the verdicts (gradients are invariant, gradient x input is not). Quantus compares
    within numpy's isclose(atol=1e-4)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(3), nn.Flatten(),
                          nn.Linear(72, CLASSES)).eval()
    x = images()
    make = {"saliency": lambda m: explain.Saliency(m, clip_percentile=100.0),
            "inputxgrad": lambda m: explain.InputXGradient(m, clip_percentile=100.0)}[method]
    explanation = make(model)(x)
    shifted = []

    def explain_func(model, inputs, targets, **kwargs):
        maps = quantus_explain_func(make)(model, inputs, targets)
        shifted.append(maps[:, 0])
        return maps

    ours = metrics.input_invariance(make(model), x, explanation)
    theirs = run_quantus(quantus.InputInvariance(disable_warnings=True), model=model, x_batch=np_(x),
                         y_batch=np_(explanation.targets), a_batch=a_batch(explanation.maps),
                         explain_func=explain_func)
    assert_close("InputInvariance", np_(ours.values), np.asarray(theirs, dtype=np.float64), 0)
    assert ours.values.all() == (method == "saliency")
    assert (ours.extra["output_change"] < 1e-5).all()
    # Quantus's shifted maps are explain's (explain compares them with the given maps).
    moved = np.abs(np.concatenate(shifted) - np_(explanation.maps)).reshape(len(x), -1).max(1)
    assert_close("InputInvariance: largest change of a map", np_(ours.extra["difference"]), moved, 1e-5)


def test_effective_complexity():
    maps = equal_peak_maps(n=6, zeros=0.2) ** 3
    maps[0, 0, :4] = torch.tensor([1e-6, 2e-5, 1e-5, 9e-6])  # at the threshold
    ours = metrics.effective_complexity(maps).values
    theirs = concentration(quantus.EffectiveComplexity(disable_warnings=True), maps)
    assert_close("EffectiveComplexity", np_(ours), theirs, 0)


def dataset_level(metric, model, x, maps):
    y = predicted(model, x)
    return np.asarray(run_quantus(metric, model=model, x_batch=np_(x), y_batch=np_(y), a_batch=a_batch(maps)),
                      dtype=np.float64)


def test_sufficiency():
    """Across 10 images whose maps fall in three clusters (a prototype each, plus noise):
    the standardised distances of the maps, scaled by their largest, at most 0.6 make
    neighbours; the share of the neighbours with the same predicted class. Where an image
    has none (the last, a map of its own), Quantus gives 0 and explain NaN."""
    model, x = tiny_model(), images(n=10)
    generator = torch.Generator().manual_seed(7)
    prototypes = torch.rand(3, SIZE, SIZE, generator=generator)
    cluster = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2, 2])
    maps = prototypes[cluster] + 0.05 * torch.rand(10, SIZE, SIZE, generator=generator)
    maps[-1] = torch.rand(SIZE, SIZE, generator=generator)
    ours = metrics.sufficiency(model, x, maps, predicted(model, x))
    theirs = dataset_level(quantus.Sufficiency(disable_warnings=True), model, x, maps)
    values = np_(ours.values)
    assert np.isnan(values[-1]) and not np.isnan(values[:-1]).any() and 0 < values[:-1].mean() < 1
    assert_close("Sufficiency", np.nan_to_num(values, nan=0.0), theirs, 1e-6)
    assert ours.extra["neighbours"][-1] == 0 and (ours.extra["neighbours"][:-1] > 0).all()


def test_consistency_with_quantus_discretisation():
    """Quantus's default ``top_n_sign``: the signs of the first five values of the
    flattened map (|a|, scaled by the batch's largest), hashed; given the same labels as
    ``discretise``, explain's share agrees (NaN where Quantus gives 0)."""
    model = tiny_model()
    x = images(n=10)
    maps = tie_free_maps(n=10)
    maps.view(10, -1)[:, :5] *= (torch.arange(10)[:, None] % 3 == 0) | (torch.arange(5) % 2 == 1)

    def top_n_sign(maps):
        return torch.tensor([hash(bytes(np.sign(np_(row.abs()).astype(np.float32))[:5])) for row in maps.flatten(1)])

    ours = metrics.consistency(model, x, maps, predicted(model, x), discretise=top_n_sign)
    theirs = dataset_level(quantus.Consistency(disable_warnings=True), model, x, maps)
    assert_close("Consistency", np.nan_to_num(np_(ours.values), nan=0.0), theirs, 1e-6)


def test_focus_on_the_same_mosaics():
    """explain builds each image's mosaic (``metrics.mosaics``) and explains it; Quantus's
    Focus, given those mosaics, their maps and which quadrants show the class, scores the
    same share of positive relevance."""
    model = tiny_model()
    x = images(n=6, size=16)
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    explainer = saliency(model)
    explanation = explainer(x, labels)
    ours = metrics.focus(explainer, x, explanation, labels=labels, seed=4)
    made, shows, valid = metrics.mosaics(x, labels, labels, seed=4)
    assert valid.all() and (shows.sum(1) == 2).all()
    maps = explainer(made, labels).maps
    theirs = run_quantus(quantus.Focus(disable_warnings=True), model=model, x_batch=np_(made), y_batch=np_(labels),
                         a_batch=a_batch(maps), custom_batch=[list(map(bool, row)) for row in np_(shows)])
    assert_close("Focus", np_(ours.values), np.asarray(theirs, dtype=np.float64), 1e-6)


@pytest.mark.parametrize("ties", [False, True])
def test_auc(ties):
    """scikit-learn's ROC AUC (Quantus) against explain's closed form from ranks; with ties
    (a map rounded to 4 levels), a tie counts half in both."""
    maps = tie_free_maps(n=6, signed=True)
    if ties:
        maps = (maps * 2).round() / 2
    masks = regions(maps)
    ours = metrics.auc(maps, masks).values
    theirs = localisation(quantus.AUC(disable_warnings=True), maps, masks)
    assert_close("AUC", np_(ours), theirs, 1e-6)


def test_attribution_localisation():
    """Quantus's default takes |a| (explain's ``magnitude=True``); with ``abs=False`` and
    ``positive_attributions=True`` it is Kohlbrenner et al.'s positive-relevance ratio,
    explain's default. Its ``weighted`` multiplies by the box's size over that of
    ``x_batch[2:]`` (the batch less two images), where explain divides by the box's share
    of one image."""
    maps = tie_free_maps(n=6, signed=True)
    masks = regions(maps)
    ours = metrics.attribution_localisation(maps, masks)
    positive = quantus.AttributionLocalisation(abs=False, positive_attributions=True, disable_warnings=True)
    assert_close("AttributionLocalisation (positive)", np_(ours.values), localisation(positive, maps, masks), 1e-6)
    magnitude = metrics.attribution_localisation(maps, masks, magnitude=True).values
    assert_close("AttributionLocalisation (|a|)", np_(magnitude),
                 localisation(quantus.AttributionLocalisation(disable_warnings=True), maps, masks), 1e-6)
    weighted = localisation(quantus.AttributionLocalisation(weighted=True, disable_warnings=True), maps, masks)
    inside = np_(masks.flatten(1).sum(1)).astype(np.float64)
    batch_less_two = (len(maps) - 2) * 3 * SIZE * SIZE  # localisation() passes 3-channel images
    assert_close("AttributionLocalisation (Quantus's weighting)", np_(magnitude) * inside / batch_less_two,
                 weighted, 1e-6)
    ours_weighted = metrics.attribution_localisation(maps, masks, weighted=True).values
    assert_close("attribution_localisation(weighted=True)", np_(ours_weighted),
                 np_(ours.values) * SIZE * SIZE / inside, 1e-5)


class RawGradients:
    """An explainer whose maps are the raw gradient summed over the channels: signed and of
    any scale (explain's own explainers scale each map)."""

    def __init__(self, model):
        self.model = model

    def __call__(self, images, targets=None, **options):
        images = images.detach().clone().requires_grad_(True)
        output = self.model(images)
        targets = output.argmax(1) if targets is None else torch.as_tensor(targets)
        grad, = torch.autograd.grad(output.gather(1, targets[:, None]).sum(), images)
        return explain.Explanation(maps=grad.sum(1).detach() * 37.0, raw_layers={}, logits=output.detach(),
                                   targets=targets, method="raw-gradients", signed=True)


def test_max_sensitivity_on_maps_of_any_scale():
    """Quantus's MaxSensitivity (HEAD and 0.6 alike: normalise=False, abs=False by default)
    is explain's ``sensitivity``: ||Phi(x + d) - Phi(x)|| / ||Phi(x)||, the maximum over the
    draws. The earlier tests use maps scaled to a maximum of 1; here signed maps 37 times
    the raw gradient, the same given explain's noise."""
    model, x = tiny_model(), images()
    explainer = RecordingExplainer(RawGradients(model))
    explanation = explainer.explainer(x)
    n_samples = 5
    ours = metrics.sensitivity(explainer, x, explanation, n_samples=n_samples)
    noisy = torch.cat(explainer.calls).view(len(x), n_samples, -1)

    def explain_func(model, inputs, targets, **kwargs):
        inputs = torch.as_tensor(np.asarray(inputs))
        return np_(RawGradients(model)(inputs, torch.as_tensor(np.asarray(targets)).long()).maps[:, None])

    metric = quantus.MaxSensitivity(nr_samples=n_samples, perturb_func=noise_from(noisy), disable_warnings=True)
    theirs = run_quantus(metric, model=model, x_batch=np_(x), y_batch=np_(explanation.targets),
                         a_batch=a_batch(explanation.maps), explain_func=explain_func)
    assert_close("MaxSensitivity (maps of any scale)", np_(ours.values), theirs, 1e-5)
    assert float(explanation.maps.abs().amax()) > 2  # not scaled to 1
