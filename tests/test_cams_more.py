"""The CAMs of pytorch-grad-cam 1.5.7 that came after the first catalogue, against values
worked out by hand and against references written here from their papers (RefineCAM,
Sobel-CAM, multi-layer Ablation-CAM, Seg-Eigen-CAM, SESS). The peers' own code is compared
in ``test_cams_peers.py``."""

import pytest
import torch
from torch import nn

import explain
from explain.explanation import scale_maps
from explain.methods.gradient_free_cams import sobel_edges


def tiny_cnn(seed=0, channels=6, classes=5):
    """conv -> ReLU -> conv(stride 2) -> ReLU -> global average pooling -> linear."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(),
        nn.Conv2d(4, channels, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, classes),
    ).eval()


def images(n=2, size=16, seed=1):
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def gradcam_by_hand(model, layer, x, ids):
    """ReLU(sum_k mean_ij(dy_c/dA^k) A^k), by plain autograd through a forward hook."""
    store = {}
    handle = model.get_submodule(layer).register_forward_hook(lambda m, i, o: store.update(a=o))
    try:
        with torch.enable_grad():
            out = model(x)
            (grad,) = torch.autograd.grad(out[torch.arange(len(ids)), ids].sum(), store["a"])
    finally:
        handle.remove()
    return torch.relu((grad.mean(dim=(2, 3), keepdim=True) * store["a"]).sum(1)).detach()


# --- Sobel-CAM ------------------------------------------------------------------------------


def test_sobel_edges_by_hand():
    # gray(i, j) = i + j on 4 x 4: inside, G_x = G_y = (1 + 2 + 1) * 2 = 8, so 0.5 * 16 = 8; on
    # a border the reflected neighbour equals the other one (OpenCV's reflect-101), so the
    # derivative across that border is 0: 4 on the edges, 0 at the corners.
    ramp = torch.arange(4.0)[:, None] + torch.arange(4.0)[None, :]
    expected = torch.tensor([[0.0, 4, 4, 0], [4, 8, 8, 4], [4, 8, 8, 4], [0, 4, 4, 0]])
    gray = ramp.expand(1, 3, 4, 4)  # three equal channels: gray = 0.299 + 0.587 + 0.114 = 1 times each
    torch.testing.assert_close(sobel_edges(gray)[0], expected)
    red_only = torch.zeros(1, 3, 4, 4)
    red_only[0, 0] = ramp
    torch.testing.assert_close(sobel_edges(red_only)[0], 0.299 * expected)
    torch.testing.assert_close(sobel_edges(ramp[None, None])[0], expected)  # one channel: itself


def test_sobelcam_maps_the_edges_for_every_target_and_runs_the_model_once():
    model, x = tiny_cnn(), images(2)
    calls = []
    handle = model.register_forward_hook(lambda *args: calls.append(1))
    try:
        res = explain.SobelCAM(model)(x, topk=2)
    finally:
        handle.remove()
    assert calls == [1] and res.targets.shape == (2, 2) and res.layers == ("input",)
    torch.testing.assert_close(res.logits, model(x).detach())
    edges = sobel_edges(x)
    torch.testing.assert_close(res.maps, scale_maps(edges, (16, 16))[:, None].expand(2, 2, 16, 16))
    with pytest.raises(ValueError, match="no target_layer"):
        explain.SobelCAM(model, "3")


def test_sobelcam_refuses_volumes():
    model = nn.Sequential(nn.Conv3d(1, 2, 3), nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(2, 3)).eval()
    with pytest.raises(explain.NotApplicable, match="2-D"):
        explain.SobelCAM(model)(torch.rand(1, 1, 4, 8, 8))


# --- RefineCAM ------------------------------------------------------------------------------


@pytest.mark.parametrize("topk", [None, 2])
def test_refinecam_is_the_product_of_the_scaled_maps_of_its_base(topk):
    model, x = tiny_cnn(), images(2)
    res = explain.RefineCAM(model, ["1", "3"], base="gradcam")(x, topk=topk)
    ids = res.targets if topk is None else res.targets[:, 1]
    early, late = (gradcam_by_hand(model, layer, x, ids) for layer in ("1", "3"))
    expected = scale_maps(scale_maps(early, (16, 16)) * scale_maps(late, (16, 16)), (16, 16))
    torch.testing.assert_close(res.maps if topk is None else res.maps[:, 1], expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(res.raw_layers["3"] if topk is None else res.raw_layers["3"][:, 1], late)
    assert res.method == "refinecam" and res.layers == ("1", "3")


def test_refinecam_defaults_to_gradcam_plus_plus_and_passes_the_options_on():
    model, x = tiny_cnn(), images(2)
    one = explain.RefineCAM(model, "3")(x)  # one layer: the base's map
    torch.testing.assert_close(one.maps, explain.GradCAMPlusPlus(model, "3")(x).maps)
    smooth = explain.RefineCAM(model, ["1", "3"], base="layercam", eigen_smooth=True)(x)
    layercam = explain.LayerCAM(model, ["1", "3"], eigen_smooth=True)(x)
    product = scale_maps(layercam.raw_layers["1"], (16, 16)) * scale_maps(layercam.raw_layers["3"], (16, 16))
    torch.testing.assert_close(smooth.maps, scale_maps(product, (16, 16)))
    for bad in ("saliency", "refinecam", "smoothgradcam++"):
        with pytest.raises(ValueError, match="base="):
            explain.RefineCAM(model, ["1", "3"], base=bad)


# --- Seg-Eigen-CAM --------------------------------------------------------------------------


def test_segeigencam_principal_component_by_hand():
    # |G| * A of one image with C = 2 on a 1 x 3 grid: rows (h*w, C) = (1, 0), (0, 0), (5, 0)
    # centred: (-1, 0), (-2, 0), (3, 0); v1 = (+-1, 0), so P = +-(-1, -2, 3); |min| = 2 < |max| = 3
    # keeps the sign that makes 3 positive: P = (-1, -2, 3), ReLU: (0, 0, 3).
    activations = torch.tensor([[[[1.0, 0.0, 5.0]], [[0.0, 0.0, 0.0]]]])
    gradients = torch.tensor([[[[-1.0, 7.0, 1.0]], [[2.0, 2.0, 2.0]]]])  # the sign of G is dropped
    p = explain.SegEigenCAM.cam(activations, gradients)
    torch.testing.assert_close(p, torch.tensor([[[-1.0, -2.0, 3.0]]]))
    # A negative peak: |G| * A = (-5, 0, 1), centred (-11/3, 4/3, 7/3): |min| = 11/3 > 7/3, so it
    # is negated, whatever sign the solver gave v1: (11/3, -4/3, -7/3).
    q = explain.SegEigenCAM.cam(torch.tensor([[[[-5.0, 0.0, 1.0]], [[0.0, 0.0, 0.0]]]]), -torch.ones(1, 2, 1, 3))
    torch.testing.assert_close(q, torch.tensor([[[11 / 3, -4 / 3, -7 / 3]]]))


def test_segeigencam_matches_the_reference_on_a_segmentation_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 8, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(8, 4, 1)).eval()
    x = images(2)
    target = explain.SegmentationTarget(category=2)
    res = explain.SegEigenCAM(model, "3")(x, target)
    store = {}
    handle = model[3].register_forward_hook(lambda m, i, o: store.update(a=o))
    try:
        out = model(x)
        score = (out[:, 2] * (out.argmax(1) == 2)).sum(dim=(1, 2))
        (grad,) = torch.autograd.grad(score.sum(), store["a"])
    finally:
        handle.remove()
    for n in range(2):
        matrix = (grad[n].abs() * store["a"][n]).detach().flatten(1).T.double()  # (h*w, C)
        centred = matrix - matrix.mean(0)
        projection = centred @ torch.linalg.svd(centred)[2][0]
        if projection.min().abs() > projection.max().abs():
            projection = -projection
        expected = torch.relu(projection).reshape(16, 16).float()
        torch.testing.assert_close(res.raw_layers["3"][n], expected, atol=1e-4, rtol=1e-4)


# --- Ablation-CAM on several layers ---------------------------------------------------------


def test_ablationcam_on_several_layers_ablates_each_layer_on_its_own():
    # Each layer's channels are zeroed one at a time with the other layers left as they are
    # (pytorch-grad-cam 1.5.7's AblationCAM with several target layers); the layers' maps are
    # scaled, averaged and scaled again.
    model, x = tiny_cnn(), images(2)
    both = explain.AblationCAM(model, ["1", "3"])(x, [0, 3])
    singles = {layer: explain.AblationCAM(model, layer)(x, [0, 3]) for layer in ("1", "3")}
    for layer, single in singles.items():
        torch.testing.assert_close(both.raw_layers[layer], single.raw_layers[layer])
    mean = (singles["1"].maps + singles["3"].maps) / 2
    torch.testing.assert_close(both.maps, scale_maps(mean, (16, 16)))
    # layer "1", channel 0 of image 0 by hand: w = (y - y without it) / y
    store = {}

    def zero_channel(module, args, output):
        output = output.clone()
        output[:, 0] = 0
        return output

    with torch.no_grad():
        y = model(x)[0, 0]
        handle = model[1].register_forward_hook(zero_channel)
        try:
            y0 = model(x)[0, 0]
        finally:
            handle.remove()
        handle = model[1].register_forward_hook(lambda m, i, o: store.update(a=o))
        try:
            model(x)
        finally:
            handle.remove()
    assert store["a"][0, 0].abs().sum() > 0
    weights = torch.stack([(y - y0) / y])  # channel 0's weight, the one checked here
    single = explain.AblationCAM(model, "1")
    captured = single.capture(x, [0, 3])
    torch.testing.assert_close(single.channel_weights(captured, "1")[0, 0, 0:1], weights, atol=1e-5, rtol=1e-4)


# --- SESS -----------------------------------------------------------------------------------


def test_sess_with_one_scale_and_one_window_is_the_base_cam_blurred():
    from explain.methods.combined_cams import gaussian_blur

    model, x = tiny_cnn(), images(2)
    res = explain.SESS(model, "3", num_scales=1, smooth=False)(x, [1, 3])
    base = explain.GradCAM(model, "3")(x, [1, 3]).maps
    torch.testing.assert_close(res.maps, scale_maps(base, (16, 16)))
    assert res.method == "sess" and res.layers == ("3",) and res.targets.tolist() == [1, 3]
    blurred = explain.SESS(model, "3", num_scales=1)(x, [1, 3]).maps
    torch.testing.assert_close(blurred, scale_maps(gaussian_blur(base), (16, 16)))
    # the blur by hand: a constant map stays constant, an impulse spreads to the kernel
    assert torch.allclose(gaussian_blur(torch.ones(1, 12, 12)), torch.ones(1, 12, 12))
    impulse = torch.zeros(1, 21, 21)
    impulse[0, 10, 10] = 1
    g = torch.exp(-((torch.arange(11.0) - 5) ** 2) / 50)
    torch.testing.assert_close(gaussian_blur(impulse)[0, 5:16, 5:16], torch.outer(g, g) / g.sum() ** 2)


def test_sess_fuses_two_patches_by_their_calibrated_weights():
    """A 16 x 24 image, window 16: two patches at scale 16 (x = 0 and x = 8). Each pixel is the
    mean over the patches covering it of (s_p / max s) * CAM(p), the scores s_p the target's
    softmax probabilities of the patches."""
    model, x = tiny_cnn(), images(1)
    x = torch.cat([x, x.flip(-1)[..., :8]], dim=-1)  # (1, 3, 16, 24)
    res = explain.SESS(model, "3", num_scales=1, smooth=False)(x, 2)
    patches = torch.cat([x[..., :16], x[..., 8:]])
    cams = explain.GradCAM(model, "3")(patches, [2, 2]).maps
    scores = model(patches).softmax(1)[:, 2].detach()
    weighted = cams * (scores / scores.max())[:, None, None]
    total, counts = torch.zeros(16, 24), torch.zeros(16, 24)
    for cam, x0 in zip(weighted, (0, 8), strict=True):
        total[:, x0 : x0 + 16] += torch.where(cam > 0, cam, 0.0)
        counts[:, x0 : x0 + 16] += (cam > 0).float()
    expected = torch.where(counts > 0, total / counts.clamp_min(1), 0.0)
    torch.testing.assert_close(res.raw[0], expected)
    assert explain.SESS(model, "3", num_scales=1).planned_passes(x) == 2 + 2  # 2 scorings, 2 Grad-CAM passes
    maxed = explain.SESS(model, "3", num_scales=1, smooth=False, pool="max")(x, 2).raw[0]
    expected_max = torch.zeros(16, 24)
    for cam, x0 in zip(weighted, (0, 8), strict=True):
        expected_max[:, x0 : x0 + 16] = torch.maximum(expected_max[:, x0 : x0 + 16], cam)
    torch.testing.assert_close(maxed, expected_max)


def test_sess_scales_prefilter_topk_and_bad_options():
    from explain.methods.combined_cams import window_starts

    model, x = tiny_cnn(), images(1)
    method = explain.SESS(model, "3", num_scales=3, pre_filter_ratio=0.5)
    # window 16, scales 16, 21, 26 (step round(16 * 2 / 7) = 5): 1 + 4 + 4 patches, 5 kept
    assert [w[3] for w in method.windows((16, 16))] == [(16, 16)] + [(21, 21)] * 4 + [(26, 26)] * 4
    assert window_starts(26, 16, 16) == [0, 10] and method.planned_passes(x) == 9 + 5
    res = method(x, topk=2)
    assert res.maps.shape == (1, 2, 16, 16) and res.targets.shape == (1, 2)
    for bad, match in (
        ({"pool": "sum"}, "pool"),
        ({"pre_filter_ratio": 1.0}, "pre_filter_ratio"),
        ({"base": "saliency"}, "gradcam"),
        ({"scales": (8,)}, "at least the window"),
    ):
        with pytest.raises(ValueError, match=match):
            explain.SESS(model, "3", **bad)(x)
    with pytest.raises(ValueError, match="callable"):
        explain.SESS(model, "3", num_scales=1)(x, lambda out: out[:, 0])


# --- Deep Feature Factorization -------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:Maximum number of iterations")  # run to the end on purpose
def test_factorize_recovers_an_exact_non_negative_product():
    from explain.methods.gradient_free_cams import factorize

    # A = W H with W (4 channels x 2 concepts), H (2 concepts x 2 images * 3 * 3 positions)
    gen = torch.Generator().manual_seed(0)
    w = torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0], [0.0, 3.0]])
    h = torch.rand(2, 18, generator=gen) + 0.1
    h[0, 0] = h[1, 1] = 0.0  # each channel's minimum is 0, so no offset is taken off
    activations = (w @ h).reshape(4, 2, 3, 3).transpose(0, 1)  # (N, C, h, w)
    concepts, maps = factorize(activations, 2, max_iter=5000, tol=1e-12)
    assert concepts.shape == (4, 2) and maps.shape == (2, 2, 3, 3)
    rebuilt = (concepts.float() @ maps.transpose(0, 1).reshape(2, -1).float()).reshape(4, 2, 3, 3).transpose(0, 1)
    torch.testing.assert_close(rebuilt, activations, atol=1e-3, rtol=1e-3)
    expected = h.reshape(2, 2, 3, 3).transpose(0, 1)
    order = [0 if concepts[:2, j].sum() > concepts[2:, j].sum() else 1 for j in range(2)]  # in any order
    assert sorted(order) == [0, 1]
    for j, truth in enumerate(order):  # and at any scale: compare the maps scaled to a maximum of 1
        got = maps[:, j] / maps[:, j].amax()
        torch.testing.assert_close(got.float(), expected[:, truth] / expected[:, truth].amax(), atol=1e-3, rtol=1e-3)


def test_dff_maps_concepts_and_their_classes_forward_only_without_hooks_left():
    from conftest import hook_count

    model, x = tiny_cnn(), images(2)
    model.train()
    before = [p.requires_grad for p in model.parameters()]
    res = explain.DeepFeatureFactorization(model, "3", n_components=3)(x)
    assert model.training and [p.requires_grad for p in model.parameters()] == before and hook_count(model) == 0
    assert all(p.grad is None for p in model.parameters())
    assert isinstance(res, explain.ConceptExplanation) and res.maps.shape == (2, 3, 16, 16)
    assert res.concepts.shape == (6, 3) and res.raw.shape == (2, 3, 8, 8) and res.method == "dff"
    # the concept scores are the head (auto: the Linear that takes the layer's 6 channels) of the embeddings
    torch.testing.assert_close(res.concept_scores, model[6](res.concepts.T).detach())
    assert res.targets.tolist() == [res.concept_scores.argmax(1).tolist()] * 2
    headless = explain.DeepFeatureFactorization(model, "3", n_components=3, classifier=None)(x)
    assert headless.concept_scores is None and (headless.targets == -1).all()
    torch.testing.assert_close(headless.maps, res.maps)
    with torch.no_grad():
        torch.testing.assert_close(explain.DeepFeatureFactorization(model, "3", n_components=3)(x).maps, res.maps)
    with pytest.raises(ValueError, match="per concept"):
        explain.DeepFeatureFactorization(model, "3")(x, topk=2)
    with pytest.raises(ValueError, match="one target_layer"):
        explain.DeepFeatureFactorization(model, ["1", "3"])(x)
