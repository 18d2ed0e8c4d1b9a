"""What a task's strategy (:mod:`~explain.batch.task_outputs`) makes of a group of images, as
plain values: per image and method, its maps and what each target's output is
(:class:`ImageOutput`), and the methods that failed on some images (:class:`Failure`); and the
one place those become manifest records, the ``.npz`` of the maps and the files to write
(:class:`OutputBuilder`), the same for every task and both engines."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import numpy as np

from ..report import TEMP_NAME_BYTES, ManifestRecord
from .inputs import Source
from .kinds import FileKind
from .manifest import NAME_MAX, RecordMaker, fitted_path, safe_name
from .storage import OutputFolder
from .writing import Job


@dataclass
class TargetOutput:
    """One output of an image: what it explains (``label``, the manifest's target column; the
    class, its probability; a detection's box or a segment's region) and ``what`` names its
    file (its class id and name, or its box)."""

    label: str
    what: str
    target_id: int
    target_name: str
    probability: float | None
    seconds: float  # the method's time on this output
    metrics: dict | None = None  # --metrics: {column: value}
    region: dict | None = None  # segmentation and detection: the region or the box
    segments: dict | None = None  # --segments: {segment name: score}
    marks: dict | None = None  # what the overlay draws on top (boxes and labels, outline)
    concept: dict | None = None  # a concept method's: {concept, concept_rank, concept_relevance}


@dataclass
class ImageOutput:
    """One method's outputs on one image (``position`` in the group's work): a map per target."""

    position: int
    cam: object
    maps: np.ndarray  # one map per target
    targets: list[TargetOutput]
    #: the model's top class on the image: (id, name, probability), each None where there is none
    predicted: tuple
    raw: dict[str, np.ndarray] = field(default_factory=dict)  # the raw layers' maps, per target
    signed: bool = False
    npz_extra: dict = field(default_factory=dict)  # more arrays for the .npz (--segments' scores)


@dataclass
class Failure:
    """``cam`` failed on the images at ``positions`` of the group: their records fail with
    ``error`` (reported as ``reported``, where the report says it otherwise)."""

    positions: list[int]
    cam: object
    error: str
    reported: str | None = None


@dataclass
class Explained:
    """What a strategy made of a group: the outputs, image by image, and the failures."""

    outputs: list[ImageOutput] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)

    def extend(self, other: Explained) -> None:
        self.outputs += other.outputs
        self.failures += other.failures


class OutputBuilder:
    """The files of an :class:`ImageOutput` and their records: the overlays' and ``.npz``'s names
    (shortened to the output folder's limit), the records (:class:`~explain.batch.manifest.RecordMaker`),
    the ``.npz`` (with --save-maps) and the :class:`~explain.batch.writing.Job` that draws and
    writes them."""

    def __init__(self, records: RecordMaker, options, kind: FileKind | None):
        self.records, self.options, self.kind = records, options, kind
        #: The longest output file name, in bytes: the output folder's limit, less what the
        #: name of the temporary file that writes it adds.
        self.name_limit = OutputFolder(options.out).name_max(NAME_MAX) - TEMP_NAME_BYTES

    def output_names(self, source: Source, method: str, what: str) -> tuple[str, str | None]:
        """The overlay's file name for one target (``what``: its id and name, or the box) and the
        image's .npz (with --save-maps). A name past the file system's limit (with the
        temporary file's name that writes it) is shortened by :func:`~explain.batch.manifest.fitted_path`:
        the same on every run, so that a rerun finds it."""
        maps = (
            fitted_path(source.folder, source.stem, f"__{safe_name(method)}.npz", self.name_limit)
            if self.options.save_maps
            else None
        )
        suffix = ".png" if self.kind is None else self.kind.suffix(source.path)
        return fitted_path(source.folder, source.stem, f"__{safe_name(method)}__{what}{suffix}", self.name_limit), maps

    def job(self, source: Source, image: ImageOutput, picture: np.ndarray) -> Job:
        """The records, the .npz and the overlays of ``image``'s outputs (``picture``: what the
        overlays draw on)."""
        method = image.cam.name  # type: ignore[attr-defined]
        best_id, best_name, best_probability = image.predicted
        records: list[ManifestRecord] = []
        for target in image.targets:
            output, maps_file = self.output_names(source, method, target.what)
            records.append(
                self.records.record(
                    source.input,
                    method,
                    target.label,
                    target_id=target.target_id,
                    target_name=target.target_name,
                    target_probability=target.probability,
                    predicted_id=best_id,
                    predicted_name=best_name,
                    predicted_probability=best_probability,
                    output=output,
                    maps=maps_file,
                    metrics=target.metrics,
                    seconds=round(target.seconds, 6),
                    region=target.region,
                    segments=target.segments,
                    **(target.concept or {}),
                )
            )
        npz = None
        if self.options.save_maps:
            npz = {"maps": image.maps, "targets": np.asarray([target.target_id for target in image.targets])}
            npz.update({f"raw_{name}": raw for name, raw in image.raw.items()})
            npz.update(image.npz_extra)
        marks = [target.marks or {} for target in image.targets] if any(t.marks for t in image.targets) else None
        return Job(
            records,
            picture,
            image.maps,
            npz,
            self.options.signed_cmap if image.signed else self.options.cmap,
            self.options.alpha,
            image.signed,
            marks,
            draw=None if self.kind is None or marks else partial(self.kind.draw, source.path),
        )
