"""The hook engine's promises: exact capture, in-place safety, low cost, and a model left as found."""

import copy

import pytest
import torch
import torchvision
from torch import nn

import explain
from explain import LayerCapture
from conftest import ModelState, hook_count


def resnet18():
    torch.manual_seed(0)
    return torchvision.models.resnet18(num_classes=10).eval()


def reference_capture(model, layer_name, x, target):
    """Activation and gradient of a layer by plain autograd through the whole network.

    The hook hands the rest of the network a copy (``output * 1``), so in-place ops after
    the layer change the copy and ``output`` keeps both its value and its own gradient.
    """
    model = copy.deepcopy(model).eval()
    store = {}

    def hook(module, args, output):
        output.retain_grad()
        store["activation"] = output
        return output * 1

    handle = model.get_submodule(layer_name).register_forward_hook(hook)
    logits = model(x)
    handle.remove()
    logits[:, target].sum().backward()
    return store["activation"].detach(), store["activation"].grad


@pytest.mark.parametrize(
    "make_model, layer",
    [
        (resnet18, "layer4.1.bn2"),  # followed by `out += identity`
        (resnet18, "layer3.0.conv2"),
        (lambda: torchvision.models.vgg11(num_classes=10).eval(), "features.16"),  # then ReLU(inplace=True)
        (lambda: torchvision.models.densenet121(num_classes=10).eval(), "features"),  # then F.relu(inplace=True)
    ],
    ids=["resnet-bn2-residual-add", "resnet-conv", "vgg-conv-inplace-relu", "densenet-features-inplace-relu"],
)
def test_capture_matches_plain_autograd_with_inplace_ops_after_layer(make_model, layer):
    torch.manual_seed(0)
    model = make_model()
    x = torch.randn(2, 3, 64, 64)
    expected_activation, expected_gradient = reference_capture(model, layer, x, target=3)
    state = ModelState(model)
    with LayerCapture(model, {layer: model.get_submodule(layer)}) as capture:
        logits = model(x)
        capture.backward(logits[:, 3])
    state.assert_unchanged()
    # The stored activation is the value before the later in-place change.
    torch.testing.assert_close(capture.activations[layer].detach(), expected_activation)
    torch.testing.assert_close(capture.gradients[layer], expected_gradient, rtol=1e-4, atol=1e-6)


def test_output_is_unchanged_by_capture():
    model = resnet18()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        expected = model(x)
    res = explain.GradCAM(model, ["layer2", "layer4.1.bn2"])(x)
    torch.testing.assert_close(res.logits, expected)


class Probe(nn.Module):
    """Records whether autograd tracked its input."""

    def __init__(self):
        super().__init__()
        self.saw_grad = []

    def forward(self, x):
        self.saw_grad.append(x.requires_grad)
        return x


def test_no_graph_before_the_target_layer_and_no_parameter_gradients():
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3), Probe(), nn.ReLU(), nn.Conv2d(4, 4, 3), Probe(), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2),
    )
    images = torch.randn(2, 3, 9, 9, requires_grad=True)
    explain.GradCAM(model, "3")(images)
    assert model[1].saw_grad == [False], "autograd recorded the layers before the target"
    assert model[4].saw_grad == [True], "the graph after the target layer is missing"
    assert images.grad is None
    assert all(p.grad is None for p in model.parameters())


def test_backward_stops_at_the_earliest_target_layer():
    model = resnet18()
    reached = []
    model.layer1.register_full_backward_hook(lambda *args: reached.append("layer1"))
    explain.GradCAM(model, "layer3")(torch.randn(1, 3, 64, 64))
    assert reached == []


@pytest.mark.parametrize("context", ["grad", "no_grad", "inference_mode"])
def test_works_under_any_grad_mode(context):
    model = resnet18()
    x = torch.randn(2, 3, 64, 64)
    reference = explain.GradCAM(model)(x)
    mode = {"grad": torch.enable_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}[context]
    with mode():
        res = explain.GradCAM(model)(x.clone())  # made inside the mode: an inference tensor there
    torch.testing.assert_close(res.maps, reference.maps)
    torch.testing.assert_close(res.raw, reference.raw)


def test_train_mode_frozen_params_and_existing_grads_are_left_alone():
    model = resnet18().train()
    model.layer4.eval()  # a mixed model: some submodules already in eval mode
    for p in model.layer1.parameters():
        p.requires_grad_(False)
    model.fc.weight.grad = torch.full_like(model.fc.weight, 0.5)
    state = ModelState(model)
    x = torch.randn(2, 3, 64, 64)
    res = explain.GradCAM(model)(x)
    state.assert_unchanged()
    # The explanation itself is computed in eval mode: identical to an eval-mode model.
    eval_res = explain.GradCAM(copy.deepcopy(model).eval())(x)
    torch.testing.assert_close(res.maps, eval_res.maps)


class Boom(nn.Module):
    def forward(self, x):
        raise RuntimeError("boom")


