"""Layer and neuron attributions (explain.methods.layer_attribution) against plain loops of
their papers' formulas, hand-made cases, and direct captum calls.

- References written here: the tiny model split at its layer (head: input -> layer, tail:
  layer -> logits), each method's sum over the path's points in a plain loop; completeness
  of layer IG and conductance; a neuron of a 1 x 1 identity convolution, whose attributions
  must sit on its own pixel and channel.
- Parity: captum's LayerIntegratedGradients, LayerConductance, InternalInfluence,
  LayerGradientXActivation, NeuronIntegratedGradients, NeuronConductance and NeuronGradient
  called directly; a channel's conductance as the sum of captum's per-neuron conductances.
- The library's promises: pass counts as planned, inner batches that change nothing, maps at
  the input or the layer's resolution, the model left as it was, clear errors.
"""

import warnings

import captum.attr as ca
import pytest
import torch
import torch.nn.functional as F
import torchvision
from captum.attr._utils.approximation_methods import approximation_parameters
from torch import nn

import explain
from conftest import ModelState, listening
from explain.passes import pass_settings

NAMES = [name for name in explain.method_names() if explain.method_class(name).family == "layer attribution"]
IDS = torch.tensor([1, 3])


def tiny_cnn(seed=0):
    """conv -> ReLU -> conv (stride 2) -> ReLU -> pooling -> linear, the head scaled by 30 so
    that the scores' differences stand well above the tolerances."""
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 6, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 5),
    ).eval()
    with torch.no_grad():
        model[6].weight.mul_(30.0)
    return model


def images(n=2, size=8, seed=1):
    coarse = torch.randn(n, 3, 4, 4, generator=torch.Generator().manual_seed(seed))
    return F.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)


def captum(attribution, *args, **kwargs):
    """A direct captum call, its own announcements silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return attribution.attribute(*args, **kwargs).detach()


def tail_gradient(model, activation, ids, split=2):
    """dS/da for S the logits of ``ids`` computed from the layer's activation ``a``."""
    activation = activation.detach().requires_grad_(True)
    score = model[split:](activation).gather(1, ids.view(-1, 1)).sum()
    return torch.autograd.grad(score, activation)[0]


def score(model, x, ids):
    with torch.no_grad():
        return model(x).gather(1, ids.view(-1, 1)).squeeze(1)


# ---------------------------------------------------------------------------------------
# 1. The formulas, in plain loops
# ---------------------------------------------------------------------------------------

def test_layer_gradient_x_activation_is_activation_times_its_gradient():
    model, x = tiny_cnn(), images()
    activation = model[:2](x)
    expected = activation * tail_gradient(model, activation, IDS)
    res = explain.LayerGradientXActivation(model, "1")(x, IDS)
    assert res.layers == ("1",) and res.raw.shape == (2, 4, 8, 8)
    torch.testing.assert_close(res.raw, expected)


def test_layer_integrated_gradients_is_a_riemann_sum_in_the_activations():
    model, x, n = tiny_cnn(), images(), 16
    a, base = model[:2](x).detach(), model[:2](torch.zeros_like(x)).detach()
    total = torch.zeros_like(a)
    for s in range(1, n + 1):  # right Riemann sum: t = s / n
        total += tail_gradient(model, base + s / n * (a - base), IDS) / n
    res = explain.LayerIntegratedGradients(model, "1", n_steps=n, method="riemann_right")(x, IDS)
    torch.testing.assert_close(res.raw, (a - base) * total)


def test_internal_influence_is_the_average_gradient_at_the_layer_along_the_input_path():
    model, x, n = tiny_cnn(), images(), 16
    total = torch.zeros_like(model[:2](x))
    for s in range(1, n + 1):
        total += tail_gradient(model, model[:2](s / n * x), IDS) / n
    res = explain.InternalInfluence(model, "1", n_steps=n, method="riemann_right")(x, IDS)
    torch.testing.assert_close(res.raw, total)


def test_layer_conductance_is_the_gradient_times_the_change_of_the_activation():
    model, x, n = tiny_cnn(), images(), 10
    points = [model[:2](s / n * x).detach() for s in range(n + 1)]  # the path x' + t (x - x'), x' = 0
    expected = sum(tail_gradient(model, points[s], IDS) * (points[s + 1] - points[s]) for s in range(n))
    res = explain.LayerConductance(model, "1", n_steps=n)(x, IDS)
    torch.testing.assert_close(res.raw, expected)


