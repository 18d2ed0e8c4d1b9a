"""NoiseTunnel (explain.methods.noise_tunnel): SmoothGrad, SmoothGrad-squared and VarGrad of
any method, against a plain loop of the wrapped method over the same noise draws.

- The reference: each image's noise drawn here as captum's NoiseTunnel draws it (one seeded
  normal draw), the method called on one noisy copy at a time with the image's targets, and
  the mean, mean of squares and variance of the raw maps taken in a loop.
- The registered smoothgrad and vargrad (captum's NoiseTunnel over Saliency) equal the tunnel
  over Saliency.
- Names (``smoothgrad:ig``), the command line, targets, seeds, progress, what cannot be
  wrapped, and the model left as it was.
"""

import json

import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

import explain
from conftest import ModelState, listening
from explain.passes import pass_settings

IDS = torch.tensor([1, 3])


def tiny_cnn(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 6, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 5),
    ).eval()
    with torch.no_grad():
        model[6].weight.mul_(30.0)
    return model


def images(n=2, size=16, seed=1):
    coarse = torch.randn(n, 3, 4, 4, generator=torch.Generator().manual_seed(seed))
    return F.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)


def noisy_copies(image, n_samples, noise_level, seed):
    """The noise as captum's NoiseTunnel draws it: one normal draw of sigma = level * range."""
    sigma = noise_level * float(image.max() - image.min())
    torch.manual_seed(seed)
    return image[None] + torch.normal(0.0, torch.full((n_samples, *image.shape), sigma))


def loop_reference(method, x, ids, kind, n_samples=4, noise_level=0.2, seed=5):
    """The tunnel by hand: the method on one noisy copy at a time, aggregated in a loop."""
    results = []
    for i in range(len(x)):
        maps = [method(copy[None], [int(ids[i])]).raw[0] for copy in noisy_copies(x[i], n_samples, noise_level, seed)]
        mean = sum(maps) / n_samples
        squares = sum(m * m for m in maps) / n_samples
        results.append({"smoothgrad": mean, "smoothgrad-sq": squares, "vargrad": squares - mean * mean}[kind])
    return torch.stack(results)


WRAPPED = {
    "ig": lambda model: explain.IntegratedGradients(model, n_steps=5),
    "inputxgrad": explain.InputXGradient,
    "guidedbp": explain.GuidedBackprop,
    "deeplift": explain.DeepLift,
    "gradcam": lambda model: explain.GradCAM(model, "3"),
    "layer-gradxact": lambda model: explain.LayerGradientXActivation(model, "2"),
    "lrp": explain.LRP,
}


@pytest.mark.parametrize("kind", ["smoothgrad", "smoothgrad-sq", "vargrad"])
@pytest.mark.parametrize("name", list(WRAPPED))
def test_equals_a_plain_loop_of_the_wrapped_method_over_the_same_noise(name, kind):
    model, x = tiny_cnn(), images()
    method = WRAPPED[name](model)
    res = explain.NoiseTunnel(method, kind=kind, n_samples=4, noise_level=0.2, seed=5)(x, IDS)
    expected = loop_reference(method, x, IDS, kind)
    torch.testing.assert_close(res.raw, expected.clamp_min(0) if kind == "vargrad" else expected,
                               rtol=1e-4, atol=1e-7)
    assert res.method == f"{kind}:{name}" and res.targets.tolist() == [1, 3] and res.layers == method(x).layers
    assert expected.abs().max() > 0 and res.maps.shape == (2, 16, 16) and res.maps.max() == 1
    if kind != "smoothgrad":  # squares and variances carry no sign
        assert res.raw.min() >= 0 and not res.signed


@pytest.mark.parametrize("name, cls", [("smoothgrad", explain.SmoothGrad), ("vargrad", explain.VarGrad)])
def test_the_registered_smoothgrad_and_vargrad_are_the_tunnel_over_saliency(name, cls):
    model, x = tiny_cnn(), images()
    registered = cls(model, n_samples=6, noise_level=0.2, seed=7, internal_batch_size=4)(x, IDS)
    tunnel = explain.NoiseTunnel(explain.Saliency(model), kind=name, n_samples=6, noise_level=0.2, seed=7)(x, IDS)
    by_name = explain.explainer(f"{name}:saliency", model, n_samples=6, noise_level=0.2, seed=7)(x, IDS)
    torch.testing.assert_close(tunnel.raw, registered.raw, rtol=1e-5, atol=1e-9)
    torch.testing.assert_close(by_name.raw, tunnel.raw)
    torch.testing.assert_close(tunnel.maps, registered.maps, rtol=1e-4, atol=1e-6)


def test_names_route_the_options_and_take_any_kind_spelling():
    model = tiny_cnn()
    tunnel = explain.explainer("SmoothGrad_SQ:IG", model, n_steps=7, n_samples=3, noise_level=0.1, seed=4,
                               baseline="blur", reduction="sum")
    assert type(tunnel).__name__ == "SmoothGradSquaredOfIntegratedGradients" and tunnel.name == "smoothgrad-sq:ig"
    assert (tunnel.n_samples, tunnel.noise_level, tunnel.seed) == (3, 0.1, 4)
    assert (tunnel.method.n_steps, tunnel.method.seed, tunnel.method.baseline, tunnel.method.reduction) == (
        7, 4, "blur", "sum")
    cam = explain.explainer("vargrad:gradcam", model, target_layer="1", seed=3)
    assert cam.needs_layer and cam.method.layer_names(images(1)) == ("1",) and cam.seed == 3
    assert explain.method_class("vargrad:gradcam") is type(cam)  # one class per name
    assert "smoothgrad:ig" not in explain.method_names()  # made on demand, not listed
    with pytest.raises(ValueError, match="unknown noise tunnel 'blur'"):
        explain.explainer("blur:ig", model)
    with pytest.raises(ValueError, match="unknown method 'igg'"):
        explain.explainer("smoothgrad:igg", model)
    with pytest.raises(TypeError, match="unexpected keyword argument 'window'"):
        explain.explainer("smoothgrad:ig", model, window=3)