@pytest.mark.parametrize("where", ["after target", "in target"])
def test_state_restored_when_the_model_raises(where):
    model = resnet18().train()
    if where == "after target":
        model.avgpool = nn.Sequential(model.avgpool, Boom())
        layer = "layer4"
    else:
        model.layer4[1].bn2 = Boom()
        layer = "layer4.1.bn2"
    state = ModelState(model)
    with pytest.raises(RuntimeError, match="boom"):
        explain.GradCAM(model, layer)(torch.randn(1, 3, 64, 64))
    state.assert_unchanged()


def test_state_restored_when_targets_are_bad():
    model = resnet18()
    state = ModelState(model)
    with pytest.raises(ValueError, match="out of range"):
        explain.GradCAM(model, "layer4")(torch.randn(1, 3, 64, 64), targets=99)
    state.assert_unchanged()


def test_multiple_layers_in_one_forward_pass():
    model = resnet18()
    calls = []
    handle = model.register_forward_hook(lambda *args: calls.append(1))
    x = torch.randn(2, 3, 64, 64)
    layers = ["layer2", "layer3.1.bn2", "layer4"]
    with LayerCapture(model, {n: model.get_submodule(n) for n in layers}) as capture:
        logits = model(x)
        capture.backward(logits[:, 1])
    handle.remove()
    assert len(calls) == 1
    for name in layers:
        activation, gradient = reference_capture(model, name, x, target=1)
        torch.testing.assert_close(capture.activations[name].detach(), activation)
        torch.testing.assert_close(capture.gradients[name], gradient, rtol=1e-4, atol=1e-6)
    assert hook_count(model) == 0


def test_reused_module_is_refused_with_a_fix():
    model = resnet18()  # BasicBlock calls self.relu twice
    state = ModelState(model)
    with pytest.raises(ValueError, match="runs 2 times.*block that contains it"):
        explain.GradCAM(model, "layer4.1.relu")(torch.randn(1, 3, 64, 64))
    state.assert_unchanged()


def test_layer_with_non_tensor_output_is_refused():
    class Pair(nn.Module):
        def forward(self, x):
            return x, x

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.pair = Pair()
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            a, b = self.pair(x)
            return self.fc((a + b).mean(dim=(2, 3)))

    with pytest.raises(TypeError, match="returns tuple, not a tensor"):
        explain.GradCAM(Net(), "pair")(torch.randn(1, 3, 4, 4))


def test_layer_off_the_output_path_is_refused():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.side = nn.Conv2d(3, 3, 1)
            self.main = nn.Conv2d(3, 3, 1)
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            self.side(x)
            return self.fc(self.main(x).mean(dim=(2, 3)))

    model = Net()
    with pytest.raises(ValueError, match="do not depend on"):
        explain.GradCAM(model, "side")(torch.randn(1, 3, 4, 4))
    assert hook_count(model) == 0


def test_gradient_free_capture_keeps_pre_inplace_value():
    model = torchvision.models.vgg11(num_classes=10).eval()
    x = torch.randn(1, 3, 32, 32)
    expected, _ = reference_capture(model, "features.3", x, target=0)
    with torch.no_grad(), LayerCapture(model, {"features.3": model.features[3]}, gradients=False) as capture:
        model(x)
    torch.testing.assert_close(capture.activations["features.3"], expected)
    assert expected.min() < 0  # the conv output has negatives the in-place ReLU would erase
    with pytest.raises(RuntimeError, match="gradients=False"):
        capture.backward(torch.zeros(1))


def test_lazy_modules_are_explained_and_left_lazy_free():
    model = nn.Sequential(nn.LazyConv2d(4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.LazyLinear(3))
    res = explain.GradCAM(model)(torch.randn(2, 3, 8, 8))
    assert res.layers == ("1",) and res.maps.shape == (2, 8, 8)
    assert all(p.requires_grad and p.grad is None for p in model.parameters())
    assert hook_count(model) == 0


def test_layer_that_does_not_run_is_refused():
    model = torchvision.models.googlenet(aux_logits=True, init_weights=False).eval()  # aux heads skip in eval
    with pytest.raises(ValueError, match=r"did not run in the forward pass.*explain layers"):
        explain.GradCAM(model, "aux1.conv")(torch.randn(1, 3, 64, 64))
    assert hook_count(model) == 0


def test_keyboard_interrupt_in_a_target_leaves_the_model_clean():
    model = resnet18().train()
    state = ModelState(model)

    def interrupted(logits):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        explain.GradCAM(model)(torch.randn(1, 3, 64, 64), interrupted)
    state.assert_unchanged()


@pytest.mark.parametrize("variant", ["bfloat16", "channels_last"])
def test_low_precision_and_channels_last_match_float32(variant):
    model = resnet18()
    x = torch.randn(2, 3, 64, 64)
    reference = explain.GradCAM(model, "layer3")(x, targets=[1, 2])
    if variant == "bfloat16":
        model, x = copy.deepcopy(model).to(torch.bfloat16), x.to(torch.bfloat16)
    else:
        model, x = copy.deepcopy(model).to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
    res = explain.GradCAM(model, "layer3")(x, targets=[1, 2])
    assert res.maps.dtype == torch.float32
    difference = (res.maps - reference.maps).abs()
    if variant == "bfloat16":  # 8-bit mantissa: close on average, not to the last digit
        assert difference.mean() < 0.05
        assert torch.corrcoef(torch.stack([res.maps.flatten(), reference.maps.flatten()]))[0, 1] > 0.98
    else:
        assert difference.max() < 1e-4


@pytest.mark.parametrize("context", ["no_grad", "inference_mode"])
def test_the_hook_engine_itself_records_gradients_under_any_grad_mode(context):
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(144, 2)).eval()
    x = torch.randn(2, 3, 8, 8)
    activation, gradient = reference_capture(model, "0", x, 1)
    mode = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}[context]
    with mode():
        with LayerCapture(model, {"conv": model[0]}) as capture:
            capture.backward(model(x)[:, 1])
        assert not torch.is_grad_enabled()  # the caller's mode is back once the block ends
    torch.testing.assert_close(capture.activations["conv"].detach(), activation)
    torch.testing.assert_close(capture.gradients["conv"], gradient)
    assert hook_count(model) == 0


