"""What a batch job is asked to do, as typed values: :class:`RunOptions` for ``explain run`` (and
the Ray engine and :func:`explain.ray_data.explain_dataset`), :class:`EvaluateOptions` for
``explain evaluate``, :class:`AtlasOptions` for ``explain concepts atlas``,
:class:`VisualizeOptions` for ``explain concepts visualize``. The command line
builds them from its flags; Python callers build them directly. Free of torch, so that the
Ray engine's driver plans without it.

Lists of names (``methods``, ``metrics``, ``layer``) are :class:`NameList` s, parsed once where
the options are made (a comma-separated string, the command line's form, or a list):

>>> options = RunOptions(inputs=["photos/"], out="out", methods="gradcam, layercam")
>>> options.batch_size, options.target, options.engine, options.methods.names, options.layer.auto
(16, 'top1', 'local', ('gradcam', 'layercam'), True)
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from ..options import BUNDLED_MODEL

_Options = TypeVar("_Options", bound="ModelOptions")


@dataclass(frozen=True)
class NameList:
    """Names, parsed once from a comma-separated string (the command line's form) or a
    list: ``names`` in order, blanks left out; or the ``word`` that stands for a choice of
    its own (``all`` methods or metrics, the ``auto`` layer), in any case. ``text`` is what was
    given, for messages.

    >>> NameList.parse("gradcam, layercam,"), NameList.parse(["ig"]).names, NameList.parse(" All ").every
    (NameList(names=('gradcam', 'layercam'), word=None, text='gradcam, layercam,'), ('ig',), True)
    """

    names: tuple[str, ...] = ()
    word: str | None = None  # "all" or "auto"
    text: str = ""

    @classmethod
    def parse(cls, value: str | Sequence[str] | NameList, word: str = "all") -> NameList:
        """``value`` as names, or as ``word`` where it is that word."""
        if isinstance(value, NameList):
            return value
        text = (value if isinstance(value, str) else ",".join(value)).strip()
        if text.lower() == word:
            return cls((), word, text)
        return cls(tuple(name.strip() for name in text.split(",") if name.strip()), None, text)

    @property
    def every(self) -> bool:
        """``all``: every method (or metric)."""
        return self.word == "all"

    @property
    def auto(self) -> bool:
        """``auto``: the layer each method picks."""
        return self.word == "auto"

    def __str__(self) -> str:
        return self.text

    def __bool__(self) -> bool:
        """Whether any name (or the word) was given."""
        return bool(self.names or self.word)


@dataclass
class ModelOptions:
    """The model and where its inputs and outputs are: what every batch job takes."""

    inputs: list[str] = field(default_factory=list)
    out: str | Path = "out"
    model: str = BUNDLED_MODEL
    weights: str | None = None
    trust_model_file: bool = False
    device: str | None = None
    #: --layer: the layers to explain, or ``auto``
    layer: NameList = field(default_factory=lambda: NameList.parse("auto", "auto"))
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
    #: --engine: ``local`` (this process) or ``ray`` (Ray Data, where the job has a Ray side:
    #: :meth:`~explain.batch.job.DatasetJob.worker`); --address, --actors: the cluster, its actors
    engine: str = "local"
    address: str | None = None
    actors: int | None = None

    def __post_init__(self) -> None:
        self.layer = NameList.parse(self.layer, "auto")

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

    #: --method: the methods to run, or ``all``
    methods: NameList = field(default_factory=lambda: NameList.parse("gradcam"))
    task: str | None = None
    eigen_smooth: bool = False
    aug_smooth: bool = False
    reduction: str = "abs-sum"
    cmap: str = "jet"
    signed_cmap: str = "RdBu_r"
    alpha: float = 0.5
    save_maps: bool = False
    #: --metrics: the metric names, or ``all`` (None: no metrics)
    metrics: NameList | None = None
    #: --labels: a CSV of path,label (see explain.batch.ground_truth)
    labels: Path | None = None
    #: --segments: a folder of mask files, or model:NAME[=WEIGHTS] (see explain.batch.segment_sources)
    segments: str | None = None
    #: --copy-originals: index.html shows thumbnails copied into the output folder, not links
    #: to the inputs (see explain.batch.page.OriginalCopies)
    copy_originals: bool = False
    #: --atlas: an `explain concepts atlas` folder whose concept pages index.html links
    #: --method crp's concepts to (see explain.batch.page.atlas_links)
    atlas: Path | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.methods = NameList.parse(self.methods)
        self.metrics = None if self.metrics is None else NameList.parse(self.metrics)


@dataclass
class EvaluateOptions(ModelOptions):
    """``explain evaluate``: every map of each method scored with each metric."""

    methods: NameList = field(default_factory=lambda: NameList.parse("gradcam"))
    metrics: NameList = field(default_factory=lambda: NameList.parse("deletion,insertion"))
    regions: Path | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.methods = NameList.parse(self.methods)
        self.metrics = NameList.parse(self.metrics)


@dataclass
class AtlasOptions(ModelOptions):
    """``explain concepts atlas``: the concept atlas of the images at ``layer``: per channel, its
    ``top_n`` RelMax and ActMax reference images, with the statistics counting each image's
    ``top_k`` most relevant channels."""

    top_n: int = 8
    top_k: int = 5
    #: --channels: the channels whose reference patches and concepts.json entries are written,
    #: such as "0-15,31" (None: all); the atlas keeps every channel
    channels: str | None = None


def parse_channels(text: str) -> list[int]:
    """``--channels``: channel numbers and ranges, comma-separated, in order without repeats.

    >>> parse_channels("7, 0-2")
    [0, 1, 2, 7]
    """
    channels: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        first, dash, last = part.partition("-")
        if not (first.strip().isdigit() and (not dash or last.strip().isdigit())):
            raise ValueError("give channel numbers and ranges, such as 0-15,31")
        channels.update(range(int(first), int(last if dash else first) + 1))
    if not channels:
        raise ValueError("the ranges hold no channel; write FIRST-LAST with FIRST <= LAST, such as 0-15")
    return sorted(channels)


@dataclass
class VisualizeOptions(ModelOptions):
    """``explain concepts visualize``: the feature visualisation of each of ``concepts`` (texts
    :func:`parse_concept` reads) by :func:`explain.concepts.visualize`, one PNG per concept
    under ``out``. ``batch_size``: concepts optimised together (0: 1 on the CPU, 8 elsewhere)."""

    concepts: list[str] = field(default_factory=list)
    steps: int = 256
    size: int | None = None
    seed: int = 0
    parameterization: str = "fourier"
    views: int | None = None
    lr: float | None = None
    batch_size: int = 0


@dataclass(frozen=True)
class ConceptSpec:
    """One ``LAYER:WHAT`` of ``explain concepts visualize``: its ``layer`` and ``channels``
    (one or more), or one channel's neuron at ``position`` (y, x on the layer's grid), or the
    ``direction`` a .npy file holds."""

    text: str
    layer: str
    channels: tuple[int, ...] = ()
    position: tuple[int, int] | None = None
    direction: str | None = None


def parse_concept(text: str) -> ConceptSpec:
    """A concept of ``explain concepts visualize``: ``LAYER:CHANNELS`` (channel numbers and
    ranges, as :func:`parse_channels` reads them), ``LAYER:CHANNEL@Y,X`` (a neuron) or
    ``LAYER:FILE.npy`` (a direction: a 1-D array of one weight per channel).

    >>> parse_concept("layer4:0-2,7").channels, parse_concept("layer4:7@2,3").position
    ((0, 1, 2, 7), (2, 3))
    """
    layer, colon, what = (part.strip() for part in text.partition(":"))
    if not (colon and layer and what):
        raise ValueError("give LAYER:CHANNEL (or LAYER:0-7,12, LAYER:CHANNEL@Y,X, LAYER:FILE.npy), such as layer4:7")
    if what.lower().endswith(".npy"):
        return ConceptSpec(text, layer, direction=what)
    channels, at, where = what.partition("@")
    if at:
        y, comma, x = (part.strip() for part in where.partition(","))
        if not (channels.strip().isdigit() and comma and y.isdigit() and x.isdigit()):
            raise ValueError("a neuron is LAYER:CHANNEL@Y,X, one channel and a position on the layer's grid")
        return ConceptSpec(text, layer, (int(channels),), (int(y), int(x)))
    return ConceptSpec(text, layer, tuple(parse_channels(channels)))


@dataclass
class CheckedRun:
    """What checking a run's options against the model found, in plain values: what the Ray
    engine's driver (which never loads the model) plans and names its rows with.
    :class:`~explain.batch.preparation.PreparedRun` is one, with the model and the built
    explainers besides."""

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
    #: method -> its concepts per target (--method crp: one row each), for the methods that have them
    concepts: dict[str, int] = field(default_factory=dict)

    @property
    def records(self):
        """The maker of this run's manifest records (:class:`~explain.batch.manifest.RecordMaker`)."""
        from .manifest import RecordMaker

        return RecordMaker(self.layers, self.settings, self.task, self.concepts)
