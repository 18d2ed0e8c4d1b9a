"""The public surface: names, the factory, and errors on bad input that say how to fix it."""

import functools
import inspect
import os
import string
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from torch import nn

import explain
from explain.methods import TransformerAttention
from conftest import CHEAP, hook_count


def by_class(keep) -> list[str]:
    """The registered methods whose class ``keep`` accepts, in listing order."""
    return [name for name in explain.method_names() if keep(explain.method_class(name))]


CAM_FAMILIES = ("gradient CAM", "gradient-free CAM", "perturbation CAM")
METHODS = by_class(lambda cls: cls.family in CAM_FAMILIES)  # the CAMs, FullGrad among them
GRADIENT_CAMS = by_class(lambda cls: cls.family == "gradient CAM" and cls.needs_layer)
ATTRIBUTIONS = by_class(lambda cls: cls.family in ("gradient attribution", "perturbation attribution")
                        and getattr(cls, "task", "classify") == "classify")
LAYER_ATTRIBUTIONS = by_class(lambda cls: cls.family == "layer attribution")
TRANSFORMER = by_class(lambda cls: cls.family == "transformer attention")
RELEVANCE = by_class(lambda cls: cls.family == "relevance")


def test_methods_and_factory():
    assert sorted(explain.method_names()) == sorted(  # D-RISE: detectors
        METHODS + ATTRIBUTIONS + LAYER_ATTRIBUTIONS + TRANSFORMER + RELEVANCE + ["drise"])
    model = torchvision.models.resnet18()
    for name in METHODS:  # those that need no layer (FullGrad, Sobel-CAM) are no BaseCAM
        needs_layer = explain.method_class(name).needs_layer
        cam = explain.explainer(name, model, target_layer="layer4" if needs_layer else None)
        assert cam.name == name
        assert isinstance(cam, explain.GradientCAM) <= (name in GRADIENT_CAMS)  # RefineCAM: a base's maps
        assert isinstance(cam, explain.BaseCAM) == needs_layer
    for name in ATTRIBUTIONS:
        attribution = explain.explainer(name, model)
        assert attribution.name == name and isinstance(attribution, explain.Attribution)
    for name in LAYER_ATTRIBUTIONS:
        attribution = explain.explainer(name, model, target_layer="layer4")
        assert attribution.name == name and isinstance(attribution, explain.Attribution)
    assert isinstance(explain.explainer("IG", model), explain.IntegratedGradients)
    vit = torchvision.models.VisionTransformer(32, 8, num_layers=1, num_heads=2, hidden_dim=16, mlp_dim=32)
    for name in TRANSFORMER:
        method = explain.explainer(name, vit)
        assert method.name == name and isinstance(method, TransformerAttention)
    # The package of methods exports the same objects as explain.
    from explain.methods import GradCAM, explain_together
    from explain.methods import explain_together as from_package
    from explain.methods.gradient_free_cams import EigenCAM

    assert explain_together is from_package is explain.explain_together and GradCAM is explain.GradCAM
    assert callable(explain.method_names) and explain.EigenCAM is EigenCAM
    assert isinstance(explain.explainer("Grad-CAM++", model), explain.GradCAMPlusPlus)
    assert isinstance(explain.explainer("grad_cam_elementwise", model), explain.GradCAMElementWise)
    described = explain.describe_methods()
    assert described["gradcam"]["description"].startswith("Grad-CAM:")
    assert all(described[name]["description"] and described[name]["cost"] and described[name]["family"]
               for name in METHODS + ATTRIBUTIONS)
    assert {described[name]["family"] for name in ATTRIBUTIONS} == {"gradient attribution", "perturbation attribution"}
    assert {described[name]["family"] for name in TRANSFORMER} == {"transformer attention"}
    assert {described[name]["family"] for name in LAYER_ATTRIBUTIONS} == {"layer attribution"}
    assert all(described[name]["needs_layer"] for name in LAYER_ATTRIBUTIONS)
    assert {described[name]["family"] for name in RELEVANCE} == {"relevance"}
    for name in RELEVANCE:  # maps at a layer, as the CAMs'; CRP's per concept of the layer (test_crp_cli.py)
        made = explain.explainer(name, model, target_layer="layer3")
        assert isinstance(made, explain.BaseCAM) != made.per_image_concepts
    assert [name for name in METHODS + ATTRIBUTIONS if described[name]["needs_layer"]] == (
        [name for name in METHODS if isinstance(explain.explainer(name, model), explain.BaseCAM)] + ["guidedgradcam"])


