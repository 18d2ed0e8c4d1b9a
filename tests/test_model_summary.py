"""explain.summary and explain.feature_maps: counts checked by hand and against torchvision's
published figures; hooks and train/eval flags left as they were."""

import pytest
import torch
import torchvision
from torch import nn

import explain
from explain.model_summary import ModelSummary

from conftest import ModelState


class TwoConvs(nn.Module):
    """A strided convolution, a depthwise one, one ReLU run twice, and a linear head."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = self.relu(self.conv1(x))
        x = self.relu(self.conv2(x))
        return self.fc(x.mean((2, 3)))


def test_counts_of_a_small_cnn_by_hand():
    result = explain.summary(TwoConvs(), (2, 3, 16, 16))
    # Input 2 x 3 x 16 x 16; both convolutions output 2 x 8 x 8 x 8 = 1024 elements.
    conv1 = (3 * 8 * 3 * 3 + 8, 1024 * 3 * 3 * 3)  # (parameters, multiply-adds): each output sums 3 channels x 3 x 3
    conv2 = (8 * 1 * 3 * 3, 1024 * 1 * 3 * 3)       # depthwise: each output reads 1 channel
    fc = (8 * 5 + 5, 2 * 5 * 8)
    assert [(row.name, row.output_shape, row.params, row.macs) for row in result.rows] == [
        ("conv1", (2, 8, 8, 8), *conv1),
        ("relu", (2, 8, 8, 8), 0, 0),
        ("conv2", (2, 8, 8, 8), *conv2),
        ("relu", (2, 8, 8, 8), 0, 0),
        ("fc", (2, 5), *fc),
    ]
    assert result.total_params == 224 + 72 + 45
    assert result.total_macs == 27_648 + 9_216 + 80
    # The ReLU runs twice, so its activations are ambiguous: the automatic target is conv2.
    assert result.target_layer == "conv2"
    assert [row.name for row in result.rows if row.is_target] == ["conv2"]


class Attention(nn.Module):
    """Cross-attention through nn.MultiheadAttention called with keywords, on a 4 x 4 grid of
    16 channels read as 16 tokens (sequence first), then a linear layer on every token."""

    def __init__(self):
        super().__init__()
        self.attention = nn.MultiheadAttention(16, 4)
        self.linear = nn.Linear(16, 3)

    def forward(self, images):
        tokens = images.flatten(2).permute(2, 0, 1)
        query, memory = tokens[:10], tokens[10:]
        out, _ = self.attention(query=query, key=memory, value=memory)
        return self.linear(out)


def test_attention_and_tokens_by_hand():
    result = explain.summary(Attention(), (2, 16, 4, 4), target_layer=None)  # 2 sequences of 16 tokens
    attention, linear = result.rows
    # 10 query and 6 key tokens per sequence, 2 sequences, embedding 16 split over 4 heads.
    projections = (10 + 6 + 6) * 2 * 16 * 16   # in-projections of query, key and value
    products = 2 * (2 * 10 * 6 * 16)           # Q K^T and A V, summed over the heads
    output_projection = 10 * 2 * 16 * 16       # out_proj, which the module uses without calling it
    assert attention.macs == projections + products + output_projection
    assert attention.params == (3 * 16 * 16 + 3 * 16) + (16 * 16 + 16)  # out_proj's weights are its own too
    assert attention.output_shape == (10, 2, 16)
    assert (linear.output_shape, linear.macs) == ((10, 2, 3), 10 * 2 * 3 * 16)  # over all leading dimensions
    assert result.target_layer is None and not any(row.is_target for row in result.rows)


# torchvision's weights.meta: "num_params" counts every parameter; "_ops" are GFLOPS meaning
# billions of multiply-adds of the convolutions and matrix products (linear layers, attention)
# for one 224 x 224 image, rounded to 3 decimals. summary matches them to that rounding (so
# within 1%: 0.057 for MobileNetV3-Small is 0.0565 rounded up).
@pytest.mark.parametrize("name, weights, target", [
    ("resnet50", torchvision.models.ResNet50_Weights.IMAGENET1K_V1, "layer4"),
    ("mobilenet_v3_small", torchvision.models.MobileNet_V3_Small_Weights.IMAGENET1K_V1, "features"),
    ("vit_b_16", torchvision.models.ViT_B_16_Weights.IMAGENET1K_V1, "encoder.layers.encoder_layer_11.ln_1"),
])
def test_totals_match_torchvision_published_figures(name, weights, target):
    model = torchvision.models.get_model(name, weights=None)
    result = explain.summary(model, (3, 224, 224))
    assert result.total_params == weights.meta["num_params"]
    assert round(result.total_macs / 1e9, 3) == weights.meta["_ops"]
    assert result.target_layer == target
    assert [row.name for row in result.rows if row.is_target] == [target]


def test_table_and_html():
    result = explain.summary(TwoConvs(), (3, 16, 16), target_layer="conv1")
    assert result.input_shape == (1, 3, 16, 16)
    lines = str(result).splitlines()
    assert lines[0].split() == ["layer", "type", "output", "shape", "parameters", "multiply-adds"]
    assert lines[1].split() == ["*", "conv1", "Conv2d", "8x8x8", "224", "13,824"]
    assert lines[-2] == "total: 0.00 M parameters, 0.00 GMACs (multiply-adds) for an input of 1x3x16x16"
    assert lines[-1] == "* target layer: conv1"
    assert str(result) == result.to_string()
    page = result._repr_html_()
    assert page.startswith("<table>") and page.count("<tr") == 1 + len(result.rows)
    assert '<tr style="font-weight:bold"><td>*</td><td>conv1</td>' in page


def test_a_block_as_target_gets_a_row_of_its_own():
    model = torchvision.models.resnet18()
    result = explain.summary(model, (3, 64, 64), target_layer=model.layer3)
    (marked,) = [row for row in result.rows if row.is_target]
    assert (marked.name, marked.module_type, marked.output_shape, marked.params, marked.macs) == (
        "layer3", "Sequential", (1, 256, 4, 4), 0, 0)  # its contents are the rows that follow it
    assert sum(row.params for row in result.rows) == result.total_params
    with pytest.raises(ValueError, match="no layer named 'layer9'"):
        explain.summary(model, (3, 64, 64), target_layer="layer9")


class Fails(nn.Module):
    def forward(self, x):
        raise RuntimeError("forward failed")


def test_hooks_removed_and_mode_restored_after_success_and_after_an_error():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Dropout(), nn.Flatten(), nn.Linear(144, 2))
    model.train()
    model[0].register_forward_hook(lambda module, args, output: None)  # the caller's own hook stays
    state = ModelState(model)
    explain.summary(model, (2, 3, 8, 8))
    state.assert_unchanged()  # also: batch-norm statistics untouched, as it ran in eval mode

    failing = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), Fails()).train()
    state = ModelState(failing)
    with pytest.raises(RuntimeError, match="forward failed"):
        explain.summary(failing, (3, 8, 8), target_layer=None)
    state.assert_unchanged()


def test_feature_maps_draws_the_strongest_channels():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(inplace=True), nn.Conv2d(8, 2, 1)).train()
    image = torch.rand(3, 12, 12)
    with torch.no_grad():
        means = model[1](model[0](image[None])).mean((0, 2, 3))
    state = ModelState(model)
    figure = explain.feature_maps(model, image, "0", n=5, cmap="magma")
    state.assert_unchanged()
    assert len(figure.axes) == 5
    strongest = means.argsort(descending=True)[:5].tolist()
    assert [axis.get_title() for axis in figure.axes] == [f"channel {c}" for c in strongest]
    assert all(axis.images[0].get_array().shape == (12, 12) for axis in figure.axes)
    assert figure.axes[0].images[0].get_cmap().name == "magma"
    # All channels where the layer has fewer than n; a batch of two is refused.
    assert len(explain.feature_maps(model, image[None], model[2]).axes) == 2
    with pytest.raises(ValueError, match="one image"):
        explain.feature_maps(model, torch.rand(2, 3, 12, 12), "0")


def test_feature_maps_of_transformer_tokens():
    vit = torchvision.models.VisionTransformer(32, 8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32)
    figure = explain.feature_maps(vit, torch.rand(3, 32, 32), "encoder.layers.encoder_layer_1.ln_1", n=4)
    # 1 class token + a 4 x 4 grid of patch tokens: the class token is left out.
    assert [axis.images[0].get_array().shape for axis in figure.axes] == [(4, 4)] * 4


def test_a_model_that_is_one_layer():
    result = explain.summary(nn.Linear(4, 2), (3, 4), target_layer=None)  # three vectors of four
    assert isinstance(result, ModelSummary)
    assert [(row.name, row.output_shape, row.params, row.macs) for row in result.rows] == [("<model>", (3, 2), 10, 24)]
    assert (result.total_params, result.total_macs) == (10, 24)
