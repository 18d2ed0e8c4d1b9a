"""LRP with zennit's composites: values worked out by hand on the tiny model of
test_relevance.py, parity with zennit's composites applied directly, conservation where their
rules conserve (no biases), and the model left as it was.

The tiny model (see test_relevance.py): x = [1, 0.5], bounds l = -1, h = 1,

    W1 = [[1, -1], [2, 1]]   b1 = [0.5, -1]  a1 = [1, 1.5]
    W2 = [[1, 1], [-1, 1]]   b2 = [0, -1]    a2 = [2.5, 0]
    W3 = [[1, 2], [0.5, -1]] b3 = [0.5, 0]   z3 = [3, 1.25], class 0 explained, R3 = 3.

zennit's rules keep the biases in their denominators: the head's epsilon rule passes
(z - b) / z of R3 down, R2 = [2.5, 0], and the biases of the other layers are where the
composites differ.
"""

import warnings

import pytest
import torch
import torchvision
from torch import nn

import explain
from conftest import ModelState, hook_count
from explain.methods.relevance import LRP
from test_relevance import HALF, X, tiny_model

ZENNIT = ["epsilon-gamma-box", "epsilon-plus-flat", "epsilon-alpha2-beta1", "excitation-backprop"]


def relevance(composite, model=None, images=X, targets=None):
    return LRP(model or tiny_model(), composite=composite, normalization=HALF)(images, targets).raw


def test_epsilon_gamma_box_by_hand():
    # Gamma, unit 0 (b2 = 0): 1.25 / 3.125 and 1.875 / 3.125 of 2.5: R1 = [1, 1.5]. z-box: the
    # bias enters the three terms x w + b, l w+ + b+, h w- + b- and cancels, so each unit's
    # share is c / sum(c), c = x w - l w+ - h w-: [2, 0.5] / 2.5 of 1 and [4, 1.5] / 5.5 of 1.5.
    expected = [2 / 2.5 + 1.5 * 4 / 5.5, 0.5 / 2.5 + 1.5 * 1.5 / 5.5]
    assert relevance("epsilon-gamma-box").flatten().tolist() == pytest.approx(expected, rel=1e-5)
    assert sum(expected) == pytest.approx(3 - 0.5)  # the head's bias absorbed


def test_epsilon_plus_flat_by_hand():
    # z+ on the second convolution (b2 = 0 for the only unit with relevance) keeps 2.5; the
    # flat first layer shares each unit's relevance equally between the two pixels.
    assert relevance("epsilon-plus-flat").flatten().tolist() == pytest.approx([1.25, 1.25], rel=1e-5)


def test_excitation_backprop_composite_by_hand():
    # z+ everywhere, the positive bias in the denominator: the head passes 2.5 / 3 of R3
    # (b3+ = 0.5), the second convolution [1, 1.5] / 2.5 of 2.5, and the first keeps
    # [1, 0] / 1.5 of unit 0's 1 (b1+ = 0.5 absorbs a third) and [2, 0.5] / 2.5 of unit 1's 1.5.
    expected = [1 / 1.5 + 1.5 * 2 / 2.5, 1.5 * 0.5 / 2.5]
    assert relevance("excitation-backprop").flatten().tolist() == pytest.approx(expected, rel=1e-5)


def test_alpha_beta_by_hand():
    # alpha 2, beta 1, each part normalised by its own sum (biases included in it):
    # conv2 unit 0 has no negative part: 2 * [1, 1.5] / 2.5 of 2.5 = R1 = [2, 3]. conv1
    # unit 0: positive part x+ w+ = [1, 0] with b+ = 0.5, negative [0, -0.5]: 2 * [1, 0] / 1.5 * 2
    # - [0, -0.5] / -0.5 * 2; unit 1: positive [2, 0.5] (b+ = 0), negative part its bias alone:
    # 2 * [2, 0.5] / 2.5 * 3. Relevance is not conserved: 20 / 3 for a score of 3.
    expected = [2 * 1 / 1.5 * 2 + 2 * 2 / 2.5 * 3, -2 + 2 * 0.5 / 2.5 * 3]
    assert relevance("epsilon-alpha2-beta1").flatten().tolist() == pytest.approx(expected, rel=1e-5)


def small_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 5),
    ).eval()


