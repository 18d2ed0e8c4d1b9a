"""``explain concepts atlas`` (explain/batch/concept_atlas.py, concept_files.py): the command
writes the atlas, its reference patches and concepts.json; a rerun skips every image; a run
stopped after some batches (Ctrl-C, or killed without its last save) and run again ends with
the atlas of one uninterrupted run; a broken image fails (exit 1) and the others are done;
and on the shortcut benchmark the channel CRP finds on the mark has mark crops for its
RelMax patches, as the job writes them.

Cheap: a four-channel CNN pickled for --trust-model-file on a few small images, and the
shortcut CNN at its own 64 pixels (the job run in this process with its preprocessing)."""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn
from torchvision import transforms

from explain.batch.concept_atlas import ATLAS_FILE, AtlasJob, AtlasWorker, PreparedAtlas, prepare_atlas
from explain.batch.decoding import ModelInputs
from explain.batch.concept_files import CONCEPTS_FILE
from explain.batch.inputs import collect_inputs
from explain.batch.job import run_job
from explain.batch.options import AtlasOptions
from explain.batch.outcome import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_OUT_OF_MEMORY
from explain.cli import main
from explain.concepts import CRP, AtlasProbe, ConceptAtlas
from explain.data import SHORTCUT_CLASS, load_shortcut_model, shortcut_dataset
from explain.models import LoadedModel


def _tiny_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        OrderedDict(
            conv1=nn.Conv2d(3, 4, 5, stride=8, padding=2),
            relu1=nn.ReLU(),
            conv2=nn.Conv2d(4, 4, 3, padding=1),
            relu2=nn.ReLU(),
            pool=nn.AdaptiveAvgPool2d(1),
            flatten=nn.Flatten(),
            fc=nn.Linear(4, 3),
        )
    ).eval()


