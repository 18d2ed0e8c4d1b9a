"""The methods from the other anchors (Guided IG, Blur IG, XRAI, extremal perturbations,
RISE) against those anchors and against plain references of their papers' formulas.

- Anchors: Google PAIR's ``saliency`` package (Guided IG, Blur IG, XRAI) and TorchRay
  (extremal perturbations; RISE on the same masks), called here on the same tiny model,
  input and target.
- Plain references written here with loops: Guided IG on the straight line is left-Riemann
  IG; Blur IG adds up to S(x) - S(blurred x); RISE's weighted sum of masks.
- The library's promises: results independent of the memory budget, the model left as it
  was (also after Ctrl-C), NotApplicable where a method does not apply.

Tiny seeded models on 16 x 16 inputs keep each test to a second or two.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import explain
from conftest import ModelState
from explain.passes import pass_settings

saliency_core = pytest.importorskip("saliency.core")


def tiny_cnn(seed=0, classes=5):
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 6, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, classes),
    ).eval()


def images(n=2, size=16, seed=1):
    coarse = torch.randn(n, 3, 4, 4, generator=torch.Generator().manual_seed(seed))
    return F.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)


def pair_gradients(model, channels_last):
    """PAIR's ``call_model_function``: the gradient of the target class's logit."""

    def call(batch, call_model_args=None, expected_keys=None):
        x = torch.tensor(np.asarray(batch), dtype=torch.float32)
        x = x.permute(0, 3, 1, 2) if channels_last else x
        x.requires_grad_(True)
        (gradient,) = torch.autograd.grad(model(x)[:, call_model_args].sum(), x)
        gradient = gradient.permute(0, 2, 3, 1) if channels_last else gradient
        return {saliency_core.INPUT_OUTPUT_GRADIENTS: gradient.numpy()}

    return call


@pytest.fixture
def numpy2_quantile(monkeypatch):
    """PAIR's Guided IG calls ``np.quantile(..., interpolation=)``, which numpy 2 renamed ``method=``."""
    import saliency.core.guided_ig as guided_ig

    quantile = np.quantile

    class Numpy:
        def __getattr__(self, name):
            return getattr(np, name)

        @staticmethod
        def quantile(a, q, interpolation="linear"):
            return quantile(a, q, method=interpolation)

    monkeypatch.setattr(guided_ig, "np", Numpy())


def test_guided_ig_matches_pair_saliency(numpy2_quantile):
    model, x = tiny_cnn(), images()
    ours = explain.GuidedIG(model, steps=20, fraction=0.25, max_dist=0.02)(x)
    for i, target in enumerate(ours.targets.tolist()):
        theirs = saliency_core.GuidedIG().GetMask(
            x[i].double().numpy(), pair_gradients(model, False), call_model_args=target, x_steps=20,
            fraction=0.25, max_dist=0.02,
        )
        assert np.abs(ours.raw[i].double().numpy() - theirs).max() < 1e-4 * np.abs(theirs).max()


def test_guided_ig_on_the_straight_line_is_left_riemann_ig():
    # max_dist = 0 keeps every feature on the straight line: each step moves all of them to
    # alpha = (k + 1) / steps, so the sum is IG's left Riemann sum.
    model, x = tiny_cnn(), images()
    guided = explain.GuidedIG(model, steps=8, max_dist=0.0)(x).raw
    straight = explain.IntegratedGradients(model, n_steps=8, method="riemann_left")(x).raw
    assert torch.allclose(guided, straight, atol=1e-6, rtol=1e-4)


def test_blur_ig_matches_pair_saliency():
    model, x = tiny_cnn(), images()
    ours = explain.BlurIG(model, steps=20, max_sigma=10.0)(x)
    for i, target in enumerate(ours.targets.tolist()):
        theirs = saliency_core.BlurIG().GetMask(
            x[i].permute(1, 2, 0).double().numpy(), pair_gradients(model, True), call_model_args=target,
            steps=20, max_sigma=10.0,
        )
        mine = ours.raw[i].permute(1, 2, 0).double().numpy()
        assert np.abs(mine - theirs).max() < 1e-4 * np.abs(theirs).max()


