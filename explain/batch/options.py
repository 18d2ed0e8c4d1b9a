"""What a batch job is asked to do, as typed values: :class:`RunOptions` for ``explain run`` (and
the Ray engine and :func:`explain.ray_data.explain_dataset`), :class:`EvaluateOptions` for
``explain evaluate``. The command line builds them from its flags; Python callers build them
directly. Free of torch, so that the Ray engine's driver plans without it.

>>> options = RunOptions(inputs=["photos/"], out="out", method="gradcam,layercam")
>>> options.batch_size, options.target, options.engine
(16, 'top1', 'local')
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from ..options import BUNDLED_MODEL

_Options = TypeVar("_Options", bound="ModelOptions")


@dataclass
class ModelOptions:
    """The model and where its inputs and outputs are: what every batch job takes."""

    inputs: list[str] = field(default_factory=list)
    out: str | Path = "out"
    model: str = BUNDLED_MODEL
    weights: str | None = None
    trust_model_file: bool = False
    device: str | None = None
    layer: str = "auto"
    #: --method-option: ``METHOD:KEY=VALUE`` entries, each a keyword option of one method's class
    #: (see :func:`explain.batch.explainers.parse_method_options`)
    method_options: list[str] = field(default_factory=list)
    target: str = "top1"
    batch_size: int = 16
    step: int | None = None
    workers: int | None = None
    overwrite: bool = False
    max_pixels: int | None = None
    #: The budget of the methods' and metrics' inner batches, such as "2GB" (None: half the
    #: memory available on the device); see :mod:`explain.passes`.
    max_memory: str | int | None = None
    quiet: bool = False

    @classmethod
    def from_values(cls: type[_Options], values) -> _Options:
        """The options from any object with these attributes (an argparse namespace); the
        attributes it lacks keep their defaults."""
        return cls(**{f.name: getattr(values, f.name) for f in dataclasses.fields(cls) if hasattr(values, f.name)})

    def replace(self: _Options, **changes) -> _Options:
        return dataclasses.replace(self, **changes)

    def with_absolute_paths(self: _Options) -> _Options:
        """These options with the paths they name made absolute: Ray's workers do not share the
        driver's working directory."""
        from .storage import is_uri

        changes: dict = {}
        if not is_uri(self.out):
            changes["out"] = os.path.abspath(self.out)
        if self.weights:
            changes["weights"] = os.path.abspath(self.weights)
        if os.path.exists(self.model):
            changes["model"] = os.path.abspath(self.model)
        segments = getattr(self, "segments", None)
        if segments and os.path.exists(segments):
            changes["segments"] = os.path.abspath(segments)
        return self.replace(**changes)


@dataclass
class RunOptions(ModelOptions):
    """``explain run``: overlays (and optionally maps and metric values) per image, method and target."""

    method: str = "gradcam"
    task: str | None = None
    eigen_smooth: bool = False
    aug_smooth: bool = False
    reduction: str = "abs-sum"
    cmap: str = "jet"
    signed_cmap: str = "RdBu_r"
    alpha: float = 0.5
    save_maps: bool = False
    metrics: str | None = None
    #: --labels: a CSV of path,label (see explain.batch.ground_truth)
    labels: Path | None = None
    #: --segments: a folder of mask files, or model:NAME[=WEIGHTS] (see explain.batch.segment_sources)
    segments: str | None = None
    #: --copy-originals: index.html shows thumbnails copied into the output folder, not links
    #: to the inputs (see explain.batch.page.OriginalCopies)
    copy_originals: bool = False
    engine: str = "local"
    address: str | None = None
    actors: int | None = None


@dataclass
class EvaluateOptions(ModelOptions):
    """``explain evaluate``: every map of each method scored with each metric."""

    methods: str = "gradcam"
    metrics: str = "deletion,insertion"
    regions: Path | None = None


@dataclass
class CheckedRun:
    """What checking a run's options against the model found, in plain values: what the Ray
    engine's driver (which never loads the model) plans and names its rows with."""

    methods: list[str]
    labels: list[str]  # the manifest's target column, one per output
    layers: dict[str, str]  # method -> its layers, comma-separated
    settings: dict[str, str]  # method -> the settings that shape its outputs (a changed one redoes them)
    task: str
    metrics: list[str]
    metric_columns: list[str]
    fixed_batch: bool  # the model takes batches of one image
    device: str  # the model's device type
    decoding: bytes = b""  # the decode step's preprocessing and draft size, pickled
    messages: str = ""  # what the check printed (a note on random weights), for the driver to show
    class_names: list[str] = field(default_factory=list)  # the model's, for --labels
    zoom: float | None = None  # how the model's crop frames an image (explain.batch.decoding.crop_zoom)

    @property
    def records(self):
        """The maker of this run's manifest records (:class:`~explain.batch.manifest.RecordMaker`)."""
        from .manifest import RecordMaker

        return RecordMaker(self.layers, self.settings, self.task)
