"""Each method against values worked out by hand on tiny inputs.

The worked example uses C = 2 channels on a 1 x 2 grid:

    A^0 = [1, -2]   A^1 = [4, 3]      (activations)
    G^0 = [2,  1]   G^1 = [1, -1]     (gradients dS/dA)
    G*A: channel 0 = [2, -2], channel 1 = [4, -3]

The tiny model below is an identity "layer" followed by a bias-free linear head, so its
gradient with respect to the layer's output is exactly the head's weight row.
"""

import math

import pytest
import torch
from torch import nn

import explain
from explain.methods.gradient_cams import (
    EigenGradCAM,
    GradCAM,
    GradCAMElementWise,
    GradCAMPlusPlus,
    HiResCAM,
    LayerCAM,
    XGradCAM,
)
from explain.explanation import scale_maps

A = torch.tensor([[[[1.0, -2.0]], [[4.0, 3.0]]]])  # (1, 2, 1, 2)
G = torch.tensor([[[[2.0, 1.0]], [[1.0, -1.0]]]])

# Before the final ReLU, worked by hand:
BY_HAND = {
    # a = mean(G) = [1.5, 0]; 1.5 * [1, -2]
    GradCAM: [1.5, -3.0],
    # channel 0: G^2 = [4, 1], G^3 = [8, 1], sum A = -1, denominators [8 - 8, 2 - 1] = [0, 1],
    #   alpha = [0 (zero denominator), 1], w = 0 * 2 + 1 * 1 = 1
    # channel 1: G^2 = [1, 1], G^3 = [1, -1], sum A = 7, denominators [9, -5],
    #   alpha = [1/9, -1/5], ReLU(G) = [1, 0], w = 1/9
    # 1 * [1, -2] + 1/9 * [4, 3] = [13/9, -15/9]
    GradCAMPlusPlus: [13 / 9, -15 / 9],
    # w_0 = (2 - 2) / (1 - 2) = 0, w_1 = (4 - 3) / (4 + 3) = 1/7; 1/7 * [4, 3]
    XGradCAM: [4 / 7, 3 / 7],
    # sum over channels of G*A: [2 + 4, -2 - 3]
    HiResCAM: [6.0, -5.0],
    # ReLU(G) = [2, 1], [1, 0]; times A: [2, -2] + [4, 0]
    LayerCAM: [6.0, -2.0],
    # ReLU(G*A) summed: [2 + 4, 0 + 0]
    GradCAMElementWise: [6.0, 0.0],
    # rows (pixels) of G*A: [2, 4], [-2, -3]; channel means [0, 0.5]; centred rows
    # [2, 3.5], [-2, -3.5]; v1 = +-[2, 3.5] / sqrt(16.25); projections +-sqrt(16.25) * [1, -1];
    # the sign that agrees with sum_k G*A = [6, -5] is +.
    EigenGradCAM: [math.sqrt(16.25), -math.sqrt(16.25)],
}


@pytest.mark.parametrize("method", list(BY_HAND), ids=lambda m: m.name)
def test_formula_matches_hand_computation(method):
    got = method.cam(A, G)
    assert got.shape == (1, 1, 2)
    torch.testing.assert_close(got.flatten(), torch.tensor(BY_HAND[method]), rtol=1e-5, atol=1e-6)


def test_xgradcam_channel_whose_activations_sum_to_zero_gets_weight_zero():
    # A^0 = [1, -1] sums to 0, so w_0 = 0 (not NaN); w_1 = (2 * 1 + 2 * 0) / (2 + 2) = 0.5.
    activations = torch.tensor([[[[1.0, -1.0]], [[2.0, 2.0]]]])
    gradients = torch.tensor([[[[3.0, 1.0]], [[1.0, 0.0]]]])
    torch.testing.assert_close(XGradCAM.cam(activations, gradients).flatten(), torch.tensor([1.0, 1.0]))


def test_eigengradcam_sign_is_chosen_per_image():
    # Image 0 has G, image 1 has -G: each map follows its own evidence.
    got = EigenGradCAM.cam(torch.cat([A, A]), torch.cat([G, -G])).reshape(2, 2)
    root = math.sqrt(16.25)
    torch.testing.assert_close(got, torch.tensor([[root, -root], [-root, root]]))


def test_eigengradcam_sign_does_not_depend_on_svd():
    # Negating the input flips G*A; the map must follow the evidence, not the solver's sign.
    flipped = EigenGradCAM.cam(A, -G).flatten()
    torch.testing.assert_close(flipped, torch.tensor([-math.sqrt(16.25), math.sqrt(16.25)]))


