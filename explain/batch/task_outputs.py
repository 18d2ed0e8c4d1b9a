"""What the task changes in a run, as a strategy of :class:`~explain.batch.explaining.GroupExplainer`:
a classifier's outputs are its targets' classes (:class:`ClassifyOutputs`); a segmentation or
detection model's are read per image from one pass of the model, a class over its region or
the boxes the target selects, one output per box (:class:`DenseOutputs`)."""

from __future__ import annotations

import re
import time

import numpy as np
import torch
from torch import Tensor, nn

from ..errors import failure_reason, is_out_of_memory
from ..hooks import preserved_state
from ..passes import StopRequested
from ..tasks import DetectionTarget, SegmentationTarget, crop_padding
from .explainers import class_name
from .inputs import Source
from .manifest import is_detection_row, safe_name
from .method_results import Outcome, explain_all, raise_if_out_of_memory
from .segment_sources import ImageSegments
from .writing import Job


def outputs_for(task: str) -> ClassifyOutputs | DenseOutputs:
    return ClassifyOutputs() if task == "classify" else DenseOutputs(task)


def _rounded(value: float | None) -> float | None:
    return None if value is None or value != value else round(float(value), 6)


def with_segment_scores(jobs: list[Job], images: list[int], result, segments: list[ImageSegments]) -> None:
    """Each job's rows (one per target of image ``images[i]``) with the manifest's ``segments``,
    {segment name: score} (None for a NaN: a segment XRAI never added), and its .npz (with
    --save-maps) with ``segment_scores`` ((K,), or (k, K) for topk) and ``segment_names``."""
    for job, j in zip(jobs, images, strict=True):
        scores, names = result.segment_scores[j].cpu(), segments[j].names
        by_rank = scores[None] if scores.dim() == 1 else scores
        for row, values in zip(job.rows, by_rank.tolist(), strict=True):
            row["segments"] = dict(zip(names, map(_rounded, values), strict=True))
        if job.npz is not None:
            job.npz.update(segment_scores=scores.numpy(), segment_names=np.asarray(names))


