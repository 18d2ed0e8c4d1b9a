"""The metrics against values worked out by hand on tiny hand-built models, and their
behaviour: an oracle map beats a random map, which beats an anti-oracle; the sanity check
tells Grad-CAM from an edge detector; the model is left as it was; batching, seeds and
``topk`` do not change the numbers.

Most models here are a bias-free ``Linear`` on the flattened image with hand-set weights,
so the explained logit is a weighted sum of known pixels and every curve is a sum one can
write down. Worked examples use the 4 x 4 one-channel image X = 1..16 in raster order:

     1  2  3  4
     5  6  7  8
     9 10 11 12
    13 14 15 16
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import explain
from conftest import ModelState, hook_count
from explain import Explanation, metrics
from explain.hooks import preserved_state
from explain.metrics import registry
from explain.metrics.base import draws
from explain.metrics.faithfulness.perturbing import random_subsets
from explain.metrics.faithfulness.random_removal import square_masks
from explain.metrics.randomisation import histogram_entropy, spearman, ssim
from explain.metrics.randomisation.cascade import smoothed_maps
from explain.metrics.robustness.continuity import translations

X = torch.arange(1.0, 17.0).view(1, 1, 4, 4)


def linear(weights, bias=None) -> nn.Module:
    """A model whose class-c logit is sum(weights[c] * image) (+ bias[c]); weights (K, C, H, W)."""
    weights = torch.as_tensor(weights, dtype=torch.float32)
    model = nn.Sequential(nn.Flatten(), nn.Linear(weights[0].numel(), weights.shape[0], bias=bias is not None))
    with torch.no_grad():
        model[1].weight.copy_(weights.reshape(weights.shape[0], -1))
        if bias is not None:
            model[1].bias.copy_(torch.as_tensor(bias, dtype=torch.float32))
    return model.eval()


def region_model(pixels, shape=(1, 4, 4), classes=2, bias=None) -> nn.Module:
    """Class 0's logit is the sum of the listed pixels (raster index, every channel); the
    other classes' logits are their bias (0 without one)."""
    weights = torch.zeros(classes, *shape)
    weights[0].view(shape[0], -1)[:, list(pixels)] = 1.0
    return linear(weights, bias)


def map_from_order(order, shape=(4, 4)) -> torch.Tensor:
    """A (1, H, W) map that ranks the pixels (raster indices) in ``order``, first = highest."""
    values = torch.empty(shape[0] * shape[1])
    values[list(order)] = torch.arange(len(order), 0, -1, dtype=torch.float32)
    return values.view(1, *shape)


def trapezoid(curve) -> float:
    """The area under ``curve`` by the trapezoid rule on equal intervals of [0, 1]."""
    curve = list(curve)
    return sum((a + b) / 2 for a, b in zip(curve, curve[1:])) / (len(curve) - 1)


def sigmoid(z: float) -> float:
    """The softmax probability of a class whose logit exceeds the only other one by z."""
    return math.exp(z) / (math.exp(z) + 1.0)


def close(actual, expected, tol=1e-5):
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float32).flatten(),
                               torch.as_tensor(expected, dtype=torch.float32).flatten(), rtol=tol, atol=tol)


class MapExplainer(explain.Explainer):
    """An explainer whose maps are ``fn(images, targets)``, whatever the model; it records
    every batch it is called on."""

    def __init__(self, model, fn, fail_on_call=None):
        super().__init__(model)
        self.fn, self.fail_on_call, self.calls = fn, fail_on_call, []

    def _explain(self, images, targets=None, *, topk=None):
        with preserved_state(self.model), torch.no_grad():  # as explainers run the model
            logits = self.model(images)
        targets = logits.argmax(1) if targets is None else torch.as_tensor(targets).expand(len(images))
        self.calls.append((images.clone(), targets.clone()))
        if self.fail_on_call is not None and len(self.calls) == self.fail_on_call:
            raise RuntimeError("explainer failed")
        maps = self.fn(images, targets)
        return Explanation(maps=maps, raw_layers={"input": maps[:, None]}, logits=logits, targets=targets,
                           method="test")


def sobel(images, targets=None):
    """Edge strength of the channel mean: a map that ignores the model and the class."""
    gray = images.mean(1, keepdim=True)
    kx = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]])[None, None]
    gx, gy = F.conv2d(gray, kx, padding=1), F.conv2d(gray, kx.transpose(-1, -2), padding=1)
    return (gx ** 2 + gy ** 2).sqrt()[:, 0]


def channel_of_target(images, targets):
    return images[torch.arange(len(images)), targets]


# --- deletion, insertion, pixel-flipping -----------------------------------------------

# Class 0 reads the top-left 2 x 2 square, R = pixels {0, 1, 4, 5} with X = 1, 2, 5, 6: 14.
R = [0, 1, 4, 5]
# Deleted in this order: pixel 5 (6, in R), 0 (1, in R), 15 (outside), 1 (2, in R), 4 (5, in R), ...
ORDER = [5, 0, 15, 1, 4, 2, 3, 6, 7, 8, 9, 10, 11, 12, 13, 14]
# The logit after deleting k pixels (baseline 0), k = 0..16.
DELETION_LOGITS = [14, 8, 7, 7, 5] + [0] * 12


def test_deletion_step_one_logit_by_hand():
    model = region_model(R)
    result = metrics.deletion(model, X, map_from_order(ORDER), torch.tensor([0]), step=1, score="logit")
    close(result.curves["deletion"], DELETION_LOGITS)
    # ((14 + 8) + (8 + 7) + (7 + 7) + (7 + 5) + (5 + 0)) / 2 / 16 = 34 / 16
    assert trapezoid(DELETION_LOGITS) == 34 / 16
    close(result.values, [34 / 16])
    close(result.steps, [k / 16 for k in range(17)])
    assert result.higher_is_better is False and result.metric == "deletion"


def test_deletion_probability_and_a_number_as_baseline():
    # Deleted pixels become 0.5: deleting pixel p of R takes X_p - 0.5 from the logit.
    model = region_model(R)
    logits = [14, 14 - 5.5, 14 - 5.5 - 0.5, 8, 8 - 1.5, 6.5 - 4.5] + [2.0] * 11
    result = metrics.deletion(model, X, map_from_order(ORDER), torch.tensor([0]), step=1, baseline=0.5,
                              score="probability")
    # Class 1's logit is 0, so the probability of class 0 is e^l / (e^l + 1).
    probabilities = [sigmoid(l) for l in logits]
    close(result.curves["deletion"], probabilities)
    close(result.values, [trapezoid(probabilities)])


@pytest.mark.parametrize("step, counts", [
    (3, [0, 3, 6, 9, 12, 15, 16]),  # 16 is not a multiple of 3: the last step deletes one pixel
    (4, [0, 4, 8, 12, 16]),
    (0.25, [0, 4, 8, 12, 16]),  # a quarter of the image
    (None, [0, 4, 8, 12, 16]),  # one row's worth
])
def test_deletion_steps_of_several_pixels(step, counts):
    model = region_model(R)
    result = metrics.deletion(model, X, map_from_order(ORDER), torch.tensor([0]), step=step, score="logit")
    expected = [DELETION_LOGITS[k] for k in counts]
    close(result.curves["deletion"], expected)
    close(result.steps, [k / 16 for k in counts])
    # The paper's code: the trapezoid rule over equal intervals, the partial last one included.
    close(result.values, [trapezoid(expected)])
    if step == 3:
        close(result.values, [(14 + 7) / 2 / 6 + (7 + 0) / 2 / 6])


def test_deletion_ties_are_deleted_in_raster_order():
    model = region_model(R)
    result = metrics.deletion(model, X, torch.ones(1, 4, 4), torch.tensor([0]), step=1, score="logit")
    # Pixels 0, 1 (both in R), 2, 3 (outside), 4, 5 (in R), then nothing in R is left.
    close(result.curves["deletion"], [14, 13, 11, 11, 11, 6, 0] + [0] * 10)


def test_deletion_of_three_channels_deletes_every_channel():
    # Channel c of pixel p holds (c + 1) * X_p; class 0 reads pixel 5 in channels 0 and 2.
    images = X.repeat(1, 3, 1, 1) * torch.tensor([1.0, 2.0, 3.0]).view(1, 3, 1, 1)
    weights = torch.zeros(2, 3, 4, 4)
    weights[0, 0].view(-1)[5] = 1.0
    weights[0, 2].view(-1)[5] = 2.0
    model = linear(weights)
    order = [0, 5] + [p for p in range(16) if p not in (0, 5)]
    result = metrics.pixel_flipping(model, images, map_from_order(order), torch.tensor([0]), step=1)
    # f(x) = 6 + 2 * 18 = 42, until pixel 5 (all three channels) is replaced by 0 at k = 2.
    close(result.curves["pixel-flipping"], [42, 42] + [0] * 15)
    close(result.values, [trapezoid([42, 42] + [0] * 15)])
    assert result.higher_is_better is False


def test_pixel_flipping_defaults_to_the_logit_and_one_percent_steps():
    model = region_model(R, bias=[0.0, 3.0])
    # 1 % of 16 pixels rounds to 0: one pixel per step.
    result = metrics.pixel_flipping(model, X, map_from_order(ORDER), torch.tensor([0]))
    close(result.curves["pixel-flipping"], DELETION_LOGITS)
    result = metrics.pixel_flipping(model, X, map_from_order(ORDER), torch.tensor([0]), step=8, baseline=1.0,
                                    score="probability")
    # 8 pixels (5, 0, 15, 1, 4, 2, 3, 6) take R to 1 each: logit 4; all 16 deleted: logit 4.
    close(result.curves["pixel-flipping"], [sigmoid(14 - 3), sigmoid(4 - 3), sigmoid(4 - 3)])


def gaussian_blur_by_hand(image: np.ndarray, size: int = 11, sigma: float = 5.0) -> np.ndarray:
    """A 2-D image under a normalised size x size Gaussian, reflection at the borders (as
    torchvision pads)."""
    half = size // 2
    d = np.arange(-half, half + 1)
    k = np.exp(-(d ** 2) / (2 * sigma ** 2))
    kernel = np.outer(k, k) / np.outer(k, k).sum()
    padded = np.pad(image, half, mode="reflect")
    out = np.empty_like(image)
    for i in range(image.shape[0]):
        for j in range(image.shape[1]):
            out[i, j] = (kernel * padded[i:i + size, j:j + size]).sum()
    return out


def test_insertion_onto_the_blurred_image_by_hand():
    image = torch.rand(1, 1, 8, 8)
    region = [9, 18, 27, 50]
    model = region_model(region, shape=(1, 8, 8), bias=[0.0, 1.0])
    order = torch.randperm(64).tolist()
    saliency = map_from_order(order, (8, 8))
    substrate = gaussian_blur_by_hand(image[0, 0].double().numpy()).reshape(-1)
    x = image.view(-1).double().numpy()
    position = {p: i for i, p in enumerate(order)}
    # After k insertions a pixel of the region holds the image's value if it is among the
    # k first, else the blurred value.
    logits = [sum(x[p] if position[p] < k else substrate[p] for p in region) for k in range(65)]
    result = metrics.insertion(model, image, saliency, torch.tensor([0]), step=1, score="logit")
    close(result.curves["insertion"], logits)
    close(result.values, [trapezoid(logits)])
    assert result.higher_is_better is True
    # Eight pixels a step, the probability (class 1's logit is 1).
    result = metrics.insertion(model, image, saliency, torch.tensor([0]), step=8)
    probabilities = [sigmoid(logits[k] - 1) for k in range(0, 65, 8)]
    close(result.curves["insertion"], probabilities)
    close(result.values, [trapezoid(probabilities)])


def test_insertion_of_a_constant_image_is_flat():
    # Blurring a constant image (reflection at the borders) gives the same image back.
    model = region_model(R)
    result = metrics.insertion(model, torch.full((1, 1, 4, 4), 0.25), map_from_order(ORDER), torch.tensor([0]),
                               step=2, blur_kernel=3, blur_sigma=1.0, score="logit")
    close(result.curves["insertion"], [1.0] * 9)
    close(result.values, [1.0])


# --- oracle, random and anti-oracle maps ------------------------------------------------


def checkerboard_model() -> nn.Module:
    """Class 0's logit is the checkerboard pattern's strength in the 8 x 8 block at rows and
    columns 8..15 of a 3 x 32 x 32 image, over 16, minus 3; class 1's logit is 0. Zeros and
    blur both wipe the pattern out."""
    conv = nn.Conv2d(3, 1, 8, stride=8, bias=False)
    head = nn.Linear(16, 2)
    sign = (-1.0) ** (torch.arange(8)[:, None] + torch.arange(8)[None, :])
    with torch.no_grad():
        conv.weight.copy_(sign.expand(1, 3, 8, 8))
        head.weight.zero_()
        head.weight[0, 5] = 1 / 16  # block (1, 1) of the 4 x 4 grid
        head.bias.copy_(torch.tensor([-3.0, 0.0]))
    return nn.Sequential(conv, nn.Flatten(), head).eval()


