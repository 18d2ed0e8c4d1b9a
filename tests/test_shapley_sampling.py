"""Shapley value sampling over SLIC superpixels (explain.ShapleyValueSampling) against values
known exactly, a plain loop of its definition, and captum called directly.

- Known values: on a linear model each superpixel's Shapley value is its own contribution,
  sum over its pixels of w (x - x'), whatever the permutations.
- Efficiency: on a ReLU network every permutation's gains add up to S(x) - S(x'), so the
  sampled values do too.
- A plain loop of Castro et al.'s estimator on the same seeded permutations, and captum's
  ShapleyValueSampling on the same superpixels and seed.
- The library's promises: seeded per image, inner batches and pass counts, the model left as
  it was, images only.
"""

import warnings

import captum.attr as ca
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import explain
from conftest import ModelState, listening
from explain.passes import pass_settings
from explain.superpixels import superpixels

IDS = torch.tensor([1, 3])


def tiny_cnn(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 6, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 5),
    ).eval()
    with torch.no_grad():
        model[6].weight.mul_(30.0)
    return model


def images(n=2, size=16, seed=1):
    coarse = torch.randn(n, 3, 4, 4, generator=torch.Generator().manual_seed(seed))
    return F.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)


def values_of(raw, segments):
    """Each superpixel's value (the same on all its pixels and channels), by segment id."""
    values = []
    for s in range(int(segments.max()) + 1):
        inside = raw[:, segments[0] == s]
        assert torch.allclose(inside, inside.flatten()[0].expand_as(inside))
        values.append(inside.flatten()[0])
    return torch.stack(values)


def test_on_a_linear_model_each_superpixel_gets_its_own_contribution():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 5)).eval()
    x = images()
    res = explain.ShapleyValueSampling(model, n_samples=3, n_segments=6, baseline=0.5)(x, IDS)
    segments = superpixels(x, 6, 10.0)
    weights = model[1].weight.detach().view(5, 3, 16, 16)
    for i in range(2):
        contribution = weights[IDS[i]] * (x[i] - 0.5)
        expected = torch.stack([contribution[:, segments[i, 0] == s].sum() for s in range(int(segments[i].max()) + 1)])
        assert len(expected) >= 3
        torch.testing.assert_close(values_of(res.raw[i], segments[i]), expected, rtol=1e-4, atol=1e-5)


def test_the_values_add_up_to_the_score_difference():
    model, x = tiny_cnn(), images()
    res = explain.ShapleyValueSampling(model, n_samples=4, n_segments=8)(x, IDS)
    segments = superpixels(x, 8, 10.0)
    with torch.no_grad():
        delta = model(x).gather(1, IDS[:, None])[:, 0] - model(torch.zeros_like(x)).gather(1, IDS[:, None])[:, 0]
    assert delta.abs().min() > 0.1
    for i in range(2):
        torch.testing.assert_close(values_of(res.raw[i], segments[i]).sum(), delta[i], rtol=1e-5, atol=1e-5)


def shapley_loop(model, image, baseline, segments, target, n_samples, seed):
    """Castro et al.'s estimator: the mean over seeded random orders of each feature's gain."""
    features = int(segments.max()) + 1
    values = torch.zeros(features)
    torch.manual_seed(seed)
    with torch.no_grad():
        for _ in range(n_samples):
            order = torch.randperm(features).tolist()
            current = baseline.clone()
            before = model(current[None])[0, target]
            for feature in order:
                current = torch.where(segments == feature, image, current)
                after = model(current[None])[0, target]
                values[feature] += after - before
                before = after
    return values / n_samples


def test_equals_a_plain_loop_of_the_estimator_on_the_same_permutations():
    model, x = tiny_cnn(), images()
    res = explain.ShapleyValueSampling(model, n_samples=5, n_segments=8, seed=3, internal_batch_size=3)(x, IDS)
    segments = superpixels(x, 8, 10.0)
    for i in range(2):
        expected = shapley_loop(model, x[i], torch.zeros_like(x[i]), segments[i], IDS[i], 5, seed=3)
        torch.testing.assert_close(values_of(res.raw[i], segments[i]), expected, rtol=1e-5, atol=1e-6)


def test_matches_captum_on_the_same_superpixels_and_seed():
    model, x = tiny_cnn(), images()
    res = explain.ShapleyValueSampling(model, n_samples=6, n_segments=8, seed=11)(x, IDS)
    segments = superpixels(x, 8, 10.0)
    for i in range(2):
        torch.manual_seed(11)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = ca.ShapleyValueSampling(model).attribute(
                x[i : i + 1], baselines=torch.zeros_like(x[i : i + 1]), target=IDS[i : i + 1],
                feature_mask=segments[i : i + 1], n_samples=6, perturbations_per_eval=4,
            )
        torch.testing.assert_close(res.raw[i : i + 1], expected)
        assert expected.abs().max() > 0


def test_seeded_per_image_batched_and_counted():
    model, x = tiny_cnn(), images(3)
    method = explain.ShapleyValueSampling(model, n_samples=3, n_segments=6, seed=2)
    counted = []
    with pass_settings(listener=listening(lambda name, done, total: counted.append(done))):
        whole = method(x)
    features = [int(s.max()) + 1 for s in superpixels(x, 6, 10.0)]
    # one pass for the targets, then per image the baseline and one per feature and order
    assert counted[-1] == 3 + sum(1 + 3 * k for k in features)
    assert method.planned_passes(x) == 3 * (2 + 3 * 6)  # estimated from n_segments
    alone = explain.ShapleyValueSampling(model, n_samples=3, n_segments=6, seed=2)(x[1:2], whole.targets[1:2])
    torch.testing.assert_close(alone.raw, whole.raw[1:2])
    one_row = explain.ShapleyValueSampling(model, n_samples=3, n_segments=6, seed=2, internal_batch_size=1)(x)
    torch.testing.assert_close(one_row.raw, whole.raw)
    state = torch.random.get_rng_state()
    explain.ShapleyValueSampling(model, n_samples=2, n_segments=6, seed=5)(x[:1])
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's stream untouched


@pytest.mark.parametrize("mode", ["plain", "no_grad", "inference_mode"])
def test_the_model_is_left_as_it_was(mode):
    model = tiny_cnn().train()
    next(model.parameters()).requires_grad_(False)
    state = ModelState(model)
    context = {"plain": torch.enable_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}[mode]
    with context():
        res = explain.ShapleyValueSampling(model, n_samples=2, n_segments=6)(images(1))
    state.assert_unchanged()
    assert res.maps.max() == 1

    def failing(output):
        raise RuntimeError("target failed")

    with pytest.raises(RuntimeError, match="target failed"):
        explain.ShapleyValueSampling(model, n_samples=2, n_segments=6)(images(1), failing)
    state.assert_unchanged()


def test_applies_to_images_only_and_checks_its_settings():
    with pytest.raises(explain.NotApplicable, match="superpixels"):
        explain.ShapleyValueSampling(nn.Sequential(nn.Conv1d(2, 3, 3), nn.Flatten()))(torch.rand(1, 2, 16))
    with pytest.raises(ValueError, match="n_samples must be a positive int"):
        explain.ShapleyValueSampling(tiny_cnn(), n_samples=0)
