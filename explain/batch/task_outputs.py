"""What the task changes in a run, as small strategies that return what they made of a group
(:class:`~explain.batch.outputs.Explained`: outputs per image and method, and failures), never
calling back into the engine: a classifier's outputs are its targets' classes
(:class:`ClassifyOutputs`); a segmentation model's the class over its region
(:class:`SegmentOutputs`), a detector's the boxes the target selects, one output per box
(:class:`DetectOutputs`), both read per image from one pass of the model
(:class:`DenseOutputs`)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..errors import failure_reason, is_out_of_memory
from ..hooks import preserved_state
from ..passes import StopRequested
from ..tasks import DetectionTarget, SegmentationTarget, crop_padding
from .explainers import TargetSpec, class_name
from .inputs import Source
from .manifest import concept_count, is_detection_row, safe_name
from .method_results import explain_all, raise_if_out_of_memory
from .outputs import Explained, Failure, ImageOutput, TargetOutput
from .segment_sources import ImageSegments

#: A method's scores of a batch's maps: ``scorer(cam, images, result)`` -> {(image, target
#: rank): {column: value}} (--metrics; see :class:`~explain.batch.scoring.MetricScorer`).
Scorer = Callable[..., dict]


def rounded(value: float | None) -> float | None:
    return None if value is None or value != value else round(float(value), 6)


def outputs_for(prepared, scorer: Scorer) -> ClassifyOutputs | DenseOutputs:
    """The strategy of ``prepared``'s task (a :class:`~explain.batch.preparation.PreparedRun`)."""
    costs, names = prepared.costs, prepared.loaded.class_names
    if prepared.task == "classify":
        return ClassifyOutputs(prepared.target, costs, names, scorer, prepared.segments)
    if prepared.task == "segment":
        return SegmentOutputs(prepared.target, costs, names, prepared.loaded.model)
    return DetectOutputs(prepared.target, costs, names, prepared.loaded.model, prepared.options.batch_size)