def test_oracle_beats_random_beats_anti_oracle():
    n = 2
    model = checkerboard_model()
    images = 0.2 * torch.rand(n, 3, 32, 32)
    images[:, :, 8:16, 8:16] += 0.5 * (-1.0) ** (torch.arange(8)[:, None] + torch.arange(8)[None, :])
    inside = torch.zeros(32, 32)
    inside[8:16, 8:16] = 1.0
    # The region first, then the rest in a fixed order (small decreasing values).
    oracle = (inside + 0.5 * torch.linspace(1, 0, 1024).view(32, 32)).expand(n, 32, 32)
    anti = -oracle
    randoms = [torch.rand(n, 32, 32) for _ in range(5)]
    targets = torch.zeros(n, dtype=torch.long)

    def scores(metric):
        return [metric(model, images, m, targets).values for m in (oracle, *randoms, anti)]

    deletion = scores(metrics.deletion)
    insertion = scores(metrics.insertion)
    for i in range(n):
        d = [float(v[i]) for v in deletion]
        s = [float(v[i]) for v in insertion]
        assert d[0] < min(d[1:-1]) and max(d[1:-1]) < d[-1], d  # lower is better
        assert s[0] > max(s[1:-1]) and min(s[1:-1]) > s[-1], s  # higher is better
    # Deleting the oracle's first 64 pixels (two rows' worth) removes the block: logit -3.
    curve = metrics.deletion(model, images, oracle, targets).curves["deletion"]
    close(curve[:, 2:], torch.full((n, 31), sigmoid(-3.0)))


# --- average drop, increase in confidence, average gain ---------------------------------


def test_average_drop_increase_and_gain_by_hand():
    # Class 0's logit is x0 - x1, class 1's is 0: p = e^(x0 - x1) / (e^(x0 - x1) + 1).
    model = linear([[[[1.0, -1.0]]], [[[0.0, 0.0]]]])
    ln3 = math.log(3.0)
    images = torch.tensor([[ln3, 0.0], [ln3, ln3], [ln3, 0.0]]).view(3, 1, 1, 2)
    maps = torch.tensor([
        [0.5, 1.0],  # drop: x' = (ln 3 / 2, 0); Y = 3/4, O = sqrt 3 / (sqrt 3 + 1)
        [1.0, 0.0],  # increase: x' = (ln 3, 0); Y = 1/2, O = 3/4
        [1.0, -0.5],  # unchanged: the negative part counts as 0, x' = x; Y = O = 3/4
    ]).view(3, 1, 2)
    result = metrics.average_drop(model, images, maps, torch.zeros(3, dtype=torch.long))
    y = [0.75, 0.5, 0.75]
    o = [math.sqrt(3) / (math.sqrt(3) + 1), 0.75, 0.75]
    close(result.extra["probability"], y)
    close(result.extra["masked_probability"], o)
    close(result.values, [100 * (y[0] - o[0]) / y[0], 0.0, 0.0], tol=1e-4)
    close(result.extra["increase"], [0.0, 100.0, 0.0])
    close(result.extra["gain"], [0.0, 100 * (0.75 - 0.5) / (1 - 0.5), 0.0], tol=1e-4)
    assert result.higher_is_better is False
    # Baseline 1: an empty map gives x' = (1, 1), logit 0, O = 1/2 for Y = 3/4: a third lost.
    result = metrics.average_drop(model, images[:1], torch.zeros(1, 1, 2), torch.tensor([0]), baseline=1.0)
    close(result.values, [100 / 3], tol=1e-4)
    close(result.extra["gain"], [0.0])


# --- region perturbation ----------------------------------------------------------------


def test_region_perturbation_by_hand_patches_dividing_the_image():
    # f = the sum of every pixel; patches of 2 x 2 ranked by summed relevance:
    # BL (12) before TL (10, one bright pixel) before BR (5) before TR (4).
    model = linear(torch.ones(2, 1, 4, 4) * torch.tensor([1.0, 0.0]).view(2, 1, 1, 1))
    saliency = torch.tensor([[[10.0, 0, 1, 1], [0, 0, 1, 1], [3, 3, 2, 2], [3, 3, 2, -1]]])
    result = metrics.region_perturbation(model, X, saliency, torch.tensor([0]), patch_size=2, baseline=1.0)
    # Replacing a patch by 1s takes sum(X) - 4 from f: BL 46 - 4, TL 14 - 4, BR 54 - 4, TR 22 - 4.
    drops = [0, 42, 52, 102, 120]
    close(result.curves["region-perturbation"], drops)
    close(result.values, [sum(drops) / 5])  # AOPC: the mean over k = 0..L, k = 0 included
    close(result.steps, [0, 1, 2, 3, 4])
    assert result.higher_is_better is True
    result = metrics.region_perturbation(model, X, saliency, torch.tensor([0]), patch_size=2, baseline=1.0, regions=2)
    close(result.curves["region-perturbation"], [0, 42, 52])
    close(result.values, [(0 + 42 + 52) / 3])


def test_region_perturbation_by_hand_patches_cut_at_the_border():
    # 5 x 5, X = 1..25; 2 x 2 patches on a 3 x 3 grid, the last row and column cut to one pixel.
    image = torch.arange(1.0, 26.0).view(1, 1, 5, 5)
    model = linear(torch.ones(2, 1, 5, 5) * torch.tensor([1.0, 0.0]).view(2, 1, 1, 1))
    saliency = torch.zeros(1, 5, 5)
    saliency[0, 4, 4] = 5.0  # the 1 x 1 corner patch: sum 5
    saliency[0, 0:2, 4] = 2.0  # the 2 x 1 patch at the right: sum 4
    saliency[0, 0:2, 0:2] = 0.5  # the top-left patch: sum 2
    result = metrics.region_perturbation(model, image, saliency, torch.tensor([0]), patch_size=2, baseline=0.0,
                                         regions=3)
    # Removed: 25; then 5 + 10; then 1 + 2 + 6 + 7.
    drops = [0, 25, 40, 56]
    close(result.curves["region-perturbation"], drops)
    close(result.values, [sum(drops) / 4])
    # More regions than patches: all nine, the last leaving nothing (f = 0, drop = 325).
    result = metrics.region_perturbation(model, image, saliency, torch.tensor([0]), patch_size=2, baseline=0.0)
    assert result.curves["region-perturbation"].shape == (1, 10)
    close(result.curves["region-perturbation"][0, -1], 325)


def test_region_perturbation_noise_is_seeded():
    model = linear(torch.randn(3, 1, 4, 4))
    saliency = torch.rand(1, 4, 4)
    run = lambda **kw: metrics.region_perturbation(model, X, saliency, torch.tensor([1]), patch_size=2, **kw).values
    assert torch.equal(run(), run())
    assert torch.equal(run(seed=3), run(seed=3))
    assert not torch.equal(run(seed=3), run(seed=4))


# --- IROF -------------------------------------------------------------------------------


def test_irof_by_hand():
    # X: the left half 4, the top right 2, the bottom right 0; mean 2.5. f = the sum of
    # the left half and the top right (the bottom right is not read).
    image = torch.tensor([[4.0, 4, 2, 2], [4, 4, 2, 2], [4, 4, 0, 0], [4, 4, 0, 0]]).view(1, 1, 4, 4)
    weights = torch.zeros(2, 1, 4, 4)
    weights[0, 0, :, :2] = 1.0
    weights[0, 0, :2, 2:] = 1.0
    model = linear(weights)
    images = image.repeat(2, 1, 1, 1)
    # Image 0: three segments, left (0), top right (1), bottom right (2). Image 1: two,
    # left (0) and right (1).
    segments = torch.tensor([[[0, 0, 1, 1], [0, 0, 1, 1], [0, 0, 2, 2], [0, 0, 2, 2]],
                             [[0, 0, 1, 1], [0, 0, 1, 1], [0, 0, 1, 1], [0, 0, 1, 1]]])
    saliency = torch.tensor([[0.5, 0.5, 0.9, 0.9], [0.5, 0.5, 0.9, 0.9], [0.5, 0.5, 0.1, 0.1], [0.5, 0.5, 0.1, 0.1]])
    maps = torch.stack([saliency, saliency.clone()])
    maps[1, :, :2] = 0.2
    result = metrics.irof(model, images, maps, torch.tensor([0, 0]), segments=segments, score="logit")
    # Image 0, by mean relevance: top right (0.9; the left's sum 4 beats its 3.6, its mean
    # does not), left, bottom right. f: 40; top right at 2.5 -> 32 + 10 = 42; left at 2.5
    # -> 20 + 10 = 30; bottom right -> 30.
    # Image 1: right (0.5) before left (0.2): 40 -> 32 + 10 = 42 -> 20 + 10 = 30.
    relative = [[1.0, 42 / 40, 30 / 40, 30 / 40], [1.0, 42 / 40, 30 / 40, 30 / 40]]
    close(result.curves["irof"], relative)
    close(result.values, [1 - trapezoid(relative[0]), 1 - trapezoid(relative[1][:3])])
    close(result.values, [1 - (1.025 + 0.9 + 0.75) / 3, 1 - (1.025 + 0.9) / 2])
    assert result.higher_is_better is True


def test_irof_segment_ids_need_not_be_contiguous():
    model = linear(torch.randn(2, 1, 4, 4))
    saliency = torch.rand(1, 4, 4)
    segments = torch.tensor([[[0, 0, 1, 1], [0, 0, 1, 1], [0, 0, 2, 2], [0, 0, 2, 2]]])
    renamed = torch.tensor([0, 5, 9])[segments]
    a = metrics.irof(model, X, saliency, torch.tensor([0]), segments=segments)
    b = metrics.irof(model, X, saliency, torch.tensor([0]), segments=renamed)
    close(a.values, b.values)
    close(b.curves["irof"][0, :4], a.curves["irof"][0])


def test_irof_rejects_segments_that_do_not_match_the_images():
    model = linear(torch.randn(2, 1, 4, 4))
    images, maps = X.repeat(4, 1, 1, 1), torch.rand(4, 4, 4)
    segments = torch.zeros(2, 4, 4, dtype=torch.long)  # two segment maps for four images
    with pytest.raises(ValueError, match="one per image"):
        metrics.irof(model, images, maps, torch.zeros(4, dtype=torch.long), segments=segments)
    with pytest.raises(ValueError, match="one per image"):
        metrics.irof(model, images, maps, torch.zeros(4, dtype=torch.long), segments=torch.zeros(4, 3, 4))


# --- ROAD -------------------------------------------------------------------------------

# 10 x 10, one channel: the first row R (10 pixels = 10 %) holds 1, the rest 0.2. Class 0's
# logit is the sum of R, class 1's is 5. Removing all of R leaves only 0.2s to impute from,
# so R is imputed as 0.2 and the logit is 2; removing pixels outside R changes nothing.
ROAD_IMAGE = torch.full((1, 1, 10, 10), 0.2)
ROAD_IMAGE[..., 0, :] = 1.0


def road_setup():
    model = region_model(range(10), shape=(1, 10, 10), bias=[0.0, 5.0])
    saliency = 0.5 * torch.rand(1, 10, 10)
    saliency[0, 0] += 1.0  # R first
    return model, saliency


def test_road_by_hand():
    model, saliency = road_setup()
    result = metrics.road(model, ROAD_IMAGE, saliency, torch.tensor([0]), percentages=(10, 50, 90), noise=0.0)
    morf, lerf = sigmoid(2.0 - 5.0), sigmoid(10.0 - 5.0)
    close(result.curves["morf"], [morf] * 3)
    close(result.curves["lerf"], [lerf] * 3)
    close(result.curves["morf_accuracy"], [0.0] * 3)
    close(result.curves["lerf_accuracy"], [1.0] * 3)
    close(result.extra["morf"], [morf])
    close(result.extra["lerf_accuracy"], [1.0])
    close(result.values, [lerf - morf])
    close(result.steps, [10, 50, 90])
    assert result.higher_is_better is True


def test_road_on_a_constant_image_keeps_the_probability():
    # The imputation of a constant image is the constant: nothing changes, whatever the order.
    model = linear(torch.randn(3, 1, 8, 8))
    image = torch.full((1, 1, 8, 8), 0.3)
    p = model(image).softmax(1)[0, 2].item()
    result = metrics.road(model, image, torch.rand(1, 8, 8), torch.tensor([2]), percentages=(25, 75), noise=0.0)
    close(result.curves["morf"], [p, p])
    close(result.curves["lerf"], [p, p])
    close(result.values, [0.0])


def test_road_noise_is_seeded_per_image():
    model, saliency = road_setup()
    images = torch.cat([ROAD_IMAGE, ROAD_IMAGE.flip(-2)])
    maps = torch.cat([saliency, saliency.flip(-2)])
    targets = torch.tensor([0, 0])
    run = lambda **kw: metrics.road(model, images, maps, targets, percentages=(10, 50), noise=0.1, **kw)
    a = run()
    assert torch.equal(a.values, run().values)  # the same seed, the same values
    for name in ("morf", "lerf"):  # nor the batch (up to the imputation's convergence)
        torch.testing.assert_close(a.curves[name], run(batch_size=1).curves[name], rtol=0, atol=1e-6)
    assert not torch.equal(a.curves["morf"], run(seed=1).curves["morf"])
    # The noise moves the imputed R away from 0.2, so MoRF is no longer exactly sigmoid(-3).
    assert not torch.allclose(a.curves["morf"][0], torch.tensor(sigmoid(-3.0)))


@pytest.mark.parametrize("percentages", [(0, 50), (50, 100), (), (-10,)])
def test_road_rejects_percentages_outside_0_100(percentages):
    model, saliency = road_setup()
    with pytest.raises(ValueError, match="percentages must lie strictly between 0 and 100"):
        metrics.road(model, ROAD_IMAGE, saliency, torch.tensor([0]), percentages=percentages)


# --- sensitivity ------------------------------------------------------------------------


def small_linear(channels=3, size=4, classes=3):
    return linear(torch.randn(classes, channels, size, size))


def test_sensitivity_of_a_constant_map_is_zero():
    explainer = MapExplainer(small_linear(), lambda images, targets: torch.ones(len(images), 4, 4))
    result = metrics.sensitivity(explainer, torch.rand(2, 3, 4, 4))
    close(result.values, [0.0, 0.0])
    close(result.extra["average"], [0.0, 0.0])
    assert result.higher_is_better is False


