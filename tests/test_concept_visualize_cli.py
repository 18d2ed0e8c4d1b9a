"""``explain concepts visualize`` (explain/batch/feature_visuals.py): one PNG per concept
(channels, a neuron, a direction) and visualizations.json, the very images
:func:`explain.concepts.visualize` makes; a rerun skips what is written, other settings redo
it; mistakes in the concepts or the model are usage errors (exit 2) that name the fix; Ctrl-C
stops the running group at the model's next layer, the model left as it was and the groups
before it written, and the same command then ends as an uninterrupted run would.

Cheap: a four-channel CNN, a few steps, small images (the in-process runs at 32 pixels)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ModelState
from PIL import Image
from torch import nn
from torchvision import transforms
from torchvision.models.vision_transformer import VisionTransformer

from explain.batch.feature_visuals import VISUALS_FILE, VisualizeRun
from explain.batch.options import VisualizeOptions
from explain.batch.outcome import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from explain.cli import main
from explain.concepts import visualize
from explain.imagenet import IMAGENET_MEAN, IMAGENET_STD
from explain.models import LoadedModel

from test_concept_atlas_cli import _tiny_cnn


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """The tiny CNN and a small vision transformer as model files, and directions for conv2."""
    root = tmp_path_factory.mktemp("visualize")
    torch.save(_tiny_cnn(), root / "tiny.pt")
    vit = VisionTransformer(image_size=224, patch_size=56, num_layers=1, num_heads=2, hidden_dim=8, mlp_dim=8,
                            num_classes=3).eval()
    torch.save(vit, root / "vit.pt")
    np.save(root / "mix.npy", np.array([1.0, -1.0, 0.5, 0.0]))
    np.save(root / "short.npy", np.array([1.0, 2.0]))
    return root


def _cli(files: Path, out: Path, *concepts: str, model: str | None = None, extra=("-q",)) -> int:
    arguments = ["concepts", "visualize", model or str(files / "tiny.pt"), *concepts, "--out", str(out)]
    # on the CPU, as the API's images it is compared with (a seed draws other numbers on a GPU)
    return main([*arguments, "--trust-model-file", "--steps", "3", "--size", "24", "--device", "cpu", *extra])


def _entries(out: Path) -> dict:
    document = json.loads((out / VISUALS_FILE).read_text())
    assert document["format"] == "explain.concepts.visualize-files/1"
    return document["concepts"]


def _pixels(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image)


def test_the_command_writes_the_images_visualize_makes_and_a_rerun_skips_them(files, tmp_path, capsys):
    out = tmp_path / "out"
    concepts = ("conv2:0-1", "conv2:3@2,1", f"conv2:{files / 'mix.npy'}")
    assert _cli(files, out, *concepts, extra=()) == EXIT_OK
    captured = capsys.readouterr()
    assert "step" in captured.err  # the bar, over the steps
    assert captured.out.strip().endswith(f"4 concepts visualised now, 0 skipped (already written), 0 left; "
                                         f"see {out / VISUALS_FILE}")
    entries = _entries(out)
    files_of = {key: entry["file"] for key, entry in entries.items()}
    assert files_of == {"conv2:0": "conv2/0000.png", "conv2:1": "conv2/0001.png",
                        "conv2:3@2,1": "conv2/0003_y2_x1.png", f"conv2:{files / 'mix.npy'}": "conv2/direction_mix.png"}
    model = torch.load(files / "tiny.pt", weights_only=False)
    direction = torch.tensor([1.0, -1.0, 0.5, 0.0])
    for key, objective in (("conv2:0", 0), ("conv2:3@2,1", (3, 2, 1)), (f"conv2:{files / 'mix.npy'}", direction)):
        expected = visualize(model, "conv2", objective, steps=3, size=24, input_size=224, seed=0,
                             normalization=(IMAGENET_MEAN, IMAGENET_STD))
        entry = entries[key]
        pixels = expected.images[0].mul(255).round().byte().permute(1, 2, 0).numpy()
        assert np.array_equal(_pixels(out / entry["file"]), pixels), key  # the API's image, as it is
        assert entry["value"] == pytest.approx(float(expected.values[0]))
        assert entry["first_step"] == pytest.approx(float(expected.history[0, 0]))
        assert entry["last_step"] == pytest.approx(float(expected.history[-1, 0]))
        assert entry["size"] == [24, 24] and entry["settings"]["steps"] == 3 and entry["settings"]["batch_size"] == 1

    written = (out / "conv2" / "0000.png").stat().st_mtime_ns
    assert _cli(files, out, *concepts) == EXIT_OK  # nothing new to do
    assert "0 concepts visualised now, 4 skipped (already written), 0 left" in capsys.readouterr().out
    assert (out / "conv2" / "0000.png").stat().st_mtime_ns == written
    assert _cli(files, out, "conv2:1", "conv2:2", extra=("-q", "--steps", "4")) == EXIT_OK  # other settings: redone
    assert "2 concepts visualised now, 0 skipped" in capsys.readouterr().out
    entries = _entries(out)
    assert entries["conv2:1"]["settings"]["steps"] == 4 and entries["conv2:0"]["settings"]["steps"] == 3


def test_mistakes_are_usage_errors_that_name_the_fix(files, tmp_path, capsys):
    for concept, message in (  # the form: answered before the model loads
        ("conv2", "concept 'conv2': give LAYER:CHANNEL"),
        ("conv2:a", "concept 'conv2:a': give channel numbers and ranges"),
        ("conv2:1@2", "a neuron is LAYER:CHANNEL@Y,X"),
    ):
        assert _cli(files, tmp_path / "early", concept) == EXIT_USAGE
        assert message in capsys.readouterr().err
    assert not (tmp_path / "early").exists()
    for concept, message in (  # against the model
        ("conv9:0", "concept conv9:0: model has no layer named 'conv9'; did you mean: conv2"),
        ("conv2:2,7", "concept conv2:2,7: channel 7 out of range: the layer has 4 channels; see `explain layers"),
        ("conv2:1@40,0", "position (40, 0) lies off the layer's (28, 28) grid"),
        (f"conv2:{files / 'short.npy'}", "the direction has 2 values; the layer 4 channels"),
        (f"conv2:{tmp_path / 'none.npy'}", "cannot read the direction"),
    ):
        assert _cli(files, tmp_path / "out", "conv2:0", concept) == EXIT_USAGE
        assert message in capsys.readouterr().err, concept
    assert not list((tmp_path / "out").rglob("*.png"))  # every concept is checked before the first step
    attention = "encoder.layers.encoder_layer_0.self_attention:0"  # returns a tuple: no layer to read
    assert _cli(files, tmp_path / "out", attention, model=str(files / "vit.pt")) == EXIT_USAGE
    assert "returns tuple; pick a layer with one tensor" in capsys.readouterr().err
    tokens = "encoder.layers.encoder_layer_0:5"  # a block's tokens, read as their grid
    assert _cli(files, tmp_path / "out", tokens, model=str(files / "vit.pt")) == EXIT_OK
    assert _cli(files, tmp_path / "out", "layer4:0", model="resnet-18") == EXIT_USAGE
    assert "unknown model 'resnet-18'; did you mean resnet18" in capsys.readouterr().err


def _loaded(model: nn.Module) -> LoadedModel:
    preprocess = transforms.Compose([transforms.ToTensor(), transforms.Normalize([0.5] * 3, [0.5] * 3)])
    return LoadedModel(model, preprocess, ["a", "b", "c"], torch.device("cpu"), torch.zeros(1, 3, 32, 32))


def _run(model: nn.Module, out: Path) -> int:
    options = VisualizeOptions(out=out, model="tiny", concepts=["conv2:0-2"], steps=4, size=16, quiet=True)
    out.mkdir(exist_ok=True)
    return VisualizeRun(options, _loaded(model), out).run()


def test_ctrl_c_stops_at_the_next_layer_keeps_what_is_written_and_a_rerun_finishes(tmp_path, capsys):
    model = _tiny_cnn()
    model.fc.weight.requires_grad_(False)
    assert _run(model, tmp_path / "whole") == EXIT_OK
    state, calls = ModelState(model), []

    def ctrl_c(module, args, output):  # in the second concept's third step
        calls.append(module)
        if len(calls) == 4 + 3:
            os.kill(os.getpid(), signal.SIGINT)

    handle = model.conv1.register_forward_hook(ctrl_c)
    try:
        assert _run(model, tmp_path / "out") == EXIT_INTERRUPTED
    finally:
        handle.remove()
    assert len(calls) == 7  # stopped at conv2, before the step's backward pass and the next forward
    state.assert_unchanged()
    captured = capsys.readouterr()
    assert "explain: stopping: the running group of concepts stops at the model's next layer" in captured.err
    assert "interrupted, run the same command again to finish; 1 concepts visualised now, 0 skipped" in captured.out
    assert sorted(_entries(tmp_path / "out")) == ["conv2:0"]
    assert sorted(p.name for p in (tmp_path / "out" / "conv2").iterdir()) == ["0000.png"]

    assert _run(model, tmp_path / "out") == EXIT_OK
    assert "2 concepts visualised now, 1 skipped (already written), 0 left" in capsys.readouterr().out
    for name in ("0000.png", "0001.png", "0002.png"):  # as the uninterrupted run made them
        assert np.array_equal(_pixels(tmp_path / "out" / "conv2" / name), _pixels(tmp_path / "whole" / "conv2" / name))
    state.assert_unchanged()