def test_what_cannot_be_wrapped_says_why():
    model = tiny_cnn()
    with pytest.raises(ValueError, match="aug_smooth"):
        explain.NoiseTunnel(explain.GradCAM(model, "3", aug_smooth=True))
    with pytest.raises(explain.NotApplicable, match="no training mode"):
        explain.explainer("smoothgrad:gradcam", model, train_mode=True)
    with pytest.raises(TypeError, match="wraps an explainer"):
        explain.NoiseTunnel(model)
    with pytest.raises(ValueError, match="unknown noise tunnel"):
        explain.NoiseTunnel(explain.Saliency(model), kind="median")
    with pytest.raises(ValueError, match="n_samples must be a positive int"):
        explain.NoiseTunnel(explain.Saliency(model), n_samples=0)
    neuron = explain.NoiseTunnel(explain.LayerGradientXActivation(model, "2", neuron=1), n_samples=2)
    with pytest.raises(ValueError, match="pass no targets"):
        neuron(images(1), 2)
    res = neuron(images(1))
    assert res.targets.tolist() == [-1] and res.raw.shape == (1, 3, 16, 16)
    with pytest.raises(explain.NotApplicable, match="superpixels"):
        explain.explainer("smoothgrad:lime", nn.Sequential(nn.Conv1d(2, 3, 3), nn.Flatten()))(torch.rand(1, 2, 16))


def test_topk_and_callable_targets():
    model, x = tiny_cnn(), images()
    tunnel = explain.NoiseTunnel(explain.InputXGradient(model), n_samples=3, seed=1)
    both = tunnel(x, topk=2)
    assert both.raw.shape == (2, 2, 3, 16, 16) and both.maps.shape == (2, 2, 16, 16)
    for k in range(2):
        torch.testing.assert_close(both.raw[:, k], tunnel(x, both.targets[:, k]).raw)

    class PerImage:
        """Class 1 for image 0, class 3 for image 1: a target that chooses by row."""

        def __call__(self, output):
            return self.score_rows(output, torch.arange(len(output)))

        def score_rows(self, output, rows):
            return output[torch.arange(len(output)), IDS[rows]]

    torch.testing.assert_close(tunnel(x, PerImage()).raw, tunnel(x, IDS).raw)
    assert tunnel(x, PerImage()).targets.tolist() == [-1, -1]


def test_seeded_per_image_and_counted_as_planned():
    model, x = tiny_cnn(), images(3)
    tunnel = explain.explainer("smoothgrad:ig", model, n_samples=3, n_steps=4, seed=2)
    counted = []
    with pass_settings(listener=listening(lambda name, done, total: counted.append((name, done, total)))):
        whole = tunnel(x)
    assert counted[-1] == ("smoothgrad:ig", tunnel.planned_passes(x), tunnel.planned_passes(x))
    assert tunnel.planned_passes(x) == 3 * (1 + 3 * (1 + 4))
    alone = tunnel(x[1:2], whole.targets[1:2])
    torch.testing.assert_close(alone.raw, whole.raw[1:2])
    state = torch.random.get_rng_state()
    tunnel(x[:1])
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's stream untouched


@pytest.mark.parametrize("mode", ["plain", "no_grad", "inference_mode"])
@pytest.mark.parametrize("name", ["smoothgrad:deeplift", "vargrad:gradcam", "smoothgrad-sq:layer-ig"])
def test_the_model_is_left_as_it_was(name, mode):
    model = tiny_cnn().train()
    next(model.parameters()).requires_grad_(False)
    state = ModelState(model)
    tunnel = explain.explainer(name, model, n_samples=2, **({"n_steps": 3} if name.endswith("ig") else {}))
    context = {"plain": torch.enable_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}[mode]
    with context():
        res = tunnel(images(1))
    state.assert_unchanged()
    assert res.maps.max() == 1

    calls = []

    def failing(output):
        calls.append(1)
        if len(calls) == 3:  # after the pass for the targets, inside the noisy copies' calls
            raise RuntimeError("target failed")
        return output[:, 0]

    with pytest.raises(RuntimeError, match="target failed"):
        tunnel(images(1), failing)
    state.assert_unchanged()


def test_the_command_line_runs_a_tunnel_by_name(tmp_path):
    from explain.cli import main

    torch.save(tiny_cnn(), tmp_path / "tiny.pt")
    Image.fromarray((torch.rand(24, 24, 3) * 255).byte().numpy()).save(tmp_path / "photo.png")
    out = tmp_path / "out"
    code = main(["run", str(tmp_path / "photo.png"), "--model", str(tmp_path / "tiny.pt"), "--trust-model-file",
                 "--out", str(out), "--method", "smoothgrad:inputxgrad,vargrad:gradcam", "--layer", "3",
                 "--workers", "0", "-q"])
    assert code == 0
    rows = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert [(row["method"], row["layer"], row["status"]) for row in rows] == [
        ("smoothgrad:inputxgrad", "input", "ok"), ("vargrad:gradcam", "3", "ok")]
    assert all((out / row["output"]).is_file() and ":" not in row["output"] for row in rows)
    assert main(["run", str(tmp_path / "photo.png"), "--model", str(tmp_path / "tiny.pt"), "--trust-model-file",
                 "--out", str(out), "--method", "jitter:ig", "-q"]) == 2