@pytest.mark.parametrize("normalise", [False, True])
def test_sensitivity_of_the_first_channel_by_hand(normalise):
    # Phi(x) = x's first channel: ||Phi(x + d) - Phi(x)|| = ||d's first channel||.
    explainer = MapExplainer(small_linear(), lambda images, targets: images[:, 0])
    images = torch.rand(2, 3, 4, 4) + 0.5
    explanation = explainer(images)
    explainer.calls.clear()
    radius, n_samples = 0.1, 5
    result = metrics.sensitivity(explainer, images, explanation, radius=radius, n_samples=n_samples, batch_size=3,
                                 normalise=normalise)
    # n_samples noisy copies of each image, in batches of at most 3, for the same targets.
    assert [len(batch) for batch, _ in explainer.calls] == [3, 3, 3, 1]
    noisy = torch.cat([batch for batch, _ in explainer.calls])
    assert torch.equal(torch.cat([t for _, t in explainer.calls]), explanation.targets.repeat_interleave(n_samples))
    noise = (noisy - images.repeat_interleave(n_samples, 0)).view(2, n_samples, 3, 4, 4)
    # Uniform in [-radius, radius] per value: every value within the ball, the ball used.
    assert noise.abs().max() <= radius + 1e-6 and noise.abs().max() > 0.8 * radius
    # Draw s is the same for every image (so a score does not depend on the image's position),
    # and differs between draws.
    torch.testing.assert_close(noise[0], noise[1], rtol=0, atol=1e-6)
    assert len(noise[0].flatten().unique()) == noise[0].numel()
    distances = noise[:, :, 0].flatten(2).norm(dim=2)
    scale = images[:, 0].flatten(1).norm(dim=1, keepdim=True) if normalise else torch.ones(2, 1)
    close(result.values, (distances / scale).amax(1))
    close(result.extra["average"], (distances / scale).mean(1))
    assert (result.values <= radius * math.sqrt(16) / scale[:, 0] + 1e-6).all()


def test_sensitivity_is_seeded_and_batching_does_not_matter():
    explainer = MapExplainer(small_linear(), lambda images, targets: images[:, 0] ** 2)
    images = torch.rand(3, 3, 4, 4)
    explanation = explainer(images)
    run = lambda **kw: metrics.sensitivity(explainer, images, explanation, n_samples=4, **kw)
    a = run()
    assert torch.equal(a.values, run().values) and torch.equal(a.extra["average"], run().extra["average"])
    assert torch.equal(a.values, run(batch_size=1).values)
    assert torch.equal(a.values, run(batch_size=5).values)
    assert not torch.equal(a.values, run(seed=1).values)
    # Without a seed, the caller's random stream: two runs differ.
    assert not torch.equal(run(seed=None).values, run(seed=None).values)
    # The explanation is computed when not given.
    assert torch.equal(metrics.sensitivity(explainer, images, n_samples=4).values, a.values)


def test_an_image_scores_the_same_alone_and_in_a_batch_with_random_draws():
    # Noise depends on the seed and the step, never on the image's position in the batch.
    model, saliency = road_setup()
    other = torch.rand(1, 1, 10, 10)
    pair, maps = torch.cat([other, ROAD_IMAGE]), torch.cat([torch.rand(1, 10, 10), saliency])
    targets = torch.tensor([1, 0])
    alone = metrics.road(model, ROAD_IMAGE, saliency, targets[1:], percentages=(10, 50), noise=0.1)
    second = metrics.road(model, pair, maps, targets, percentages=(10, 50), noise=0.1)
    torch.testing.assert_close(second.curves["morf"][1:], alone.curves["morf"], rtol=0, atol=1e-6)
    alone = metrics.region_perturbation(model, ROAD_IMAGE, saliency, targets[1:], patch_size=2, regions=5)
    second = metrics.region_perturbation(model, pair, maps, targets, patch_size=2, regions=5)
    torch.testing.assert_close(second.values[1:], alone.values)
    explainer = MapExplainer(small_linear(channels=1, size=10), lambda images, targets: images[:, 0] ** 2)
    alone = metrics.sensitivity(explainer, ROAD_IMAGE, n_samples=3)
    second = metrics.sensitivity(explainer, pair, n_samples=3)
    torch.testing.assert_close(second.values[1:], alone.values)


# --- local Lipschitz estimate, continuity, relative stability ------------------------


def recorded_neighbours(explainer, images, n_samples):
    """The neighbours the metric explained, (N, n_samples, ...), from the explainer's calls."""
    return torch.cat([batch for batch, _ in explainer.calls]).view(len(images), n_samples, *images.shape[1:])


def test_local_lipschitz_estimate_of_a_linear_map_by_hand():
    # Phi(x) = 3 x on one-channel images: ||Phi(x) - Phi(x')|| / ||x - x'|| = 3 for every x'.
    explainer = MapExplainer(small_linear(channels=1), lambda images, targets: 3 * images[:, 0])
    images = torch.rand(2, 1, 4, 4)
    result = metrics.local_lipschitz_estimate(explainer, images, n_samples=4)
    close(result.values, [3.0, 3.0])
    close(result.extra["average"], [3.0, 3.0])
    assert result.higher_is_better is False and result.metric == "local-lipschitz-estimate"
    # A constant map does not move: 0.
    constant = MapExplainer(small_linear(), lambda images, targets: torch.ones(len(images), 4, 4))
    close(metrics.local_lipschitz_estimate(constant, torch.rand(2, 3, 4, 4)).values, [0.0, 0.0])


@pytest.mark.parametrize("noise", ["uniform", "normal"])
def test_local_lipschitz_estimate_of_a_square_by_hand(noise):
    # Phi(x) = x_0 ** 2 (the first of three channels): the ratio is ||(x'_0)^2 - x_0^2|| / ||x' - x||,
    # the norm below over all three channels; the largest over the draws.
    explainer = MapExplainer(small_linear(), lambda images, targets: images[:, 0] ** 2)
    images = torch.rand(2, 3, 4, 4)
    explanation = explainer(images)
    explainer.calls.clear()
    result = metrics.local_lipschitz_estimate(explainer, images, explanation, radius=0.3, noise=noise, n_samples=6,
                                              batch_size=5)
    assert [len(batch) for batch, _ in explainer.calls] == [5, 5, 2]
    neighbours = recorded_neighbours(explainer, images, 6)
    offsets = neighbours - images[:, None]
    if noise == "uniform":  # the L-inf ball of radius 0.3, used
        assert offsets.abs().max() <= 0.3 + 1e-6 and offsets.abs().max() > 0.25
    else:  # N(0, 0.3^2): 576 values
        assert abs(offsets.std().item() - 0.3) < 0.05 and abs(offsets.mean().item()) < 0.05
    ratios = ((neighbours[:, :, 0] ** 2 - images[:, None, 0] ** 2).flatten(2).norm(dim=2)
              / offsets.flatten(2).norm(dim=2))
    close(result.values, ratios.amax(1))
    close(result.extra["average"], ratios.mean(1))
    torch.testing.assert_close(offsets[0], offsets[1])  # draw s is the same for every image


def translated_by_hand(image, shift):
    """A loop reference: ``image`` (C, H, W) moved ``shift`` columns right, the rest its minimum."""
    out = torch.full_like(image, image.min().item())
    width = image.shape[-1]
    for column in range(width):
        if 0 <= column - shift < width:
            out[..., column] = image[..., column - shift]
    return out


def test_continuity_by_hand():
    # R(x) = x's first channel: ||R(x) - R(x')||_1 / ||x - x'||_2, with x' the image moved
    # sideways by each shift and filled with the image's minimum.
    explainer = MapExplainer(small_linear(channels=2, size=6), lambda images, targets: images[:, 0])
    images = torch.rand(2, 2, 6, 6)
    explanation = explainer(images)
    explainer.calls.clear()
    result = metrics.continuity(explainer, images, explanation, steps=4)
    # 13 // 4 = 3 pixels a step from -6 + 3: -3, 0 (left out), 3, 6.
    assert translations(6, 4) == [-3, 3, 6]
    close(result.steps, [-3, 3, 6])
    moved = recorded_neighbours(explainer, images, 3)
    expected = []
    for i in range(2):
        row = []
        for j, shift in enumerate((-3, 3, 6)):
            by_hand = translated_by_hand(images[i], shift)
            close(moved[i, j], by_hand, tol=0)
            row.append((by_hand[0] - images[i, 0]).abs().sum() / (by_hand - images[i]).norm())
        expected.append(row)
    close(result.curves["continuity"], expected)
    close(result.values, torch.tensor(expected).amax(1))
    assert result.higher_is_better is False and result.metric == "continuity"
    # A constant map is perfectly continuous; an image the shifts leave unchanged (constant)
    # has no x' != x: NaN.
    constant = MapExplainer(small_linear(channels=2, size=6), lambda images, targets: torch.ones(len(images), 6, 6))
    close(metrics.continuity(constant, images, steps=4).values, [0.0, 0.0])
    flat = metrics.continuity(explainer, torch.full((1, 2, 6, 6), 0.5), steps=4)
    assert flat.values.isnan().all()
    with pytest.raises(ValueError, match=r"steps must be at most 2 \* width \+ 1 = 13"):
        metrics.continuity(explainer, images, steps=14)


def test_relative_stability_of_a_constant_map_is_zero():
    constant = MapExplainer(small_linear(), lambda images, targets: torch.ones(len(images), 4, 4))
    images = torch.rand(2, 3, 4, 4)
    for metric in (metrics.relative_input_stability, metrics.relative_output_stability,
                   metrics.relative_representation_stability):
        options = {"layer": "1"} if metric is metrics.relative_representation_stability else {}
        result = metric(constant, images, n_samples=3, **options)
        close(result.values, [0.0, 0.0])
        assert result.higher_is_better is False


def test_relative_input_stability_by_hand():
    # e = x (one channel, values in [0.5, 1.5): no zeros): the map's relative change is the
    # input's, so RIS = 1 wherever the class holds. A model that reads pixel 0 against a
    # threshold changes its class for some neighbours: they are left out.
    model = linear([[[[1.0] + [0.0] * 15]], [[[0.0] * 16]]], bias=[-1.0, 0.0])  # class 0 iff pixel 0 > 1
    explainer = MapExplainer(model, lambda images, targets: images[:, 0])
    images = torch.rand(3, 1, 4, 4) + 0.5
    images[:, 0, 0, 0] = torch.tensor([1.03, 1.4, 0.6])  # near the threshold, above, below
    explanation = explainer(images)
    explainer.calls.clear()
    result = metrics.relative_input_stability(explainer, images, explanation, radius=0.1, n_samples=8)
    neighbours = recorded_neighbours(explainer, images, 8)
    kept = (neighbours[:, :, 0, 0, 0] > 1) == (images[:, None, 0, 0, 0] > 1)
    close(result.extra["kept"], kept.sum(1))
    assert 0 < kept[0].sum() < 8 and kept[1:].all()
    close(result.values, [1.0, 1.0, 1.0])
    # Another map: e = x ** 2, so (e - e') / e = 1 - (x'/x)^2 against (x - x') / x = 1 - x'/x.
    square = MapExplainer(model, lambda images, targets: images[:, 0] ** 2)
    found = metrics.relative_input_stability(square, images, radius=0.1, n_samples=8)
    ratio = ((1 - (neighbours / images[:, None]) ** 2).flatten(2).norm(dim=2)
             / (1 - neighbours / images[:, None]).flatten(2).norm(dim=2))
    close(found.values, torch.where(kept, ratio, -1.0).amax(1), tol=1e-4)
    # Every neighbour changes the class (class 0 only where pixel 0 is exactly 1): NaN.
    peak = MapExplainer(Peak(), lambda images, targets: images[:, 0])
    flipped = metrics.relative_input_stability(peak, torch.ones(1, 1, 4, 4), n_samples=4)
    assert flipped.values.isnan().all() and flipped.extra["kept"].tolist() == [0.0]


class Peak(nn.Module):
    """Class 0 where pixel 0 is exactly 1, else class 1."""

    def forward(self, x):
        off = (x[:, 0, 0, 0] - 1).abs()
        return torch.stack([-off, torch.full_like(off, -1e-6)], 1)


def test_relative_stability_where_the_map_or_the_input_is_zero_takes_eps():
    # A zero of e_x (or of x) is replaced by eps: the change there counts 1 / eps-fold.
    model = small_linear(channels=1)
    explainer = MapExplainer(model, lambda images, targets: images[:, 0] * (images[:, 0] > 0.5))
    images = torch.rand(1, 1, 4, 4) * 0.4 + 0.55  # every pixel > 0.5: no zero in the map
    images[0, 0, 0, 0] = 0.45  # one zero in the map, which noise of 0.1 may lift
    explanation = explainer(images)
    explainer.calls.clear()
    result = metrics.relative_input_stability(explainer, images, explanation, radius=0.1, n_samples=6, eps=1e-3)
    neighbours = recorded_neighbours(explainer, images, 6)[0]
    e, again = explanation.maps[0], explainer.fn(neighbours, None)
    numerator = ((e - again) / torch.where(e == 0, 1e-3, e)).flatten(1).norm(dim=1)
    denominator = ((images[0] - neighbours) / images[0]).flatten(1).norm(dim=1)
    keep = model(neighbours).argmax(1) == model(images).argmax(1)
    close(result.values, torch.where(keep, numerator / denominator, -1.0).max(), tol=1e-4)


