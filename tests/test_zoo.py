"""Every method on a zoo of torchvision architectures (random weights), on several layers each,
including layers whose output is later changed in place, with and without autograd enabled."""

from functools import lru_cache

import pytest
import torch
import torchvision.models as tvm

import explain
from conftest import ModelState

SIZE = 96

# architecture -> layers to explain (None = automatic); comments mark the in-place cases.
ZOO = {
    "resnet18": [None, "layer3", "layer4.1.bn2"],  # bn2: then `out += identity`
    "resnet50": [None, "layer4.2.bn3"],  # bn3: then `out += identity`
    "vgg11": [None, "features.18"],  # conv, then ReLU(inplace=True)
    "vgg16_bn": [None, "features.41"],  # batch norm, then ReLU(inplace=True)
    "densenet121": [None, "features.denseblock4"],  # auto = features, then F.relu(inplace=True)
    "mobilenet_v2": [None, "features.17"],
    "mobilenet_v3_small": [None, "features.9.block"],
    "efficientnet_b0": [None, "features.6"],
    "convnext_tiny": [None, "features.5"],
    "regnet_x_400mf": [None, "trunk_output.block3"],
    "squeezenet1_1": [None, "features.12.expand3x3"],  # conv, then ReLU(inplace=True)
    "shufflenet_v2_x0_5": [None, "stage3"],
}

CASES = [(arch, layer) for arch, layers in ZOO.items() for layer in layers]


@lru_cache(maxsize=2)
def make(arch):
    torch.manual_seed(0)
    return tvm.get_model(arch, weights=None, num_classes=20).eval()


@pytest.mark.parametrize("grad_mode", ["grad", "no_grad"])
@pytest.mark.parametrize("arch, layer", CASES, ids=[f"{a}-{l or 'auto'}" for a, l in CASES])
def test_every_method(arch, layer, grad_mode):
    model = make(arch)
    torch.manual_seed(1)
    images = torch.randn(2, 3, SIZE, SIZE)
    state = ModelState(model)
    context = torch.no_grad() if grad_mode == "no_grad" else torch.enable_grad()
    for method in explain.methods():
        cam = explain.explainer(method, model, target_layer=layer)
        with context:
            res = cam(images)
        assert res.maps.shape == (2, SIZE, SIZE), method
        assert res.maps.dtype == torch.float32
        assert torch.isfinite(res.maps).all(), method
        assert res.maps.min() >= 0 and res.maps.max() <= 1, method
        # Each map is either scaled to reach exactly 1 or carries no evidence at all.
        peaks = res.maps.flatten(1).amax(dim=1)
        assert all(p in (0.0, 1.0) for p in peaks.tolist()), method
        (name,) = res.layers
        raw = res.raw
        assert raw.dim() == 3 and raw.shape[0] == 2 and raw.min() >= 0, method
        assert torch.isfinite(raw).all(), method
        assert res.targets.tolist() == res.logits.argmax(dim=1).tolist()
        if layer is not None:
            assert name == layer
    state.assert_unchanged()  # anything a call changed would still show here
