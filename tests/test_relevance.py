"""LRP against values worked out by hand, its conservation on real architectures, and the
model left as it was.

The tiny model: a 1 x 1 convolution (the first layer: z-box rule), ReLU, a 1 x 1
convolution (gamma rule), ReLU, a linear layer (epsilon rule), on one 1 x 1 image with
two channels x = [1, 0.5], normalised with mean = std = 0.5, so the z-box bounds are
l = -1, h = 1. Every neuron has n = 2 inputs.

    W1 = [[1, -1], [2, 1]]   b1 = [0.5, -1]  z1 = [1, 1.5]      a1 = [1, 1.5]
    W2 = [[1, 1], [-1, 1]]   b2 = [0, -1]    z2 = [2.5, -0.5]   a2 = [2.5, 0]
    W3 = [[1, 2], [0.5, -1]] b3 = [0.5, 0]   z3 = [3, 1.25]     top class 0, R3 = 3
"""

import copy
import warnings

import pytest
import torch
import torchvision
from torch import nn

import explain
from conftest import BackwardFails, ModelState, hook_count
from explain.methods.relevance import LRP

# Epsilon (epsilon ~ 0), bias 0.5 shared by the two inputs: R2_i = (a2_i w_0i + 0.25) / 3 * 3.
R2 = [2.5 * 1 + 0.25, 0 * 2 + 0.25]
# Gamma 0.25. Unit 0 (z >= 0): w' = w + 0.25 w+ = [1.25, 1.25], b' = 0,
# z' = 1 * 1.25 + 1.5 * 1.25 = 3.125.
UNIT_0 = [1 * 1.25 / 3.125 * R2[0], 1.5 * 1.25 / 3.125 * R2[0]]
# Unit 1 (z < 0): w' = w + 0.25 w- = [-1.25, 1], b' = b + 0.25 b- = -1.25,
# z' = 1 * -1.25 + 1.5 * 1 - 1.25 = -1; each input also gets half the bias term, b' / 2.
UNIT_1 = [(1 * -1.25 - 1.25 / 2) / -1 * R2[1], (1.5 * 1 - 1.25 / 2) / -1 * R2[1]]
R1 = [UNIT_0[0] + UNIT_1[0], UNIT_0[1] + UNIT_1[1]]  # = [1.56875, 1.43125]
# z-box: unit 0, w = [1, -1]: x w - l w+ - h w- = [1 + 1, -0.5 + 1] = [2, 0.5], sum 2.5;
# unit 1, w = [2, 1]: [2 + 2, 0.5 + 1] = [4, 1.5], sum 5.5.
BY_HAND = [R1[0] * 2 / 2.5 + R1[1] * 4 / 5.5, R1[0] * 0.5 / 2.5 + R1[1] * 1.5 / 5.5]


def tiny_model() -> nn.Module:
    first, second, head = nn.Conv2d(2, 2, 1), nn.Conv2d(2, 2, 1), nn.Linear(2, 2)
    with torch.no_grad():
        first.weight.copy_(torch.tensor([[1.0, -1.0], [2.0, 1.0]])[:, :, None, None])
        first.bias.copy_(torch.tensor([0.5, -1.0]))
        second.weight.copy_(torch.tensor([[1.0, 1.0], [-1.0, 1.0]])[:, :, None, None])
        second.bias.copy_(torch.tensor([0.0, -1.0]))
        head.weight.copy_(torch.tensor([[1.0, 2.0], [0.5, -1.0]]))
        head.bias.copy_(torch.tensor([0.5, 0.0]))
    return nn.Sequential(first, nn.ReLU(), second, nn.ReLU(), nn.Flatten(), head).eval()


X = torch.tensor([1.0, 0.5]).reshape(1, 2, 1, 1)
HALF = ([0.5, 0.5], [0.5, 0.5])


def relevance(model, images, targets=None, **options):
    return LRP(model, normalization=options.pop("normalization", HALF), **options)(images, targets).raw


def test_rules_match_hand_computation():
    assert relevance(tiny_model(), X).flatten().tolist() == pytest.approx(BY_HAND, rel=1e-5)
    assert sum(BY_HAND) == pytest.approx(3.0)


def test_flat_first_rule_shares_equally():
    # R1 sums to 3 and each first-layer neuron sees both pixels: 1.5 each.
    assert relevance(tiny_model(), X, first_rule="flat").flatten().tolist() == pytest.approx([1.5, 1.5], rel=1e-5)


def test_epsilon_absorbs_its_share():
    # epsilon = 1: the head's neuron passes z / (z + 1) = 3 / 4 of R3 = 3 down; the rest conserve.
    assert relevance(tiny_model(), X, epsilon=1.0).sum().item() == pytest.approx(2.25, rel=1e-5)