class ClassifyOutputs:
    """A classifier: one output per image, method and target class (top1, topk:K, a class)."""

    #: Whether a run knows all its outputs before it explains (the plan does not grow).
    plan_grows = False

    def __init__(self, target: TargetSpec, costs: dict, class_names: list[str], scorer: Scorer, segments=None):
        self.target, self.costs, self.class_names, self.scorer = target, costs, class_names, scorer
        self.segments = segments  # --segments: each image's segments (None: no --segments)

    def keys(self, rows: dict, source: Source, method: str, labels, settings: str, ranks=(None,)) -> list[tuple]:
        """The manifest keys of ``source``'s outputs by ``method`` (:func:`~explain.batch.manifest.row_key`):
        per target, one per concept rank (``ranks``: [None] for a method of one map per target)."""
        return [(source.input, method, label, rank) for label in labels for rank in ranks]

    def explain(self, work: list[tuple[Source, list]], model_input: Tensor, pictures: np.ndarray, cams) -> Explained:
        segmented = [cam for cam in cams if self.segments is not None and cam.takes_segments]
        found = self._explain(work, model_input, [cam for cam in cams if cam not in segmented])
        if segmented:
            found.extend(self._explain_segments(work, model_input, pictures, segmented))
        return found

    def _explain_segments(self, work, model_input: Tensor, pictures: np.ndarray, cams: list) -> Explained:
        """--segments: the methods that score each image's segments, on the images that have
        some; the others' records fail with the reason (no mask file, a bad one)."""
        assert self.segments is not None
        found = Explained()
        try:
            segments = self.segments([source for source, _ in work], pictures)
        except Exception as error:  # the segmentation model fails on this group
            raise_if_out_of_memory([error], len(work))
            segments = [f"--segments: {type(error).__name__}: {error}"] * len(work)
        for j, item in enumerate(segments):
            if isinstance(item, str):
                found.failures += [Failure([j], cam, item) for cam in cams]
        ok = [j for j, item in enumerate(segments) if not isinstance(item, str)]
        if ok:
            part = self._explain(
                [work[j] for j in ok],
                model_input[torch.tensor(ok, device=model_input.device)],
                cams,
                [segments[j] for j in ok],
            )
            for image in part.outputs:
                image.position = ok[image.position]
            for failure in part.failures:
                failure.positions = [ok[j] for j in failure.positions]
            found.extend(part)
        return found

    def _explain(self, work, model_input: Tensor, cams: list, segments: list[ImageSegments] | None = None) -> Explained:
        """The outputs of ``cams`` on the group (with ``segments``: each image's, which they score)."""
        found = Explained()
        if not cams:
            return found
        masks = None if segments is None else [each.masks for each in segments]
        results, seconds = explain_all(cams, model_input, self.target.targets, self.target.topk, self.costs, masks)
        raise_if_out_of_memory(results, len(work))
        everyone = list(range(len(work)))
        for cam, result in zip(cams, results, strict=True):
            if isinstance(result, Exception):
                reason = failure_reason(result)
                said = reason if is_out_of_memory(result) else str(result)
                found.failures.append(Failure(everyone, cam, reason, said))
        # A method that Ctrl-C stopped is neither done nor failed: a resumed run does it.
        done = [
            (cam, result, took)
            for cam, result, took in zip(cams, results, seconds, strict=True)
            if not isinstance(result, (Exception, StopRequested))
        ]
        if not done:
            return found
        best_probability, best_id = done[0][1].logits.float().softmax(dim=1).max(dim=1)
        predicted: list[tuple]
        if callable(self.target.targets):  # an embedding (similar:IMAGE): no classes
            predicted = [(None, None, None)] * len(work)
        else:
            predicted = [
                (i, self.class_names[i], rounded(p))
                for i, p in zip(best_id.cpu().tolist(), best_probability.cpu().tolist(), strict=True)
            ]
        for cam, result, took in done:
            started = time.perf_counter()
            scores = self.scorer(cam, model_input, result)
            took += time.perf_counter() - started  # --metrics: the method's time includes its scoring
            found.outputs += self._images(work, cam, result, scores, predicted, took / len(work), segments)
        return found

    def _images(self, work, cam, result, scores: dict, predicted: list, seconds: float, segments) -> list[ImageOutput]:
        """One method's outputs, per image that still needs it; ``seconds``: the method's time
        per image, which the image's targets share."""
        columns = output_columns(self.target.labels, cam, result)
        maps, ids, probabilities = result.maps, result.targets, result.probabilities
        if ids.dim() == 1:  # one target per image: (N, H, W) maps (volumes (N, D, H, W), signals (N, L))
            maps, ids, probabilities = maps[:, None], ids[:, None], probabilities[:, None]
        maps, ids, probabilities = maps.cpu().numpy(), ids.cpu().tolist(), probabilities.cpu().tolist()
        one_target = result.targets.dim() == 1  # raw then lacks the targets' axis
        raw = {name: (r[:, None] if one_target else r).cpu().numpy() for name, r in result.raw_layers.items()}
        images = []
        for j, (_, cams) in enumerate(work):
            if cam not in cams:
                continue
            outputs = zip(columns, ids[j], probabilities[j], strict=False)
            targets = [
                self._target(result, j, rank, output, scores.get((j, rank)), seconds / len(columns))
                for rank, output in enumerate(outputs)
            ]
            image = ImageOutput(
                j, cam, maps[j], targets, predicted[j], {n: r[j] for n, r in raw.items()}, result.signed
            )
            if segments is not None:
                self._with_segment_scores(image, result.segment_scores[j].cpu(), segments[j].names)
            if getattr(result, "relevances", None) is not None and concept_count(cam):
                image.npz_extra = {
                    "concept_ids": result.concept_ids[j].cpu().numpy(),
                    "concept_relevances": result.relevances[j].cpu().numpy(),
                }
            images.append(image)
        return images

    def _target(self, result, image: int, rank: int, output: tuple, metrics: dict | None, seconds: float):
        """The :class:`~explain.batch.outputs.TargetOutput` of map ``rank`` of ``image``:
        ``output`` its (target label, concept rank), class id and probability."""
        (label, concept_rank), class_id, probability = output
        # A callable target (similar:IMAGE) has no class: its label names it.
        name = self.class_names[class_id] if class_id >= 0 else label
        what = f"{class_id}-{safe_name(name)}" if class_id >= 0 else safe_name(re.sub(r"\.\w+$", "", label))
        concept = None
        if concept_rank is not None:  # a concept method: an output per concept of the target
            concept = concept_values(result, image, rank, concept_rank)
            what += f"__c{concept_rank}-{safe_name(concept['concept'])}"
        return TargetOutput(
            label, what, class_id, name, rounded(probability), seconds, metrics=metrics, concept=concept
        )

    @staticmethod
    def _with_segment_scores(image: ImageOutput, scores: Tensor, names: list[str]) -> None:
        """Each target's ``segments``, {segment name: score} (None for a NaN: a segment XRAI
        never added), and the .npz's ``segment_scores`` ((K,), or (k, K) for topk) and
        ``segment_names``."""
        by_rank = scores[None] if scores.dim() == 1 else scores
        for target, values in zip(image.targets, by_rank.tolist(), strict=True):
            target.segments = dict(zip(names, map(rounded, values), strict=True))
        image.npz_extra = {"segment_scores": scores.numpy(), "segment_names": np.asarray(names)}


