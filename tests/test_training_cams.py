"""CAMs inside a training loop: train_mode leaves the model in its mode, create_graph keeps the
map differentiable with respect to the parameters; nothing else about the hygiene changes."""

import copy
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import explain
from conftest import ModelState, hook_count

TRAINS = [name for name in explain.method_names() if explain.method_class(name).trains]
GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide" / "training.md"


def tiny(dtype=torch.float32, norm=False):
    torch.manual_seed(0)
    layers = [nn.Conv2d(1, 4, 3, padding=1)]
    layers += [nn.BatchNorm2d(4)] if norm else []
    layers += [nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2)]
    return nn.Sequential(*layers).to(dtype)


def plain_gradcam(model, images, target, layer=1):
    """Grad-CAM written out with autograd: A the output of model[:layer + 1], G = dS/dA built
    with create_graph, L = ReLU(sum_k mean(G_k) A_k)."""
    activations = model[: layer + 1](images)
    score = model[layer + 1 :](activations)[:, target].sum()
    (gradients,) = torch.autograd.grad(score, activations, create_graph=True)
    return F.relu((gradients.mean(dim=(2, 3), keepdim=True) * activations).sum(dim=1))


def test_the_map_is_differentiable_and_its_gradients_match_a_plain_reference():
    model = tiny(torch.float64).train()
    images = torch.rand(2, 1, 6, 6, dtype=torch.float64)
    cam = explain.GradCAM(model, "1", train_mode=True, create_graph=True)
    res = cam(images, 1)
    assert res.raw.requires_grad and res.maps.requires_grad and res.logits.requires_grad
    assert all(p.grad is None for p in model.parameters())  # the explainer writes no .grad
    expected = plain_gradcam(model, images, 1)  # in float64; the library's maps are float32
    torch.testing.assert_close(res.raw.double(), expected)
    parameters = list(model.parameters())[:-1]  # the head's bias changes no gradient, nor the map
    ours = torch.autograd.grad(res.raw.pow(2).sum(), parameters)
    reference = torch.autograd.grad(expected.pow(2).sum(), parameters)
    assert all(g.abs().sum() > 0 for g in ours)
    for got, want in zip(ours, reference, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    # A central finite difference on one weight of the convolution.
    weight, eps = model[0].weight, 1e-3
    with torch.no_grad():
        weight[0, 0, 1, 1] += eps
        up = cam(images, 1).raw.pow(2).sum()
        weight[0, 0, 1, 1] -= 2 * eps
        down = cam(images, 1).raw.pow(2).sum()
        weight[0, 0, 1, 1] += eps
    assert ours[0][0, 0, 1, 1].item() == pytest.approx(((up - down) / (2 * eps)).item(), rel=1e-3)


@pytest.mark.parametrize("method", TRAINS)
def test_every_training_cam_is_differentiable_and_leaves_the_model_in_train_mode(method):
    model = tiny(norm=True).train()
    before = copy.deepcopy(model)
    state = ModelState(model)
    images = torch.rand(4, 1, 8, 8)
    res = explain.explainer(method, model, target_layer="2", train_mode=True, create_graph=True)(images)
    (grad,) = torch.autograd.grad(res.maps.sum(), [model[0].weight])
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0, method
    assert model.training and all(m.training for m in model.modules())
    assert hook_count(model) == 0 and all(p.requires_grad and p.grad is None for p in model.parameters())
    # Batch norm ran as in training: one forward pass moved its running statistics as a
    # training step's forward pass does.
    before(images)
    torch.testing.assert_close(model[1].running_mean, before[1].running_mean)
    torch.testing.assert_close(model[1].running_var, before[1].running_var)
    assert not torch.equal(model[1].running_mean, state.buffers[1])


def test_train_mode_without_a_graph_freezes_nothing_it_does_not_restore():
    model = tiny(norm=True).train()
    model[0].weight.requires_grad_(False)  # a frozen layer stays frozen, the others trainable
    flags = [p.requires_grad for p in model.parameters()]
    res = explain.GradCAM(model, "2", train_mode=True)(torch.rand(2, 1, 8, 8))
    assert not res.maps.requires_grad and model.training
    assert [p.requires_grad for p in model.parameters()] == flags
    assert hook_count(model) == 0 and all(p.grad is None for p in model.parameters())


def test_methods_without_a_training_mode_say_so():
    model = tiny()
    for method in ("scorecam", "eigencam", "ablationcam", "shapleycam", "eigengradcam", "ig", "fullgrad"):
        with pytest.raises(explain.NotApplicable, match="has no training mode.*use gradcam"):
            explain.explainer(method, model, create_graph=True)
    with pytest.raises(explain.NotApplicable, match=r"eigencam has no training mode \(train_mode=True\)"):
        explain.EigenCAM(model, train_mode=True)


def test_a_few_steps_of_cam_regularisation_train():
    # Attention-guided training in miniature: cross-entropy plus the CAM's mass outside where
    # the evidence should be (the left half). The penalty falls as the model learns it.
    model = tiny(norm=True).train()
    torch.manual_seed(1)
    images, labels = torch.rand(8, 1, 8, 8), torch.randint(0, 2, (8,))
    outside = torch.zeros(8, 8)
    outside[:, 4:] = 1.0
    cam = explain.GradCAM(model, "2", train_mode=True, create_graph=True)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.5)
    penalties = []
    for _ in range(8):
        res = cam(images, labels)
        penalty = (res.maps * outside).mean()
        loss = F.cross_entropy(res.logits, labels) + 10 * penalty
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        penalties.append(penalty.item())
    assert penalties[-1] < 0.5 * penalties[0], penalties
    assert model.training and hook_count(model) == 0
    assert all(p.requires_grad for p in model.parameters())


def test_the_guide_example_runs():
    code = re.search(r"```python\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.S)[1]
    namespace: dict = {}
    exec(compile(code, str(GUIDE), "exec"), namespace)
    assert namespace["model"].training and hook_count(namespace["model"]) == 0