def tiny_inputs(root: Path, count: int) -> Path:
    """``count`` small images under ``root/in`` (seeded noise, each with a square a row lower)
    and the tiny CNN as the model file ``root/tiny.pt``; ``root``."""
    (root / "in").mkdir(parents=True)
    generator = torch.Generator().manual_seed(1)
    for i in range(count):
        pixels = (torch.rand(24, 24, 3, generator=generator) * 255).byte()
        pixels[4 + i : 12 + i, 6:14] = 255
        Image.fromarray(pixels.numpy()).save(root / "in" / f"img{i}.png")
    torch.save(_tiny_cnn(), root / "tiny.pt")
    return root


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Six small images and the tiny CNN as a model file."""
    return tiny_inputs(tmp_path_factory.mktemp("atlas"), 6)


def _cli(folder: Path, out: Path, *extra: str) -> int:
    arguments = ["concepts", "atlas", str(folder / "in"), "--out", str(out), "--layer", "conv2"]
    arguments += ["--model", str(folder / "tiny.pt"), "--trust-model-file", "-n", "2", "-b", "2", "-j", "0", "-q"]
    return main([*arguments, *extra])


def _state(out: Path) -> dict:
    return torch.load(out / ATLAS_FILE, weights_only=True)


def _same_atlas(first: dict, second: dict) -> None:
    assert first["images"] == second["images"]
    one, two = first["atlas"]["layers"]["conv2"], second["atlas"]["layers"]["conv2"]
    assert one["images"] == two["images"]
    for kind in ("activation", "relevance"):
        for name in ("ids", "positions", "classes"):
            assert torch.equal(one[kind][name], two[kind][name]), (kind, name)
        torch.testing.assert_close(one[kind]["values"], two[kind]["values"])
    for name in ("activation_sum", "relevance_sum", "top_count", "top_by_class"):
        torch.testing.assert_close(one[name], two[name])


def test_the_command_writes_the_atlas_its_patches_and_a_rerun_skips_everything(folder, tmp_path, capsys):
    out = tmp_path / "out"
    assert _cli(folder, out) == EXIT_OK
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("explain: 6 images added to the atlas now, 0 skipped (already in atlas.pt), 0 failed;")
    state = _state(out)
    assert [Path(p).name for p in state["images"]] == [f"img{i}.png" for i in range(6)]
    atlas = ConceptAtlas.from_state_dict(state["atlas"])
    assert atlas.images == 6 and atlas.references("conv2").ids.shape == (2, 4)
    document = json.loads((out / CONCEPTS_FILE).read_text())
    concepts = document["layers"]["conv2"]["concepts"]
    assert document["images"] == 6 and [c["channel"] for c in concepts] == [0, 1, 2, 3]
    for concept in concepts:
        for kind, mode in (("relmax", "relevance"), ("actmax", "activation")):
            references = atlas.references("conv2", mode)
            assert len(concept[kind]) == 2
            for rank, ref in enumerate(concept[kind]):
                assert ref["image"] == state["images"][int(references.ids[rank, concept["channel"]])]
                assert ref["value"] == pytest.approx(float(references.values[rank, concept["channel"]]))
                x0, y0, x1, y1 = ref["box"]
                with Image.open(out / ref["patch"]) as patch:  # the crop of the box, in the input's pixels
                    assert patch.size == (x1 - x0, y1 - y0) and 0 < x1 - x0 <= 224
        assert concept["statistics"]["top_count"] >= 0 and "mean_activation" in concept["statistics"]
    assert (out / "patches" / "conv2" / "0003" / "relmax_1.png").is_file()
    assert (out / "failures.csv").read_text() == "image,error\n"

    written = (out / CONCEPTS_FILE).stat().st_mtime_ns
    assert _cli(folder, out) == EXIT_OK  # a rerun: every image is in the atlas already
    assert "0 images added to the atlas now, 6 skipped" in capsys.readouterr().out
    _same_atlas(state, _state(out))
    assert (out / CONCEPTS_FILE).stat().st_mtime_ns == written  # nothing new: the files stay

    assert _cli(folder, out, "--channels", "1,3") == EXIT_OK  # other channels: their files, and only theirs
    concepts = json.loads((out / CONCEPTS_FILE).read_text())["layers"]["conv2"]["concepts"]
    assert [c["channel"] for c in concepts] == [1, 3]
    assert sorted(p.name for p in (out / "patches" / "conv2").iterdir()) == ["0001", "0003"]
    _same_atlas(state, _state(out))


def test_usage_mistakes_answer_before_the_model_loads(folder, tmp_path, capsys):
    for extra, message in (
        (["--channels", "3-1"], "--channels 3-1: the ranges hold no channel"),
        (["--channels", "a"], "--channels a: give channel numbers"),
        (["--max-memory", "lots"], "--max-memory lots"),
        (["--address", "auto"], "--address applies to --engine ray"),
    ):
        assert _cli(folder, tmp_path / "out", *extra) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    code = main(["concepts", "atlas", str(folder / "in"), "--out", str(tmp_path / "o"), "--layer", "auto"])
    assert code == 2 and "--layer: name the layer(s)" in capsys.readouterr().err
    assert _cli(folder, tmp_path / "wrong", "--layer", "conv9") == 2
    assert "--layer" in capsys.readouterr().err


class Stopped(AtlasJob):
    """The job stopped in its ``stop_at``-th batch: by Ctrl-C there, or killed (``killed``: the
    batch never ends and the job writes nothing more, as after kill -9)."""

    def __init__(self, *args, stop_at: int, killed: bool = False):
        super().__init__(*args)
        self.stop_at, self.killed, self.batches = stop_at, killed, 0
        self.checkpoint_seconds = 0.0  # saved after every batch

    def group(self, indices, images):
        self.batches += 1
        if self.batches == self.stop_at:
            raise KeyboardInterrupt
        super().group(indices, images)

    def finish(self, end, completed, summary):
        if not self.killed:
            super().finish(end, completed, summary)


def _job(folder: Path, out: Path, job=AtlasJob, first: int | None = None, **stopping) -> int:
    """The job on the folder's images (its ``first`` ones only, where given)."""
    options = AtlasOptions(inputs=[str(folder / "in")], out=out, model=str(folder / "tiny.pt"),
                           trust_model_file=True, layer="conv2", top_n=2, batch_size=2, workers=0, quiet=True)
    out.mkdir(exist_ok=True)
    prepared = prepare_atlas(options, out)
    return run_job(job(prepared, out, collect_inputs(options.inputs, out)[:first], **stopping))


class StoppedAfterItsLastGroup(AtlasJob):
    """Ctrl-C once every image is in the atlas, before the job's files are written."""

    def group(self, indices, images):
        super().group(indices, images)
        if self.added == len(self.sources) - self.skipped:
            raise KeyboardInterrupt


def test_a_run_stopped_after_its_last_group_leaves_concepts_json_to_the_next_run(folder, tmp_path, capsys):
    out = tmp_path / "out"
    assert _job(folder, out, first=4) == EXIT_OK
    assert json.loads((out / CONCEPTS_FILE).read_text())["images"] == 4
    assert _job(folder, out, StoppedAfterItsLastGroup) == EXIT_INTERRUPTED
    assert len(_state(out)["images"]) == 6  # the atlas saved whole; concepts.json still of 4
    assert json.loads((out / CONCEPTS_FILE).read_text())["images"] == 4
    capsys.readouterr()
    assert _job(folder, out) == EXIT_OK  # nothing to add, and yet the files are of the 4
    assert "0 images added to the atlas now, 6 skipped" in capsys.readouterr().out
    assert json.loads((out / CONCEPTS_FILE).read_text())["images"] == 6