def test_relative_output_stability_by_hand():
    # h = W x: ROS = max ||(e - e') / e|| / ||W (x - x')||, over the neighbours keeping the class.
    model = small_linear(channels=1, classes=3)
    explainer = MapExplainer(model, lambda images, targets: images[:, 0] ** 2)
    images = torch.rand(2, 1, 4, 4) + 0.5
    explanation = explainer(images)
    explainer.calls.clear()
    result = metrics.relative_output_stability(explainer, images, explanation, n_samples=5)
    neighbours = recorded_neighbours(explainer, images, 5)
    with torch.no_grad():
        logits = model(neighbours.flatten(0, 1)).view(2, 5, 3)
        original = model(images)
    numerator = (1 - (neighbours[:, :, 0] / images[:, None, 0]) ** 2).flatten(2).norm(dim=2)
    ratio = numerator / (logits - original[:, None]).norm(dim=2)
    kept = logits.argmax(2) == original.argmax(1)[:, None]
    close(result.values, torch.where(kept, ratio, -1.0).amax(1), tol=1e-4)
    close(result.extra["kept"], kept.sum(1))
    # The logits come from the explanations, without forward passes of the metric's own.
    rows = []
    handle = model.register_forward_hook(lambda module, args, output: rows.append(len(output)))
    metrics.relative_output_stability(explainer, images, explanation, n_samples=5)
    handle.remove()
    assert sum(rows) == 10  # the explainer's own, one per neighbour


def test_relative_representation_stability_by_hand():
    # L = relu(conv(x)), a layer's output: RRS = max ||(e - e') / e|| / ||(L - L') / L||.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 2, 1), nn.ReLU(), nn.Flatten(), nn.Linear(32, 3)).eval()
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([1.0, 2.0]).view(2, 1, 1, 1))
        model[0].bias.copy_(torch.tensor([0.1, -0.2]))
    explainer = MapExplainer(model, lambda images, targets: images[:, 0] ** 2)
    images = torch.rand(2, 1, 4, 4) + 0.5
    explanation = explainer(images)
    explainer.calls.clear()
    state = ModelState(model)
    result = metrics.relative_representation_stability(explainer, images, explanation, layer="1", n_samples=5)
    state.assert_unchanged()
    neighbours = recorded_neighbours(explainer, images, 5)
    with torch.no_grad():
        before = model[:2](images).flatten(1)[:, None]
        after = model[:2](neighbours.flatten(0, 1)).view(2, 5, -1)
        kept = model(neighbours.flatten(0, 1)).view(2, 5, 3).argmax(2) == model(images).argmax(1)[:, None]
    numerator = (1 - (neighbours[:, :, 0] / images[:, None, 0]) ** 2).flatten(2).norm(dim=2)
    ratio = numerator / ((before - after) / before).norm(dim=2)
    close(result.values, torch.where(kept, ratio, -1.0).amax(1), tol=1e-4)
    # By default, the layer Grad-CAM explains: here the ReLU, the last spatial layer.
    close(metrics.relative_representation_stability(explainer, images, explanation, n_samples=5).values,
          result.values)
    with pytest.raises(ValueError, match="reads one layer"):
        metrics.relative_representation_stability(explainer, images, explanation, layer=["0", "1"])
    with pytest.raises(ValueError, match="no layer named 'conv'"):
        metrics.relative_representation_stability(explainer, images, explanation, layer="conv")


@pytest.mark.parametrize("name", ["local-lipschitz-estimate", "continuity", "relative-input-stability",
                                  "relative-output-stability", "relative-representation-stability"])
def test_robustness_metrics_are_seeded_batch_free_and_leave_the_model_alone(name):
    model, images = model_with_state(), smooth_images(3, 16)
    state = ModelState(model)
    cam = explain.GradCAM(model)
    explanation = cam(images)
    options = {"continuity": {"steps": 4}}.get(name, {"n_samples": 3})
    run = lambda batch_size, x=images, e=explanation: metrics.compute(name, cam, x, e, batch_size=batch_size,
                                                                      **options)
    one, many = run(1), run(64)
    torch.testing.assert_close(one.values, many.values, rtol=1e-4, atol=1e-5, equal_nan=True)
    state.assert_unchanged()
    # An image scores the same alone as second in a batch (a score of a few draws may be NaN).
    alone = run(None, images[1:2], Explanation(explanation.maps[1:2], {}, explanation.logits[1:2],
                                               explanation.targets[1:2], "gradcam"))
    torch.testing.assert_close(alone.values, many.values[1:2], rtol=1e-4, atol=1e-5, equal_nan=True)
    with torch.no_grad():
        torch.testing.assert_close(run(None).values, many.values, rtol=1e-4, atol=1e-5, equal_nan=True)
    assert hook_count(model) == 0 and torch.is_grad_enabled()
    if name != "continuity":
        assert not torch.equal(metrics.compute(name, cam, images, explanation, seed=1, **options).values.nan_to_num(),
                               many.values.nan_to_num())


# --- randomisation ----------------------------------------------------------------------


def small_cnn(width=16, classes=10) -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, width, 3, padding=1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, classes)).eval()


def smooth_images(n, size=32):
    """Images with structure: noise upsampled from 8 x 8, so blobs and edges."""
    return F.interpolate(torch.randn(n, 3, 8, 8), size=size, mode="bilinear", align_corners=False)


def test_model_randomisation_of_grad_cam_and_of_an_edge_detector():
    last = []
    for s in range(8):
        torch.manual_seed(s)
        model, images = small_cnn(), smooth_images(4)
        cam = explain.GradCAM(model)
        result = metrics.model_randomisation(cam, images, seed=s)
        # Top down: the linear head first, then the second convolution, then the first.
        assert result.step_labels == ("6", "2", "0")
        close(result.steps, [1, 2, 3])
        assert result.curves["spearman"].shape == result.curves["ssim"].shape == (4, 3)
        close(result.extra["spearman_last"], result.curves["spearman"][:, -1])
        close(result.values, result.curves["spearman"].mean(1))
        assert result.higher_is_better is False
        last.append(result.extra["spearman_last"])
        # A map that ignores the model survives every layer's randomisation.
        edges = metrics.model_randomisation(MapExplainer(model, sobel), images, seed=s)
        close(edges.curves["spearman"], torch.ones(4, 3))
        close(edges.curves["ssim"], torch.ones(4, 3))
        close(edges.values, torch.ones(4))
    last = torch.stack(last)  # (models, images)
    # Grad-CAM's maps after the whole cascade are unrelated to the original ones: near-zero
    # correlation on average (per model it scatters around 0, within about +-0.5).
    assert abs(last.mean().item()) < 0.25, last.mean(1)
    assert last.mean(1).abs().max() < 0.6, last.mean(1)


def test_model_randomisation_compares_at_evenly_spaced_checkpoints_of_the_cascade():
    layers = [nn.Conv2d(3, 4, 3, padding=1)] + [nn.Conv2d(4, 4, 3, padding=1) for _ in range(10)]
    model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 5)).eval()
    images, cam = smooth_images(2, size=16), explain.GradCAM(model, target_layer="5")
    every = metrics.model_randomisation(cam, images, checkpoints=None)
    assert every.step_labels == ("13", "10", "9", "8", "7", "6", "5", "4", "3", "2", "1", "0")
    some = metrics.model_randomisation(cam, images, checkpoints=4)
    # 12 layers, 4 checkpoints: after 1, 5 (round(4.67)), 8 (round(8.33)) and all 12 layers.
    close(some.steps, [1, 5, 8, 12])
    assert some.step_labels == ("13", "7", "4", "0")
    close(some.curves["spearman"], every.curves["spearman"][:, [0, 4, 7, 11]])
    close(metrics.model_randomisation(cam, images, checkpoints=1).steps, [12])