def output_columns(labels, cam, result) -> list[tuple[str, int | None]]:
    """(target label, concept rank) of each of a result's maps per image: a map per target,
    the rank None; for a concept method (``--method crp``), each target's concepts in turn,
    ranked from 1."""
    count = concept_count(cam)
    if not count:
        return [(label, None) for label in labels]
    return [(label, rank) for label in labels for rank in range(1, count + 1)]


def concept_values(result, image: int, column: int, rank: int) -> dict:
    """The manifest's concept columns of map ``column`` of ``image`` in a concept method's
    result (a :class:`~explain.ConceptExplanation`): the concept as ``layer:channel``, its rank
    and its relevance for the target."""
    return {
        "concept": f"{result.layer}:{result.labels[image][column]}",
        "concept_rank": rank,
        "concept_relevance": float(f"{float(result.relevances[image, column]):.6g}"),
    }


class DenseOutputs:
    """A segmentation or detection model. Each group runs the model once to read its targets:
    per image, the class and region of the --target, or the boxes it selects, each box
    explained on its own copy of the image. An output's overlay draws the region's outline or
    the box, and its record the region or the box (``region``). As the boxes are known only
    once the detector has run, an image's outputs enter the plan when they are made; a
    finished image is known by its rows with the same settings. What differs, the targets and
    how they are read and named, is :class:`SegmentOutputs`' and :class:`DetectOutputs`'."""

    plan_grows = True

    def __init__(self, target: TargetSpec, costs: dict, class_names: list[str], model: nn.Module):
        self.target, self.costs, self.class_names, self.model = target, costs, class_names, model

    def keys(self, rows: dict, source: Source, method: str, labels, settings: str, ranks=(None,)) -> list[tuple]:
        return [(source.input, method, label, None) for label in labels]

    def explain(self, work: list[tuple[Source, list]], model_input: Tensor, pictures: np.ndarray, cams) -> Explained:
        found = Explained()
        try:
            with preserved_state(self.model), torch.no_grad():
                output = self.model(model_input)
            target, owners, records, marks, predicted = self.targets(output, len(model_input))
        except Exception as error:  # the model or the target fails on this batch
            if is_out_of_memory(error) and len(work) > 1:
                raise_if_out_of_memory([error], len(work))
            found.failures += [Failure(list(range(len(work))), cam, failure_reason(error)) for cam in cams]
            return found
        maps = self._maps(cams, target, owners, model_input)
        raise_if_out_of_memory(maps.values(), len(work))  # nothing of this group is kept: its halves start again
        empty = [j for j in range(len(work)) if j not in owners]
        for cam in cams:
            found.failures.append(Failure(empty, cam, f"no detected box matches --target {self.target.labels[0]}"))
            if isinstance(maps[cam], Exception):
                found.failures.append(Failure(sorted(set(owners)), cam, failure_reason(maps[cam])))
            elif maps[cam] and not isinstance(maps[cam], StopRequested):
                found.outputs += self._images(work, cam, maps[cam], owners, records, marks, predicted)
        return found

    def _maps(self, cams: list, target, owners: list[int], model_input: Tensor) -> dict:
        """Per CAM, the (maps, raw layers, seconds per row) of each chunk of the target's rows
        (:meth:`chunks`), or the error it raised."""
        found: dict = {cam: [] for cam in cams}
        for chunk, batch, rows in self.chunks(target, owners, model_input):
            for cam, result, took in zip(cams, *explain_all(cams, batch, chunk, costs=self.costs), strict=True):
                if isinstance(found[cam], (Exception, StopRequested)):
                    continue
                if isinstance(result, (Exception, StopRequested)):  # stopped: not written, done on resume
                    found[cam] = result
                    continue
                result = self.cropped(result)
                found[cam].append(
                    (result.maps.cpu().numpy(), {n: r.cpu().numpy() for n, r in result.raw_layers.items()}, took / rows)
                )
            if any(isinstance(value, StopRequested) for value in found.values()):
                break  # Ctrl-C: the boxes left are for a resumed run
        return found

    def _images(
        self, work, cam, chunks: list, owners: list[int], records: list[dict], marks: list[dict], predicted: list
    ) -> list[ImageOutput]:
        maps = np.concatenate([maps for maps, _, _ in chunks])
        raw = {name: np.concatenate([layers[name] for _, layers, _ in chunks]) for name in chunks[0][1]}
        seconds = [per_row for chunk_maps, _, per_row in chunks for _ in chunk_maps]
        images = []
        for j in sorted(set(owners)):
            if cam not in work[j][1]:
                continue
            mine = [r for r, owner in enumerate(owners) if owner == j]
            targets = []
            for r in mine:
                record = records[r]
                name = class_name(self.class_names, record["class_id"])
                label, what = self.naming(record)
                region = {
                    key: value
                    for key, value in record.items()
                    if key not in ("task", "class_id", "class_name", "probability")
                }
                targets.append(
                    TargetOutput(
                        label,
                        f"{what}-{safe_name(name)}",
                        record["class_id"],
                        name,
                        record["probability"],
                        seconds[r],
                        region=region,
                        marks=marks[r],
                    )
                )
            best_id, best_probability = predicted[j]
            best = (best_id, None if best_id is None else class_name(self.class_names, best_id), best_probability)
            images.append(ImageOutput(j, cam, maps[mine], targets, best, {n: r[mine] for n, r in raw.items()}))
        return images

    # -- what the task says

    def targets(self, output, n: int) -> tuple:
        """The group's targets from the model's ``output`` on its ``n`` images: the target, the
        image of each of its rows, each row's record (class, region or box, probability) and
        overlay marks, and each image's prediction (class id, probability)."""
        raise NotImplementedError

    def chunks(self, target, owners: list[int], model_input: Tensor):
        """(target, images, rows) in the pieces that are explained at once."""
        raise NotImplementedError

    def cropped(self, result):
        return result

    def naming(self, record: dict) -> tuple[str, object]:
        """A row's target column and what names its file (before the class name)."""
        raise NotImplementedError


