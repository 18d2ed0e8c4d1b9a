"""Excitation Backprop and its contrastive form against values worked out by hand, against
zennit's own composite and TorchRay, and the model left as it was.

The tiny model: a 1 x 1 convolution that copies its two channels (so a1 = x), ReLU (the
target layer "1"), a 1 x 1 convolution, ReLU, and a linear classifier over the flattened
1 x 2 grid, on one image with x = [[1, 2], [3, 0]] (channel, location):

    W2 = [[1, -1], [2, 1]]  b2 = [0, 0.5]   a2 = [[0, 2], [5.5, 4.5]]  (the bias is left out by the rule)
    W3 = [[1, 1, -1, 2], [0.5, -1, 1, 1]]   z3 = [5.5, 8]: class 1 explained

Class 1: W3[1]^+ = [0.5, 0, 1, 1] over a2 = [0, 2, 5.5, 4.5]: contributions [0, 0, 5.5, 4.5],
so P(a2) = [[0, 0], [0.55, 0.45]]. Through conv2, unit (1, p) shares by a1[:, p] * W2[1]^+ =
a1[:, p] * [2, 1]: location 0 gives [2, 3] / 5 of 0.55, location 1 [4, 0] / 4 of 0.45:
P(a1) = [[0.22, 0.45], [0.33, 0]], the map [0.55, 0.45].
The dual unit: (-W3[1])^+ = [0, 1, 0, 0]: all of P to a2[0, 1] = 2, which conv2's unit (0, 1)
hands to a1[0, 1] (W2[0]^+ = [1, 0]): P_dual(a1) = [[0, 1], [0, 0]], so the contrastive map
is max(0, [0.55, 0.45] - [0, 1]) = [0.55, 0].
"""

import copy

import pytest
import torch
import torchvision
from torch import nn

import explain
from conftest import BackwardFails, ModelState, hook_count
from explain.methods.relevance import ContrastiveExcitationBackprop, ExcitationBackprop, excitation_layer


def tiny_model() -> nn.Module:
    first, second, head = nn.Conv2d(2, 2, 1), nn.Conv2d(2, 2, 1), nn.Linear(4, 2)
    with torch.no_grad():
        first.weight.copy_(torch.eye(2)[:, :, None, None])
        first.bias.zero_()
        second.weight.copy_(torch.tensor([[1.0, -1.0], [2.0, 1.0]])[:, :, None, None])
        second.bias.copy_(torch.tensor([0.0, 0.5]))
        head.weight.copy_(torch.tensor([[1.0, 1.0, -1.0, 2.0], [0.5, -1.0, 1.0, 1.0]]))
        head.bias.zero_()
    return nn.Sequential(first, nn.ReLU(), second, nn.ReLU(), nn.Flatten(), head).eval()


X = torch.tensor([[1.0, 2.0], [3.0, 0.0]]).reshape(1, 2, 1, 2)


def test_winning_probabilities_match_hand_computation():
    explainer = ExcitationBackprop(tiny_model(), "1")
    captured = explainer.capture(X)
    assert captured.targets.tolist() == [1]
    probabilities = captured.gradients["1"][0]
    torch.testing.assert_close(probabilities, torch.tensor([[[[0.22, 0.45]], [[0.33, 0.0]]]]), atol=1e-6, rtol=0)
    result = explainer(X)
    torch.testing.assert_close(result.raw, torch.tensor([[[0.55, 0.45]]]), atol=1e-6, rtol=0)
    assert result.raw.sum().item() == pytest.approx(1.0, abs=1e-6)  # a probability distribution


def test_contrastive_subtracts_the_dual_unit_by_hand():
    result = ContrastiveExcitationBackprop(tiny_model(), "1")(X)
    torch.testing.assert_close(result.raw, torch.tensor([[[0.55, 0.0]]]), atol=1e-6, rtol=0)
    captured = ContrastiveExcitationBackprop(tiny_model(), "1").capture(X)
    expected = torch.tensor([[[[0.22, 0.45 - 1.0]], [[0.33, 0.0]]]])  # P - P_dual, per channel
    torch.testing.assert_close(captured.gradients["1"][0], expected, atol=1e-6, rtol=0)