def model_with_state():
    """A small CNN with batch norm, one frozen parameter and a .grad on another."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                          nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))
    with torch.no_grad():
        model[1].running_mean.uniform_(-0.5, 0.5)
        model[1].running_var.uniform_(0.5, 2.0)
    model[0].bias.requires_grad_(False)
    model[3].weight.grad = torch.randn_like(model[3].weight)
    return model.eval()


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_model_randomisation_restores_the_model_also_after_an_error(training):
    model, images = model_with_state().train(training), smooth_images(2, 16)
    state = ModelState(model)
    result = metrics.model_randomisation(explain.GradCAM(model), images)
    assert result.step_labels == ("7", "3", "1", "0")  # batch norm has reset_parameters too
    state.assert_unchanged()
    assert torch.is_grad_enabled()
    cam = explain.GradCAM(model)
    failing = MapExplainer(model, lambda images, targets: cam(images, targets).maps, fail_on_call=3)
    with pytest.raises(RuntimeError, match="explainer failed"):
        metrics.model_randomisation(failing, images)
    assert len(failing.calls) == 3  # the original maps, the head randomised, then the error
    state.assert_unchanged()
    assert hook_count(model) == 0 and torch.is_grad_enabled()
    # The same numbers again: nothing of the failed run was left behind.
    close(metrics.model_randomisation(explain.GradCAM(model), images).values, result.values)


def test_histogram_entropy_matches_numpy_and_scipy():
    from scipy.stats import entropy

    maps = torch.rand(4, 9, 9)
    maps[1] = torch.randint(0, 11, (9, 9)) / 10  # values on the edges of 10 bins over [0, 1]
    maps[2] = -maps[2] ** 3  # negative, skewed
    maps[3] = 0.25  # constant: numpy widens the range to [-0.25, 0.75], one bin filled
    for bins in (10, 100, 7):
        expected = [entropy(np.histogram(m, bins=bins)[0]) for m in maps.numpy()]
        close(histogram_entropy(maps, bins), expected, tol=1e-6)
    close(histogram_entropy(maps[3:], 10), [0.0])
    # Two values, half and half: ln 2, whatever the number of bins.
    two = torch.tensor([[[0.0, 1.0], [1.0, 0.0]]])
    close(histogram_entropy(two, 100), [math.log(2)])


def test_smoothed_maps_average_noisy_copies_and_the_image_itself():
    explainer = MapExplainer(small_linear(channels=2), lambda images, targets: images[:, 0] * 2)
    images = torch.rand(2, 2, 4, 4) * torch.tensor([1.0, 3.0]).view(2, 1, 1, 1)  # ranges about 1 and 3
    targets = torch.tensor([0, 1])
    smooth = smoothed_maps(explainer, images, targets, n_samples=4, noise=0.1, seed=5, batch_size=3)
    assert [len(batch) for batch, _ in explainer.calls] == [3, 3, 2]
    copies = recorded_neighbours(explainer, images, 4)
    assert torch.equal(torch.cat([t for _, t in explainer.calls]), targets.repeat_interleave(4))
    spread = 0.1 * (images.flatten(1).amax(1) - images.flatten(1).amin(1))
    for s in range(3):  # Gaussian, of standard deviation 0.1 x the image's range; draw s the same for both
        expected = draws(5, [s], images.shape[1:], images.device, normal=True)[0]
        for i in range(2):
            close(copies[i, s] - images[i], expected * spread[i], tol=1e-5)
    close(copies[:, 3], images, tol=0)  # the last copy is the image itself
    close(smooth, (copies[:, :, 0] * 2).mean(1))


def test_smooth_model_randomisation_of_grad_cam_and_of_an_edge_detector():
    last = []
    for s in range(4):
        torch.manual_seed(s)
        model, images = small_cnn(), smooth_images(4)
        result = metrics.smooth_model_randomisation(explain.GradCAM(model), images, n_samples=3, seed=s)
        # From the input up by default: the first convolution, the second, then the head.
        assert result.step_labels == ("0", "2", "6") and result.metric == "smooth-randomisation"
        close(result.values, result.curves["spearman"].mean(1))
        close(result.extra["spearman_last"], result.curves["spearman"][:, -1])
        assert result.higher_is_better is False
        last.append(result.extra["spearman_last"])
        # A map that ignores the model survives: the same noise for every state, the same average.
        edges = metrics.smooth_model_randomisation(MapExplainer(model, sobel), images, n_samples=3, seed=s)
        close(edges.curves["spearman"], torch.ones(4, 3))
    assert abs(torch.stack(last).mean().item()) < 0.3, torch.stack(last)


def test_smooth_model_randomisation_of_one_sample_is_model_randomisation():
    torch.manual_seed(0)
    model, images = small_cnn(width=8), smooth_images(3, 16)
    cam = explain.GradCAM(model)
    explanation = cam(images)
    plain = metrics.model_randomisation(cam, images, explanation)
    one = metrics.smooth_model_randomisation(cam, images, explanation, n_samples=1, order="top_down")
    assert one.step_labels == plain.step_labels == ("6", "2", "0")
    close(one.curves["spearman"], plain.curves["spearman"])
    bottom_up = metrics.smooth_model_randomisation(cam, images, explanation, n_samples=1, checkpoints=2)
    assert bottom_up.step_labels == ("0", "6")
    with pytest.raises(ValueError, match="unknown order 'up'; use one of top_down, bottom_up"):
        metrics.smooth_model_randomisation(cam, images, explanation, order="up")


@pytest.mark.parametrize("metric", ["smooth", "efficient"])
def test_smooth_and_efficient_randomisation_restore_the_model_also_after_an_error(metric):
    run = {"smooth": lambda e, x, **kw: metrics.smooth_model_randomisation(e, x, n_samples=2, **kw),
           "efficient": metrics.efficient_model_randomisation}[metric]
    model, images = model_with_state(), smooth_images(2, 16)
    state = ModelState(model)
    result = run(explain.GradCAM(model), images)
    state.assert_unchanged()
    cam = explain.GradCAM(model)
    # Fail inside the cascade: after the explanation (and for Smooth MPRT the 2 x 2 noisy
    # copies of the original), at the second image with the first layer(s) randomised.
    fail_on_call = {"smooth": 7, "efficient": 3}[metric]
    failing = MapExplainer(model, lambda images, targets: cam(images, targets).maps, fail_on_call=fail_on_call)
    with pytest.raises(RuntimeError, match="explainer failed"):
        run(failing, images, batch_size=1)
    assert len(failing.calls) == fail_on_call
    state.assert_unchanged()
    assert hook_count(model) == 0 and torch.is_grad_enabled()
    torch.testing.assert_close(run(explain.GradCAM(model), images).values, result.values, equal_nan=True)


def test_efficient_model_randomisation_by_hand():
    # The map is the target class's weights (a map that reads the model): 0 and 1 in equal
    # parts, entropy ln 2. Randomised, they are nn.Linear's fresh weights, drawn after
    # torch.manual_seed(seed + 1).
    weights = torch.zeros(2, 1, 4, 4)
    weights[0].view(-1)[::2] = 1.0
    weights[1].view(-1)[:4] = 1.0  # 4 ones of 16: entropy of (1/4, 3/4)
    model = linear(weights, bias=[0.0, 0.0])
    reads_weights = MapExplainer(model, lambda images, targets: model[1].weight[targets].abs().view(-1, 4, 4))
    images, targets = torch.rand(2, 1, 4, 4), torch.tensor([0, 1])
    state = ModelState(model)
    result = metrics.efficient_model_randomisation(reads_weights, images, reads_weights(images, targets), seed=7)
    state.assert_unchanged()
    assert len(reads_weights.calls) == 2  # the explanation, then once with every layer randomised
    fresh = nn.Linear(16, 2)
    torch.manual_seed(8)
    fresh.reset_parameters()
    from scipy.stats import entropy

    before = [math.log(2), entropy([4, 12])]
    after = [entropy(np.histogram(fresh.weight[t].detach().abs().numpy(), bins=100)[0]) for t in (0, 1)]
    close(result.extra["entropy"], before)
    close(result.extra["entropy_random"], after, tol=1e-5)
    close(result.values, [(a - b) / b for a, b in zip(after, before)], tol=1e-5)
    assert result.higher_is_better is True and result.metric == "efficient-randomisation"
    assert (result.values > 0).all()  # random weights spread over many bins: more complex
    # A map that ignores the model does not change: 0; a constant map has no complexity to rise from: NaN.
    edges = MapExplainer(small_cnn(), sobel)
    close(metrics.efficient_model_randomisation(edges, smooth_images(2, 16)).values, [0.0, 0.0])
    flat = MapExplainer(model, lambda images, targets: torch.ones(len(images), 4, 4))
    assert metrics.efficient_model_randomisation(flat, images).values.isnan().all()


def test_random_logit_draws_another_class():
    model = small_linear(classes=5, size=8)
    images = torch.rand(100, 3, 8, 8)
    targets = torch.arange(100) % 5
    explainer = MapExplainer(model, sobel)
    explanation = explainer(images, targets)
    explainer.calls.clear()
    result = metrics.random_logit(explainer, images, explanation)
    explained_again = torch.cat([t for _, t in explainer.calls])
    others = result.extra["class"].long()
    assert (others != targets).all() and ((others >= 0) & (others < 5)).all()
    # Uniform over the other four classes: every one drawn for some image of each target.
    for t in range(5):
        assert set(others[targets == t].tolist()) == set(range(5)) - {t}
    assert torch.equal(metrics.random_logit(explainer, images, explanation).extra["class"], result.extra["class"])
    assert not torch.equal(metrics.random_logit(explainer, images, explanation, seed=1).extra["class"],
                           result.extra["class"])
    # The edge map is the same for every class: SSIM and Spearman 1.
    close(result.values, torch.ones(100))
    close(result.extra["spearman"], torch.ones(100))
    assert explained_again.tolist() == others.tolist()  # explained again for the drawn class


def test_random_logit_ssim_by_hand():
    from skimage.metrics import structural_similarity

    # Two classes: the other class is always the other one. The map is the class's channel.
    model = small_linear(channels=2, size=16, classes=2)
    images = torch.rand(3, 2, 16, 16)
    targets = torch.tensor([0, 1, 1])
    explainer = MapExplainer(model, channel_of_target)
    result = metrics.random_logit(explainer, images, explainer(images, targets))
    close(result.extra["class"], [1, 0, 0])
    expected = []
    for image, t in zip(images.double().numpy(), targets.tolist()):
        a, b = image[t], image[1 - t]
        expected.append(structural_similarity(a, b, data_range=max(a.max(), b.max()) - min(a.min(), b.min())))
    close(result.values, expected)


def test_spearman_and_ssim_helpers_match_scipy_and_skimage():
    from scipy.stats import spearmanr
    from skimage.metrics import structural_similarity

    a = torch.randint(0, 4, (5, 9, 9)).float()  # many ties
    b = torch.randint(0, 4, (5, 9, 9)).float()
    b[0] = a[0] * 2 + 1  # a monotone function of a: 1
    b[1] = -a[1]  # reversed: -1
    expected = [spearmanr(x.flatten(), y.flatten())[0] for x, y in zip(a.numpy(), b.numpy())]
    close(spearman(a, b), expected)
    close(spearman(a, b)[:2], [1.0, -1.0])
    # A constant map has no ranking: 0 (scipy says NaN).
    close(spearman(torch.ones(1, 9, 9), a[:1]), [0.0])
    close(spearman(torch.ones(1, 9, 9), torch.ones(1, 9, 9)), [0.0])

    x, y = torch.rand(3, 12, 12), torch.rand(3, 12, 12)
    y[1] = x[1] * 0.5 + 0.25
    expected = [structural_similarity(p, q, data_range=max(p.max(), q.max()) - min(p.min(), q.min()))
                for p, q in zip(x.double().numpy(), y.double().numpy())]
    close(ssim(x, y), expected)
    close(ssim(x, x), torch.ones(3))
    close(ssim(torch.full((1, 9, 9), 0.3), torch.full((1, 9, 9), 0.3)), [1.0])  # identical constants
    zeros, ones = np.zeros((9, 9)), np.ones((9, 9))
    close(ssim(torch.zeros(1, 9, 9), torch.ones(1, 9, 9)), [structural_similarity(zeros, ones, data_range=1.0)])


# --- localisation -----------------------------------------------------------------------


def one_peak(y, x, size=40):
    maps = torch.zeros(1, size, size)
    maps[0, y, x] = 1.0
    return maps


def one_pixel(y, x, size=40):
    mask = torch.zeros(1, size, size, dtype=torch.bool)
    mask[0, y, x] = True
    return mask


def test_pointing_game_hit_miss_and_the_15_pixel_tolerance():
    game = lambda maps, region, **kw: metrics.pointing_game(maps, region, **kw).values.item()
    assert game(one_peak(20, 20), one_pixel(20, 20), tolerance=0) == 1.0  # hit
    assert game(one_peak(20, 20), one_pixel(20, 21), tolerance=0) == 0.0  # miss
    assert game(one_peak(20, 20), one_pixel(20, 35)) == 1.0  # 15 px away
    assert game(one_peak(20, 20), one_pixel(20, 36)) == 0.0  # 16 px away
    assert game(one_peak(0, 0), one_pixel(9, 12)) == 1.0  # sqrt(81 + 144) = 15
    assert game(one_peak(0, 0), one_pixel(9, 13)) == 0.0  # sqrt(81 + 169) > 15
    assert game(one_peak(0, 0), one_pixel(9, 12), tolerance=14.9) == 0.0
    assert metrics.pointing_game(one_peak(0, 0), one_pixel(9, 12)).higher_is_better is True


def test_pointing_game_ties_and_empty_regions():
    maps = one_peak(0, 0)
    maps[0, 30, 30] = 1.0  # a second maximum, inside the region
    assert metrics.pointing_game(maps, one_pixel(30, 30), tolerance=0).values.item() == 1.0
    assert metrics.pointing_game(maps, one_pixel(2, 2), tolerance=0).values.item() == 0.0
    empty = torch.zeros(1, 40, 40, dtype=torch.bool)
    for metric in (metrics.pointing_game, metrics.relevance_mass, metrics.relevance_rank,
                   metrics.energy_pointing_game, metrics.top_k_intersection):
        assert math.isnan(metric(maps, empty).values.item())


def test_boxes_and_masks_give_the_same_results():
    maps = torch.rand(3, 30, 30)
    boxes = torch.tensor([[10, 10, 20, 20], [0, 5, 7, 25], [10.2, 3.4, 19.6, 3.6]])
    masks = torch.zeros(3, 30, 30, dtype=torch.bool)
    masks[0, 10:20, 10:20] = True  # pixel centres 10.5 .. 19.5 inside [10, 20]
    masks[1, 5:25, 0:7] = True
    masks[2, 3, 10:20] = True  # only row 3's centre (3.5) lies within [3.4, 3.6]
    assert torch.equal(metrics.region_masks(boxes, (30, 30)), masks)
    for metric in (metrics.pointing_game, metrics.relevance_mass, metrics.relevance_rank,
                   metrics.energy_pointing_game, metrics.top_k_intersection):
        torch.testing.assert_close(metric(maps, boxes).values, metric(maps, masks).values, equal_nan=True)
        torch.testing.assert_close(metric(maps, boxes).values, metric(maps, masks[:, None]).values, equal_nan=True)


def test_relevance_mass_counts_positive_relevance_only():
    maps = torch.tensor([[[3.0, 1.0, -4.0], [0.0, 2.0, -1.0], [0.5, 0.5, 1.0]]])
    region = torch.tensor([[[True, False, True], [False, True, False], [False, False, False]]])
    # Positive total 3 + 1 + 2 + 0.5 + 0.5 + 1 = 8; inside 3 + 2 (the -4 is not mass).
    close(metrics.relevance_mass(maps, region).values, [5 / 8])
    close(metrics.relevance_mass(-torch.ones(1, 3, 3), region).values, [0.0])  # no positive relevance


def test_relevance_rank_takes_the_region_size_top_pixels():
    maps = torch.tensor([[[9.0, 1.0, 8.0], [2.0, 7.0, 3.0], [4.0, 5.0, 6.0]]])
    region = torch.tensor([[[True, True, False], [False, True, False], [False, False, False]]])
    # K = 3: the top three are 9 (in), 8 (out), 7 (in).
    close(metrics.relevance_rank(maps, region).values, [2 / 3])
    # Ties in raster order: a flat map's top K are the first K pixels, 0 and 1 of them inside.
    close(metrics.relevance_rank(torch.ones(1, 3, 3), region).values, [2 / 3])


def test_energy_pointing_game_scales_to_0_1_first():
    maps = torch.tensor([[[5.0, 3.0], [1.0, 1.0]]])  # scaled: 1, 0.5, 0, 0
    region = torch.tensor([[[False, True], [True, False]]])
    close(metrics.energy_pointing_game(maps, region).values, [0.5 / 1.5])
    close(metrics.energy_pointing_game(torch.full((1, 2, 2), 7.0), region).values, [0.0])  # no energy


# --- sparseness and complexity ----------------------------------------------------------


def test_sparseness_gini_by_hand():
    maps = torch.tensor([
        [[0.0, 0.0], [0.0, 1.0]],  # one-hot: (2*4 - 5) * 1 / (4 * 1) = 0.75
        [[1.0, 1.0], [1.0, 1.0]],  # flat: 0
        [[4.0, 2.0], [3.0, 1.0]],  # (-3*1 - 1*2 + 1*3 + 3*4) / (4 * 10) = 0.25
        [[0.0, -1.0], [0.0, 0.0]],  # magnitudes: one-hot
        [[0.0, 0.0], [0.0, 0.0]],  # all zero: 0
    ])
    result = metrics.sparseness(maps)
    close(result.values, [0.75, 0.0, 0.25, 0.75, 0.0])
    assert result.higher_is_better is True


def test_complexity_entropy_by_hand():
    maps = torch.tensor([
        [[1.0, 1.0], [1.0, 1.0]],  # ln 4
        [[0.0, 3.0], [0.0, 0.0]],  # 0
        [[1.0, -1.0], [2.0, 0.0]],  # p = 1/4, 1/4, 1/2, 0: 2 * (1/4) ln 4 + (1/2) ln 2 = 1.5 ln 2
        [[0.0, 0.0], [0.0, 0.0]],  # all zero: 0
    ])
    result = metrics.complexity(maps)
    close(result.values, [math.log(4), 0.0, 1.5 * math.log(2), 0.0])
    assert result.higher_is_better is False


# --- issue 30: infidelity and sensitivity-n -----------------------------------------------


def exact_linear(channels=3, size=6, classes=3, n=3, seed=0):
    """A bias-free linear model, images, and its exact attribution of class 0 against the zero
    baseline: each pixel's share of the logit, sum_c w_c x_c, so that removing any set of
    pixels lowers the logit by the map's sum over them."""
    generator = torch.Generator().manual_seed(seed)
    weights = torch.randn(classes, channels, size, size, generator=generator)
    images = torch.rand(n, channels, size, size, generator=generator)
    return linear(weights), images, (images * weights[0]).sum(1), torch.zeros(n, dtype=torch.long)


def removal_reference(model, images, targets, maps, masks, score="logit"):
    """A plain loop: for each image and mask, the map's sum over the mask and the drop of the
    score when the masked pixels are set to 0, one forward pass at a time."""
    sums, drops = [], []
    with torch.no_grad():
        for image, target, saliency in zip(images, targets, maps):
            out = model(image[None])
            full = out.softmax(1)[0, target] if score == "probability" else out[0, target]
            row_sums, row_drops = [], []
            for mask in masks:
                out = model(torch.where(mask, 0.0, image)[None])
                value = out.softmax(1)[0, target] if score == "probability" else out[0, target]
                row_sums.append(float(saliency[mask].sum()))
                row_drops.append(float(full - value))
            sums.append(row_sums)
            drops.append(row_drops)
    return np.array(sums), np.array(drops)


