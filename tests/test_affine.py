"""Whether the layers after a target layer are affine in its output
(explain.methods.affine.is_affine, LayerReplay.affine): the structural test says yes only
for operations affine in the input, and no for anything else, never a guess."""

from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn.functional as F
import torchvision
from torch import nn

from explain.methods import LayerReplay
from explain.methods.affine import is_affine


class Scaled(nn.Module):
    def __init__(self, divide_by_input=False, square=False):
        super().__init__()
        self.divide_by_input, self.square = divide_by_input, square
        self.fc = nn.Linear(4, 2)

    def forward(self, x, y):
        if self.square:
            return self.fc(x * x)
        if self.divide_by_input:
            return self.fc(y / x)
        return self.fc(2.0 * x.view(x.shape[0], -1) / 3.0 + y * x - x.mean(dim=1, keepdim=True))


class BatchNormReLU(nn.BatchNorm1d):
    def forward(self, x):
        return torch.relu(super().forward(x))


class Untraceable(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: fx cannot trace it
            return x
        return -x


class Leaves(fx.Tracer):
    """Keeps every submodule whole, as LayerReplay's trace keeps those around the layer."""

    def is_leaf_module(self, module, qualified_name):
        return True


def traced(module):
    return fx.GraphModule(module, Leaves().trace(module))


def test_affine_operations_and_products_with_fixed_values_are_affine():
    assert is_affine(traced(Scaled()), "x")  # scaled, reshaped, multiplied by y, a mean taken
    assert not is_affine(traced(Scaled(square=True)), "x")  # a product of two varying values
    assert not is_affine(traced(Scaled(divide_by_input=True)), "x")  # divided by the input
    assert is_affine(traced(Scaled(divide_by_input=True)), "y")  # y / x: affine in y
    assert not is_affine(traced(nn.Sequential(nn.Linear(4, 4), nn.ReLU())), "input")
    assert not is_affine(traced(nn.Sequential(nn.MaxPool2d(2), nn.Flatten())), "input")


def test_batch_norm_counts_in_eval_mode_only_and_its_subclasses_are_traced():
    head = nn.Sequential(nn.BatchNorm1d(4), nn.Dropout(0.5), nn.Linear(4, 2))
    assert is_affine(traced(head.eval()), "input")
    assert not is_affine(traced(head.train()), "input")
    assert not is_affine(traced(nn.Sequential(BatchNormReLU(4).eval(), nn.Linear(4, 2))), "input")
    assert not is_affine(traced(nn.Sequential(nn.Linear(4, 4), Untraceable())), "input")
    assert not is_affine(traced(nn.Sequential(nn.Linear(4, 4))), "no such input")


def test_layer_replay_knows_a_resnet_s_head_is_affine_after_layer4_only():
    model = torchvision.models.resnet18(num_classes=3).eval()
    assert LayerReplay(model, "layer4").affine  # avgpool, flatten, fc
    assert not LayerReplay(model, "layer3").affine  # layer4's ReLUs
    assert not LayerReplay(model, "layer4.1.bn2").affine  # the residual sum's ReLU


def test_split_affine_parts_compose_to_the_whole_and_pass_each_affine_value():
    from explain.data import load_shortcut_model

    model = torchvision.models.resnet18(num_classes=3).eval()
    replay = LayerReplay(model, "layer3")
    head, rest = replay.affine_start()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        activation = model.layer3(model.layer2(model.layer1(model.maxpool(model.relu(model.bn1(model.conv1(x)))))))
        replay.prepare(x, activation, model(x))
        rows = torch.arange(2)
        values = head(activation, rows)  # layer4.0's conv1 -> bn1 and its downsample branch
        assert len(values) == 2
        # (rest may change the values in place: resnet's ReLU(inplace=True))
        torch.testing.assert_close(rest([v.clone() for v in values], rows), model(x), atol=1e-5, rtol=1e-4)
        # each value is affine in the activation: the values of a weighted sum are the weighted sum
        other = torch.rand_like(activation)
        mixed = head(0.3 * activation + 0.7 * other, rows)
        for value, of_x, of_other in zip(mixed, values, head(other, rows), strict=True):
            torch.testing.assert_close(value, 0.3 * of_x + 0.7 * of_other, atol=1e-4, rtol=1e-4)
    shortcut = LayerReplay(load_shortcut_model().eval(), "block3")
    assert shortcut.affine_start() is not None  # block4's convolution and batch norm, then its ReLU
    assert LayerReplay(model, "layer4").affine_start() is None  # affine throughout: LayerReplay.affine
    relu_first = nn.Sequential(nn.Conv2d(3, 4, 1), nn.ReLU(), nn.Flatten(), nn.Linear(4, 2)).eval()
    assert LayerReplay(relu_first, "0").affine_start() is None  # nothing affine before the ReLU


class ReadsTheShape(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 1)

    def forward(self, x):
        return torch.relu(self.conv(x)).flatten(1)[:, : x.shape[1]]  # the input's shape past the ReLU


def test_split_affine_declines_a_rest_that_reads_the_input_past_the_split():
    from explain.methods.affine import split_affine

    assert split_affine(fx.symbolic_trace(ReadsTheShape()), "x") is None
    parts = split_affine(fx.symbolic_trace(nn.Sequential(nn.Conv2d(4, 4, 1), nn.ReLU())), "input")
    x = torch.randn(2, 4, 3, 3)
    head, rest = parts
    torch.testing.assert_close(rest(*head(x)), torch.relu(parts[0].get_submodule("0")(x)))


class Bilinear(nn.Module):
    def forward(self, x):
        return F.linear(x, x.mean(0))  # a weight made from the input: not affine


class Lookup(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(10))

    def forward(self, x):
        return self.table[x]  # the input as an index


class FloorDivision(nn.Module):
    def forward(self, x):
        return torch.div(x, 2.0, rounding_mode="floor")


class SquareByKeyword(nn.Module):
    def forward(self, x):
        return torch.mul(x, other=x)


class ReLUInPlaceThenRead(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        y = self.a(x)
        torch.relu_(y)  # y changed in place: b reads the rectified y
        return torch.relu(self.b(y))


class DictOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 3)

    def forward(self, x):
        return {"logits": self.b(torch.relu(self.a(x)))}


def test_operations_affine_only_in_some_arguments_are_not_taken_for_affine():
    for module in (Bilinear(), Lookup(), FloorDivision(), SquareByKeyword()):
        assert not is_affine(fx.symbolic_trace(module), "x"), type(module).__name__
    batch_statistics = nn.Sequential(nn.BatchNorm1d(4, track_running_stats=False)).eval()
    assert not is_affine(traced(batch_statistics), "input")  # normalised by the batch's statistics


def test_split_affine_declines_a_value_changed_in_place_and_keeps_a_dict_output():
    from explain.methods.affine import split_affine

    assert split_affine(fx.symbolic_trace(ReLUInPlaceThenRead().eval()), "x") is None
    model, x = DictOutput().eval(), torch.randn(2, 4)
    head, rest = split_affine(fx.symbolic_trace(model), "x")
    torch.testing.assert_close(rest(*head(x))["logits"], model(x)["logits"])


def test_layer_replay_keeps_a_bfloat16_model_s_dtype_given_a_float32_activation():
    from explain import AblationCAM

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3)).eval()
    x = torch.randn(2, 3, 8, 8)
    expected = AblationCAM(model, "3")(x).maps  # Ablation-CAM hands the replay a float32 copy
    low = AblationCAM(model.to(torch.bfloat16), "3")(x.to(torch.bfloat16)).maps
    torch.testing.assert_close(low.float(), expected, atol=0.1, rtol=0.1)