def test_channels_that_a_layer_lacks_leave_it_without_patches(folder, tmp_path, capsys):
    out = tmp_path / "out"
    assert _cli(folder, out, "--channels", "2-9") == EXIT_OK
    assert "conv2 has channels 0-3; the others are left out" in capsys.readouterr().err
    assert _cli(folder, out, "--channels", "7-9") == EXIT_OK  # none of them: no patch, no failure
    document = json.loads((out / CONCEPTS_FILE).read_text())
    assert document["patch_channels"] == "7-9" and document["images"] == 6
    assert not list((out / "patches").rglob("*.png"))


def test_a_stopped_run_resumed_gives_the_atlas_of_one_run(folder, tmp_path, capsys):
    assert _job(folder, tmp_path / "whole") == EXIT_OK
    whole = _state(tmp_path / "whole")
    for name, stopping in (("ctrl-c", {"stop_at": 2}), ("killed", {"stop_at": 3, "killed": True})):
        out = tmp_path / name
        assert _job(folder, out, Stopped, **stopping) == EXIT_INTERRUPTED
        kept = _state(out)
        assert len(kept["images"]) == 2 * (stopping["stop_at"] - 1)  # the batches before the stop
        assert not (out / CONCEPTS_FILE).exists()  # written once the atlas is complete
        capsys.readouterr()
        assert _job(folder, out) == EXIT_OK
        assert f"{6 - len(kept['images'])} images added to the atlas now" in capsys.readouterr().out
        _same_atlas(whole, _state(out))
        assert json.loads((out / CONCEPTS_FILE).read_text())["images"] == 6


class Crowded:
    """A probe on a device that holds one image at a time, and not the third one it is given."""

    def __init__(self, probe):
        self.probe, self.singles, self.settings = probe, 0, probe.settings

    def __call__(self, images, ids=None):
        if len(images) == 1:
            self.singles += 1
        if len(images) > 1 or self.singles == 3:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self.probe(images, ids)


class Halving(AtlasJob):
    def __init__(self, prepared, *args):
        super().__init__(prepared, *args)
        prepared.probe = Crowded(prepared.probe)


def test_a_group_out_of_memory_is_probed_in_halves_and_an_image_that_alone_fails_is_redone(folder, tmp_path, capsys):
    assert _job(folder, tmp_path / "whole") == EXIT_OK
    assert _job(folder, tmp_path / "out", Halving) == EXIT_OUT_OF_MEMORY
    captured = capsys.readouterr()
    assert "img2.png: out of memory: CUDA out of memory" in captured.err
    assert "5 images added to the atlas now, 0 skipped (already in atlas.pt), 1 failed" in captured.out
    assert [Path(p).name for p in _state(tmp_path / "out")["images"]] == [f"img{i}.png" for i in (0, 1, 3, 4, 5)]
    assert _job(folder, tmp_path / "out") == EXIT_OK  # the image that failed, on a device with room
    resumed, whole = _state(tmp_path / "out"), _state(tmp_path / "whole")
    assert [Path(p).name for p in resumed["images"]] == [f"img{i}.png" for i in (0, 1, 3, 4, 5, 2)]
    assert torch.equal(resumed["atlas"]["layers"]["conv2"]["top_count"], whole["atlas"]["layers"]["conv2"]["top_count"])
    torch.testing.assert_close(resumed["atlas"]["layers"]["conv2"]["activation_sum"],
                               whole["atlas"]["layers"]["conv2"]["activation_sum"])


def test_a_broken_image_fails_and_the_others_are_done(folder, tmp_path, capsys):
    broken = tmp_path / "in"
    broken.mkdir()
    for path in (folder / "in").iterdir():
        (broken / path.name).write_bytes(path.read_bytes())
    (broken / "broken.png").write_bytes(b"not a png")
    (tmp_path / "tiny.pt").write_bytes((folder / "tiny.pt").read_bytes())
    assert _cli(tmp_path, tmp_path / "out") == EXIT_FAILED
    captured = capsys.readouterr()
    assert "explain: failed: " in captured.err and "broken.png" in captured.err
    assert "6 images added to the atlas now, 0 skipped (already in atlas.pt), 1 failed (see" in captured.out
    assert len(_state(tmp_path / "out")["images"]) == 6
    rows = (tmp_path / "out" / "failures.csv").read_text().splitlines()
    assert rows[0] == "image,error" and len(rows) == 2 and "broken.png" in rows[1]
    assert json.loads((tmp_path / "out" / CONCEPTS_FILE).read_text())["images"] == 6