class TinyNet(nn.Module):
    """layer = identity on a (1, 2, 1, 2) input; head: logits = W @ flatten(layer)."""

    def __init__(self):
        super().__init__()
        self.layer = nn.Identity()
        self.head = nn.Linear(4, 2, bias=False)
        with torch.no_grad():
            self.head.weight.copy_(torch.tensor([G.flatten().tolist(), [-1.0, 0.0, 0.0, 1.0]]))

    def forward(self, x):
        return self.head(self.layer(x).flatten(1))


@pytest.mark.parametrize("method", list(BY_HAND), ids=lambda m: m.name)
def test_end_to_end_on_tiny_model(method):
    model = TinyNet()
    res = method(model, "layer")(A.clone(), targets=0)
    expected_raw = torch.relu(torch.tensor(BY_HAND[method])).reshape(1, 1, 2)
    torch.testing.assert_close(res.raw, expected_raw, rtol=1e-5, atol=1e-6)
    assert res.maps.shape == (1, 1, 2) and res.maps.dtype == torch.float32
    torch.testing.assert_close(res.maps, scale_maps(expected_raw, (1, 2)))
    assert res.targets.tolist() == [0]
    torch.testing.assert_close(res.logits, A.flatten(1) @ model.head.weight.T)


def test_other_target_uses_that_class_gradient():
    # Class 1 has W = [-1, 0, 0, 1]: G^0 = [-1, 0], G^1 = [0, 1], Grad-CAM a = [-0.5, 0.5],
    # -0.5 * [1, -2] + 0.5 * [4, 3] = [1.5, 2.5].
    res = GradCAM(TinyNet(), "layer")(A.clone(), targets=1)
    torch.testing.assert_close(res.raw.flatten(), torch.tensor([1.5, 2.5]))
    torch.testing.assert_close(res.maps.flatten(), torch.tensor([0.0, 1.0]))


def test_gradcam_equals_cam_for_global_average_pooling_head():
    # With logits = W @ mean_ij(A), dS/dA^k_ij = W_ck / Z everywhere, so Grad-CAM and
    # HiResCAM both reduce to CAM (Zhou et al. 2016): sum_k W_ck A^k / Z.
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3, padding=1)
    fc = nn.Linear(4, 3)
    model = nn.Sequential(conv, nn.AdaptiveAvgPool2d(1), nn.Flatten(), fc)
    x = torch.randn(2, 3, 5, 6)
    features = conv(x).detach()
    expected = torch.einsum("k,nkhw->nhw", fc.weight[2].detach(), features) / 30
    for method in (GradCAM, HiResCAM):
        res = method(model, "0")(x, targets=2)
        torch.testing.assert_close(res.raw, torch.relu(expected), rtol=1e-5, atol=1e-6)


def test_bilinear_upsampling_and_scaling_by_hand():
    # 1 x 2 -> 1 x 4 with align_corners=False samples source x = -0.25, 0.25, 0.75, 1.25,
    # clamped at the borders: [v0, .75 v0 + .25 v1, .25 v0 + .75 v1, v1].
    got = scale_maps(torch.tensor([[[2.0, 6.0]]]), (1, 4))
    torch.testing.assert_close(got, torch.tensor([[[0.0, 0.25, 0.75, 1.0]]]))


def test_constant_and_zero_maps_scale_to_zero_not_nan():
    for raw in (torch.zeros(2, 3, 3), torch.full((2, 3, 3), 7.0), torch.full((1, 2, 2), 1e-20)):
        got = scale_maps(raw, (6, 6))
        assert torch.equal(got, torch.zeros_like(got))


def test_dead_layer_gives_zero_maps():
    # ReLU'd features with a target whose weights are all negative: no positive evidence, for
    # every method that weighs channels by the score's gradient. (Not for the others, by
    # their definitions: EigenGrad-CAM centres G*A, so it maps relative variation, not sign, and
    # Seg-Eigen-CAM turns the principal component's sign towards its peak;
    # Score-CAMs weigh by probabilities, which are positive; Ablation-CAM divides by the
    # score, negative here; the gradient-free CAMs ignore the class; CAM has no final ReLU;
    # FullGrad takes absolute values.)
    model = nn.Sequential(nn.Conv2d(1, 2, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2, 1))
    with torch.no_grad():
        model[0].weight.fill_(1.0)
        model[0].bias.zero_()
        model[4].weight.fill_(-1.0)
    gradient_weighted = [name for name in explain.method_names()
                         if issubclass(explain.method_class(name), explain.GradientCAM)
                         and name not in ("eigengradcam", "segeigencam")]
    assert len(gradient_weighted) == 9
    for name in gradient_weighted:
        res = explain.explainer(name, model, target_layer="1")(torch.rand(1, 1, 4, 4) + 0.1, targets=0)
        assert torch.isfinite(res.maps).all()
        assert res.maps.max() == 0, name