class ClassifyOutputs:
    """A classifier: one output per image, method and target class (top1, topk:K, a class)."""

    #: Whether a run knows all its outputs before it explains (the plan does not grow).
    plan_grows = False

    def keys(self, rows: dict, source: Source, method: str, labels, settings: str) -> list[tuple]:
        """The manifest keys of ``source``'s outputs by ``method``."""
        return [(source.input, method, label) for label in labels]

    def explain(self, host, work: list[tuple[Source, list]], model_input: Tensor, pictures: np.ndarray) -> Outcome:
        cams = host.pending(work)
        source = host.prepared.segments
        segmented = [cam for cam in cams if source is not None and cam.takes_segments]
        outcome = self._explain(host, work, model_input, pictures, [cam for cam in cams if cam not in segmented])
        if segmented:
            outcome.extend(self._explain_segments(host, work, model_input, pictures, segmented))
        return outcome

    def _explain_segments(self, host, work, model_input: Tensor, pictures: np.ndarray, cams: list) -> Outcome:
        """--segments: the methods that score each image's segments, on the images that have
        some; the others' rows fail with the reason (no mask file, a bad one)."""
        outcome = Outcome()
        try:
            found = host.prepared.segments([source for source, _ in work], pictures)
        except Exception as error:  # the segmentation model fails on this group
            raise_if_out_of_memory([error], len(work))
            found = [f"--segments: {type(error).__name__}: {error}"] * len(work)
        for j, item in enumerate(found):
            if isinstance(item, str):
                for cam in cams:
                    host.fail(outcome, work, [j], cam, item)
        ok = [j for j, item in enumerate(found) if not isinstance(item, str)]
        if ok:
            rows = torch.tensor(ok, device=model_input.device)
            part = [work[j] for j in ok], model_input[rows], pictures[ok]
            outcome.extend(self._explain(host, *part, cams, [found[j] for j in ok]))
        return outcome

    def _explain(self, host, work, model_input: Tensor, pictures: np.ndarray, cams: list, segments=None) -> Outcome:
        """The outputs of ``cams`` on the group (with ``segments``: each image's, which they score)."""
        if not cams:
            return Outcome()
        target = host.prepared.target
        masks = None if segments is None else [found.masks for found in segments]
        results, seconds = explain_all(cams, model_input, target.targets, target.topk, host.prepared.costs, masks)
        raise_if_out_of_memory(results, len(work))
        outcome = Outcome()
        for cam, result in zip(cams, results, strict=True):
            if isinstance(result, Exception):
                reason = failure_reason(result)
                reported = reason if is_out_of_memory(result) else str(result)
                host.fail(outcome, work, range(len(work)), cam, reason, reported)
        # A method that Ctrl-C stopped is neither done nor failed: a resumed run does it.
        done = [
            (cam, result, took)
            for cam, result, took in zip(cams, results, seconds, strict=True)
            if not isinstance(result, (Exception, StopRequested))
        ]
        if not done:
            return outcome
        best_probability, best_id = done[0][1].logits.float().softmax(dim=1).max(dim=1)
        predicted = list(zip(best_id.cpu().tolist(), best_probability.cpu().tolist(), strict=True))
        if target.targets is not None and callable(target.targets):  # an embedding (similar:IMAGE): no classes
            predicted = [(None, None)] * len(work)
        for cam, result, took in done:
            started = time.perf_counter()
            scores = host.scores(cam, model_input, result)
            took += time.perf_counter() - started  # --metrics: the method's time includes its scoring
            first = len(outcome.jobs)
            self._jobs(host, outcome, work, cam, result, scores, predicted, pictures, took / len(work))
            if segments is not None:
                images = [j for j, (_, needed) in enumerate(work) if cam in needed]
                with_segment_scores(outcome.jobs[first:], images, result, segments)
        return outcome

    def _jobs(
        self, host, outcome: Outcome, work, cam, result, scores: dict, predicted: list, pictures, seconds: float
    ) -> None:
        """The files and rows of one method's explanation, per image that still needs it;
        ``seconds``: the method's time per image, which the image's targets share."""
        names, labels, options = host.loaded.class_names, host.prepared.target.labels, host.options
        maps, ids, probabilities = result.maps, result.targets, result.probabilities
        if ids.dim() == 1:  # one target per image: (N, H, W) maps (volumes (N, D, H, W), signals (N, L))
            maps, ids, probabilities = maps[:, None], ids[:, None], probabilities[:, None]
        maps, ids, probabilities = maps.cpu().numpy(), ids.cpu().tolist(), probabilities.cpu().tolist()
        one_target = result.targets.dim() == 1  # raw then lacks the targets' axis
        raw = {name: (r[:, None] if one_target else r).cpu().numpy() for name, r in result.raw_layers.items()}
        for j, (source, cams) in enumerate(work):
            if cam not in cams:
                continue
            best_id, best_probability = predicted[j]
            rows = []
            for rank, (label, class_id, probability) in enumerate(zip(labels, ids[j], probabilities[j], strict=False)):
                # A callable target (similar:IMAGE) has no class: its label names it.
                target_name = names[class_id] if class_id >= 0 else label
                what = (
                    f"{class_id}-{safe_name(target_name)}" if class_id >= 0 else safe_name(re.sub(r"\.\w+$", "", label))
                )
                output, maps_file = host.output_names(source, cam.name, what)
                rows.append(
                    host.row(
                        source.input,
                        cam.name,
                        label,
                        target_id=class_id,
                        target_name=target_name,
                        target_probability=_rounded(probability),
                        predicted_id=best_id,
                        predicted_name=None if best_id is None else names[best_id],
                        predicted_probability=_rounded(best_probability),
                        output=output,
                        maps=maps_file,
                        metrics=scores.get((j, rank)),
                        seconds=round(seconds / len(labels), 6),
                    )
                )
            npz = None
            if options.save_maps:
                npz = {"maps": maps[j], "targets": np.asarray(ids[j])}
                npz.update({f"raw_{name}": r[j] for name, r in raw.items()})
            outcome.jobs.append(
                Job(
                    rows,
                    pictures[j],
                    maps[j],
                    npz,
                    options.signed_cmap if result.signed else options.cmap,
                    options.alpha,
                    result.signed,
                    draw=host.drawing(source),
                )
            )


