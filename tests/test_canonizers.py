"""The canonizers of ConvNeXt blocks, squeeze-excitation gates and functional heads (DenseNet,
MobileNetV2, ShuffleNetV2): by hand on tiny models, LRP's conservation on each architecture,
Excitation Backprop through them, and the model as it was after each call."""

import warnings

import pytest
import torch
import torchvision
from torch import nn
from torchvision.ops.misc import SqueezeExcitation

from conftest import ModelState
from explain.methods.relevance import LRP, ContrastiveExcitationBackprop, ExcitationBackprop
from test_relevance import assert_same_storage, snapshot


def gated_model() -> nn.Module:
    """torchvision's squeeze-excitation on two channels whose gate is sigmoid([0, ln 3]) =
    [0.5, 0.75] whatever the input (its first layer's weights and bias are zero), then a
    linear head w = [2, 1], b = 1."""
    gate, head = SqueezeExcitation(2, 1), nn.Linear(2, 1)
    with torch.no_grad():
        gate.fc1.weight.zero_()
        gate.fc1.bias.zero_()
        gate.fc2.weight.zero_()
        gate.fc2.bias.copy_(torch.tensor([0.0, float(torch.tensor(3.0).log())]))
        head.weight.copy_(torch.tensor([[2.0, 1.0]]))
        head.bias.fill_(1.0)
    return nn.Sequential(gate, nn.Flatten(), head).eval()


def test_gate_is_a_constant_weight_by_hand():
    # x = [1, 2] gated to y = [0.5, 1.5], z = 2 * 0.5 + 1.5 + 1 = 3.5. The head shares its bias:
    # R_y = [1 + 0.5, 1.5 + 0.5]; the gate passes each unit's relevance to x whole, and none
    # into the branch that computes it, so R_x = R_y and the sum is the score.
    model = gated_model()
    raw = LRP(model, normalization=([0.5, 0.5], [0.5, 0.5]))(torch.tensor([1.0, 2.0]).reshape(1, 2, 1, 1)).raw
    assert raw.flatten().tolist() == pytest.approx([1.5, 2.0], rel=1e-5)
    assert not any("forward" in vars(m) for m in model.modules())


def test_functional_pool_divides_in_proportion_by_hand():
    """DenseNet applies F.relu and F.adaptive_avg_pool2d to its features: as modules, the
    pool's rule gives each location of a channel its share of the channel's probability in
    proportion to its activation, relu(a_kl) / sum_l relu(a_kl), where the gradient of the
    functions would give 1 / (h w) to active locations."""
    torch.manual_seed(0)
    model = torchvision.models.DenseNet(
        growth_rate=4, block_config=(2,), num_init_features=4, bn_size=2, num_classes=3
    ).eval()
    captured = ExcitationBackprop(model, "features").capture(torch.randn(2, 3, 32, 32))
    activation, probability = captured.activations["features"], captured.gradients["features"][0]
    active = activation.relu()
    per_channel = probability.sum(dim=(2, 3), keepdim=True)
    expected = active / active.sum(dim=(2, 3), keepdim=True).clamp_min(1e-12) * per_channel
    torch.testing.assert_close(probability, expected, rtol=1e-4, atol=1e-7)
    assert probability.flatten(1).sum(1).tolist() == pytest.approx([1.0, 1.0], abs=1e-4)


def with_statistics(make) -> nn.Module:
    torch.manual_seed(0)
    model = make().eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.2, 0.2)
    return model


def timm_efficientnet():
    timm = pytest.importorskip("timm")
    return timm.create_model("efficientnet_b0", pretrained=False, num_classes=10)


def torchvision_model(arch):
    return lambda: torchvision.models.get_model(arch, weights=None, num_classes=10)


# architecture -> (model, relative tolerance of the pixels' relevance to the score). Measured
# gaps: 2e-6 (ConvNeXt-T), 1e-6 (EfficientNet-B0, torchvision's and timm's), 4e-7 (DenseNet-121),
# 4e-6 (ShuffleNetV2); MobileNetV3-Small's random score of 0.013 is near epsilon, 1.3e-4.
ARCHITECTURES = {
    "convnext_tiny": (torchvision_model("convnext_tiny"), 1e-4),  # CNBlock: sum, layer scale, layer norms
    "mobilenet_v3_small": (torchvision_model("mobilenet_v3_small"), 5e-4),  # squeeze-excitation gates
    "efficientnet_b0": (torchvision_model("efficientnet_b0"), 1e-4),  # squeeze-excitation gates
    "timm_efficientnet_b0": (timm_efficientnet, 1e-4),  # timm's SqueezeExcite
    "densenet121": (torchvision_model("densenet121"), 1e-4),  # F.relu and F.adaptive_avg_pool2d
    "shufflenet_v2_x0_5": (torchvision_model("shufflenet_v2_x0_5"), 1e-4),  # x.mean([2, 3])
}


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_lrp_conserves_and_restores(arch):
    make, tolerance = ARCHITECTURES[arch]
    model, images = with_statistics(make), torch.randn(2, 3, 64, 64)
    state, storage = ModelState(model), snapshot(model)
    with torch.no_grad():
        scores = model(images).max(dim=1).values
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="LRP")  # no addition or product left outside a module
        raw = LRP(model)(images).raw
    torch.testing.assert_close(raw.flatten(1).sum(1), scores, rtol=tolerance, atol=0)
    state.assert_unchanged()
    assert_same_storage(model, storage)
    assert not any("forward" in vars(m) or any(name.startswith("explain_") for name in m._modules)
                   for m in model.modules())


@pytest.mark.parametrize("arch", ["convnext_tiny", "mobilenet_v3_small", "densenet121"])
def test_excitation_backprop_runs_through_them_and_restores(arch):
    make, _ = ARCHITECTURES[arch]
    model, images = with_statistics(make), torch.randn(2, 3, 64, 64)
    state = ModelState(model)
    for method in (ExcitationBackprop, ContrastiveExcitationBackprop):
        result = method(model)(images)
        assert result.maps.shape == (2, 64, 64) and torch.isfinite(result.raw).all()
        assert result.maps.flatten(1).amax(1).tolist() == [1.0, 1.0]
    state.assert_unchanged()