def test_blur_ig_adds_up_to_the_score_lost_by_blurring():
    # A path method: the attributions sum to S(x) - S(x blurred at max_sigma), up to the
    # Riemann sum's error, which many steps make small. The reference blur: scipy's.
    from scipy import ndimage

    model, x = tiny_cnn(), images(1)
    result = explain.BlurIG(model, steps=400, max_sigma=6.0)(x)
    target = result.targets.item()
    blurred = ndimage.gaussian_filter(x[0].double().numpy(), sigma=[0, 6.0, 6.0], mode="constant")
    with torch.no_grad():
        lost = (model(x)[0, target] - model(torch.from_numpy(blurred)[None].float())[0, target]).item()
    assert result.raw.sum().item() == pytest.approx(lost, rel=0.02)


def test_xrai_matches_pair_saliency():
    model, x = tiny_cnn(), images(size=24)
    ours = explain.XRAI(model, steps=10)(x)
    assert ours.raw.shape == (2, 1, 24, 24) and ours.signed
    for i, target in enumerate(ours.targets.tolist()):
        theirs = saliency_core.XRAI().GetMask(
            x[i].permute(1, 2, 0).double().numpy(), pair_gradients(model, True), call_model_args=target,
            extra_parameters=saliency_core.XRAIParameters(steps=10),
        )
        assert np.abs(ours.raw[i, 0].double().numpy() - theirs).max() < 1e-4 * np.abs(theirs).max()


def test_xrai_ranks_the_region_holding_the_attribution_first():
    # A plain check of the greedy ranking: the region with the highest mean gain over its new
    # pixels comes first and they get that mean; then the whole image (its 75 new pixels:
    # mean -25/75) beats the bottom-right square (mean -1), which then adds nothing and is dropped.
    from explain.methods.region_attribution import xrai_ranking

    attribution = torch.zeros(10, 10)
    attribution[:5, :5] = 2.0
    attribution[5:, 5:] = -1.0
    regions = torch.zeros(3, 10, 10, dtype=torch.bool)
    regions[0, :5, :5] = True
    regions[1, 5:, 5:] = True
    regions[2, :, :] = True
    heatmap = xrai_ranking(attribution, regions, min_pixel_diff=10)
    assert heatmap[0, 0] == 2.0  # first: the top-left square, its mean
    assert torch.allclose(heatmap[5:, :], torch.tensor(-25.0 / 75.0, dtype=heatmap.dtype))
    assert torch.allclose(heatmap[:, 5:], torch.tensor(-25.0 / 75.0, dtype=heatmap.dtype))


