"""Planning and resuming ``explain run``: which outputs an earlier run (its manifest) already
made with this run's settings, and which are still to make. :class:`RunPlan` holds the local
engine's plan and rows; :func:`finished_pairs` is the Ray driver's bounded-memory version of the
same rule, by hashes, for lists of millions of images."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from ..report import iter_json_records, read_manifest
from .inputs import Source
from .manifest import concept_count, concept_ranks, is_complete, is_detection_row, is_well_formed, row_key
from .options import CheckedRun


class RunPlan:
    """The manifest's rows by key (input, method, target, concept rank) in manifest order, which outputs are
    pending (source index -> explainers still to run) and which were recorded by this run.
    ``outputs`` is the task's strategy (its keys, whether the plan grows as boxes are found)."""

    def __init__(self, prepared, outputs, folder, manifest_path):
        self.prepared, self.outputs, self.folder, self.manifest_path = prepared, outputs, folder, manifest_path
        self.rows: dict[tuple, dict] = {}
        self.order: list[tuple] = []  # every output of this run, in manifest order
        self.in_order: set[tuple] = set()
        self.pending: dict[int, list] = {}
        self.recorded: set[tuple] = set()  # the keys of the rows this run recorded

    def _complete(self, key: tuple) -> bool:
        prepared = self.prepared
        return is_complete(
            self.rows.get(key),
            self.folder.is_file,
            prepared.settings.get(key[1]),
            prepared.layers.get(key[1]),
            prepared.options.save_maps,
            prepared.metric_columns,
        )

    def make(self, sources: list[Source], overwrite: bool) -> Iterator[tuple[Source, str, str]]:
        """Read the earlier manifest and plan: complete outputs are recorded as skipped, the rest
        pending; yields ``(source, method, error)`` for the inputs that failed before decoding,
        whose failed rows the caller records."""
        for row in filter(is_well_formed, read_manifest(self.manifest_path)):
            self.rows[row_key(row)] = row
        labels = self.prepared.target.labels
        for index, source in enumerate(sources):
            for cam in self.prepared.explainers:
                ranks = concept_ranks(concept_count(cam))
                keys = self.outputs.keys(self.rows, source, cam.name, labels, self.prepared.settings[cam.name], ranks)
                if not self.outputs.plan_grows:
                    self._add_to_order(keys)
                if source.error:
                    yield source, cam.name, source.error
                elif not overwrite and all(self._complete(key) for key in keys):
                    for key in keys:
                        self.record(dict(self.rows[key], status="skipped", error=None))
                else:
                    self.pending.setdefault(index, []).append(cam)

    def _add_to_order(self, keys: Iterable[tuple]) -> None:
        for key in keys:
            if key not in self.in_order:
                self.in_order.add(key)
                self.order.append(key)

    def record(self, row: dict) -> None:
        key = row_key(row)
        if self.outputs.plan_grows:
            self._add_to_order([key])
        self.rows[key] = row
        self.recorded.add(key)

    def planned_rows(self) -> list[dict]:
        """This run's rows, in manifest order."""
        return [self.rows[key] for key in self.order if key in self.rows]

    def recorded_rows(self) -> list[dict]:
        """The rows this run recorded so far, in manifest order (not the earlier manifest's)."""
        return [self.rows[key] for key in self.order if key in self.recorded]


def finished_pairs(
    manifest_lines: Iterable[str], inputs: Iterable[str], checked: CheckedRun, exists, save_maps: bool
) -> tuple[set[int], set[int]]:
    """Hashes of a run's inputs, and of the (input, method) pairs whose outputs an earlier run
    finished with this run's settings: every target's (classify, segment) or every box's
    (detect). Only hashes are held, and ``inputs`` (a stream) is read only where an earlier run
    left complete rows."""
    complete_keys: set[int] = set()
    counts: dict[int, list[int]] = {}  # detect: pair -> [rows with these settings, complete ones]
    settings, layers = checked.settings, checked.layers
    for row in filter(is_well_formed, iter_json_records(manifest_lines)):
        method = row.get("method")
        if method not in settings:
            continue
        done = is_complete(row, exists, settings[method], layers[method], save_maps, checked.metric_columns)
        if checked.task == "detect":
            if is_detection_row(row, settings[method]):
                count = counts.setdefault(hash((row.get("input"), method)), [0, 0])
                count[0] += 1
                count[1] += done
        elif done:
            complete_keys.add(hash(row_key(row)))
    hashed_inputs: set[int] = set()
    finished = {pair for pair, (rows, done) in counts.items() if rows and rows == done}
    if not (complete_keys or finished):  # nothing to keep (a first run): no need to know the inputs yet
        return hashed_inputs, finished
    for input in inputs:
        hashed_inputs.add(hash(input))
        for method in checked.methods:
            ranks = concept_ranks(checked.concepts.get(method, 0))
            keys = ((input, method, label, rank) for label in checked.labels for rank in ranks)
            if complete_keys and all(hash(key) in complete_keys for key in keys):
                finished.add(hash((input, method)))
    return hashed_inputs, finished


def skipped_rows(rows: Iterable[dict], inputs: set[int], finished: set[int]) -> Iterator[dict]:
    """The earlier manifest's ``rows`` of the outputs :func:`finished_pairs` found finished, of
    this run's ``inputs`` (hashes both), as ``skipped``: what a run on Ray keeps at its start."""
    for row in filter(is_well_formed, rows):
        input = row.get("input")
        if (
            hash(input) in inputs
            and hash((input, row.get("method"))) in finished
            and row.get("status") in ("ok", "skipped")
        ):
            yield dict(row, status="skipped", error=None)
