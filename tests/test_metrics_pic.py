"""explain.metrics.pic (the softmax and accuracy information curves) against its reference,
Google PAIR's ``saliency.metrics.pic`` (the ``anchors`` extra), on the same images, maps,
random masks and model.

PAIR computes one image at a time from its 8-bit pixels: ``create_blurred_image`` interpolates
the unknown pixels with scipy's ``griddata`` once per channel, ``estimate_image_entropy`` takes
the lossless WebP size, ``compute_pic_metric`` builds the curve and its area (``np.trapz``,
which numpy 2 removed: put back for these tests). explain makes the same copies with one
triangulation and exact barycentric weights, runs them through the model in batches, and
builds the same curve; the copies are bitwise equal, the curves and areas equal up to the
float32 rounding of batched passes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

pic = pytest.importorskip("saliency.metrics.pic")

from explain import metrics  # noqa: E402
from explain.metrics.faithfulness.information_curves import (  # noqa: E402
    PIC_THRESHOLDS,
    compressed_size,
    eight_bit,
    interpolated_image,
    random_pixels,
)

LAPLACE = torch.tensor([[0.0, -1.0, 0.0], [-1.0, 4.0, -1.0], [0.0, -1.0, 0.0]])[None, None]


class Edges(nn.Module):
    """Class 0 is the image's high-frequency energy, class 1 a constant: a noisy image is
    class 0, its blurred copies are class 1, and revealing the edges brings class 0 back."""

    def forward(self, x):
        energy = F.conv2d(x.mean(1, keepdim=True), LAPLACE, padding=1).abs().mean((1, 2, 3))
        return torch.stack([40 * (energy - 0.15), torch.zeros_like(energy)], 1)


@pytest.fixture
def trapz():
    if hasattr(np, "trapz"):
        yield
        return
    np.trapz = np.trapezoid
    try:
        yield
    finally:
        del np.trapz


def setup(n=2, size=24, seed=0):
    generator = torch.Generator().manual_seed(seed)
    noise = torch.rand(n, 3, size, size, generator=generator) * 0.5
    images = (noise + torch.linspace(0, 0.5, size)).clamp(0, 1)
    pixels = eight_bit(images, None)
    images = torch.from_numpy(pixels).permute(0, 3, 1, 2).float() / 255  # exactly 8-bit
    maps = F.conv2d(images.mean(1, keepdim=True), LAPLACE, padding=1).abs()[:, 0]
    maps = maps + torch.rand(maps.shape, generator=generator) * 1e-3  # no ties
    return Edges().eval(), images, pixels, maps


def pred_func(model, which):
    def predict(batch: np.ndarray):
        with torch.no_grad():
            out = model(torch.from_numpy(batch).permute(0, 3, 1, 2).float() / 255)
        return (out.softmax(1)[:, 0] if which == "sic" else (out.argmax(1) == 0).float()).tolist()

    return predict


def test_copies_and_information_are_pairs():
    rng = np.random.default_rng(0)
    for size, fraction in [(16, 0.0), (32, 0.01), (32, 0.3), (48, 0.75), (40, 0.5)]:
        image = rng.integers(0, 256, (size, size + 3, 3)).astype(np.uint8)
        known = rng.random((size, size + 3)) < fraction
        ours = interpolated_image(image, known)
        assert np.array_equal(ours, pic.create_blurred_image(image, known)), (size, fraction)
        assert compressed_size(ours) == pic.estimate_image_entropy(ours)
    gray = rng.integers(0, 256, (20, 20, 1)).astype(np.uint8)
    known = rng.random((20, 20)) < 0.2
    assert np.array_equal(interpolated_image(gray, known)[..., 0], pic.create_blurred_image(gray[..., 0], known))
    assert compressed_size(gray) == pic.estimate_image_entropy(gray[..., 0])


@pytest.mark.parametrize("keep_monotonous", [True, False])
def test_sic_and_aic_equal_pairs(trapz, keep_monotonous):
    """The same random pixels (explain's, drawn from the seed and the image, handed to PAIR),
    thresholds and minimum probability; SIC from the class's softmax, AIC from whether it is
    the top class."""
    model, images, pixels, maps = setup()
    targets = torch.zeros(len(images), dtype=torch.long)
    names = ("sic", "aic") if keep_monotonous else ("sic",)
    ours = metrics.pic(model, images, maps, targets, keep_monotonous=keep_monotonous, seed=7)
    for name in names:
        values = ours.values if name == "sic" else ours.extra["aic"]
        for i in range(len(images)):
            theirs = pic.compute_pic_metric(
                img=pixels[i], saliency_map=maps[i].numpy(), random_mask=random_pixels(pixels[i], 0.01, 7),
                pred_func=pred_func(model, name), saliency_thresholds=list(PIC_THRESHOLDS), min_pred_value=0.8,
                keep_monotonous=keep_monotonous, num_data_points=1000)
            print(f"{name} image {i}: explain {values[i].item():.6f}, PAIR {theirs.auc:.6f}")
            assert values[i].item() == pytest.approx(theirs.auc, abs=1e-5)
            np.testing.assert_allclose(ours.curves[name][i].numpy(), theirs.curve_y, atol=1e-5)
            np.testing.assert_allclose(ours.steps.numpy(), theirs.curve_x, atol=1e-7)
    assert (ours.values > 0.3).all() and (ours.values < 1).all()  # a curve that rises, not a trivial one


def test_skipped_images_are_those_pair_refuses(trapz):
    """An image below the minimum probability: PAIR raises ComputePicMetricError, explain
    scores NaN."""
    model, images, pixels, maps = setup()
    ours = metrics.pic(model, images, maps, torch.zeros(2, dtype=torch.long), min_probability=0.9999)
    for i in range(2):
        with pytest.raises(pic.ComputePicMetricError):
            pic.compute_pic_metric(img=pixels[i], saliency_map=maps[i].numpy(),
                                   random_mask=random_pixels(pixels[i], 0.01, 0), pred_func=pred_func(model, "sic"),
                                   saliency_thresholds=list(PIC_THRESHOLDS), min_pred_value=0.9999)
    assert torch.isnan(ours.values).all()
