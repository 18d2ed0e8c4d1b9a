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

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import explain
from conftest import ModelState, listening
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
    with pass_settings(listener=listening(should_stop=lambda: next(asked) == 3)), pytest.raises(KeyboardInterrupt):
        explain.explainer(method, model, internal_batch_size=2, **options)(x)
    state.assert_unchanged()


def smooth_masks_reference(parameters, shape, step, sigma):
    """Fong et al.'s smooth masks written out as TorchRay's MaskGenerator does it: every
    parameter within reach gathered (unfold) and upsampled (nearest) to every pixel, times
    the kernel weight of its distance, softmax-pooled (coldness 20), clamped, cropped."""
    margin, padding, radius = sigma, 1 + math.ceil(2 * sigma / step), 1 + math.ceil(sigma / step)
    size = 2 * radius + 1
    mid = [math.ceil(z / step) + 2 * padding - size + 1 for z in shape]
    out = [step * z - step + 1 for z in mid]
    gathered = F.unfold(parameters, size, padding=padding).reshape(len(parameters), size**2, *mid)
    gathered = gathered.repeat_interleave(step, 2).repeat_interleave(step, 3)[:, :, : out[0], : out[1]]
    uy, ux = torch.meshgrid(torch.arange(out[0]), torch.arange(out[1]), indexing="ij")
    weight = torch.empty(size**2, *out, dtype=parameters.dtype)
    for ky in range(size):
        for kx in range(size):
            dy = uy - (margin + step * (uy // step + ky - padding))
            dx = ux - (margin + step * (ux // step + kx - padding))
            distance = torch.sqrt(dy.to(parameters.dtype) ** 2 + dx.to(parameters.dtype) ** 2)
            weight[ky * size + kx] = torch.exp(-2 * (distance / sigma - 0.5).clamp(min=0) ** 2)
    values = weight * gathered
    mask = (values * torch.softmax(20 * values, dim=1)).sum(dim=1, keepdim=True).clamp(0, 1)
    m = round(margin)
    return mask[:, :, m : m + shape[0], m : m + shape[1]], mask


def mask_parameters(count, shape_in, seed=0):
    """Random parameters in [0, 1], with blocks of exact zeros and ones (the optimiser's clamps)."""
    parameters = torch.rand(count, 1, *shape_in, generator=torch.Generator().manual_seed(seed))
    parameters[0, :, :2] = 1.0
    parameters[-1, :, :, -2:] = 0.0
    return parameters


@pytest.mark.parametrize("shape, step, sigma", [((32, 32), 4, 8.0), ((30, 50), 3, 5.0), ((20, 20), 7, 21.0)])
def test_smooth_masks_are_the_plain_smooth_max(shape, step, sigma):
    # SoftmaxPooling never builds the (K, window^2, H, W) tensor of the reference; the same
    # masks and gradients within float32 rounding (the reference in float64).
    from explain.methods.mask_optimisation import SmoothMasks

    masks = SmoothMasks(shape, step, sigma, torch.device("cpu"))
    parameters = mask_parameters(3, masks.shape_in)
    ours_in, theirs_in = parameters.clone().requires_grad_(True), parameters.double().requires_grad_(True)
    ours, theirs = masks(ours_in), smooth_masks_reference(theirs_in, shape, step, sigma)
    weights = [torch.randn(t.shape, generator=torch.Generator().manual_seed(i)) for i, t in enumerate(ours)]
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape
        assert torch.allclose(a.double(), b, atol=1e-5)
    sum(((a * w).sum() for a, w in zip(ours, weights))).backward()
    sum(((b * w.double()).sum() for b, w in zip(theirs, weights))).backward()
    assert torch.allclose(ours_in.grad.double(), theirs_in.grad, atol=1e-5 * theirs_in.grad.abs().max())


def test_softmax_pooling_takes_kernel_positions_one_or_several_at_a_time():
    # On an accelerator several kernel positions run together (GROUP_ELEMENTS); the same sums.
    from explain.methods.mask_optimisation import SmoothMasks, SoftmaxPooling

    masks = SmoothMasks((24, 24), 4, 8.0, torch.device("cpu"))
    columns = F.unfold(mask_parameters(2, masks.shape_in), 7, padding=masks.padding).transpose(0, 1).reshape(49, -1)
    results = []
    for group in (1, 5, 49, 64):
        x = columns.clone().requires_grad_(True)
        y = SoftmaxPooling.apply(x, masks.kernel, group)
        (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        results.append((y, x.grad))
    for y, grad in results[1:]:  # the sums in another order: float32 rounding
        assert torch.allclose(y, results[0][0], atol=5e-6)
        assert torch.allclose(grad, results[0][1], atol=1e-5 * results[0][1].abs().max())


@pytest.mark.filterwarnings("ignore:torch.meshgrid")  # TorchRay's
def test_smooth_masks_match_torchrays_mask_generator():
    extremal = pytest.importorskip("torchray.attribution.extremal_perturbation")
    from explain.methods.mask_optimisation import SmoothMasks

    masks, theirs = SmoothMasks((30, 50), 3, 5.0, torch.device("cpu")), extremal.MaskGenerator((30, 50), 3, 5.0)
    parameters = mask_parameters(2, masks.shape_in)
    a, b = parameters.clone().requires_grad_(True), parameters.clone().requires_grad_(True)
    (ours_cropped, ours), (their_cropped, their_whole) = masks(a), theirs.generate(b)
    assert torch.allclose(ours_cropped, their_cropped, atol=1e-5) and torch.allclose(ours, their_whole, atol=1e-5)
    weights = torch.randn(ours.shape, generator=torch.Generator().manual_seed(0))
    (ours * weights).sum().backward()
    (their_whole * weights).sum().backward()
    assert torch.allclose(a.grad, b.grad, atol=1e-5 * b.grad.abs().max())


def test_blur_pyramid_interpolates_between_its_levels():
    # A plain reference: the mask m picks level m (L - 1), linearly between the two levels around it.
    from explain.baselines import gaussian_filter
    from explain.methods.mask_optimisation import BlurPyramid

    x = images(2, size=12)
    pyramid = BlurPyramid(x, levels=4, max_blur=3.0)
    masks = torch.rand(3, 1, 12, 12, generator=torch.Generator().manual_seed(0))
    masks[0, 0, 0, :4] = torch.tensor([0.0, 1.0, 1 / 3, 2 / 3])  # on the levels themselves
    owners = torch.tensor([1, 0, 1])
    sigmas = [float((1 - s) * 3.0) for s in torch.linspace(0, 1, 4)]  # 3, 2, 1, 0 in float32 (TorchRay's)
    levels = [gaussian_filter(x, sigma, math.ceil(4 * sigma)) for sigma in sigmas]
    expected = torch.empty(3, 3, 12, 12)
    for row, owner in enumerate(owners.tolist()):
        for i in range(12):
            for j in range(12):
                at = float(masks[row, 0, i, j]) * 3
                low = min(int(math.floor(at)), 3)
                high, fraction = min(low + 1, 3), at - low
                expected[row, :, i, j] = (1 - fraction) * levels[low][owner, :, i, j] + fraction * levels[high][owner, :, i, j]
    assert torch.allclose(pyramid.apply(masks, owners), expected, atol=1e-6)


def test_ranked_reference_is_the_sorted_reference_put_back():
    # A plain reference: sort each row (stable: equal values keep their order), put the
    # reference (zeros, then ``ones`` ones) at the sorted places.
    from explain.methods.mask_optimisation import ranked_reference

    values = torch.rand(4, 50, generator=torch.Generator().manual_seed(0)).round(decimals=1)  # many ties
    ones = [5, 20, 5, 50]
    expected = torch.zeros(4, 50)
    for row, count in enumerate(ones):
        order = torch.sort(values[row], stable=True).indices
        expected[row, order[50 - count :]] = 1.0
    assert torch.equal(ranked_reference(values, ones), expected)


@pytest.mark.filterwarnings("ignore:torch.meshgrid")  # TorchRay's
@pytest.mark.parametrize("variant", ["preserve", "delete"])
def test_extremal_perturbation_matches_torchray(variant, monkeypatch):
    # TorchRay's result breaks ties among equal mask values by the exact float values (the
    # masks of equal parameters repeat in every cell) and by its unstable sort: its own
    # masks changed by a relative 1e-7 move its result here by 0.11 after 12 steps (0.98
    # after 100). So TorchRay runs on our masks (compared with its MaskGenerator above) and
    # with a stable sort (ours ranks ties so); the rest of its loop is matched as it is.
    extremal = pytest.importorskip("torchray.attribution.extremal_perturbation")
    from explain.methods.mask_optimisation import SmoothMasks

    def our_masks(generator, parameters):
        return SmoothMasks(generator.shape, generator.step, generator.sigma, parameters.device)(parameters)

    sort = torch.Tensor.sort
    monkeypatch.setattr(extremal.MaskGenerator, "generate", our_masks)
    monkeypatch.setattr(torch.Tensor, "sort", lambda self, *args, **kwargs: sort(self, *args, stable=True, **kwargs))
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


def test_extremal_perturbation_runs_its_image_area_pairs_in_batches_of_the_budget():
    model, x = tiny_cnn(), images(2, size=16)
    sizes = []
    model.register_forward_pre_hook(lambda module, inputs: sizes.append(len(inputs[0])))
    options = dict(areas=(0.1, 0.2, 0.3), steps=4, mask_step=4, sigma=8.0)
    four = explain.ExtremalPerturbation(model, internal_batch_size=4, **options)(x)
    assert sizes == [2] + [4] * 4 + [2] * 4  # the targets, then 6 pairs as 4 + 2 rows a step
    one = explain.ExtremalPerturbation(model, internal_batch_size=1, **options)(x)
    assert torch.allclose(four.raw, one.raw, atol=1e-6)


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