class SegmentOutputs(DenseOutputs):
    """A segmentation model: per image, the class of the --target over its predicted region
    (:class:`~explain.tasks.SegmentationTarget`); an output is named after its class."""

    def targets(self, output, n: int) -> tuple:
        spec: Any = self.target.targets  # a SegmentationTarget, whose region the output sets
        target = spec.resolve(output)
        probabilities = target.probabilities(output).tolist()
        records = [dict(target.describe(j, self.class_names), probability=rounded(probabilities[j])) for j in range(n)]
        marks = [{"outline": target.mask[j if len(target.mask) > 1 else 0].cpu().numpy()} for j in range(n)]
        top = SegmentationTarget().resolve(output)
        best = top.probabilities(output).tolist()
        predicted = [(top.describe(j)["class_id"], rounded(best[j])) for j in range(n)]
        return target, list(range(n)), records, marks, predicted

    def chunks(self, target, owners: list[int], model_input: Tensor):
        yield target, model_input, len(owners)

    def naming(self, record: dict) -> tuple[str, object]:
        return self.target.labels[0], record["class_id"]


class DetectOutputs(DenseOutputs):
    """A detector: the boxes the target selects (:meth:`~explain.tasks.DetectionTarget.select`),
    each explained on its own copy of its image, ``batch_size`` boxes at a time (an image can
    hold hundreds); an output is named after its box (``box3``, the box's index in the
    detector's output)."""

    def __init__(self, target: TargetSpec, costs: dict, class_names: list[str], model: nn.Module, batch_size: int):
        super().__init__(target, costs, class_names, model)
        self.batch_size = batch_size

    def keys(self, rows: dict, source: Source, method: str, labels, settings: str, ranks=(None,)) -> list[tuple]:
        found = [
            key for key, row in rows.items() if key[:2] == (source.input, method) and is_detection_row(row, settings)
        ]
        return found or super().keys(rows, source, method, labels, settings, ranks)

    def targets(self, output, n: int) -> tuple:
        names = self.class_names
        target = DetectionTarget.select(output, **(self.target.select or {}))
        records = [dict(d.describe(names), probability=rounded(d.score)) for d in target.detections]
        marks = [
            {"boxes": [d.box], "labels": [f"{class_name(names, d.label)} {d.score:.2f}"]} for d in target.detections
        ]
        tops = {d.image: (d.label, rounded(d.score)) for d in DetectionTarget.select(output).detections}
        return target, target.image_ids.tolist(), records, marks, [tops.get(j, (None, None)) for j in range(n)]

    def chunks(self, target, owners: list[int], model_input: Tensor):
        step = max(self.batch_size, 1)
        for start in range(0, len(owners), step):
            chunk = target.subset(list(range(start, min(start + step, len(owners)))))
            yield chunk, model_input[chunk.image_ids.to(model_input.device)], min(step, len(owners) - start)

    def cropped(self, result):
        return crop_padding(result, self.model)

    def naming(self, record: dict) -> tuple[str, object]:
        label = f"box{record['index']}"
        return label, label
