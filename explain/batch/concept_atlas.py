"""``explain concepts atlas``: the concept atlas of a dataset as a job of the batch layer
(:class:`~explain.batch.job.DatasetJob`): per channel of the chosen layers, the images that
most activate it (ActMax) and in which it is most relevant for the predicted class (RelMax),
kept as the running top-N of :class:`~explain.concepts.ConceptAtlas`, and, at the end, its
reference patches and ``concepts.json`` (:mod:`explain.batch.concept_files`).

Each decoded group goes through :class:`~explain.concepts.AtlasProbe` (one forward and one
LRP backward pass) into :meth:`~explain.concepts.ConceptAtlas.update`; the memory held is the
atlas's tensors (top-N per channel, sums), whatever the number of images. The atlas is saved
to ``atlas.pt`` (atomically) with the images it has seen, in the order of their ids, every
:attr:`AtlasJob.checkpoint_seconds` and at the end: a rerun (after Ctrl-C, SIGTERM or
kill -9) skips those images and numbers the others on, so that it ends with the atlas of one
uninterrupted run (the atlas's order is total: see :mod:`explain.concepts.atlas`)."""

from __future__ import annotations

import io
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import Tensor

from ..concepts import AtlasBatch, AtlasProbe, ConceptAtlas
from ..errors import Option, UsageError, failure_reason, is_out_of_memory
from ..layers import resolve_layers
from ..models import LoadedModel, load_model, warn_if_random
from ..report import atomic_write
from .concept_files import (
    CONCEPTS_FILE,
    FAILURES_FILE,
    PAGE_FILE,
    PATCHES_FOLDER,
    AtlasFiles,
    concepts_current,
    write_concepts,
    write_failures,
)
from .decoding import ModelInputs, default_workers
from .inputs import Source
from .job import DatasetJob, GroupWorker
from .loop import LoopEnd, OutOfMemory, in_halves
from .options import AtlasOptions
from .outcome import report_failure
from .progress import time_taken
from .storage import device_errors

#: The saved atlas (a dict of tensors and plain values, read back with ``weights_only``).
ATLAS_FILE = "atlas.pt"
#: The ``format`` entry of ``atlas.pt``.
ATLAS_FILE_FORMAT = "explain.concepts.atlas-run/1"


@dataclass
class PreparedAtlas:
    """What an atlas run needs besides its images: the options, the model, the layers (their
    names), the probe, and the atlas so far (read back from ``atlas.pt``) with the paths of
    the images it has seen, in the order of their ids."""

    options: AtlasOptions
    loaded: LoadedModel
    layers: list[str]
    probe: AtlasProbe
    atlas: ConceptAtlas
    images: list[str]


def read_saved(out_dir: Path) -> dict | None:
    """The state ``atlas.pt`` under ``out_dir`` holds (None: no such file)."""
    path = out_dir / ATLAS_FILE
    if not path.exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise UsageError(
            f"cannot read {path} ({type(error).__name__}: {error}); remove it to start the atlas anew"
        ) from None
    if not isinstance(state, dict) or state.get("format") != ATLAS_FILE_FORMAT:
        raise UsageError(f"{path} is not an atlas of `explain concepts atlas`; pass another ", Option("out"))
    return state


def run_settings(options: AtlasOptions, layers: list[str], probe: AtlasProbe) -> dict:
    """What an atlas's images must share: the model, its weights, the layers, N and the probe's
    reductions and rules (a rerun with other ones is refused)."""
    return {
        "model": options.model,
        "weights": options.weights or "",
        "layers": list(layers),
        "top_n": options.top_n,
        **probe.settings,
    }


def make_probe(loaded: LoadedModel, layers: list[str], options: AtlasOptions) -> AtlasProbe:
    """The atlas's probe of ``layers`` (the driver's and each Ray actor's alike)."""
    return AtlasProbe(loaded.model, layers, top_k=options.top_k)


def prepare_atlas(options: AtlasOptions, out_dir: Path) -> PreparedAtlas:
    """Load the model, resolve ``--layer`` on it, make the probe, and read back the atlas of an
    earlier run into ``out_dir`` (refused where it was made with other settings)."""
    loaded = load_model(options.model, options.weights, options.trust_model_file, options.device)
    if loaded.task != "classify" or loaded.kind != "images":
        raise UsageError(
            f"explain concepts atlas takes image classifiers; {options.model} is a {loaded.task} model of {loaded.kind}"
        )
    try:
        layers = list(resolve_layers(loaded.model, list(options.layer.names)))
        probe = make_probe(loaded, layers, options)
    except (ValueError, TypeError) as error:
        raise UsageError(Option("layer"), f": {error}; see `explain layers {options.model}`") from None
    if options.workers is None:
        options = options.replace(workers=default_workers(loaded.device))
    settings = run_settings(options, layers, probe)
    saved, atlas, images = read_saved(out_dir), ConceptAtlas(options.top_n), []
    if saved is not None:
        if saved["settings"] != settings:
            changed = ", ".join(k for k in settings if saved["settings"].get(k) != settings[k])
            raise UsageError(
                f"{out_dir / ATLAS_FILE} is an atlas made with another {changed}; pass another ",
                Option("out"),
                ", or the options of that run to go on with it",
            )
        atlas, images = ConceptAtlas.from_state_dict(saved["atlas"]), list(saved["images"])
    warn_if_random(loaded, options.model)
    return PreparedAtlas(options, loaded, layers, probe, atlas, images)


