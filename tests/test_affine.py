"""Whether the layers after a target layer are affine in its output
(explain.methods.affine.is_affine, LayerReplay.affine): the structural test says yes only
for operations affine in the input, and no for anything else, never a guess."""

from __future__ import annotations

import torch
import torch.fx as fx
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