def test_multi_layer_map_is_mean_of_scaled_layer_maps():
    torch.manual_seed(1)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3),
    )
    x = torch.randn(2, 3, 8, 8)
    both = GradCAM(model, ["1", "3"])(x, targets=[0, 2])
    first = GradCAM(model, "1")(x, targets=[0, 2])
    second = GradCAM(model, "3")(x, targets=[0, 2])
    torch.testing.assert_close(both.raw_layers["1"], first.raw)
    torch.testing.assert_close(both.raw_layers["3"], second.raw)
    torch.testing.assert_close(both.maps, scale_maps((first.maps + second.maps) / 2, (8, 8)))
    assert both.layers == ("1", "3")
    with pytest.raises(ValueError, match="raw_layers"):
        both.raw


def test_explain_together_gives_every_hand_value_from_one_pass():
    model = TinyNet()
    forwards = []
    model.register_forward_pre_hook(lambda module, args: forwards.append(1))
    cams = [method(model, "layer") for method in BY_HAND]
    results = explain.explain_together(cams, A.clone(), targets=0)
    assert len(forwards) == 1
    for method, res in zip(BY_HAND, results):
        assert res.method == method.name
        torch.testing.assert_close(res.raw.flatten(), torch.relu(torch.tensor(BY_HAND[method])), rtol=1e-5, atol=1e-6)

    # topk: k gradients from the same forward; class 1 of the tiny head gives Grad-CAM [1.5, 2.5]
    # (see test_other_target_uses_that_class_gradient), class 0 gives ReLU([1.5, -3]).
    gradcam, hirescam = explain.explain_together([GradCAM(model, "layer"), HiResCAM(model, "layer")], A.clone(), topk=2)
    assert len(forwards) == 2 and gradcam.targets.tolist() == hirescam.targets.tolist()
    by_class = dict(zip(gradcam.targets[0].tolist(), gradcam.raw[0].flatten(1).tolist()))
    assert by_class == {0: [1.5, 0.0], 1: [1.5, 2.5]}


def test_explain_together_shares_a_pass_only_where_it_can():
    model, other_model = TinyNet(), TinyNet()
    forwards = []
    for m in (model, other_model):
        m.register_forward_pre_hook(lambda module, args: forwards.append(module))

    class Constant(explain.Explainer):  # stands for a gradient-free method
        name = "constant"

        def _explain(self, images, targets=None, *, topk=None):
            self.model(images)
            return "called"

    explainers = [GradCAM(model, "layer"), HiResCAM(other_model, "layer"), Constant(model),
                  LayerCAM(model, model.layer)]
    results = explain.explain_together(explainers, A.clone(), targets=0)
    # one pass per (model, layers) group, however the layer was named, plus the other explainer's own
    assert forwards == [model, other_model, model]
    assert results[2] == "called"
    torch.testing.assert_close(results[0].raw.flatten(), torch.tensor([1.5, 0.0]))
    torch.testing.assert_close(results[1].raw.flatten(), torch.tensor([6.0, 0.0]))
    torch.testing.assert_close(results[3].raw.flatten(), torch.tensor([6.0, 0.0]))
    assert explain.explain_together([], A.clone()) == []


def test_explain_together_reads_class_names_per_explainer():
    # Names given to each explainer can map the same word to different ids: no shared pass then.
    model = TinyNet()
    first = GradCAM(model, "layer", class_names=["cat", "dog"])
    second = GradCAM(model, "layer", class_names=["dog", "cat"])
    a, b = explain.explain_together([first, second], A.clone(), targets="cat")
    assert a.targets.tolist() == [0] and b.targets.tolist() == [1]
    torch.testing.assert_close(a.raw.flatten(), torch.tensor([1.5, 0.0]))  # class 0 by hand, above
    torch.testing.assert_close(b.raw.flatten(), torch.tensor([1.5, 2.5]))  # class 1 by hand, above