def test_every_call_is_the_base_class_one_typed_with_its_pass_options_and_one_lock(monkeypatch):
    """``Explainer.__call__`` is the one public call: its signature shows ``max_memory`` and
    ``progress`` (to type checkers too), and it takes the model's lock once, however many
    ``_explain`` of the method's bases run under it."""
    for name in explain.method_names():
        assert explain.method_class(name).__call__ is explain.Explainer.__call__, name
    parameters = inspect.signature(explain.GradCAM.__call__).parameters
    assert [parameters[p].kind for p in ("max_memory", "progress")] == [inspect.Parameter.KEYWORD_ONLY] * 2
    from explain import base

    taken, lock = [], base.model_lock
    monkeypatch.setattr(base, "model_lock", lambda model: taken.append(model) or lock(model))
    model = torchvision.models.resnet18(num_classes=3).eval()
    x = torch.rand(1, 3, 64, 64)
    explain.LayerGradientXActivation(model, "layer4")(x, max_memory="1GB", progress=False)  # two _explain
    explain.GuidedGradCAM(model, "layer4")(x)  # and a Grad-CAM inside
    assert taken == [model, model]


@functools.lru_cache(maxsize=1)
def small_models():
    """A small CNN (8 channels at its layer "3") and a one-layer ViT, with an image for each."""
    torch.manual_seed(0)
    cnn = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5)).eval()
    vit = torchvision.models.VisionTransformer(32, 8, num_layers=1, num_heads=2, hidden_dim=16, mlp_dim=32).eval()
    return (cnn, torch.rand(1, 3, 32, 32)), (vit, torch.rand(1, 3, 32, 32))


def built(cls, **options):
    """``cls`` on the small model its family explains, with ``options``, and that model's image."""
    (cnn, x), (vit, y) = small_models()
    if cls.family == "transformer attention":
        return cls(vit, **options), y
    return cls(cnn, **({"target_layer": "3"} if cls.needs_layer else {}), **options), x


def test_the_one_cheap_settings_table_makes_every_method_cheap():
    """conftest.CHEAP, the settings the tests that run every method use, keeps each registered
    method within a few dozen passes of a small model's image: a method added with costly
    defaults fails here until it has its entry."""
    costly = {}
    for name in explain.method_names():
        method, x = built(explain.method_class(name), **CHEAP.get(name, {}))
        if method.planned_passes(x) > 32:
            costly[name] = method.planned_passes(x)
    assert not costly, f"add cheap settings for these methods to tests/conftest.py's CHEAP: {costly}"
    assert set(CHEAP) <= set(explain.method_names())


def test_each_cost_names_the_options_that_its_planned_passes_count():
    """A method's ``cost`` is written out from its defaults (its ``{option}`` fields), and the
    options it names are those that change the passes :meth:`planned_passes` counts: a changed
    default, or a new option that costs passes, cannot leave the text behind."""
    from explain.base import keyword_parameters

    described = explain.describe_methods()
    for name in explain.method_names():
        cls = explain.method_class(name)
        options = keyword_parameters(cls)
        named = {field for _, field, _, _ in string.Formatter().parse(cls.cost) if field} & set(options)
        method, x = built(cls)
        counted = set()
        for option, parameter in options.items():
            default = parameter.default
            if type(default) is int:
                more = default + 1
            elif isinstance(default, tuple) and default:
                more = (*default, default[0])
            else:
                continue
            if built(cls, **{option: more})[0].planned_passes(x) != method.planned_passes(x):
                counted.add(option)
        assert named == counted, f"{name}: its cost names {sorted(named)}, its passes count {sorted(counted)}"
        assert described[name]["cost"] == explain.base.cost_text(cls)


def test_unknown_method():
    with pytest.raises(ValueError, match="unknown method 'gradcm'; did you mean gradcam"):
        explain.explainer("gradcm", torchvision.models.resnet18())


@pytest.mark.parametrize(
    "images, error, message",
    [
        (np.zeros((1, 3, 32, 32), np.float32), TypeError, r"must be a torch.Tensor.*unsqueeze\(0\)"),
        (torch.zeros(3, 32, 32), ValueError, r"single image.*images.unsqueeze\(0\)"),
        (torch.zeros(32, 32), ValueError, r"shape \(N, C, H, W\)"),
        (torch.zeros(0, 3, 32, 32), ValueError, "empty batch"),
        (torch.zeros(1, 3, 32, 32, dtype=torch.uint8), TypeError, "preprocessed float input"),
        (torch.zeros(1, 3, 32, 32, dtype=torch.float64), ValueError, r"cast them with images.to\(torch.float32\)"),
        (torch.full((1, 3, 32, 32), float("nan")), ValueError, "NaN"),
    ],
)
def test_bad_images(images, error, message):
    with pytest.raises(error, match=message):
        explain.GradCAM(torchvision.models.resnet18(), "layer4")(images)