def test_infidelity_of_the_exact_attribution_is_zero_and_the_scale_is_optimal():
    model, images, exact, targets = exact_linear()
    close(metrics.infidelity(model, images, exact, targets, normalise=False).values, [0, 0, 0])
    tripled = metrics.infidelity(model, images, 3 * exact, targets)
    close(tripled.values, [0, 0, 0])
    close(tripled.extra["scale"], [1 / 3] * 3)
    # Unscaled, each square's error is (3 S - S)^2 = 4 S^2, S the exact map's sum over it.
    masks = square_masks(0, 100, [1, 2, 3], 6, 6, torch.device("cpu"))
    sums = (exact.flatten(1) @ masks.flatten(1).float().T).double()
    unscaled = metrics.infidelity(model, images, 3 * exact, targets, normalise=False, patch_sizes=[1, 2, 3])
    close(unscaled.values, (4 * sums.square()).mean(1), tol=1e-4)
    assert unscaled.higher_is_better is False and unscaled.metric == "infidelity"


def test_infidelity_by_hand_with_squares_that_cover_the_image():
    # Every square is the whole image: the logit falls by 14, the map's sum is 10.
    model, saliency = region_model(R), torch.full((1, 4, 4), 10 / 16)
    plain = metrics.infidelity(model, X, saliency, torch.tensor([0]), patch_sizes=[4], n_samples=3, normalise=False)
    close(plain.values, [(10 - 14) ** 2])
    scaled = metrics.infidelity(model, X, saliency, torch.tensor([0]), patch_sizes=[4], n_samples=3)
    close(scaled.values, [0.0])
    close(scaled.extra["scale"], [1.4])


def test_infidelity_against_a_loop_reference():
    torch.manual_seed(0)
    model, images, maps = small_cnn(width=4), torch.rand(2, 3, 10, 10), torch.randn(2, 10, 10)
    targets = torch.tensor([3, 7])
    ours = metrics.infidelity(model, images, maps, targets, n_samples=12, patch_sizes=[2, 5], seed=4)
    masks = square_masks(4, 12, [2, 5], 10, 10, torch.device("cpu"))
    sums, drops = removal_reference(model, images, targets, maps, masks)
    beta = (sums * drops).sum(1) / (sums * sums).sum(1)
    close(ours.values, ((beta[:, None] * sums - drops) ** 2).mean(1), tol=1e-4)


def test_square_masks_are_uniform_over_every_square():
    masks = square_masks(1, 2000, [1, 2], 4, 4, torch.device("cpu"))
    sizes = masks.flatten(1).sum(1)
    assert set(sizes.tolist()) == {1, 4}
    for mask, size in zip(masks, sizes):
        rows, cols = mask.any(1).nonzero().flatten(), mask.any(0).nonzero().flatten()
        side = int(size ** 0.5)
        assert len(rows) == len(cols) == side and rows.diff().eq(1).all() and cols.diff().eq(1).all()
    # 16 squares of side 1 and 9 of side 2: a square of side 1 comes 16 / 25 of the time.
    assert abs(float((sizes == 1).float().mean()) - 16 / 25) < 0.04
    # Every position of a side-2 square comes up (9 of them).
    assert len({tuple(m.nonzero()[0].tolist()) for m in masks[sizes == 4]}) == 9
    with pytest.raises(ValueError, match=r"patch_sizes must lie in 1..4"):
        square_masks(1, 3, [5], 4, 4, torch.device("cpu"))


def test_sensitivity_n_is_1_for_the_exact_map_and_minus_1_for_its_opposite():
    model, images, exact, targets = exact_linear()
    result = metrics.sensitivity_n(model, images, exact, targets, n_samples=8)
    close(result.values, [1, 1, 1])
    close(result.curves["sensitivity-n"], torch.ones(3, 10))
    # 36 pixels: a fraction f takes round(36 f) pixels, at least 1 and at most 35.
    close(result.steps, torch.tensor([1, 1, 1, 1, 1, 2, 4, 7, 18, 29]) / 36)
    close(metrics.sensitivity_n(model, images, -exact, targets, n_samples=8).values, [-1, -1, -1])
    flat = metrics.sensitivity_n(model, images, torch.ones(3, 6, 6), targets, n_samples=8)
    close(flat.values, [0, 0, 0])  # a constant map's sums do not vary: nothing to correlate


def test_sensitivity_n_against_a_loop_reference():
    torch.manual_seed(1)
    model, images, maps = small_cnn(width=4), torch.rand(2, 3, 8, 8), torch.randn(2, 8, 8)
    targets = torch.tensor([1, 4])
    ours = metrics.sensitivity_n(model, images, maps, targets, fractions=(0.1, 0.5), n_samples=6, seed=2)
    counts = torch.tensor([6, 6, 6, 6, 6, 6, 32, 32, 32, 32, 32, 32])  # round(6.4), round(32)
    masks = random_subsets(2, list(range(12)), counts, 8, 8, "cpu")
    sums, drops = removal_reference(model, images, targets, maps, masks)
    expected = [[np.corrcoef(s[j:j + 6], d[j:j + 6])[0, 1] for j in (0, 6)] for s, d in zip(sums, drops)]
    close(ours.curves["sensitivity-n"], expected, tol=1e-4)
    close(ours.values, np.mean(expected, 1), tol=1e-4)


# --- faithfulness correlation and estimate -----------------------------------------------


def test_faithfulness_correlation_by_hand_and_against_a_loop_reference():
    model, images, exact, targets = exact_linear()
    result = metrics.faithfulness_correlation(model, images, exact, targets, subset=5, n_runs=10)
    close(result.values, [1, 1, 1])
    assert result.higher_is_better is True and result.metric == "faithfulness-correlation"
    close(metrics.faithfulness_correlation(model, images, -exact, targets, subset=5, n_runs=10).values, [-1, -1, -1])
    # A subset given as a fraction of the image: 0.25 of 36 pixels is 9.
    torch.manual_seed(2)
    cnn, maps = small_cnn(width=4), torch.randn(3, 6, 6)
    ours = metrics.faithfulness_correlation(cnn, images, maps, targets, subset=0.25, n_runs=7, seed=9)
    masks = random_subsets(9, list(range(7)), torch.full((7,), 9), 6, 6, "cpu")
    sums, drops = removal_reference(cnn, images, targets, maps, masks)
    close(ours.values, [np.corrcoef(s, d)[0, 1] for s, d in zip(sums, drops)], tol=1e-4)


def test_faithfulness_estimate_by_hand():
    # The logit of a linear model falls by the exact map's sum over each group: Pearson 1.
    model, images, exact, targets = exact_linear()
    close(metrics.faithfulness_estimate(model, images, exact, targets, step=4, score="logit").values, [1, 1, 1])
    close(metrics.faithfulness_estimate(model, images, -exact, targets, step=4, score="logit").values, [-1, -1, -1])
    # X on the region model, groups of 4 pixels in ORDER's ranking (step 4): {5, 0, 15, 1},
    # {4, 2, 3, 6}, ... The map's sums over them and the probability drops, by hand.
    saliency = map_from_order(ORDER)  # values 16 (pixel 5) down to 1
    sums = [16 + 15 + 14 + 13, 12 + 11 + 10 + 9, 8 + 7 + 6 + 5, 4 + 3 + 2 + 1]
    logits = [14 - 6 - 1 - 2, 14 - 5, 14, 14]  # removing group g alone
    drops = [sigmoid(14) - sigmoid(z) for z in logits]
    result = metrics.faithfulness_estimate(region_model(R), X, saliency, torch.tensor([0]), step=4)
    close(result.values, [np.corrcoef(sums, drops)[0, 1]])


# --- monotonicity and monotonicity correlation -------------------------------------------


def test_monotonicity_by_hand():
    # Class 0's logit is 1 x0 - 1 x1 + 2 x2 + 0.5 x3 on the 2 x 2 image (1, 2, 3, 4): the
    # pixels add 1, -2, 6 and 2.
    model = linear([[[[1.0, -1.0], [2.0, 0.5]]], [[[0.0, 0.0], [0.0, 0.0]]]])
    image = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]])
    # Put back in increasing order of the map: pixel 1 (-2), 0 (1), 3 (2), 2 (6): -2, -1, 1, 7.
    exact = torch.tensor([[[1.0, -2.0], [6.0, 2.0]]])
    result = metrics.monotonicity(model, image, exact, torch.tensor([0]), step=1, score="logit")
    close(result.curves["monotonicity"], [-2, -1, 1, 7])
    close(result.values, [1.0])
    close(result.steps, [0.25, 0.5, 0.75, 1.0])
    # Pixel 3 (2), then 0 (3), 1 (1: falls), 2 (7): not monotonic, 2 of 3 steps rise.
    other = torch.tensor([[[1.0, 2.0], [3.0, 0.0]]])
    result = metrics.monotonicity(model, image, other, torch.tensor([0]), step=1, score="logit")
    close(result.curves["monotonicity"], [2, 3, 1, 7])
    close(result.values, [0.0])
    close(result.extra["non_decreasing"], [2 / 3])
    # The probability (the default) rises and falls with the logit when the other is 0.
    result = metrics.monotonicity(model, image, other, torch.tensor([0]), step=1)
    close(result.curves["monotonicity"], [sigmoid(z) for z in (2, 3, 1, 7)])
    assert result.values.item() == 0.0 and result.higher_is_better is True


def test_monotonicity_correlation_by_hand():
    # Only R matters to class 0. Groups of 4 pixels by increasing magnitude: a map that is 1
    # on R puts R in the last group, the only one whose noise moves the score: relevance
    # (0, 0, 0, 4) against variances (0, 0, 0, v): Spearman 1. A map that is 1 off R
    # reverses it: (0, 4, 4, 4) against (v, 0, 0, 0), -1.
    model = region_model(R)
    on_r = torch.zeros(1, 16)
    on_r[0, R] = 1.0
    on_r = on_r.view(1, 4, 4)
    result = metrics.monotonicity_correlation(model, X, on_r, torch.tensor([0]), step=4, n_samples=3)
    close(result.values, [1.0])
    assert result.higher_is_better is True and result.metric == "monotonicity-correlation"
    reversed_ = metrics.monotonicity_correlation(model, X, 1 - on_r, torch.tensor([0]), step=4, n_samples=3)
    close(reversed_.values, [-1.0])
    # The sign does not matter: the magnitude ranks.
    close(metrics.monotonicity_correlation(model, X, -on_r, torch.tensor([0]), step=4, n_samples=3).values, [1.0])


# --- selectivity ---------------------------------------------------------------------------


def test_selectivity_by_hand():
    # 2 x 2 patches of the 4 x 4 image: top left {0, 1, 4, 5} = R (the logit, 14), top right,
    # bottom left, bottom right. A map that ranks the top right first, then R: 14, 14, 0, 0, 0.
    saliency = torch.tensor([[[2.0, 2.0, 4.0, 4.0], [2.0, 2.0, 4.0, 4.0], [1.0, 1.0, 0.0, 0.0],
                              [1.0, 1.0, 0.0, 0.0]]])
    result = metrics.selectivity(region_model(R), X, saliency, torch.tensor([0]), patch_size=2)
    close(result.curves["selectivity"], [14, 14, 0, 0, 0])
    close(result.values, [trapezoid([14, 14, 0, 0, 0])])
    close(result.steps, [0, 0.25, 0.5, 0.75, 1])
    assert result.higher_is_better is False
    # R first: 14, 0, 0, 0, 0, a smaller area.
    first = metrics.selectivity(region_model(R), X, saliency.flip(-1), torch.tensor([0]), patch_size=2)
    assert first.values.item() < result.values.item()


# --- performance information curves (SIC, AIC) ---------------------------------------------


def test_pic_curve_by_hand():
    from explain.metrics.faithfulness.information_curves import pic_curve

    # Sizes: original 100, fully blurred 50, then 60, 75, 90: information 0.2, 0.5, 0.8.
    # Predictions 0.9 and 0.1, then 0.5, 0.3, 0.9: normalised 0.5, 0.25, 1.0, kept rising:
    # 0.5, 0.5, 1.0. The curve through (0, 0), (0.2, 0.5), (0.5, 0.5), (0.8, 1), (1, 1) has
    # the area 0.05 + 0.15 + 0.225 + 0.2 = 0.625.
    sizes, predictions = np.array([100, 50, 60, 75, 90]), np.array([0.9, 0.1, 0.5, 0.3, 0.9])
    curve = pic_curve(sizes, predictions, min_prediction=0.8, keep_monotonous=True, points=1000)
    x = np.append(np.linspace(0, 1, 1000, endpoint=False), 1.0)
    assert curve.shape == (1001,) and curve[200] == pytest.approx(0.5) and curve[650] == pytest.approx(0.75)
    assert np.trapezoid(curve, x) == pytest.approx(0.625)
    falling = pic_curve(sizes, predictions, min_prediction=0.8, keep_monotonous=False, points=1000)
    assert falling[500] == pytest.approx(0.25)
    # PAIR skips an image whose original scores below the minimum, or whose fully blurred copy
    # holds as much information, or scores as high.
    assert pic_curve(sizes, predictions, min_prediction=0.95, keep_monotonous=True, points=10) is None
    assert pic_curve(np.array([50, 50, 60]), predictions[:3], min_prediction=0, keep_monotonous=True, points=10) is None
    assert pic_curve(sizes[:3], np.array([0.9, 0.9, 0.5]), min_prediction=0, keep_monotonous=True, points=10) is None