@pytest.mark.parametrize("name, n_steps", [("layer-ig", 256), ("layer-conductance", 400)])
def test_layer_attributions_add_up_to_the_score_difference(name, n_steps):
    model, x = tiny_cnn(), images()
    res = explain.explainer(name, model, target_layer="1", n_steps=n_steps)(x, IDS)
    delta = score(model, x, IDS) - score(model, torch.zeros_like(x), IDS)
    assert delta.abs().min() > 0.1
    torch.testing.assert_close(res.raw.sum(dim=(1, 2, 3)), delta, rtol=2e-3, atol=0)


def identity_stem():
    """A 1 x 1 convolution that copies the input (the layer), then a small head."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 3, 1), nn.ReLU(), nn.Conv2d(3, 4, 3, padding=1), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(4, 5)).eval()
    with torch.no_grad():
        model[0].weight.copy_(torch.eye(3).view(3, 3, 1, 1))
        model[0].bias.zero_()
    return model


@pytest.mark.parametrize("name", ["layer-ig", "internal-influence", "layer-gradxact"])
def test_a_neuron_is_explained_by_its_own_pixel_and_a_channel_by_its_own_input_channel(name):
    model, x = identity_stem(), images(1) + 3.0  # positive: the identity's ReLU passes everything
    unit = explain.explainer(name, model, target_layer="0", neuron=(1, 2, 5))(x)
    assert unit.targets.tolist() == [-1] and unit.raw.shape == (1, 3, 8, 8)
    outside = unit.raw.clone()
    outside[0, 1, 2, 5] = 0
    assert outside.abs().max() == 0
    # the neuron's activation is x[1, 2, 5]: its gradient is 1, so IG and x * grad give the pixel itself
    expected = 1.0 if name == "internal-influence" else x[0, 1, 2, 5].item()
    assert unit.raw[0, 1, 2, 5].item() == pytest.approx(expected, rel=1e-5)
    channel = explain.explainer(name, model, target_layer="0", neuron=1)(x)
    assert channel.raw[0, [0, 2]].abs().max() == 0
    torch.testing.assert_close(channel.raw[0, 1], torch.ones(8, 8) if name == "internal-influence" else x[0, 1])


def test_neuron_integrated_gradients_is_integrated_gradients_of_the_neuron():
    model, x, n = tiny_cnn(), images(), 16
    x0 = torch.zeros_like(x)

    def channel_gradient(point):
        point = point.detach().requires_grad_(True)
        return torch.autograd.grad(model[:2](point)[:, 2].sum(), point)[0]

    expected = x * sum(channel_gradient(s / n * x) for s in range(1, n + 1)) / n
    res = explain.LayerIntegratedGradients(model, "1", neuron=2, n_steps=n, method="riemann_right")(x)
    torch.testing.assert_close(res.raw, expected)
    # completeness for the neuron: the channel's summed activation, from the baseline to the image
    fine = explain.LayerIntegratedGradients(model, "1", neuron=2, n_steps=64)(x)
    delta = model[:2](x)[:, 2].sum((1, 2)) - model[:2](x0)[:, 2].sum((1, 2))
    torch.testing.assert_close(fine.raw.sum((1, 2, 3)), delta.detach(), rtol=1e-3, atol=1e-3)


def test_a_channels_conductance_is_the_sum_of_its_neurons_conductances():
    model, x = tiny_cnn(), images()
    res = explain.LayerConductance(model, "1", neuron=3, n_steps=8)(x, IDS)
    per_neuron = ca.NeuronConductance(model, model[1])
    expected = sum(
        captum(per_neuron, x, (3, i, j), baselines=torch.zeros_like(x), target=IDS, n_steps=8,
               method="riemann_trapezoid")
        for i in range(8) for j in range(8)
    )
    assert res.targets.tolist() == [1, 3]  # conductance explains the class through the neuron
    torch.testing.assert_close(res.raw, expected, rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------------------------------
# 2. Parity with captum called directly
# ---------------------------------------------------------------------------------------

def captum_layer(name, model, x):
    layer, base = model[2], torch.zeros_like(x)
    if name == "layer-ig":
        return captum(ca.LayerIntegratedGradients(model, layer), x, baselines=base, target=IDS, n_steps=12)
    if name == "layer-conductance":
        return captum(ca.LayerConductance(model, layer), x, baselines=base, target=IDS, n_steps=12,
                      method="riemann_trapezoid")
    if name == "internal-influence":
        return captum(ca.InternalInfluence(model, layer), x, baselines=base, target=IDS, n_steps=12)
    return captum(ca.LayerGradientXActivation(model, layer), x, target=IDS)


def captum_neuron(name, model, x, neuron):
    layer, base = model[2], torch.zeros_like(x)
    if name == "layer-ig":
        return captum(ca.NeuronIntegratedGradients(model, layer), x, neuron, baselines=base, n_steps=12)
    if name == "layer-conductance":
        return captum(ca.NeuronConductance(model, layer), x, neuron, baselines=base, target=IDS, n_steps=12,
                      method="riemann_trapezoid")
    if name == "internal-influence":
        method = ca.NeuronIntegratedGradients(model, layer, multiply_by_inputs=False)
        return captum(method, x, neuron, baselines=base, n_steps=12)
    return x * captum(ca.NeuronGradient(model, layer), x, neuron)


@pytest.mark.parametrize("name", NAMES)
def test_layer_and_neuron_attributions_match_captum(name):
    model, x = tiny_cnn(), images()
    options = {} if name == "layer-gradxact" else {"n_steps": 12, "internal_batch_size": 5}
    res = explain.explainer(name, model, target_layer="2", **options)(x, IDS)
    torch.testing.assert_close(res.raw, captum_layer(name, model, x))
    neuron = explain.explainer(name, model, target_layer="2", neuron=(4, 1, 2), **options)
    res = neuron(x, IDS) if name == "layer-conductance" else neuron(x)
    torch.testing.assert_close(res.raw, captum_neuron(name, model, x, (4, 1, 2)))
    assert res.raw.abs().max() > 0


# ---------------------------------------------------------------------------------------
# 3. The library's promises
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("neuron", [None, 1])
@pytest.mark.parametrize("name", NAMES)
def test_each_call_runs_the_passes_it_plans_and_inner_batches_change_nothing(name, neuron):
    model, x = tiny_cnn(), images(3)
    counted = []
    options = {} if name == "layer-gradxact" else {"n_steps": 6}
    method = explain.explainer(name, model, target_layer="2", neuron=neuron, **options)
    with pass_settings(listener=listening(lambda method, done, total: counted.append((done, total)))):
        whole = method(x)
    assert counted[-1] == (method.planned_passes(x),) * 2
    if name != "layer-gradxact":
        small = explain.explainer(name, model, target_layer="2", neuron=neuron, internal_batch_size=2, **options)(x)
        torch.testing.assert_close(small.raw, whole.raw)


def test_maps_at_the_input_or_at_the_layers_grid():
    model, x = tiny_cnn(), images()
    upsampled = explain.LayerConductance(model, "2", n_steps=4)(x)
    on_grid = explain.LayerConductance(model, "2", n_steps=4, resolution="layer")(x)
    assert upsampled.maps.shape == (2, 8, 8) and on_grid.maps.shape == (2, 4, 4)
    reduced = on_grid.raw.abs().sum(1)
    expected = F.interpolate(reduced[:, None], size=(8, 8), mode="bilinear", align_corners=False)[:, 0]
    torch.testing.assert_close(upsampled.maps, explain.methods.attribution_base.normalize_maps(expected))
    assert upsampled.maps.flatten(1).amax(1).tolist() == [1.0, 1.0]
    signed = explain.LayerGradientXActivation(model, "2", reduction="sum")(x, IDS)
    summed = F.interpolate(signed.raw.sum(1, keepdim=True), size=(8, 8), mode="bilinear", align_corners=False)[:, 0]
    assert signed.signed and summed.min() < 0 < summed.max()
    torch.testing.assert_close(signed.maps, explain.methods.attribution_base.normalize_maps(summed))


def test_the_automatic_layer_is_the_cams_and_topk_gives_a_column_per_target():
    model, x = torchvision.models.resnet18(num_classes=6).eval(), torch.rand(2, 3, 64, 64)
    res = explain.LayerGradientXActivation(model)(x, topk=2)
    assert res.layers == ("layer4",) and res.raw.shape == (2, 2, 512, 2, 2) and res.maps.shape == (2, 2, 64, 64)
    for k in range(2):
        torch.testing.assert_close(res.raw[:, k], explain.LayerGradientXActivation(model)(x, res.targets[:, k]).raw)


def test_a_vision_transformers_tokens_are_read_as_its_patch_grid():
    vit = torchvision.models.VisionTransformer(32, 8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32).eval()
    nn.init.normal_(vit.heads.head.weight)  # torchvision starts the head at zero: every gradient would be 0
    res = explain.LayerIntegratedGradients(vit, n_steps=4)(torch.rand(1, 3, 32, 32))
    assert res.layers == ("encoder.layers.encoder_layer_1.ln_1",)
    assert res.raw.shape == (1, 16, 4, 4) and res.maps.shape == (1, 32, 32) and res.maps.max() == 1


def resnet18():
    torch.manual_seed(0)
    return torchvision.models.resnet18(num_classes=10).eval()


@pytest.mark.parametrize("mode", ["plain", "no_grad", "inference_mode"])
@pytest.mark.parametrize("neuron", [None, 6, (6, 1, 1)])
@pytest.mark.parametrize("name", NAMES)
def test_the_model_is_left_as_it_was(name, neuron, mode):
    model = resnet18().train()  # the call runs in eval mode and must restore this
    next(model.parameters()).requires_grad_(False)
    state = ModelState(model)
    options = {} if name == "layer-gradxact" else {"n_steps": 3}
    method = explain.explainer(name, model, target_layer="layer3.1.bn2", neuron=neuron, **options)  # then += identity
    context = {"plain": torch.enable_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}[mode]
    with context():
        res = method(images(1, 32))
    state.assert_unchanged()
    assert torch.isfinite(res.maps).all() and res.maps.max() == 1


class Flaky(nn.Module):
    """The model, raising in its ``fail_at``-th forward pass (after its layers have run)."""

    def __init__(self, model, fail_at):
        super().__init__()
        self.model, self.fail_at, self.calls = model, fail_at, 0

    def forward(self, x):
        out = self.model(x)
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("flaky forward")
        return out


@pytest.mark.parametrize("neuron", [None, 2])
@pytest.mark.parametrize("name", NAMES)
def test_the_model_is_left_as_it_was_after_an_exception(name, neuron):
    options = {} if name == "layer-gradxact" else {"n_steps": 3}
    # the first pass inside captum: a single-pass method's only one, the others' second
    model = Flaky(resnet18(), 1 if name == "layer-gradxact" else 2)
    state = ModelState(model)
    with pytest.raises(RuntimeError, match="flaky forward"):
        explain.explainer(name, model, target_layer="model.layer3", neuron=neuron, **options)(images(1, 32))
    state.assert_unchanged()


def test_bad_settings_raise_errors_that_say_what_to_do():
    model, x = tiny_cnn(), images(1)
    with pytest.raises(ValueError, match="neuron must be a channel index"):
        explain.LayerIntegratedGradients(model, "2", neuron=(1,))
    with pytest.raises(ValueError, match="neuron must be a channel index"):
        explain.LayerIntegratedGradients(model, "2", neuron=-1)
    with pytest.raises(ValueError, match="unknown resolution"):
        explain.LayerConductance(model, "2", resolution="pixels")
    with pytest.raises(ValueError, match="resolution='layer' does not apply"):
        explain.LayerConductance(model, "2", neuron=1, resolution="layer")
    with pytest.raises(ValueError, match="one target layer"):
        explain.LayerGradientXActivation(model, ["1", "2"])
    with pytest.raises(ValueError, match="pass no targets"):
        explain.InternalInfluence(model, "2", neuron=1, n_steps=2)(x, 3)
    with pytest.raises(ValueError, match="pass no targets"):  # the check says so before any call
        explain.LayerIntegratedGradients(model, "2", neuron=1).check(x, topk=2)
    with pytest.raises(ValueError, match="grid holds 6 channels of 4 x 4"):
        explain.LayerGradientXActivation(model, "2", neuron=(1, 4, 0))(x)
    with pytest.raises(ValueError, match="grid holds 6 channels"):
        explain.LayerGradientXActivation(model, "2", neuron=6).check(x)
    with pytest.raises(ValueError, match="unknown method"):
        explain.LayerIntegratedGradients(model, "2", method="simpson")
