import pytest
import timm
import torch
import torchvision.models as tvm
from torch import nn

import explain
from explain.layers import resolve_layers
from conftest import hook_count

# One member of every torchvision CNN family -> the layer a person would pick for Grad-CAM:
# the last block before global pooling.
EXPECTED = {
    "alexnet": "features",
    "convnext_tiny": "features",
    "densenet121": "features",
    "efficientnet_b0": "features",
    "efficientnet_v2_s": "features",
    "googlenet": "inception5b",
    "inception_v3": "Mixed_7c",
    "mnasnet0_5": "layers",
    "mobilenet_v2": "features",
    "mobilenet_v3_small": "features",
    "regnet_y_400mf": "trunk_output",
    "resnet18": "layer4",
    "resnext50_32x4d": "layer4",
    "shufflenet_v2_x0_5": "conv5",
    "squeezenet1_0": "classifier.2",  # the final conv + ReLU, one map per class
    "vgg11": "features",
}


@pytest.mark.parametrize("arch", sorted(EXPECTED))
def test_automatic_layer_for_every_cnn_family(arch):
    extra = {"aux_logits": False, "init_weights": False} if arch in ("googlenet", "inception_v3") else {}
    model = tvm.get_model(arch, weights=None, **extra).eval()
    size = 299 if arch == "inception_v3" else 96
    assert explain.find_target_layer(model, torch.randn(1, 3, size, size)) == EXPECTED[arch]
    assert hook_count(model) == 0


def test_automatic_layer_for_bundled_architecture():
    model = timm.create_model("tf_efficientnet_lite0", pretrained=False).eval()
    assert explain.find_target_layer(model, torch.randn(1, 3, 96, 96)) == "bn2"


def test_candidates_list_spatial_layers_in_order_without_reused_modules():
    model = tvm.resnet18().eval()
    candidates = explain.candidate_layers(model, torch.randn(1, 3, 64, 64))
    names = [c.name for c in candidates]
    assert names[0] == "conv1" and names[-1] == "layer4"
    assert "layer4.1.relu" not in names  # runs twice per forward pass
    assert "avgpool" not in names  # 1 x 1 output
    layer4 = candidates[-1]
    assert layer4.shape == (1, 512, 2, 2) and layer4.module_type == "Sequential"


def test_model_without_spatial_layers_gets_a_clear_error():
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 2))
    with pytest.raises(ValueError, match="no layer with a spatial"):
        explain.GradCAM(model)(torch.randn(1, 3, 2, 2))


def test_wrong_name_lists_close_names():
    model = tvm.resnet18()
    with pytest.raises(ValueError, match=r"no layer named 'layer5'.*did you mean: layer.*explain layers"):
        explain.GradCAM(model, "layer5")
    with pytest.raises(ValueError, match="did you mean: layer4.1.bn2"):
        explain.GradCAM(model, "layer4.1.bn3")
    with pytest.raises(ValueError, match="top-level layers are: conv1, bn1"):
        explain.GradCAM(model, "zzzzzz")


def test_layer_specs():
    model = tvm.resnet18()
    assert list(resolve_layers(model, model.layer3)) == ["layer3"]
    assert list(resolve_layers(model, ["layer2", model.layer4[1].bn2])) == ["layer2", "layer4.1.bn2"]
    with pytest.raises(ValueError, match="not a submodule"):
        resolve_layers(model, nn.Conv2d(1, 1, 1))
    with pytest.raises(ValueError, match="empty list"):
        resolve_layers(model, [])
    with pytest.raises(TypeError, match="a module, a dotted name"):
        resolve_layers(model, 3)


def test_vision_transformers_get_the_first_norm_of_their_last_block():
    # After conv_proj a ViT works on tokens; Swin's stages are channels-last (N, h, w, C),
    # and its final Permute gives (N, C, h, w) after pooling's norm: neither is the usual choice.
    x = torch.randn(1, 3, 64, 64)
    assert explain.find_target_layer(tvm.vit_b_16(image_size=64).eval(), x) == "encoder.layers.encoder_layer_11.ln_1"
    swin = tvm.swin_t().eval()
    assert explain.find_target_layer(swin, torch.randn(1, 3, 96, 96)) == "features.7.1.norm1"
    assert all(not c.name.startswith("features.7") for c in explain.candidate_layers(swin, torch.randn(1, 3, 96, 96)))
    assert hook_count(swin) == 0


@pytest.mark.parametrize("layer, shape", [("fc", r"\(1, 1000\)"), ("avgpool", r"\(1, 512, 1, 1\)")])
def test_explicit_layer_without_spatial_output_names_the_fix(layer, shape):
    model = tvm.resnet18().eval()
    with pytest.raises(ValueError, match=rf"layer '{layer}' outputs shape {shape}.*earlier convolutional layer"):
        explain.GradCAM(model, layer)(torch.randn(1, 3, 64, 64))
    assert hook_count(model) == 0


@pytest.mark.parametrize("size", [(48, 256), (128, 40), (96, 320), (224, 448)])
def test_automatic_layer_for_strip_shaped_images(size):
    # On small grids stride rounding moves the aspect ratio (48 x 256 -> 2 x 8 at layer4).
    model = tvm.resnet18().eval()
    assert explain.find_target_layer(model, torch.randn(1, 3, *size)) == "layer4"