def test_pic_interpolation_and_random_pixels():
    from explain.metrics.faithfulness.information_curves import interpolated_image, random_pixels

    # Linear interpolation restores a linear ramp exactly, whatever pixels are known.
    rows, cols = np.mgrid[0:16, 0:16]
    ramp = np.stack([4 * rows + 8 * cols, 10 + 5 * rows, 200 - 6 * cols], -1).astype(np.uint8)
    known = random_pixels(ramp, 0.05, 0)
    assert known.sum() == 12  # int(256 * 0.05)
    assert np.array_equal(interpolated_image(ramp, known), ramp)
    # The random pixels depend on the seed and the image, not on anything else.
    assert np.array_equal(random_pixels(ramp, 0.05, 0), known)
    assert not np.array_equal(random_pixels(ramp, 0.05, 1), known)
    assert not np.array_equal(random_pixels(255 - ramp, 0.05, 0), known)


def pic_setup():
    """A model whose class 0 is the image's high-frequency energy (class 1 a constant), noisy
    images that it scores high, and maps of each pixel's edge strength."""

    class Edges(nn.Module):
        def forward(self, x):
            kernel = torch.tensor([[0.0, -1.0, 0.0], [-1.0, 4.0, -1.0], [0.0, -1.0, 0.0]])[None, None]
            energy = F.conv2d(x.mean(1, keepdim=True), kernel, padding=1).abs().mean((1, 2, 3))
            return torch.stack([40 * (energy - 0.15), torch.zeros_like(energy)], 1)

    generator = torch.Generator().manual_seed(0)
    images = (torch.rand(3, 3, 24, 24, generator=generator) * 0.5 + torch.linspace(0, 0.5, 24)).clamp(0, 1)
    kernel = torch.tensor([[0.0, -1.0, 0.0], [-1.0, 4.0, -1.0], [0.0, -1.0, 0.0]])[None, None]
    maps = F.conv2d(images.mean(1, keepdim=True), kernel, padding=1).abs()[:, 0]
    return Edges().eval(), images, maps, torch.zeros(3, dtype=torch.long)


def test_pic_reveals_what_the_model_needs():
    model, images, maps, targets = pic_setup()
    good = metrics.pic(model, images, maps, targets)
    bad = metrics.pic(model, images, -maps, targets)
    assert good.metric == "sic" and good.higher_is_better is True
    assert good.curves["sic"].shape == (3, 1001) and good.steps.shape == (1001,)
    assert torch.isfinite(good.values).all() and torch.isfinite(good.extra["aic"]).all()
    assert (good.values > bad.values).all() and (good.extra["aic"] >= bad.extra["aic"]).all()
    # Below the minimum probability, an image is skipped (NaN), as PAIR skips it.
    assert torch.isnan(metrics.pic(model, images, maps, targets, min_probability=1.0).values).all()
    # Normalised inputs give the same scores once their normalisation is given.
    mean, std = (0.4, 0.5, 0.6), (0.2, 0.3, 0.25)
    normalised = (images - torch.tensor(mean).view(3, 1, 1)) / torch.tensor(std).view(3, 1, 1)
    model_of_normalised = nn.Sequential(_Unnormalise(mean, std), model)
    again = metrics.pic(model_of_normalised, normalised, maps, targets, normalization=(mean, std))
    close(again.values, good.values, tol=1e-4)
    with pytest.raises(ValueError, match=r"pass normalization=\(mean, std\)"):
        metrics.pic(model_of_normalised, normalised, maps, targets)
    with pytest.raises(ValueError, match="thresholds must be shares"):
        metrics.pic(model, images, maps, targets, thresholds=(0.5, 0.1))


class _Unnormalise(nn.Module):
    def __init__(self, mean, std):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1))

    def forward(self, x):
        return x * self.std + self.mean


# --- top-k intersection --------------------------------------------------------------------


def test_top_k_intersection_by_hand():
    maps = torch.tensor([[[4.0, 3.0], [2.0, 1.0]], [[1.0, 1.0], [1.0, 1.0]], [[0.0, 1.0], [2.0, 3.0]]])
    region = torch.tensor([[[True, False], [True, False]]] * 2 + [[[False, False], [False, False]]])
    # Top 2: pixels 0 and 1 (one in the region); ties in raster order: 0 and 1; empty: NaN.
    result = metrics.top_k_intersection(maps, region, k=2)
    close(result.values[:2], [0.5, 0.5])
    assert torch.isnan(result.values[2]) and result.higher_is_better is True
    # Concept influence divides by the region's share of the image (2 of 4 pixels).
    close(metrics.top_k_intersection(maps, region, k=3, concept_influence=True).values[:2], [4 / 3, 4 / 3])
    # k beyond the image takes every pixel: the region's share.
    close(metrics.top_k_intersection(maps, region, k=100).values[:2], [0.5, 0.5])
    with pytest.raises(ValueError, match="k must be a positive int"):
        metrics.top_k_intersection(maps, region, k=0)


# --- topk explanations ------------------------------------------------------------------


def topk_setup():
    model = linear(torch.randn(3, 1, 4, 4))
    images = torch.rand(2, 1, 4, 4)
    maps = torch.rand(2, 2, 4, 4)
    targets = torch.tensor([[0, 2], [1, 0]])
    explanation = Explanation(maps=maps, raw_layers={}, logits=model(images).detach(), targets=targets, method="test")
    return model, images, explanation


SEGMENTS = torch.tensor([[[0, 0, 1, 1], [0, 0, 1, 1], [2, 2, 3, 3], [2, 2, 3, 3]],
                         [[0, 1, 1, 1], [0, 1, 1, 1], [0, 0, 2, 2], [0, 0, 2, 2]]])

MODEL_METRICS = {
    "deletion": lambda *a: metrics.deletion(*a, step=3),
    "insertion": lambda *a: metrics.insertion(*a, step=3, blur_kernel=3),
    "average-drop": metrics.average_drop,
    "pixel-flipping": metrics.pixel_flipping,
    "region-perturbation": lambda *a: metrics.region_perturbation(*a, patch_size=2, baseline=0.5),
    "irof": lambda *a: metrics.irof(*a, segments=SEGMENTS),
    "road": lambda *a: metrics.road(*a, percentages=(25, 50), noise=0.0),
    "selectivity": lambda *a: metrics.selectivity(*a, patch_size=2),
    "faithfulness-estimate": lambda *a: metrics.faithfulness_estimate(*a, step=3),
    "monotonicity": lambda *a: metrics.monotonicity(*a, step=3),
    "completeness": metrics.completeness,
    "non-sensitivity": lambda *a: metrics.non_sensitivity(*a, step=3),
}


@pytest.mark.parametrize("name", list(MODEL_METRICS))
def test_topk_equals_one_target_at_a_time(name):
    model, images, explanation = topk_setup()
    metric = MODEL_METRICS[name]
    together = metric(model, images, explanation)
    assert together.values.shape == (2, 2)
    for j in range(2):
        alone = metric(model, images, explanation.maps[:, j], explanation.targets[:, j])
        close(together.values[:, j], alone.values)
        for key, curve in together.curves.items():
            close(curve[:, j], alone.curves[key])
        for key, value in together.extra.items():
            close(value[:, j], alone.extra[key])


@pytest.mark.parametrize("name", ["region-perturbation", "road", "sensitivity", "random-logit",
                                  "local-lipschitz-estimate", "continuity", "relative-input-stability",
                                  "relative-representation-stability", "infidelity", "sensitivity-n",
                                  "faithfulness-correlation", "monotonicity-correlation"])
def test_topk_equals_one_target_at_a_time_with_random_draws(name):
    # The random draws (noise, the other class) belong to the image, not to its row among
    # the explained targets. (8 x 8: SSIM's window is 7 x 7.)
    model = linear(torch.randn(3, 1, 8, 8))
    images = torch.rand(2, 1, 8, 8)
    explanation = Explanation(maps=torch.rand(2, 2, 8, 8), raw_layers={}, logits=model(images).detach(),
                              targets=torch.tensor([[0, 2], [1, 0]]), method="test")
    explainer = MapExplainer(model, lambda images, targets: images[:, 0] * (targets + 1).view(-1, 1, 1))
    run = {
        "region-perturbation": lambda e, t=None: metrics.region_perturbation(model, images, e, t, patch_size=2),
        "road": lambda e, t=None: metrics.road(model, images, e, t, percentages=(25, 50)),
        "sensitivity": lambda e, t=None: metrics.sensitivity(explainer, images, e, t, n_samples=3),
        "random-logit": lambda e, t=None: metrics.random_logit(explainer, images, e, t),
        "local-lipschitz-estimate": lambda e, t=None: metrics.local_lipschitz_estimate(explainer, images, e, t,
                                                                                       n_samples=3),
        "continuity": lambda e, t=None: metrics.continuity(explainer, images, e, t, steps=4),
        "relative-input-stability": lambda e, t=None: metrics.relative_input_stability(explainer, images, e, t,
                                                                                       n_samples=3),
        "relative-representation-stability": lambda e, t=None: metrics.relative_representation_stability(
            explainer, images, e, t, layer="0", n_samples=3),
        "infidelity": lambda e, t=None: metrics.infidelity(model, images, e, t, n_samples=5),
        "sensitivity-n": lambda e, t=None: metrics.sensitivity_n(model, images, e, t, fractions=(0.1, 0.5),
                                                                 n_samples=4),
        "faithfulness-correlation": lambda e, t=None: metrics.faithfulness_correlation(model, images, e, t, subset=8,
                                                                                       n_runs=5),
        "monotonicity-correlation": lambda e, t=None: metrics.monotonicity_correlation(model, images, e, t, step=8,
                                                                                       n_samples=3),
    }[name]
    together = run(explanation)
    assert together.values.shape == (2, 2)
    for j in range(2):
        alone = Explanation(maps=explanation.maps[:, j], raw_layers={}, logits=explanation.logits,
                            targets=explanation.targets[:, j], method="test")
        close(together.values[:, j], run(alone).values)


def test_topk_localisation_and_concentration():
    maps = torch.rand(2, 3, 8, 8)
    boxes = torch.tensor([[0, 0, 4, 4], [2, 2, 8, 6]])
    for metric in (metrics.pointing_game, metrics.relevance_mass, metrics.relevance_rank,
                   metrics.energy_pointing_game, metrics.top_k_intersection):
        together = metric(maps, boxes).values
        assert together.shape == (2, 3)
        for j in range(3):
            close(together[:, j], metric(maps[:, j], boxes).values)
    for metric in (metrics.sparseness, metrics.complexity):
        together = metric(maps).values
        assert together.shape == (2, 3)
        for j in range(3):
            close(together[:, j], metric(maps[:, j]).values)


# --- input validation -------------------------------------------------------------------


def test_errors_name_the_fix():
    model = small_cnn(width=4)
    images = torch.rand(2, 3, 16, 16)
    targets = torch.tensor([0, 1])
    with pytest.raises(ValueError, match=r"one map per image at the images' size, \(2, 16, 16\)"):
        metrics.deletion(model, images, torch.rand(2, 8, 8), targets)
    with pytest.raises(ValueError, match=r"one map per image"):
        metrics.deletion(model, images, torch.rand(3, 16, 16), targets)
    with pytest.raises(ValueError, match="pass targets="):
        metrics.deletion(model, images, torch.rand(2, 16, 16))
    with pytest.raises(ValueError, match=r"targets have shape \(3,\)"):
        metrics.deletion(model, images, torch.rand(2, 16, 16), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="must be class ids"):
        metrics.deletion(model, images, torch.rand(2, 16, 16), torch.tensor([0.0, 1.0]))
    # An explanation of a callable target has no class ids (targets -1).
    custom = explain.GradCAM(model)(images, targets=lambda output: output[:, 0] - output[:, 1])
    assert (custom.targets == -1).all()
    for metric in (metrics.deletion, metrics.average_drop, metrics.road):
        with pytest.raises(ValueError, match="explain class ids, or pass targets="):
            metric(model, images, custom)
    # ... and passing them works.
    assert metrics.deletion(model, images, custom, targets, step=64).values.shape == (2,)
    nan_maps = torch.rand(2, 16, 16)
    nan_maps[0, 3, 3] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        metrics.insertion(model, images, nan_maps, targets)
    with pytest.raises(TypeError, match="explain.Explanation or a tensor"):
        metrics.deletion(model, images, nan_maps.numpy(), targets)
    for step in (0, -2, 1.5, 0.0, True, "row"):
        with pytest.raises(ValueError, match=r"step must be a number of pixels \(int >= 1\) or a fraction"):
            metrics.deletion(model, images, torch.rand(2, 16, 16), targets, step=step)
    with pytest.raises(ValueError, match="unknown score 'prob'; use one of probability, logit"):
        metrics.deletion(model, images, torch.rand(2, 16, 16), targets, score="prob")
    with pytest.raises(ValueError, match="n_samples must be a positive int"):
        metrics.sensitivity(explain.GradCAM(model), images, n_samples=0)
    with pytest.raises(ValueError, match="maps must be"):
        metrics.sparseness(torch.rand(16, 16))
    with pytest.raises(ValueError, match="one region per image"):
        metrics.pointing_game(torch.rand(2, 16, 16), torch.tensor([[0, 0, 4, 4]]))
    with pytest.raises(ValueError, match=r"masks \(N, 16, 16\) at the maps' size or boxes \(N, 4\)"):
        metrics.relevance_mass(torch.rand(2, 16, 16), torch.ones(2, 8, 8, dtype=torch.bool))


# --- hygiene: the model is left alone, no graph, batching does not matter ---------------