def test_callable_target_starts_from_z_times_gradient():
    # f = z_0 + z_1 is linear: R = z * df/dz = [3, 1.25] at the output, summing to f = 4.25.
    raw = relevance(tiny_model(), X, lambda out: out[:, 0] + out[:, 1])
    assert raw.sum().item() == pytest.approx(4.25, rel=1e-5)


def with_statistics(arch: str = "resnet18") -> nn.Module:
    """Random weights and random batch-norm statistics, so merging them matters."""
    torch.manual_seed(0)
    model = torchvision.models.get_model(arch, weights=None).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.2, 0.2)
    return model


def assert_conserved(model, images):
    with torch.no_grad():
        logits = model(images).max(dim=1).values
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="LRP")
        raw = LRP(model)(images).raw
    assert torch.allclose(raw.flatten(1).sum(dim=1), logits, rtol=1e-4, atol=0)


def test_conserved_on_resnet18():
    assert_conserved(with_statistics(), torch.randn(2, 3, 64, 64))


@pytest.mark.parametrize("arch", ["mobilenet_v2", "regnet_x_400mf"])
def test_conserved_on_torchvision_blocks_that_add_in_forward(arch):
    """MobileNetV2's inverted residuals and RegNet's bottlenecks add their shortcut in
    forward; the canonizer turns the addition into a module with a rule."""
    assert_conserved(with_statistics(arch), torch.randn(2, 3, 64, 64))


def test_conserved_on_the_bundled_model(bundled, photos):
    assert_conserved(bundled[0], photos[1][:1])


def test_warns_where_relevance_is_copied():
    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.head = nn.Conv2d(3, 3, 3, padding=1), nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 4))

        def forward(self, x):
            return self.head(torch.relu(self.conv(x)) + x)

    with pytest.warns(UserWarning, match="outside any module .found: 1;"):
        LRP(Residual().eval())(torch.rand(1, 3, 8, 8))


def test_warns_where_relevance_is_lost():
    class FunctionalReLU(nn.Module):
        """The head's bias share reaches inactive units, which F.relu's gradient zeroes."""

        def __init__(self):
            super().__init__()
            self.conv, self.head = nn.Conv2d(3, 4, 3, padding=1), nn.Linear(4 * 8 * 8, 2)
            with torch.no_grad():
                self.head.bias.fill_(10.0)

        def forward(self, x):
            return self.head(torch.relu(self.conv(x)).flatten(1))

    with pytest.warns(UserWarning, match="lost or copied where no rule applies"):
        LRP(FunctionalReLU().eval())(torch.randn(1, 3, 8, 8))


def snapshot(model):
    return [(p, p.data_ptr()) for p in model.parameters()] + [(b, b.data_ptr()) for b in model.buffers()]


def assert_same_storage(model, before):
    assert [(t, t.data_ptr()) for t, _ in before] == before, "a parameter or buffer was replaced"


