"""``explain run`` for segmentation and detection models: the classifier pipeline, with targets
read per image (a class over its region, the selected boxes) and one output per box."""

from __future__ import annotations

from collections import deque

import numpy as np
import torch
from torch import Tensor, nn

from ..methods import explain_together
from ..hooks import preserved_state
from ..tasks import DetectionTarget, SegmentationTarget, crop_padding
from .common import _safe
from .explainers import _class_name
from .inputs import Source
from .pipeline import _OutOfMemory, _Run, _rounded, _write_outputs


class _TaskRun(_Run):
    """One ``explain run`` of a segmentation or detection model.

    Each batch runs the model once to read its targets: per image, the class and region of
    the --target (:class:`~explain.tasks.SegmentationTarget`), or the boxes it selects
    (:meth:`~explain.tasks.DetectionTarget.select`), each box explained on its own copy of
    the image. An output is named after its class (segment) or its box (``box3``, the box's
    index in the detector's output), its overlay draws the region's outline or the box, and
    its manifest row records the region or the box (``region``). As the boxes are known only
    once the detector has run, an image's outputs enter the plan when they are made; a
    finished image is known by its rows with the same settings.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.task = self.loaded.task
        self.in_plan: set[tuple] = set()

    def _keys(self, source: Source, method: str) -> list[tuple]:
        if self.task == "detect":
            found = [key for key, row in self.rows.items() if key[:2] == (source.input, method)
                     and row.get("task") == "detect" and row.get("region") and row.get("settings") == self.settings[method]]
            if found:
                return found
        return super()._keys(source, method)

    def _make_plan(self) -> None:
        self._read_manifest()
        for index, source in enumerate(self.sources):
            for cam in self.explainers:
                keys = self._keys(source, cam.name)
                if source.error:
                    self._fail(source, cam.name, source.error)
                elif not self.args.overwrite and all(self._complete(key) for key in keys):
                    for key in keys:
                        self._record([dict(self.rows[key], status="skipped", error=None)])
                else:
                    self.pending.setdefault(index, []).append(cam)

    def _record(self, rows: list[dict]) -> None:
        for row in rows:
            key = (row["input"], row["method"], row["target"])
            if key not in self.in_plan:
                self.in_plan.add(key)
                self.plan.append(key)
        super()._record(rows)

    def _explain(self, source_indices: list[int], images: Tensor, saver, in_flight: deque) -> None:
        model, names = self.loaded.model, self.loaded.class_names
        model_input = self.inputs.model_input(images.to(self.loaded.device, non_blocking=True))
        pictures = self.inputs.pictures(images, model_input)
        cams = [cam for cam in self.explainers if any(cam in self.pending[i] for i in source_indices)]

        def fail(positions, cam, error: str) -> None:
            for j in positions:
                if cam in self.pending[source_indices[j]]:
                    self._report_error(self.sources[source_indices[j]].input, f"{cam.name}: {error}")
                    self._fail(self.sources[source_indices[j]], cam.name, error)

        try:
            target, owners, records, marks, predicted = self._targets(model, model_input)
        except Exception as error:  # the model or the target fails on this batch
            if isinstance(error, torch.OutOfMemoryError) and len(source_indices) > 1:
                raise _OutOfMemory from error
            for cam in cams:
                fail(range(len(source_indices)), cam, f"{type(error).__name__}: {error}")
            return
        # Boxes are explained --batch-size rows at a time: an image can hold hundreds.
        step = len(owners) if self.task == "segment" else self.args.batch_size
        outcome: dict = {cam: [] for cam in cams}  # per CAM: (maps, raw layers) per chunk, or the error
        for start in range(0, len(owners), max(step, 1)):
            rows = list(range(start, min(start + step, len(owners))))
            if self.task == "segment":
                chunk, batch = target, model_input
            else:
                chunk = target.subset(rows)
                batch = model_input[chunk.image_ids.to(model_input.device)]
            for cam, result in zip(cams, self._explain_rows(cams, batch, chunk)):
                if isinstance(outcome[cam], Exception):
                    continue
                if isinstance(result, Exception):
                    outcome[cam] = result
                    continue
                if self.task == "detect":
                    result = crop_padding(result, model)
                outcome[cam].append((result.maps.cpu().numpy(), {n: r.cpu().numpy() for n, r in result.raw_layers.items()}))
        if len(source_indices) > 1 and any(isinstance(result, torch.OutOfMemoryError) for result in outcome.values()):
            raise _OutOfMemory  # nothing of this group is written yet: its halves start again
        empty = [j for j in range(len(source_indices)) if j not in owners]
        for cam in cams:
            fail(empty, cam, f"no detected box matches --target {self.target.labels[0]}")
            if isinstance(outcome[cam], Exception):
                fail(sorted(set(owners)), cam, f"{type(outcome[cam]).__name__}: {outcome[cam]}")
                continue
            if not outcome[cam]:
                continue
            maps = np.concatenate([maps for maps, _ in outcome[cam]])
            raw = {name: np.concatenate([layers[name] for _, layers in outcome[cam]]) for name in outcome[cam][0][1]}
            for j in sorted(set(owners)):
                i = source_indices[j]
                if cam not in self.pending[i]:
                    continue
                source = self.sources[i]
                prefix = f"{source.folder}/{source.stem}" if source.folder else source.stem
                mine = [r for r, owner in enumerate(owners) if owner == j]
                rows = []
                for r in mine:
                    record = records[r]
                    name = _class_name(names, record["class_id"])
                    label = f"box{record['index']}" if self.task == "detect" else self.target.labels[0]
                    what = f"{label if self.task == 'detect' else record['class_id']}-{_safe(name)}"
                    best_id, best_probability = predicted[j]
                    rows.append(self._row(
                        source, cam.name, label, target_id=record["class_id"], target_name=name,
                        target_probability=record["probability"],
                        predicted_id=best_id, predicted_name=None if best_id is None else _class_name(names, best_id),
                        predicted_probability=best_probability,
                        output=f"{prefix}__{_safe(cam.name)}__{what}.png",
                        maps=f"{prefix}__{_safe(cam.name)}.npz" if self.args.save_maps else None,
                        region={key: value for key, value in record.items()
                                if key not in ("task", "class_id", "class_name", "probability")},
                    ))
                npz = None
                if self.args.save_maps:
                    npz = {"maps": maps[mine], "targets": np.asarray([records[r]["class_id"] for r in mine])}
                    npz.update({f"raw_{name}": r[mine] for name, r in raw.items()})
                in_flight.append(saver.submit(
                    _write_outputs, self.folder, pictures[j], maps[mine], rows, npz, self.args.cmap, self.args.alpha,
                    False, [marks[r] for r in mine],
                ))

    @staticmethod
    def _explain_rows(cams: list, batch: Tensor, target) -> list:
        """Each CAM's explanation of ``batch`` (or the error it raised): together, sharing
        their passes, or where that fails, each on its own so that the error lands on the one
        that fails."""
        try:
            return explain_together(cams, batch, target)
        except Exception:
            pass
        results = []
        for cam in cams:
            try:
                results.append(cam(batch, target))
            except Exception as error:
                results.append(error)
        return results

    def _targets(self, model: nn.Module, images: Tensor):
        """The batch's targets from one pass of the model: the target, the image of each of
        its rows, each row's record (class, region or box, probability) and overlay marks,
        and each image's prediction (class id, probability)."""
        names = self.loaded.class_names
        with preserved_state(model), torch.no_grad():
            output = model(images)
        n = len(images)
        if self.task == "segment":
            target = self.target.targets.resolve(output)
            probabilities = target.probabilities(output).tolist()
            records = [dict(target.describe(j, names), probability=_rounded(probabilities[j])) for j in range(n)]
            marks = [{"outline": target.mask[j if len(target.mask) > 1 else 0].cpu().numpy()} for j in range(n)]
            top = SegmentationTarget().resolve(output)
            best = top.probabilities(output).tolist()
            predicted = [(top.describe(j)["class_id"], _rounded(best[j])) for j in range(n)]
            return target, list(range(n)), records, marks, predicted
        target = DetectionTarget.select(output, **self.target.select)
        records = [dict(d.describe(names), probability=_rounded(d.score)) for d in target.detections]
        marks = [{"boxes": [d.box], "labels": [f"{_class_name(names, d.label)} {d.score:.2f}"]} for d in target.detections]
        tops = {d.image: (d.label, _rounded(d.score)) for d in DetectionTarget.select(output).detections}
        predicted = [tops.get(j, (None, None)) for j in range(n)]
        return target, target.image_ids.tolist(), records, marks, predicted