class NoGraph(nn.Module):
    """A small CNN with batch norm whose forward refuses to run with gradients on."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
                                 nn.Flatten(), nn.Linear(16, 3))

    def forward(self, x):
        assert not torch.is_grad_enabled(), "a metric's forward pass would build a graph"
        return self.net(x)


HYGIENE = {
    "deletion": lambda model, images, maps, t, b: metrics.deletion(model, images, maps, t, step=7, batch_size=b),
    "insertion": lambda model, images, maps, t, b: metrics.insertion(model, images, maps, t, step=7, batch_size=b),
    "average-drop": lambda model, images, maps, t, b: metrics.average_drop(model, images, maps, t, batch_size=b),
    "road": lambda model, images, maps, t, b: metrics.road(model, images, maps, t, percentages=(20, 60),
                                                           batch_size=b),
    "pixel-flipping": lambda model, images, maps, t, b: metrics.pixel_flipping(model, images, maps, t, step=0.1,
                                                                               batch_size=b),
    "region-perturbation": lambda model, images, maps, t, b: metrics.region_perturbation(
        model, images, maps, t, patch_size=4, batch_size=b),
    "irof": lambda model, images, maps, t, b: metrics.irof(model, images, maps, t, n_segments=8, batch_size=b),
    "selectivity": lambda model, images, maps, t, b: metrics.selectivity(model, images, maps, t, patch_size=4,
                                                                         batch_size=b),
    "infidelity": lambda model, images, maps, t, b: metrics.infidelity(model, images, maps, t, n_samples=6,
                                                                       batch_size=b),
    "sensitivity-n": lambda model, images, maps, t, b: metrics.sensitivity_n(model, images, maps, t, n_samples=4,
                                                                             fractions=(0.1, 0.5), batch_size=b),
    "faithfulness-correlation": lambda model, images, maps, t, b: metrics.faithfulness_correlation(
        model, images, maps, t, n_runs=6, subset=10, batch_size=b),
    "faithfulness-estimate": lambda model, images, maps, t, b: metrics.faithfulness_estimate(
        model, images, maps, t, step=0.1, batch_size=b),
    "monotonicity": lambda model, images, maps, t, b: metrics.monotonicity(model, images, maps, t, step=0.1,
                                                                           batch_size=b),
    "monotonicity-correlation": lambda model, images, maps, t, b: metrics.monotonicity_correlation(
        model, images, maps, t, step=0.1, n_samples=3, batch_size=b),
    "completeness": lambda model, images, maps, t, b: metrics.completeness(model, images, maps, t, batch_size=b),
    "non-sensitivity": lambda model, images, maps, t, b: metrics.non_sensitivity(model, images, maps, t, step=24,
                                                                                 score="logit", batch_size=b),
    "sufficiency": lambda model, images, maps, t, b: metrics.sufficiency(model, images, maps, t, threshold=1.0,
                                                                         batch_size=b),
    "consistency": lambda model, images, maps, t, b: metrics.consistency(model, images, maps, t, grid=1,
                                                                         batch_size=b),
}


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name", list(HYGIENE))
def test_model_metrics_leave_the_model_alone_and_batching_changes_nothing(name, training):
    # A model left in training mode too: batch norm must not learn from (nor depend on)
    # the perturbed batches.
    model = NoGraph().train(training)
    with torch.no_grad():
        model.net[1].running_mean.uniform_(-0.5, 0.5)
    model.net[5].weight.grad = torch.ones_like(model.net[5].weight)
    images = torch.rand(3, 3, 12, 12)
    maps = torch.rand(3, 12, 12)
    targets = torch.tensor([0, 2, 1])
    state = ModelState(model)
    one = HYGIENE[name](model, images, maps, targets, 1)
    state.assert_unchanged()
    many = HYGIENE[name](model, images, maps, targets, 64)
    state.assert_unchanged()
    assert not one.values.requires_grad and torch.isfinite(one.values).all()
    # Equal up to float rounding (a convolution's batch of 1 and of 64 may sum in another
    # order); average drop's 100 (Y - O) / Y magnifies it.
    tol = 1e-4 if name == "average-drop" else 1e-6
    if name in ("infidelity", "sensitivity-n", "faithfulness-correlation", "faithfulness-estimate"):
        tol = 1e-4  # squared errors and correlations of score differences magnify the rounding
    torch.testing.assert_close(one.values, many.values, rtol=tol, atol=tol)
    for key in one.curves:
        torch.testing.assert_close(one.curves[key], many.curves[key], rtol=max(tol, 1e-6), atol=max(tol, 1e-6))


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_pic_leaves_the_model_alone_and_batching_changes_nothing(training):
    model = NoGraph().train(training)
    state = ModelState(model)
    images, maps, targets = torch.rand(3, 3, 12, 12), torch.rand(3, 12, 12), torch.tensor([0, 2, 1])
    one = metrics.pic(model, images, maps, targets, min_probability=0.0, batch_size=1)
    state.assert_unchanged()
    many = metrics.pic(model, images, maps, targets, min_probability=0.0, batch_size=64)
    state.assert_unchanged()
    for key in ("sic", "aic"):
        torch.testing.assert_close(one.curves[key], many.curves[key], rtol=1e-5, atol=1e-5, equal_nan=True)


def test_new_faithfulness_metrics_name_the_fix():
    model, images, maps, targets = region_model(R), X, map_from_order(ORDER), torch.tensor([0])
    with pytest.raises(ValueError, match="n_samples must be a positive int"):
        metrics.infidelity(model, images, maps, targets, n_samples=0)
    with pytest.raises(ValueError, match="fractions must lie strictly between 0 and 1"):
        metrics.sensitivity_n(model, images, maps, targets, fractions=(0.5, 1.0))
    with pytest.raises(ValueError, match="n_runs must be a positive int"):
        metrics.faithfulness_correlation(model, images, maps, targets, n_runs=0)
    with pytest.raises(ValueError, match=r"step must be a number of pixels"):
        metrics.faithfulness_estimate(model, images, maps, targets, step=0)
    with pytest.raises(ValueError, match="patch_size must be a positive int"):
        metrics.selectivity(model, images, maps, targets, patch_size=0)
    with pytest.raises(ValueError, match="random_fraction must be a share of the pixels below 1"):
        metrics.pic(model, images / 16, maps, targets, random_fraction=1.0)


def test_explainer_metrics_leave_the_model_alone():
    model, images = model_with_state(), smooth_images(2, 16)
    state = ModelState(model)
    cam = explain.GradCAM(model)
    explanation = cam(images)
    a = metrics.sensitivity(cam, images, explanation, n_samples=3, batch_size=2)
    b = metrics.sensitivity(cam, images, explanation, n_samples=3, batch_size=64)
    torch.testing.assert_close(a.values, b.values, rtol=1e-5, atol=1e-6)
    one = metrics.random_logit(cam, images, explanation, batch_size=1)
    torch.testing.assert_close(one.values, metrics.random_logit(cam, images, explanation).values)
    one = metrics.model_randomisation(cam, images, explanation, batch_size=1)
    torch.testing.assert_close(one.values, metrics.model_randomisation(cam, images, explanation).values)
    state.assert_unchanged()


# --- the registry -----------------------------------------------------------------------


def test_every_registered_metric_runs_on_resnet18():
    import torchvision

    model = torchvision.models.resnet18(num_classes=10).eval()
    images = torch.rand(2, 3, 32, 32)
    cam = explain.GradCAM(model)
    explanation = cam(images)
    boxes = torch.tensor([[4, 4, 20, 20], [10, 0, 32, 16]])
    state = ModelState(model)
    assert metrics.metric_names()[:3] == ["deletion", "insertion", "average-drop"]
    assert len(metrics.metric_names()) == 43
    top = ["fc", "layer4.1.conv2", "layer4.0.conv1"]
    for name in metrics.metric_names():
        options = {"randomisation": {"layers": top}, "smooth-randomisation": {"layers": top, "n_samples": 2},
                   "efficient-randomisation": {"layers": top}, "continuity": {"steps": 4},
                   "infidelity": {"n_samples": 8}, "sensitivity-n": {"fractions": (0.1, 0.5), "n_samples": 4},
                   "faithfulness-correlation": {"n_runs": 8}, "faithfulness-estimate": {"step": 0.1},
                   "monotonicity": {"step": 0.1}, "monotonicity-correlation": {"step": 0.1, "n_samples": 2},
                   "sic": {"min_probability": 0.0}, "non-sensitivity": {"step": 256},
                   "focus": {"labels": torch.tensor([0, 1])}, "mst-c": {"threshold": 90.0}}.get(name, {})
        if name in ("sensitivity", "local-lipschitz-estimate"):
            options = {"n_samples": 2}
        if name.startswith("relative-"):  # noise too small to change a class: no NaN
            options = {"n_samples": 2, "radius": 1e-3}
        score = metrics.compute(name, cam, images, explanation, regions=boxes, **options)
        assert score.values.shape == (2,), name
        if name == "sic":  # PAIR's curve skips (NaN) an image whose blurred copy scores as high
            assert score.curves["sic"].shape == (2, 1001)
            continue
        if name in ("sufficiency", "consistency", "focus"):
            # Across images: 2 images of different classes share nothing and make no mosaic
            # (NaN; tests/test_metrics_more.py checks them with known answers).
            assert score.values.shape == (2,), name
            continue
        assert torch.isfinite(score.values).all(), name
        spec = metrics.METRICS[name]
        columns = registry.columns(name, score)
        assert list(columns) == list(spec.columns), name
        assert columns[name][1] == score.higher_is_better, name
        for column, (values, higher) in columns.items():
            assert values.shape == (2,) and torch.isfinite(values).all(), (name, column)
            assert higher in (True, False), (name, column)
    state.assert_unchanged()
    # Names ignore case and underscores; unknown names list the known ones.
    assert metrics.compute("Average_Drop", cam, images, explanation).metric == "average-drop"
    with pytest.raises(ValueError, match="did you mean deletion"):
        metrics.compute("deletoin", cam, images, explanation)
    with pytest.raises(ValueError, match="pointing-game needs the objects' regions: pass regions="):
        metrics.compute("pointing-game", cam, images, explanation)


def test_declared_columns():
    assert {name: list(spec.columns) for name, spec in metrics.METRICS.items()} == {
        "deletion": ["deletion"], "insertion": ["insertion"],
        "average-drop": ["average-drop", "increase-in-confidence", "average-gain"],
        "road": ["road", "road-morf", "road-lerf"], "pixel-flipping": ["pixel-flipping"],
        "region-perturbation": ["region-perturbation"], "irof": ["irof"],
        "sensitivity": ["sensitivity", "avg-sensitivity"], "local-lipschitz-estimate": ["local-lipschitz-estimate"],
        "continuity": ["continuity"], "relative-input-stability": ["relative-input-stability"],
        "relative-output-stability": ["relative-output-stability"],
        "relative-representation-stability": ["relative-representation-stability"],
        "randomisation": ["randomisation", "randomisation-ssim"], "smooth-randomisation": ["smooth-randomisation"],
        "efficient-randomisation": ["efficient-randomisation"], "random-logit": ["random-logit"], "pointing-game": ["pointing-game"], "relevance-mass": ["relevance-mass"],
        "relevance-rank": ["relevance-rank"], "energy-pointing-game": ["energy-pointing-game"],
        "sparseness": ["sparseness"], "complexity": ["complexity"], "selectivity": ["selectivity"],
        "infidelity": ["infidelity"], "sensitivity-n": ["sensitivity-n"],
        "faithfulness-correlation": ["faithfulness-correlation"], "faithfulness-estimate": ["faithfulness-estimate"],
        "monotonicity": ["monotonicity"], "monotonicity-correlation": ["monotonicity-correlation"],
        "sic": ["sic", "aic"], "top-k-intersection": ["top-k-intersection"],
        "arcc": ["arcc", "arcc-coherency", "arcc-complexity", "arcc-road"],
        "completeness": ["completeness", "completeness-met"], "non-sensitivity": ["non-sensitivity"],
        "input-invariance": ["input-invariance"], "sufficiency": ["sufficiency"], "consistency": ["consistency"],
        "focus": ["focus"], "auc": ["auc"], "attribution-localisation": ["attribution-localisation"],
        "effective-complexity": ["effective-complexity"], "mst-c": ["mst-c"],
    }
    assert metrics.METRICS["road"].columns["road-morf"] == ("morf", False)
    assert metrics.METRICS["average-drop"].columns["average-gain"] == ("gain", True)
    assert metrics.METRICS["sic"].columns["aic"] == ("aic", True)


@pytest.mark.parametrize("metric", [metrics.sparseness, metrics.complexity,
                                    lambda maps: metrics.pointing_game(maps, torch.ones(1, 4, 4, dtype=torch.bool)),
                                    lambda maps: metrics.relevance_mass(maps, torch.ones(1, 4, 4, dtype=torch.bool)),
                                    lambda maps: metrics.relevance_rank(maps, torch.ones(1, 4, 4, dtype=torch.bool)),
                                    lambda maps: metrics.energy_pointing_game(maps, torch.ones(1, 4, 4, dtype=torch.bool)),
                                    lambda maps: metrics.top_k_intersection(maps, torch.ones(1, 4, 4, dtype=torch.bool))])
def test_maps_metrics_refuse_nan_maps_as_the_faithfulness_metrics_do(metric):
    maps = torch.rand(1, 4, 4)
    maps[0, 1, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN or infinite"):
        metric(maps)


@pytest.mark.parametrize("metric", [metrics.deletion, metrics.insertion, metrics.average_drop, metrics.road])
def test_a_target_beyond_the_models_classes_names_the_range(metric):
    model = region_model([0, 1], classes=2)
    with pytest.raises(ValueError, match=r"target class 5 is out of range: the model has 2 classes \(ids 0..1\)"):
        metric(model, torch.rand(1, 1, 4, 4), torch.rand(1, 4, 4), targets=torch.tensor([5]))