def test_xrai_is_not_applicable_beyond_grey_and_colour_images():
    model = nn.Sequential(nn.Conv2d(4, 3, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(3, 2)).eval()
    with pytest.raises(explain.NotApplicable, match="1 or 3 channels.*use ig"):
        explain.XRAI(model, steps=2)(torch.randn(1, 4, 16, 16))


@pytest.mark.parametrize("method, options", [
    ("guidedig", {"steps": 6}), ("blurig", {"steps": 6, "max_sigma": 4.0}), ("xrai", {"steps": 4}),
    ("extremal", {"steps": 6, "mask_step": 4, "sigma": 8.0}), ("rise", {"n_masks": 20, "cell_size": 4}),
])
def test_results_do_not_depend_on_the_budget_and_the_model_is_left_alone(method, options):
    model, x = tiny_cnn(), images(3)
    state = ModelState(model)
    cam = explain.explainer(method, model, **options)
    roomy = cam(x)
    tight = cam(x, max_memory=1)  # one row per pass
    assert torch.allclose(roomy.raw, tight.raw, atol=1e-6, rtol=1e-5), method
    assert torch.equal(roomy.maps, tight.maps) or torch.allclose(roomy.maps, tight.maps, atol=1e-5)
    with torch.no_grad():
        assert cam(x[:1]).raw.shape[0] == 1  # under no_grad, as an inference loop calls it
    state.assert_unchanged()


@pytest.mark.parametrize("method, options", [
    ("guidedig", {"steps": 50}), ("blurig", {"steps": 50}), ("xrai", {"steps": 50}),
    ("extremal", {"steps": 50, "mask_step": 4, "sigma": 8.0}), ("rise", {"n_masks": 100, "cell_size": 4}),
])
def test_a_stop_between_passes_leaves_the_model_as_it_was(method, options):
    model, x = tiny_cnn(), images(2)
    state = ModelState(model)
    asked = iter(range(1000))
    with pass_settings(stop=lambda: next(asked) == 3), pytest.raises(KeyboardInterrupt):
        explain.explainer(method, model, internal_batch_size=2, **options)(x)
    state.assert_unchanged()


@pytest.mark.filterwarnings("ignore:torch.meshgrid")  # TorchRay's
@pytest.mark.parametrize("variant", ["preserve", "delete"])
def test_extremal_perturbation_matches_torchray(variant):
    extremal = pytest.importorskip("torchray.attribution.extremal_perturbation")
    model, x = tiny_cnn(), images(2, size=32)
    options = dict(areas=(0.1, 0.3), steps=12, mask_step=4, sigma=8.0)
    ours = explain.ExtremalPerturbation(model, variant=variant, **options)(x)
    assert ours.raw.shape == (2, 2, 32, 32)
    for i, target in enumerate(ours.targets.tolist()):
        theirs, _ = extremal.extremal_perturbation(
            model, x[i : i + 1], target, areas=[0.1, 0.3], max_iter=12, step=4, sigma=8.0, variant=variant,
        )
        assert torch.allclose(ours.raw[i], theirs[:, 0], atol=1e-5)
    for parameter in model.parameters():  # TorchRay leaves them frozen
        parameter.requires_grad_(True)


def test_extremal_perturbation_sums_its_areas_and_keeps_the_area_constraint():
    # The constraint holds the area of the whole mask, margin included (as TorchRay's): of the
    # 32 x 32 image, a mask of area a covers about a times the margined mask's share more.
    model, x = tiny_cnn(), images(1, size=32)
    result = explain.ExtremalPerturbation(model, areas=(0.1, 0.4), steps=400, mask_step=2, sigma=4.0)(x)
    coverage = result.raw[0].flatten(1).mean(dim=1)
    margined = (32 + 2 * 4) ** 2 / 32**2
    assert coverage.tolist() == pytest.approx([0.1 * margined, 0.4 * margined], rel=0.25)
    assert torch.equal(result.maps, explain.methods.attribution_base.normalize_maps(result.raw.sum(dim=1)))


def test_extremal_perturbation_refuses_areas_outside_the_image():
    with pytest.raises(ValueError, match=r"areas must be fractions.*\(0.05, 0.1, 0.2\)"):
        explain.ExtremalPerturbation(tiny_cnn(), areas=[0.1, 1.5])


def test_rise_is_the_papers_weighted_sum_of_masks():
    # A plain reference: one masked image at a time, S = sum_i P(c | x * M_i) M_i / (N p).
    from explain.methods.drise import rise_masks

    model, x = tiny_cnn(), images(2)
    result = explain.RISE(model, n_masks=40, cell_size=4, p=0.3, seed=5)(x)
    masks = rise_masks(40, (16, 16), cell_size=4, p=0.3, seed=5)
    for i, target in enumerate(result.targets.tolist()):
        expected = torch.zeros(16, 16)
        for mask in masks:
            with torch.no_grad():
                expected += model(x[i : i + 1] * mask).softmax(dim=1)[0, target] * mask
        assert torch.allclose(result.raw[i, 0], expected / (40 * 0.3), atol=1e-6)


def test_rise_matches_torchray_on_the_same_masks():
    # TorchRay's rise() weights by the sigmoid of the output and divides by N: given our masks
    # and a model whose sigmoid is the softmax, it is our map times p.
    rise = pytest.importorskip("torchray.attribution.rise")
    from explain.methods.drise import rise_masks

    model, x = tiny_cnn(), images(2)
    ours = explain.RISE(model, n_masks=64, cell_size=4, seed=3)(x)
    as_sigmoid = nn.Sequential(model, nn.Softmax(dim=1), LogitOf())
    masks = rise_masks(64, (16, 16), cell_size=4, p=0.5, seed=3)[:, None]
    theirs = rise.rise(as_sigmoid, x, num_masks=64, filter_masks=masks, batch_size=16)
    chosen = theirs[torch.arange(2), ours.targets]
    assert torch.allclose(ours.raw[:, 0] * 0.5, chosen, atol=1e-6)


class LogitOf(nn.Module):
    def forward(self, probabilities):
        return torch.logit(probabilities.double()).float()


def test_rise_explains_every_target_from_the_same_passes():
    model, x = tiny_cnn(), images(2)
    calls = []
    model.register_forward_pre_hook(lambda module, inputs: calls.append(len(inputs[0])))
    rise = explain.RISE(model, n_masks=30, cell_size=4, internal_batch_size=20)
    both = rise(x, topk=2)
    assert sum(calls) == 2 + 2 * 30  # the targets' pass, then the masked copies once
    assert torch.equal(both.raw[:, 1], rise(x, both.targets[:, 1].tolist()).raw)
    assert torch.equal(rise(x[1:]).raw[0], rise(x).raw[1])  # an image's map does not depend on its batch