def test_model_built_under_inference_mode_gets_a_clear_error_and_stays_as_it_was():
    with torch.inference_mode():
        model = resnet18()
    flags = [p.requires_grad for p in model.parameters()]
    # Gradient-free use (the automatic layer's dry run) works and freezes nothing for good.
    assert explain.find_target_layer(model, torch.randn(1, 3, 64, 64)) == "layer4"
    with pytest.raises(ValueError, match=r"inference tensors.*outside torch\.inference_mode\(\)"):
        explain.GradCAM(model, "layer3")(torch.randn(1, 3, 64, 64))
    assert [p.requires_grad for p in model.parameters()] == flags and all(flags)
    assert hook_count(model) == 0


def test_namedtuple_output_with_a_callable_target():
    from collections import namedtuple

    Output = namedtuple("Output", "logits features")

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.fc = nn.Linear(4, 3)

        def forward(self, x):
            features = self.conv(x)
            return Output(self.fc(features.mean(dim=(2, 3))), features)

    model = Net().eval()
    x = torch.randn(2, 3, 8, 8)
    res = explain.GradCAM(model, "conv")(x, lambda out: out.logits[:, 1])
    # By hand: behind a mean-pooled linear head, dS/dA_k is fc.weight[1, k] / (h*w) at every
    # pixel, so Grad-CAM's channel weights are exactly that.
    weights = model.fc.weight[1].detach() / 36
    by_hand = torch.relu((weights[None, :, None, None] * model.conv(x).detach()).sum(dim=1))
    torch.testing.assert_close(res.raw, by_hand)
    assert isinstance(res.logits, Output) and not res.logits.logits.requires_grad


@pytest.mark.parametrize("gradients", [True, False])
def test_layer_that_returns_its_input_keeps_the_value_it_returned(gradients):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 2, 3)
            self.identity = nn.Identity()
            self.fc = nn.Linear(2, 2)

        def forward(self, x):
            features = self.conv(x)
            same = self.identity(features)
            features.mul_(3)  # an in-place change through another name for the same tensor
            return self.fc((same + features).mean(dim=(2, 3)))

    model = Net().eval()
    x = torch.randn(1, 3, 6, 6)
    with torch.no_grad():
        expected = model.conv(x)
    with LayerCapture(model, {"identity": model.identity}, gradients=gradients) as capture:
        scores = model(x)[:, 0]
        if gradients:
            capture.backward(scores)
    torch.testing.assert_close(capture.activations["identity"].detach(), expected)
    if gradients:  # d score / d same = fc.weight[0, k] / (h * w) at every location
        by_hand = (model.fc.weight[0].detach() / 16)[None, :, None, None].expand(1, 2, 4, 4)
        torch.testing.assert_close(capture.gradients["identity"], by_hand)


def test_a_capture_and_its_graph_are_freed_when_the_call_ends():
    # The gradient hook once closed over the capture, which holds the graph that holds the
    # hook: a cycle through autograd's C++ nodes that the garbage collector cannot see, so
    # every call's graph after its layers stayed in memory (FullGrad's whole graph: 0.29 GB
    # on the bundled model and two photos).
    import gc
    import weakref

    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.Flatten(), nn.LazyLinear(2)).eval()
    model(torch.rand(1, 3, 8, 8))
    with LayerCapture(model, {"first": model[0], "second": model[2]}) as capture:
        output = model(torch.rand(2, 3, 8, 8))
        capture.backward(output[:, 0])
    assert set(capture.gradients) == {"first", "second"}
    kept = [weakref.ref(capture), weakref.ref(capture.activations["first"]), weakref.ref(output)]
    del capture, output
    gc.collect()
    assert [ref() for ref in kept] == [None, None, None]