def test_the_mark_channel_has_mark_crops_among_its_relmax_patches(tmp_path, capsys):
    """As tests/test_shortcut_benchmark.py does in Python, on the files the job writes: the
    channel of block3 that CRP finds on the planted mark has RelMax patches cut around marks."""
    model = load_shortcut_model()
    marked = shortcut_dataset(8, seed=11, mark_rate=1.0)
    triangles = marked.labels == SHORTCUT_CLASS
    result = CRP(model, "block3")(marked.inputs[triangles], k=4)
    near = F.max_pool2d(marked.marks[triangles][:, None].float(), 5, 1, 2)[:, 0] > 0
    positive = result.raw.clamp(min=0)
    share = (positive * near[:, None]).flatten(2).sum(2) / positive.flatten(2).sum(2).clamp_min(1e-12)
    channel = int(result.concept_ids[share > 0.5].mode().values)

    data = shortcut_dataset(96, seed=21)
    (tmp_path / "in").mkdir()
    for i, image in enumerate(data.images):
        Image.fromarray(image.mul(255).round().byte().permute(1, 2, 0).numpy()).save(tmp_path / "in" / f"{i:03d}.png")
    preprocess = transforms.Compose([transforms.ToTensor(), transforms.Normalize([0.5] * 3, [0.5] * 3)])
    loaded = LoadedModel(model, preprocess, list(model.class_names), torch.device("cpu"), torch.zeros(1, 3, 64, 64))
    options = AtlasOptions(inputs=[str(tmp_path / "in")], out=tmp_path / "out", layer="block3", top_n=6,
                           batch_size=32, workers=0, quiet=True, channels=str(channel))
    (tmp_path / "out").mkdir()
    prepared = PreparedAtlas(options, loaded, ["block3"], AtlasProbe(model, ["block3"]), ConceptAtlas(6), [])
    assert run_job(AtlasJob(prepared, tmp_path / "out", collect_inputs(options.inputs, tmp_path / "out"))) == EXIT_OK
    (concept,) = json.loads((tmp_path / "out" / CONCEPTS_FILE).read_text())["layers"]["block3"]["concepts"]
    assert concept["channel"] == channel
    crops = 0
    for ref in concept["relmax"]:
        mark = data.marks[int(Path(ref["image"]).stem)]
        x0, y0, x1, y1 = ref["box"]
        covered = mark[y0:y1, x0:x1].sum() / mark.sum().clamp_min(1)
        crops += bool(covered > 0.5 and (x1 - x0) * (y1 - y0) < 64 * 64 / 8)  # the mark, not the image
        with Image.open(tmp_path / "out" / ref["patch"]) as patch:
            assert patch.size == (x1 - x0, y1 - y0)
    assert crops >= 5, concept["relmax"]


def test_the_atlas_worker_pickles_without_its_model_and_works_as_the_local_one(folder, monkeypatch):
    """What a Ray actor gets (explain.batch.ray_jobs): the worker pickled without the model, with
    paths made absolute (an actor's working directory is not the driver's), started there."""
    import cloudpickle

    monkeypatch.chdir(folder)
    options = AtlasOptions(inputs=["in"], out="out", model="tiny.pt", trust_model_file=True, layer="conv2", top_n=2)
    prepared = prepare_atlas(options, folder / "unused")
    local = AtlasWorker(options, prepared.layers, prepared)
    local.start()
    shipped = cloudpickle.loads(cloudpickle.dumps(local))
    assert shipped.loaded is None and shipped.probe is None
    assert shipped.options.model == str(folder / "tiny.pt")
    monkeypatch.chdir("/")
    shipped.start()
    images = torch.randint(0, 256, (3, 3, 224, 224), dtype=torch.uint8)
    assert ModelInputs(prepared.loaded.preprocess).uint8
    (members, mine), = local.work([4, 5, 6], images)
    (their_members, theirs), = shipped.work([4, 5, 6], images)
    assert members == their_members == [4, 5, 6]
    for name, layer in mine.layers.items():
        for field in ("activation", "relevance", "activation_at", "relevance_at", "top"):
            assert torch.equal(getattr(layer, field), getattr(theirs.layers[name], field)), field