def test_wrong_channel_count_names_the_fix():
    model = torchvision.models.resnet18().eval()
    with pytest.raises(ValueError, match=r"1 channel\(s\) but the model's first convolution expects 3.*convert"):
        explain.GradCAM(model, "layer4")(torch.zeros(1, 1, 32, 32))


def test_model_error_leaves_no_hooks():
    from conftest import ModelState

    model = torchvision.models.resnet18().eval()
    model.fc = torch.nn.Linear(3, 10)  # wrong size: fails inside the forward pass, after layer4
    state = ModelState(model)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        explain.GradCAM(model, "layer4")(torch.zeros(1, 3, 32, 32))
    state.assert_unchanged()


def test_model_must_be_a_module():
    with pytest.raises(TypeError, match="torch.nn.Module"):
        explain.GradCAM(lambda x: x)


def test_explanation_helpers():
    model = torchvision.models.resnet18(num_classes=5).eval()
    res = explain.GradCAM(model, class_names=list("abcde"))(torch.randn(2, 3, 32, 32), targets=[1, 4])
    assert res.target_names == ["b", "e"] and len(res) == 2
    probs = res.probabilities
    expected = res.logits.softmax(1)[[0, 1], [1, 4]]
    torch.testing.assert_close(probs, expected)
    assert res.cpu().maps.device.type == "cpu"
    assert "GradCAM(ResNet)" == repr(explain.GradCAM(model))
    # An explanation reads as one line of shapes, layers and targets, not its tensors' values.
    assert repr(res) == ("Explanation(method='gradcam', maps=(2, 32, 32), raw_layers={'layer3': (2, 2, 2)}, "
                         "targets=[1, 4] ['b', 'e'], logits=(2, 5))")


def test_example_script_draws_every_method(tmp_path):
    from PIL import Image

    script = Path(__file__).resolve().parents[1] / "examples" / "explain_one_image.py"
    out = tmp_path / "figure.png"
    # Every CAM but the perturbation CAMs, which mask the image per channel of bn2 (Score-CAM, SS-CAM,
    # IS-CAM, Ablation-CAM: 1,280 passes and more each, two thirds of this test's time, drawn
    # by the same loop and checked against their anchors in test_methods_reference.py and
    # test_cams_peers.py), and the attributions of one or two passes (the others
    # repeat those passes many times). SESS repeats its base CAM over about 120 patches; DFF's
    # maps are per concept.
    shown = [m for m in explain.method_names() if m not in ("sess", "dff")
             and explain.method_class(m).family != "perturbation CAM"
             and issubclass(explain.method_class(m), (explain.BaseCAM, explain.FullGrad))]
    shown += ["saliency", "guidedbp", "guidedgradcam", "deeplift", "lrp"]
    command = [sys.executable, str(script), "--out", str(out), "--batch-size", "8", "--methods", ",".join(shown)]
    done = subprocess.run(command, capture_output=True, text=True,
                          env={**os.environ, "MPLBACKEND": "Agg"}, timeout=900)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":")[0].strip() for line in lines[:-1]] == shown
    layers = {"fullgrad": "input+biases", "saliency": "input", "guidedbp": "input", "guidedgradcam": "input",
              "deeplift": "input", "lrp": "input", "excitation-backprop": "blocks.5.0.bn1",
              "c-excitation-backprop": "blocks.5.0.bn1"}
    for method, line in zip(shown, lines):
        assert "cat" in line and f"at layer {layers.get(method, 'bn2')}," in line, line
    with Image.open(out) as figure:
        assert figure.width > 1000 and figure.height > 500


def test_channel_check_follows_the_convolution_that_runs_first():
    class LateRegisteredStem(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Conv2d(48, 4, 1)  # registered first, runs second
            self.stem = nn.Conv2d(3, 48, 3)
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(self.head(self.stem(x)).mean(dim=(2, 3)))

    model = LateRegisteredStem().eval()
    assert explain.GradCAM(model, "head")(torch.randn(1, 3, 8, 8)).maps.shape == (1, 8, 8)
    for layer in ("head", None):  # the explicit layer, and the automatic choice's dry run
        with pytest.raises(ValueError, match=r"1 channel\(s\) but the model's first convolution expects 3.*convert"):
            explain.GradCAM(model, layer)(torch.zeros(1, 1, 8, 8))
    assert hook_count(model) == 0