class DenseOutputs:
    """A segmentation or detection model. Each group runs the model once to read its targets:
    per image, the class and region of the --target (:class:`~explain.tasks.SegmentationTarget`),
    or the boxes it selects (:meth:`~explain.tasks.DetectionTarget.select`), each box explained
    on its own copy of the image. An output is named after its class (segment) or its box
    (``box3``, the box's index in the detector's output), its overlay draws the region's outline
    or the box, and its manifest row records the region or the box (``region``). As the boxes
    are known only once the detector has run, an image's outputs enter the plan when they are
    made; a finished image is known by its rows with the same settings."""

    plan_grows = True

    def __init__(self, task: str):
        self.task = task

    def keys(self, rows: dict, source: Source, method: str, labels, settings: str) -> list[tuple]:
        if self.task == "detect":
            found = [
                key
                for key, row in rows.items()
                if key[:2] == (source.input, method) and is_detection_row(row, settings)
            ]
            if found:
                return found
        return [(source.input, method, label) for label in labels]

    def explain(self, host, work: list[tuple[Source, list]], model_input: Tensor, pictures: np.ndarray) -> Outcome:
        cams, outcome = host.pending(work), Outcome()
        try:
            target, owners, records, marks, predicted = self._targets(host, model_input)
        except Exception as error:  # the model or the target fails on this batch
            if is_out_of_memory(error) and len(work) > 1:
                raise_if_out_of_memory([error], len(work))
            for cam in cams:
                host.fail(outcome, work, range(len(work)), cam, failure_reason(error))
            return outcome
        found = self._maps(host, cams, target, owners, model_input)
        raise_if_out_of_memory(found.values(), len(work))  # nothing of this group is kept: its halves start again
        empty = [j for j in range(len(work)) if j not in owners]
        for cam in cams:
            host.fail(outcome, work, empty, cam, f"no detected box matches --target {host.prepared.target.labels[0]}")
            if isinstance(found[cam], Exception):
                host.fail(outcome, work, sorted(set(owners)), cam, failure_reason(found[cam]))
            elif found[cam] and not isinstance(found[cam], StopRequested):
                self._jobs(host, outcome, work, cam, found[cam], owners, records, marks, predicted, pictures)
        return outcome

    def _maps(self, host, cams: list, target, owners: list[int], model_input: Tensor) -> dict:
        """Per CAM, the (maps, raw layers, seconds per row) of each chunk of the target's rows,
        or the error it raised. Boxes are explained --batch-size rows at a time: an image can
        hold hundreds."""
        step = len(owners) if self.task == "segment" else host.options.batch_size
        found: dict = {cam: [] for cam in cams}
        for start in range(0, len(owners), max(step, 1)):
            rows = list(range(start, min(start + step, len(owners))))
            if self.task == "segment":
                chunk, batch = target, model_input
            else:
                chunk = target.subset(rows)
                batch = model_input[chunk.image_ids.to(model_input.device)]
            for cam, result, took in zip(
                cams, *explain_all(cams, batch, chunk, costs=host.prepared.costs), strict=True
            ):
                if isinstance(found[cam], (Exception, StopRequested)):
                    continue
                if isinstance(result, (Exception, StopRequested)):  # stopped: not written, done on resume
                    found[cam] = result
                    continue
                if self.task == "detect":
                    result = crop_padding(result, host.loaded.model)
                found[cam].append(
                    (
                        result.maps.cpu().numpy(),
                        {n: r.cpu().numpy() for n, r in result.raw_layers.items()},
                        took / len(rows),
                    )
                )
            if any(isinstance(value, StopRequested) for value in found.values()):
                break  # Ctrl-C: the boxes left are for a resumed run
        return found

    def _jobs(
        self,
        host,
        outcome: Outcome,
        work,
        cam,
        chunks: list,
        owners: list[int],
        records: list[dict],
        marks: list[dict],
        predicted: list,
        pictures: np.ndarray,
    ) -> None:
        names, options = host.loaded.class_names, host.options
        maps = np.concatenate([maps for maps, _, _ in chunks])
        raw = {name: np.concatenate([layers[name] for _, layers, _ in chunks]) for name in chunks[0][1]}
        seconds = [per_row for chunk_maps, _, per_row in chunks for _ in chunk_maps]
        for j in sorted(set(owners)):
            source, cams = work[j]
            if cam not in cams:
                continue
            mine = [r for r, owner in enumerate(owners) if owner == j]
            best_id, best_probability = predicted[j]
            rows = []
            for r in mine:
                record = records[r]
                name = class_name(names, record["class_id"])
                label = f"box{record['index']}" if self.task == "detect" else host.prepared.target.labels[0]
                output, maps_file = host.output_names(
                    source, cam.name, f"{label if self.task == 'detect' else record['class_id']}-{safe_name(name)}"
                )
                rows.append(
                    host.row(
                        source.input,
                        cam.name,
                        label,
                        target_id=record["class_id"],
                        target_name=name,
                        target_probability=record["probability"],
                        predicted_id=best_id,
                        predicted_name=None if best_id is None else class_name(names, best_id),
                        predicted_probability=best_probability,
                        output=output,
                        maps=maps_file,
                        seconds=round(seconds[r], 6),
                        region={
                            key: value
                            for key, value in record.items()
                            if key not in ("task", "class_id", "class_name", "probability")
                        },
                    )
                )
            npz = None
            if options.save_maps:
                npz = {"maps": maps[mine], "targets": np.asarray([records[r]["class_id"] for r in mine])}
                npz.update({f"raw_{name}": r[mine] for name, r in raw.items()})
            outcome.jobs.append(
                Job(rows, pictures[j], maps[mine], npz, options.cmap, options.alpha, False, [marks[r] for r in mine])
            )

    def _targets(self, host, images: Tensor):
        """The group's targets from one pass of the model: the target, the image of each of its
        rows, each row's record (class, region or box, probability) and overlay marks, and each
        image's prediction (class id, probability)."""
        model: nn.Module = host.loaded.model
        names, spec = host.loaded.class_names, host.prepared.target
        with preserved_state(model), torch.no_grad():
            output = model(images)
        n = len(images)
        if self.task == "segment":
            target = spec.targets.resolve(output)
            probabilities = target.probabilities(output).tolist()
            records = [dict(target.describe(j, names), probability=_rounded(probabilities[j])) for j in range(n)]
            marks = [{"outline": target.mask[j if len(target.mask) > 1 else 0].cpu().numpy()} for j in range(n)]
            top = SegmentationTarget().resolve(output)
            best = top.probabilities(output).tolist()
            predicted = [(top.describe(j)["class_id"], _rounded(best[j])) for j in range(n)]
            return target, list(range(n)), records, marks, predicted
        target = DetectionTarget.select(output, **spec.select)
        records = [dict(d.describe(names), probability=_rounded(d.score)) for d in target.detections]
        marks = [
            {"boxes": [d.box], "labels": [f"{class_name(names, d.label)} {d.score:.2f}"]} for d in target.detections
        ]
        tops = {d.image: (d.label, _rounded(d.score)) for d in DetectionTarget.select(output).detections}
        predicted = [tops.get(j, (None, None)) for j in range(n)]
        return target, target.image_ids.tolist(), records, marks, predicted