class AtlasWorker(GroupWorker):
    """The atlas's work on a group of images, where they are (this process, or a Ray actor,
    which loads the model and makes the probe in :meth:`start`): the probe's values of the
    group, in halves where it runs out of device memory, down to single images (one that
    alone does not fit gives the reason)."""

    def __init__(self, options: AtlasOptions, layers: list[str], prepared: PreparedAtlas | None = None):
        self.options, self.layers = options, layers
        self.loaded: LoadedModel | None = prepared.loaded if prepared is not None else None
        self.probe: AtlasProbe | None = prepared.probe if prepared is not None else None

    def __getstate__(self) -> dict:  # pickled for the actors: without the model, paths absolute
        return {"options": self.options.with_absolute_paths(), "layers": self.layers, "loaded": None, "probe": None}

    def start(self) -> None:
        if self.loaded is None:
            options = self.options
            self.loaded = load_model(options.model, options.weights, options.trust_model_file, options.device)
            self.probe = make_probe(self.loaded, self.layers, options)
        self.inputs = ModelInputs(self.loaded.preprocess)

    def work(self, indices: list[int], images: Tensor) -> list[tuple[list[int], AtlasBatch | str]]:
        loaded, probe = self.loaded, self.probe
        assert loaded is not None and probe is not None, "start() first"
        model_input = self.inputs.model_input(images.to(loaded.device, non_blocking=True))

        def once(members: list[int], batch: Tensor) -> tuple[list[int], AtlasBatch | str]:
            try:
                found = probe(batch)
            except Exception as error:
                if not is_out_of_memory(error):
                    raise
                if len(members) > 1:
                    raise OutOfMemory from None
                return members, failure_reason(error)
            return members, found.cpu()

        return in_halves(once, indices, model_input, loaded.device)


class AtlasJob(DatasetJob):
    """One ``explain concepts atlas``: plans the images not in the atlas yet, probes each
    decoded group into the running atlas, saves it now and then, and writes its files."""

    options: AtlasOptions
    #: Seconds between two saves of ``atlas.pt`` while the job runs (and at the end).
    checkpoint_seconds: float = 10.0

    def __init__(self, prepared: PreparedAtlas, out_dir: Path, sources: list[Source]):
        self.prepared, self.out_dir, self.sources = prepared, out_dir, sources
        self.loaded, self.options, self.costs = prepared.loaded, prepared.options, {"atlas": 2.0}
        self.atlas, self.images = prepared.atlas, prepared.images
        self.inputs = ModelInputs(prepared.loaded.preprocess)
        self.failures: list[dict] = []
        self.added = self.skipped = 0
        self.saved_at = time.monotonic()

    def plan(self) -> dict:
        seen = set(self.images)
        pending = {}
        for index, source in enumerate(self.sources):
            if source.path in seen:
                self.skipped += 1
            elif source.error:
                self.failed_input(index, source.error)
            else:
                pending[index] = "atlas"
        return pending

    def failed_input(self, index: int, error: str) -> None:
        self.failures.append({"image": self.sources[index].input, "error": error})
        report_failure(self.sources[index].input, error)

    def worker(self) -> AtlasWorker:
        return AtlasWorker(self.options, self.prepared.layers, self.prepared)

    def take(self, indices: list[int], result: list[tuple[list[int], AtlasBatch | str]]) -> None:
        """Take a group's probe values into the atlas, with ids numbered on in the order of
        the images (however the group was cut); an image that alone ran out of memory fails."""
        for members, found in result:
            if isinstance(found, str):
                self.out_of_memory += 1
                self.failed_input(members[0], found)
                continue
            ids = torch.arange(len(self.images), len(self.images) + len(members))
            self.atlas.update(replace(found, ids=ids))
            self.images.extend(self.sources[i].path for i in members)  # only once the atlas holds them
            self.added += len(members)

    def between_batches(self) -> None:
        if time.monotonic() - self.saved_at >= self.checkpoint_seconds:
            self.save()

    def save(self) -> None:
        """Write ``atlas.pt``: the atlas, the images it has seen (by id) and its settings."""
        state = {
            "format": ATLAS_FILE_FORMAT,
            "atlas": self.atlas.state_dict(),
            "images": list(self.images),
            "settings": run_settings(self.options, self.prepared.layers, self.prepared.probe),
        }
        buffer = io.BytesIO()
        torch.save(state, buffer)
        with device_errors(self.out_dir):
            atomic_write(self.out_dir / ATLAS_FILE, buffer.getvalue())
        self.saved_at = time.monotonic()

    def finish(self, end: LoopEnd, completed: bool, summary: str) -> None:
        self.save()
        with device_errors(self.out_dir):
            write_failures(self.out_dir, self.failures)
            stale = self.added or not concepts_current(self.out_dir, self.options, self.atlas)
            if completed and self.atlas.images and stale:  # interrupted: the next run writes them
                files = AtlasFiles(self.options, self.loaded, self.atlas, self.prepared.layers, self.images)
                write_concepts(self.out_dir, files)

    @property
    def failed(self) -> int:
        return len(self.failures)

    def summary(self, end: LoopEnd) -> str:
        failed = f"{self.failed} failed (see {self.out_dir / FAILURES_FILE})" if self.failed else "0 failed"
        return (
            f"explain: {self.added} images added to the atlas now, {self.skipped} skipped (already in "
            f"{ATLAS_FILE}), {failed}; {time_taken(end.images, end.elapsed, self.failed)}; see "
            f"{self.out_dir / PAGE_FILE}, {self.out_dir / CONCEPTS_FILE} and {self.out_dir / PATCHES_FOLDER}"
        )