@pytest.mark.parametrize("fail", [False, True], ids=["success", "exception"])
def test_model_restored(bundled, photos, fail):
    model = copy.deepcopy(bundled[0])  # a failure here must not spoil the session's model
    model.blocks[1].train()
    model.conv_stem.weight.requires_grad_(False)
    model.classifier.weight.grad = torch.ones_like(model.classifier.weight)
    state, storage, calls = ModelState(model), snapshot(model), []

    def target(output):  # called to resolve the targets, then under LRP's hooks and merges
        calls.append((hook_count(model), model.bn1.running_mean.abs().max().item()))
        if fail and hook_count(model):
            raise KeyError("stop")
        return output[:, 0]

    if fail:
        with pytest.raises(KeyError, match="stop"):
            LRP(model)(photos[1][:1], target)
    else:
        LRP(model)(photos[1][:1], target)
    assert calls[-1][0] > 0 and calls[-1][1] == 0, "the last call ran with hooks and merged batch norms"
    state.assert_unchanged()
    assert_same_storage(model, storage)
    assert [m.training for m in model.blocks[1].modules()] == [True] * len(list(model.blocks[1].modules()))
    assert hook_count(model) == 0
    assert all(not m._forward_hooks and not m._backward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert not any(hasattr(m, "explain_residual_sum") or "forward" in vars(m) for m in model.modules())


def test_resnet_restored_after_exception():
    model = with_statistics()
    state, storage = ModelState(model), snapshot(model)

    def target(output):
        if hook_count(model):
            raise RuntimeError("stop")
        return output[:, 0]

    with pytest.raises(RuntimeError, match="stop"):
        LRP(model)(torch.randn(1, 3, 32, 32), target)
    state.assert_unchanged()
    assert_same_storage(model, storage)
    assert not any("forward" in vars(m) or hasattr(m, "canonizer_sum") for m in model.modules())



class Failing(nn.Module):
    """The model, failing from its ``fail_at``-th forward pass on (1: resolving the
    targets, 2: finding the batch norms to merge, 3: under LRP's hooks), or in the backward
    pass under LRP's hooks (``fail_at=None``)."""

    def __init__(self, model, fail_at):
        super().__init__()
        self.model, self.fail_at, self.calls = model, fail_at, 0

    def forward(self, x):
        self.calls += 1
        if self.fail_at is not None and self.calls >= self.fail_at:
            raise RuntimeError("forward failed")
        out = self.model(x)
        return out if self.fail_at is not None else BackwardFails.apply(out)


@pytest.mark.parametrize("fail_at", [2, 3, None], ids=["tracing", "under-hooks", "backward"])
def test_resnet_restored_after_a_failing_pass(fail_at):
    model = Failing(with_statistics(), fail_at)
    state, storage, attributes = ModelState(model), snapshot(model), [set(vars(m)) for m in model.modules()]
    with pytest.raises(RuntimeError, match="forward failed|backward failed"):
        LRP(model)(torch.randn(1, 3, 32, 32))
    state.assert_unchanged()
    assert_same_storage(model, storage)
    assert [set(vars(m)) for m in model.modules()] == attributes


def test_topk_shapes():
    result = LRP(with_statistics())(torch.randn(2, 3, 32, 32), topk=2)
    assert result.maps.shape == (2, 2, 32, 32)
    assert result.raw.shape == (2, 2, 3, 32, 32)
    assert result.targets.shape == (2, 2)


def test_constant_input_gives_finite_maps():
    maps = LRP(with_statistics())(torch.zeros(1, 3, 32, 32)).maps
    assert torch.isfinite(maps).all()
    assert maps.min() >= 0 and maps.max() <= 1


def test_registered():
    assert isinstance(explain.explainer("LRP", tiny_model()), LRP)


@pytest.mark.parametrize("options, message", [
    ({"epsilon": 0}, "epsilon"),
    ({"epsilon": True}, "epsilon"),
    ({"gamma": -1}, "gamma"),
    ({"first_rule": "zplus"}, "first_rule"),
    ({"normalization": ([0.5, 0.5], [0.5])}, "normalization"),
    ({"normalization": ([0.5], [0.0])}, "normalization"),
    ({"normalization": "imagenet"}, "normalization"),
])
def test_options_checked(options, message):
    with pytest.raises(ValueError, match=message):
        LRP(tiny_model(), **options)


def test_restored_modules_undoes_a_half_done_canonization():
    from explain.methods.relevance import restored_modules

    model = nn.Sequential(nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4))
    state, storage = ModelState(model), snapshot(model)
    with pytest.raises(RuntimeError, match="half-way"), restored_modules(model):
        conv, norm = model
        conv.weight.data = conv.weight.data * 2
        conv.bias = nn.Parameter(torch.ones(4))
        norm.running_var.data = torch.zeros(4)
        conv.register_forward_hook(lambda *args: None)
        conv.forward = lambda x: x
        norm.extra = nn.Identity()
        norm.momentum = 0.5  # a value the model may change itself: kept
        raise RuntimeError("half-way")
    state.assert_unchanged()
    assert_same_storage(model, storage)
    assert model[0].bias is None and "forward" not in vars(model[0]) and not hasattr(model[1], "extra")
    assert model[1].momentum == 0.5


def test_canonizers_undo_a_half_done_registration(bundled):
    from explain.methods.relevance import ResidualSumCanonizer, TracedMergeBatchNorm

    model = copy.deepcopy(bundled[0])
    blocks = [m for m in model.modules() if vars(m).get("has_skip") is True]
    state, storage = ModelState(model), snapshot(model)
    broken = nn.BatchNorm2d(4, affine=False)  # no weight to merge: the last registration fails
    with pytest.raises(AttributeError):
        TracedMergeBatchNorm([(model.conv_stem, model.bn1), (model.conv_head, broken)]).apply(model)

    class FailsOnTheThird(ResidualSumCanonizer):
        registered = 0

        def register(self, block, flag):
            super().register(block, flag)
            FailsOnTheThird.registered += 1
            if FailsOnTheThird.registered == 3:
                raise RuntimeError("third")

    with pytest.raises(RuntimeError, match="third"):
        FailsOnTheThird().apply(model)
    state.assert_unchanged()
    assert_same_storage(model, storage)
    assert all(vars(block)["has_skip"] is True and "forward" not in vars(block) for block in blocks)