def test_the_class_explained_is_the_one_asked_for():
    # Class 0: W3[0]^+ = [1, 1, 0, 2] over a2: [0, 2, 0, 9] / 11; both units at location 1
    # hand everything to a1[0, 1] = 2 (a1[1, 1] = 0): the map [0, 1].
    raw = ExcitationBackprop(tiny_model(), "1")(X, 0).raw
    torch.testing.assert_close(raw, torch.tensor([[[0.0, 1.0]]]), atol=1e-6, rtol=0)


def vgg_like() -> nn.Module:
    """A small VGG: convolutions, ReLUs and max pools, then a two-layer classifier."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
        nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10),
    ).eval()


def test_default_layer_is_one_stage_before_the_cams():
    images = torch.rand(1, 3, 64, 64)
    assert ExcitationBackprop(vgg_like()).layer_names(images) == ("4",)  # 16 x 16; Grad-CAM's "7" is 8 x 8
    assert excitation_layer(torchvision.models.resnet50(), images) == "layer3"  # not layer4.0.conv1, a branch
    assert excitation_layer(torchvision.models.regnet_x_400mf(), images) == "trunk_output.block3"


def test_matches_zennits_excitation_backprop_composite():
    from zennit.composites import ExcitationBackprop as ZennitExcitationBackprop

    model, images = vgg_like(), torch.randn(3, 3, 32, 32)
    result = ExcitationBackprop(model, "4")(images, [1, 5, 7])
    composite, kept = ZennitExcitationBackprop(zero_params=["bias"]), {}
    handle = model[4].register_forward_hook(lambda module, args, output: kept.update(output=output))
    with composite.context(model):
        output = model(images.clone().requires_grad_())
        (gradient,) = torch.autograd.grad(output, kept["output"], torch.eye(10)[[1, 5, 7]])
    handle.remove()
    torch.testing.assert_close(result.raw, gradient.sum(1), rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("contrastive", [False, True], ids=["eb", "contrastive"])
def test_matches_torchray(contrastive):
    excitation = pytest.importorskip("torchray.attribution.excitation_backprop")
    model, images = vgg_like(), torch.randn(2, 3, 32, 32)
    method = ContrastiveExcitationBackprop if contrastive else ExcitationBackprop
    # TorchRay adds 1e-20 to the denominators; the default stabilizer 1e-6 moves the maps (of
    # at most 0.015) by up to 9e-7, a smaller one matches to rounding.
    result = method(model, "4", stabilizer=1e-12)(images, topk=2)
    for k in range(2):
        ids = result.targets[:, k].tolist()
        if contrastive:  # TorchRay subtracts at fc7's ReLU; the rule is linear below it, so it is the same
            expected = excitation.contrastive_excitation_backprop(
                model, images, ids, saliency_layer=model[4], contrast_layer=model[11]
            )
        else:
            expected = excitation.excitation_backprop(model, images, ids, saliency_layer=model[4])
        torch.testing.assert_close(result.raw[:, k], expected[:, 0], rtol=1e-5, atol=1e-8)


def with_statistics(arch: str) -> nn.Module:
    torch.manual_seed(0)
    model = torchvision.models.get_model(arch, weights=None, num_classes=10).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.2, 0.2)
    return model


@pytest.mark.parametrize("arch, layer", [("resnet18", "layer3"), ("vgg11_bn", "features.13")])
def test_a_probability_distribution_at_the_layer(arch, layer):
    """Batch norms merged and residual sums as modules: the map sums to P = 1 per target."""
    result = ExcitationBackprop(with_statistics(arch), layer)(torch.randn(2, 3, 64, 64), topk=2)
    torch.testing.assert_close(result.raw.flatten(2).sum(2), torch.ones(2, 2), rtol=0, atol=1e-4)
    assert (result.raw >= 0).all()


def test_batched_over_images_and_targets():
    model, images = with_statistics("resnet18"), torch.randn(3, 3, 32, 32)
    together = ContrastiveExcitationBackprop(model)(images, topk=2)
    for i in range(3):
        for k in range(2):
            alone = ContrastiveExcitationBackprop(model)(images[i : i + 1], int(together.targets[i, k]))
            torch.testing.assert_close(together.raw[i, k], alone.raw[0], rtol=1e-4, atol=1e-7)


def test_callable_target_is_the_top_down_signal():
    # f = z_0 + z_1 puts P = 1 on both output units: the two classes' maps added.
    model = tiny_model()
    both = ExcitationBackprop(model, "1")(X, lambda out: out[:, 0] + out[:, 1]).raw
    apart = ExcitationBackprop(model, "1")(X, 0).raw + ExcitationBackprop(model, "1")(X, 1).raw
    torch.testing.assert_close(both, apart, atol=1e-6, rtol=0)


class Residual(nn.Module):
    """A residual addition written in forward: no module, so no rule."""

    def __init__(self):
        super().__init__()
        self.conv, self.head = nn.Conv2d(3, 3, 3, padding=1), nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 4))

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)) + x)


class Gated(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.gate, self.head = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 4, 1), nn.Linear(4, 3)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return self.head((y * torch.sigmoid(self.gate(y))).mean((2, 3)))


@pytest.mark.parametrize("model, layer, step", [
    (Residual(), "conv", "Add"),
    (Gated(), "conv", "Mean, Mul, Sigmoid"),
    (nn.Sequential(nn.Conv2d(3, 4, 3), nn.GroupNorm(2, 4), nn.Flatten(), nn.Linear(144, 2)), "0", "NativeGroupNorm"),
])
@pytest.mark.parametrize("method", [ExcitationBackprop, ContrastiveExcitationBackprop])
def test_refuses_steps_without_a_rule(model, layer, step, method):
    state = ModelState(model.eval())
    with pytest.raises(explain.NotApplicable, match=f"no rule for steps .*\\({step}\\)"):
        method(model, layer)(torch.rand(1, 3, 8, 8))
    state.assert_unchanged()


def test_refuses_attention():
    vit = torchvision.models.VisionTransformer(32, 8, num_layers=1, num_heads=2, hidden_dim=16, mlp_dim=32)
    for method in (ExcitationBackprop, ContrastiveExcitationBackprop):
        with pytest.raises(explain.NotApplicable, match="attention"):
            method(vit)(torch.rand(1, 3, 32, 32))


def test_contrastive_needs_a_classifier_before_the_output():
    embedder = torchvision.models.resnet18()
    embedder.fc = nn.Identity()  # the last layer to run is a convolution inside a residual block
    with pytest.raises(explain.NotApplicable, match="dual unit"):
        ContrastiveExcitationBackprop(embedder.eval(), "layer3")(torch.rand(1, 3, 32, 32), lambda out: out[:, 0])
    assert ExcitationBackprop(embedder.eval(), "layer3")(torch.rand(1, 3, 32, 32), lambda out: out[:, 0]).raw.shape
    with pytest.raises(ValueError, match="before the classifier"):
        ContrastiveExcitationBackprop(vgg_like(), "12")(torch.rand(1, 3, 32, 32))


def test_options_checked():
    with pytest.raises(ValueError, match="stabilizer"):
        ExcitationBackprop(tiny_model(), stabilizer=0)
    with pytest.raises(explain.NotApplicable, match="no training mode"):
        explain.explainer("excitation-backprop", tiny_model(), create_graph=True)


@pytest.mark.parametrize("method", [ExcitationBackprop, ContrastiveExcitationBackprop])
def test_model_restored_and_frozen_weights_and_no_grad(method):
    model = with_statistics("resnet18")
    model.layer2.train()
    model.conv1.weight.requires_grad_(False)
    model.fc.weight.grad = torch.ones_like(model.fc.weight)
    state, images = ModelState(model), torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        result = method(model)(images)
    assert torch.isfinite(result.maps).all() and result.maps.shape == (2, 32, 32)
    state.assert_unchanged()
    assert not any("forward" in vars(m) or hasattr(m, "canonizer_sum") for m in model.modules())


def test_images_made_under_inference_mode():
    model = vgg_like()
    expected = ExcitationBackprop(model)(torch.ones(1, 3, 32, 32)).raw
    with torch.inference_mode():
        images = torch.ones(1, 3, 32, 32)
        inside = ExcitationBackprop(model)(images).raw
    torch.testing.assert_close(ExcitationBackprop(model)(images).raw, expected)
    torch.testing.assert_close(inside, expected)


class Failing(nn.Module):
    """The model, failing from its ``fail_at``-th forward pass on (1: the targets, 2: the
    trace, 3: under the rules)."""

    def __init__(self, model, fail_at):
        super().__init__()
        self.model, self.fail_at, self.calls = model, fail_at, 0

    def forward(self, x):
        self.calls += 1
        if self.fail_at is not None and self.calls >= self.fail_at:
            raise RuntimeError("forward failed")
        return self.model(x)


@pytest.mark.parametrize("fail_at", [2, 3, None], ids=["tracing", "under-rules", "backward"])
def test_model_restored_after_a_failing_pass(fail_at):
    model = Failing(with_statistics("resnet18"), fail_at)
    explainer = ContrastiveExcitationBackprop(model, "model.layer3")
    state, attributes = ModelState(model), [set(vars(m)) for m in model.modules()]

    def target(output):  # the backward pass through it fails, under the rules
        return BackwardFails.apply(output)[:, 0]

    with pytest.raises(RuntimeError, match="forward failed|backward failed"):
        explainer(torch.randn(1, 3, 32, 32), None if fail_at else target)
    state.assert_unchanged()
    assert [set(vars(m)) for m in model.modules()] == attributes
    assert hook_count(model) == 0


def test_bundled_model(bundled, photos):
    model = copy.deepcopy(bundled[0])
    state = ModelState(model)
    result = ExcitationBackprop(model)(photos[1][:2])
    assert result.layers == ("blocks.5.0.bn1",) and result.maps.shape == (2, 224, 224)
    # Trained, with many units of its depthwise layers excited by their bias alone, which the
    # rule leaves out: a fifth of P reaches the layer (all of it reaches blocks.6, before them).
    total = result.raw.flatten(1).sum(1)
    assert ((0.1 < total) & (total < 0.3)).all()
    at_last_block = ExcitationBackprop(model, "blocks.6")(photos[1][:2]).raw.flatten(1).sum(1)
    torch.testing.assert_close(at_last_block, torch.ones(2), rtol=0, atol=1e-4)
    state.assert_unchanged()


def test_registered():
    for name, cls in (("excitation-backprop", ExcitationBackprop),
                      ("c-excitation-backprop", ContrastiveExcitationBackprop)):
        assert isinstance(explain.explainer(name, tiny_model()), cls)
        assert getattr(explain, cls.__name__) is cls
        assert explain.describe_methods()[name]["needs_layer"] is True


def test_video_resnet_blocks_are_canonized():
    """torchvision's video ResNets add their shortcut in forward: a Sum module for the call."""
    torch.manual_seed(0)
    model = torchvision.models.video.r3d_18(num_classes=5).eval()
    state = ModelState(model)
    result = ExcitationBackprop(model, "layer3")(torch.rand(1, 3, 4, 32, 32))
    assert result.maps.shape == (1, 4, 32, 32)
    assert result.raw.sum().item() == pytest.approx(1.0, abs=1e-4)
    state.assert_unchanged()


def test_run_from_the_command_line(tmp_path, capsys):
    import json
    from pathlib import Path

    from explain.cli import main

    image = str(Path(__file__).resolve().parents[1] / "data" / "images" / "coffee.png")
    methods = "excitation-backprop,c-excitation-backprop"
    assert main(["run", image, "--out", str(tmp_path), "--method", methods, "-q"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "manifest.jsonl").read_text().splitlines()]
    assert [(row["method"], row["layer"], row["status"]) for row in rows] == [
        ("excitation-backprop", "blocks.5.0.bn1", "ok"), ("c-excitation-backprop", "blocks.5.0.bn1", "ok")]
    assert all(row["predicted_name"] == "espresso" for row in rows)