@pytest.mark.parametrize("name", ZENNIT)
def test_matches_zennits_composite_applied_directly(name):
    from zennit import composites

    model, images = small_cnn(), torch.randn(2, 3, 16, 16)
    ours = LRP(model, composite=name)(images, [1, 3])
    low, high = LRP(model).bounds(images)
    made = {
        "epsilon-gamma-box": lambda: composites.EpsilonGammaBox(low.expand_as(images), high.expand_as(images)),
        "epsilon-plus-flat": composites.EpsilonPlusFlat,
        "epsilon-alpha2-beta1": composites.EpsilonAlpha2Beta1,
        "excitation-backprop": composites.ExcitationBackprop,
    }[name]()
    inputs = images.clone().requires_grad_()
    with made.context(model) as modified:
        output = modified(inputs)
        (expected,) = torch.autograd.grad(output, inputs, torch.eye(5)[[1, 3]] * output)
    torch.testing.assert_close(ours.raw, expected, rtol=1e-5, atol=1e-7)


def without_biases(arch: str) -> nn.Module:
    """Random weights, every bias zero and batch norms that shift nothing: merged, they
    leave no bias either, so every rule's denominator is its layer's output."""
    torch.manual_seed(0)
    model = torchvision.models.get_model(arch, weights=None, num_classes=10).eval()
    with torch.no_grad():
        for module in model.modules():
            if getattr(module, "bias", None) is not None:
                module.bias.zero_()
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.zero_()
                module.running_var.uniform_(0.5, 2.0)
                module.weight.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("arch", ["resnet18", "vgg11"])
@pytest.mark.parametrize("name", ZENNIT)
def test_conserved_without_biases(arch, name):
    """Without biases every composite but alpha-beta conserves by definition (up to its
    stabilisers), and alpha-beta where each unit has positive and negative contributions,
    which a random network's wide layers all have: the pixels' relevance sums to the score."""
    model, images = without_biases(arch), torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        scores = model(images).max(dim=1).values
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="LRP")
        raw = LRP(model, composite=name)(images).raw
    torch.testing.assert_close(raw.flatten(1).sum(1), scores, rtol=1e-4, atol=0)


def test_biases_absorb_relevance_in_zennits_composites_without_a_warning():
    """With batch-norm statistics merged into biases, zennit's epsilon / gamma / z-box keeps
    a part of the score in them (the default composite shares them and conserves); that is
    its definition, so LRP does not warn as it does for relevance lost where no rule applies."""
    from test_relevance import with_statistics

    model, images = with_statistics(), torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        scores = model(images).max(dim=1).values
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="LRP")
        absorbed = LRP(model, composite="epsilon-gamma-box")(images).raw.flatten(1).sum(1)
        conserved = LRP(model)(images).raw.flatten(1).sum(1)
    assert ((absorbed - scores).abs() > 0.05 * scores.abs()).all()
    torch.testing.assert_close(conserved, scores, rtol=1e-4, atol=0)


@pytest.mark.parametrize("name", ZENNIT)
def test_model_restored(name):
    from test_relevance import with_statistics

    model = with_statistics()
    model.layer2.train()
    model.fc.weight.grad = torch.ones_like(model.fc.weight)
    state = ModelState(model)
    with torch.no_grad():
        LRP(model, composite=name)(torch.randn(1, 3, 32, 32), topk=2)
    state.assert_unchanged()
    assert hook_count(model) == 0
    assert not any("forward" in vars(m) or hasattr(m, "canonizer_sum") for m in model.modules())


def test_default_is_the_conserving_composite():
    model = tiny_model()
    assert torch.equal(relevance("epsilon-gamma-box-shared", model), LRP(model, normalization=HALF)(X).raw)
    assert LRP(model).composite_name == "epsilon-gamma-box-shared"


@pytest.mark.parametrize("options, message", [
    ({"composite": "epsilon-plus"}, "unknown composite 'epsilon-plus'; use one of epsilon-gamma-box-shared"),
    ({"composite": "epsilon-plus-flat", "first_rule": "flat"}, "first_rule is a choice of"),
])
def test_options_checked(options, message):
    with pytest.raises(ValueError, match=message):
        LRP(tiny_model(), **options)


def test_by_name():
    explainer = explain.explainer("lrp", tiny_model(), composite="excitation-backprop")
    assert isinstance(explainer, LRP) and explainer.composite_name == "excitation-backprop"