def test_refuses_a_merge_that_changes_the_model():
    class SharedOutput(nn.Module):
        """The convolution's output feeds its batch norm and, unnormalised, the head."""

        def __init__(self):
            super().__init__()
            self.conv, self.norm, self.head = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.Linear(8 * 8 * 8, 2)
            with torch.no_grad():
                self.norm.running_var.fill_(4.0)

        def forward(self, x):
            y = self.conv(x)
            return self.head(torch.cat([self.norm(y), y], dim=1).flatten(1))

    model = SharedOutput().eval()
    state = ModelState(model)
    with pytest.raises(RuntimeError, match="canonical form"):
        LRP(model)(torch.randn(1, 3, 8, 8))
    state.assert_unchanged()


def test_lrp_reads_the_logits_of_a_model_that_returns_a_dict():
    class DictOutput(nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, x):
            return {"logits": self.model(x), "features": x.mean()}

    model = torchvision.models.resnet18(num_classes=3).eval()
    images = torch.rand(2, 3, 32, 32)
    expected = explain.LRP(model)(images)
    wrapped = explain.LRP(DictOutput(model))(images)
    assert torch.equal(wrapped.targets, expected.targets)
    assert torch.allclose(wrapped.maps, expected.maps, atol=1e-6)


def test_lrp_reads_a_named_tuple_output_by_class_id_and_by_a_callable():
    # Both were refused: class ids ("not logits; pass a callable") and callables ("needs one tensor").
    from collections import namedtuple

    Named = namedtuple("Named", "logits features")
    Unnamed = namedtuple("Unnamed", "scores features")

    class Tupled(nn.Module):
        def __init__(self, model, kind):
            super().__init__()
            self.model, self.kind = model, kind

        def forward(self, x):
            return self.kind(self.model(x), x.mean(dim=(2, 3)))

    model = torchvision.models.resnet18(num_classes=3).eval()
    images = torch.rand(2, 3, 32, 32)
    expected = explain.LRP(model)(images, [1, 2])
    by_id = explain.LRP(Tupled(model, Named))(images, [1, 2])
    assert torch.equal(by_id.targets, expected.targets) and torch.allclose(by_id.maps, expected.maps, atol=1e-6)
    # A callable's score z * df/dz at the output: for f = z_1, the explained logit in its place.
    one = explain.LRP(model)(images, 1)
    for kind, score in ((Named, lambda out: out.logits[:, 1]), (Unnamed, lambda out: out.scores[:, 1])):
        found = explain.LRP(Tupled(model, kind))(images, score)
        assert torch.allclose(found.raw, one.raw, atol=1e-6), kind.__name__


@pytest.mark.parametrize("method", ["lrp", "ablationcam"])
def test_nan_logits_are_named_as_such(method):
    # Both raised torch's "atol must be greater than or equal to zero, but got -nan".
    class NaNLogits(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.head = nn.Conv2d(3, 4, 3, padding=1), nn.Linear(4, 3)

        def forward(self, x):
            return self.head(torch.relu(self.conv(x)).mean(dim=(2, 3))) * float("nan")

    model = NaNLogits().eval()
    state = ModelState(model)
    with pytest.raises(ValueError, match="the model's output is NaN or infinite for every image, so there is no "
                                         "score to explain; check the model's weights"):
        explain.explainer(method, model)(torch.rand(2, 3, 8, 8))
    state.assert_unchanged()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_precision_model_lrp_cannot_check_is_told_to_use_float32(dtype):
    # The canonical form's merged batch norms round another way in 16 bits: the message blamed
    # the model's structure ("LRP cannot explain this model"), not the precision.
    layers, channels = [], 3
    for _ in range(6):
        layers += [nn.Conv2d(channels, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU()]
        channels = 16
    model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5)).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_var.uniform_(0.01, 0.1)
                module.running_mean.uniform_(-0.5, 0.5)
                module.weight.uniform_(0.5, 2.0)
    images = torch.rand(2, 3, 16, 16)
    assert LRP(model)(images).maps.shape == (2, 16, 16)  # in float32, LRP explains it
    model = model.to(dtype)
    state = ModelState(model)
    name = str(dtype).removeprefix("torch.")
    with pytest.raises(ValueError, match=rf"^LRP on a {name} model: its canonical form \(batch norms merged into "
                                         r"their layers\) rounds the output differently, by up to .*; explain the "
                                         r"model in float32: model.float\(\) and float32 images$"):
        LRP(model)(images.to(dtype))
    state.assert_unchanged()
