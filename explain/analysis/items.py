"""What SpRAy clusters, gathered per class: from maps, from :class:`~explain.Explanation`\\ s,
or from a finished ``explain run`` folder (its ``manifest.jsonl`` and the ``.npz`` maps that
``--save-maps`` writes; both engines write the same files).

Each class becomes a :class:`ClassItems`: one normalised feature vector per item (a map
sum-pooled to the grid, or the concepts' relevances), and what each item is (its manifest row,
or its index), its probability and whether the model got it wrong."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..explanation import ConceptExplanation, Explanation
from ..report import read_manifest
from .clustering import pooled_features

__all__ = ["FEATURES", "ClassItems", "items_from_explanations", "items_from_maps", "items_from_run"]

#: What SpRAy can cluster: where the relevance lies (``maps``) or which concepts carry it
#: (``concepts``: CRP's concept relevances); ``auto`` picks concepts for CRP, maps otherwise.
FEATURES = ("auto", "maps", "concepts")
#: The statuses of manifest rows whose files exist (``skipped``: finished by an earlier run).
DONE = ("ok", "skipped")


@dataclass
class ClassItems:
    """One class's items: ``features`` (N, D) normalised, ``keys`` (what each item is),
    ``probabilities`` (N,) (NaN unknown) and ``mistakes`` (N,) (None unknown)."""

    name: str
    features: np.ndarray
    keys: list
    probabilities: np.ndarray
    mistakes: list
    kind: str = "maps"
    concept_names: list[str] | None = None
    grid: tuple[int, int] | None = field(default=None)


def _check_features(features: str) -> None:
    if features not in FEATURES:
        raise ValueError(f"features must be one of {', '.join(FEATURES)}, got {features!r}")


def items_from_maps(maps, grid: int = 32, classes: Sequence | None = None, probabilities=None) -> dict[str, ClassItems]:
    """Maps (N, H, W) (a tensor, an array or a list of (H, W) maps of any sizes), grouped by
    ``classes`` (one class per map; all in class ``"all"`` without)."""
    count = len(maps)
    if count == 0:
        raise ValueError("no maps to cluster: pass the (N, H, W) maps of a class's images")
    labels = ["all"] * count if classes is None else [str(c) for c in classes]
    if len(labels) != count:
        raise ValueError(f"classes must name one class per map: {len(labels)} for {count} maps")
    features = pooled_features(maps, grid)
    probability = np.full(count, np.nan) if probabilities is None else np.asarray(probabilities, dtype=np.float64)
    side = round(float(np.sqrt(features.shape[1])))
    groups: dict[str, ClassItems] = {}
    for name in dict.fromkeys(labels):
        rows = [i for i, label in enumerate(labels) if label == name]
        groups[name] = ClassItems(
            name, features[rows], rows, probability[rows], [None] * len(rows), "maps", None, (side, side)
        )
    return groups


def items_from_explanations(
    explanations: Explanation | Sequence[Explanation], grid: int = 32, features: str = "auto"
) -> dict[str, ClassItems]:
    """The maps of ``explanations`` (each target of ``topk`` an item) grouped by the class
    they explain; with ``features="concepts"`` (the default for CRP's results), each image's
    relevance of every channel of the concept layer (``channel_relevances``) instead."""
    _check_features(features)
    batch = [explanations] if isinstance(explanations, Explanation) else list(explanations)
    if not batch:
        raise ValueError("no explanations to cluster: pass the Explanations of a class's images")
    concepts = features == "concepts" or (
        features == "auto" and all(getattr(e, "channel_relevances", None) is not None for e in batch)
    )
    if concepts:
        return _concept_items(batch)
    maps: list[torch.Tensor] = []
    probabilities: list[float] = []
    names: list[str] = []
    for explanation in batch:
        if isinstance(explanation, ConceptExplanation):
            raise ValueError(
                f"{explanation.method}'s maps are per concept: cluster its concept relevances (features='concepts')"
            )
        flat = explanation.maps.flatten(0, 1) if explanation.targets.dim() == 2 else explanation.maps
        maps.extend(flat.detach().cpu().float())
        probabilities.extend(explanation.probabilities.flatten().tolist())
        names.extend(_flat(explanation.target_names))
    return items_from_maps(maps, grid, names, probabilities)


def _flat(names) -> list[str]:
    return [str(n) for row in names for n in (row if isinstance(row, list) else [row])]


def _concept_items(batch: list) -> dict[str, ClassItems]:
    relevances, names, probabilities = [], [], []
    for explanation in batch:
        if getattr(explanation, "channel_relevances", None) is None:
            raise ValueError(
                f"{explanation.method} gives no concept relevances: cluster its maps (features='maps'), or "
                "explain with CRP (explain.concepts.CRP)"
            )
        relevances.append(explanation.channel_relevances.detach().cpu().double())
        names.extend(_flat([row[0] for row in explanation.target_names]))
        probabilities.extend(explanation.probabilities[:, 0].tolist())
    if len({r.shape[1] for r in relevances}) > 1:
        raise ValueError("the explanations' concept layers differ in channels: cluster one layer's concepts")
    layer = batch[0].layer
    channels = [f"{layer}:{c}" for c in range(relevances[0].shape[1])]
    return _grouped(torch.cat(relevances).numpy(), names, probabilities, channels)


def _grouped(vectors: np.ndarray, names: list[str], probabilities, channels: list[str]) -> dict[str, ClassItems]:
    """Concept-relevance vectors, each divided by its largest absolute value, per class."""
    scale = np.abs(vectors).max(axis=1, keepdims=True)
    vectors = vectors / np.where(scale > 0, scale, 1.0)
    probability = np.asarray(probabilities, dtype=np.float64)
    groups = {}
    for name in dict.fromkeys(names):
        rows = [i for i, label in enumerate(names) if label == name]
        groups[name] = ClassItems(
            name, vectors[rows], rows, probability[rows], [None] * len(rows), "concepts", channels
        )
    return groups


def items_from_run(
    folder: str | os.PathLike,
    classes: Sequence[str] | None = None,
    method: str | None = None,
    features: str = "auto",
    grid: int = 32,
) -> dict[str, ClassItems]:
    """The items of a finished ``explain run --save-maps`` folder: one per image and target of
    ``method`` (its rows ``ok`` or ``skipped``; a concept method's rows of one target are one
    item), grouped by the class explained (``target_name``), only ``classes`` (names or ids)
    where given."""
    _check_features(features)
    rows = _run_rows(Path(folder), method)
    rows = _selected(rows, classes)
    concepts = features == "concepts" or (features == "auto" and rows[0].get("concept_rank") is not None)
    if features == "maps" and rows[0].get("concept_rank") is not None:
        raise ValueError(
            f"{rows[0]['method']}'s maps are per concept: cluster its concept relevances (features='concepts', "
            "--features concepts)"
        )
    items = _unique_items(rows)
    arrays = _load_npz(Path(folder), items)
    if concepts:
        groups = _run_concepts(items, arrays)
    else:
        maps = [_target_map(arrays[item["maps"]], item) for item in items]
        groups = items_from_maps(maps, grid, [str(item["target_name"]) for item in items])
        for group in groups.values():
            _fill(group, items)
    for row in rows:
        row.pop("_map_index", None)  # the rows, as the manifest has them, are the items' keys
    return groups


def _fill(group: ClassItems, items: list[dict]) -> None:
    """Replace a group's indices by its manifest rows, probabilities and mistakes."""
    rows = [items[i] for i in group.keys]
    group.keys = rows
    group.probabilities = np.array([_number(row.get("target_probability")) for row in rows])
    group.mistakes = [None if row.get("correct") is None else not row["correct"] for row in rows]


def _number(value) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else float("nan")


def _run_rows(folder: Path, method: str | None) -> list[dict]:
    manifest = folder / "manifest.jsonl"
    if not manifest.is_file():
        raise ValueError(f"{folder} holds no manifest.jsonl: pass the --out folder of a finished `explain run`")
    rows = [row for row in read_manifest(manifest) if row.get("status") in DONE]
    methods = list(dict.fromkeys(str(row.get("method")) for row in rows))
    if not rows:
        raise ValueError(f"{manifest} has no finished rows: run `explain run ... --save-maps` to the end first")
    if method is None and len(methods) > 1:
        raise ValueError(f"the run holds the methods {', '.join(methods)}: name one (method=, --method)")
    chosen = method or methods[0]
    rows = [row for row in rows if row.get("method") == chosen]
    positions: dict[object, int] = {}
    for row in rows:  # an image's .npz holds its targets' maps in the order of their rows
        row["_map_index"] = positions.get(row.get("maps"), 0)
        positions[row.get("maps")] = row["_map_index"] + 1
    if not rows:
        raise ValueError(f"the run holds no finished rows of method {chosen!r}; its methods: {', '.join(methods)}")
    if any(not row.get("maps") for row in rows):
        raise ValueError(
            f"the run saved no maps of {chosen}: rerun `explain run` with --save-maps (the same command and "
            "--save-maps redoes only what is needed, with --overwrite all)"
        )
    return rows


def _selected(rows: list[dict], classes: Sequence[str] | None) -> list[dict]:
    if classes is None:
        return rows
    wanted = {str(c) for c in classes}
    chosen = [row for row in rows if str(row.get("target_name")) in wanted or str(row.get("target_id")) in wanted]
    found = {str(row.get("target_name")) for row in chosen} | {str(row.get("target_id")) for row in chosen}
    if wanted - found:
        known = ", ".join(sorted({str(row.get("target_name")) for row in rows}))
        raise ValueError(f"no rows explain the classes {', '.join(sorted(wanted - found))}; the run's classes: {known}")
    return chosen


def _unique_items(rows: list[dict]) -> list[dict]:
    """One row per (input, method, target): a concept method's first (best) concept's."""
    items: dict[tuple, dict] = {}
    for row in rows:
        key = (row.get("input"), row.get("method"), row.get("target"), row.get("target_id"))
        if key not in items or (row.get("concept_rank") or 0) < (items[key].get("concept_rank") or 0):
            items[key] = row
    return list(items.values())


def _load_npz(folder: Path, items: list[dict]) -> dict[str, dict]:
    paths = list(dict.fromkeys(item["maps"] for item in items))
    missing = [path for path in paths if not (folder / path).is_file()]
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise ValueError(
            f"{len(missing)} of the run's {len(paths)} .npz map files are missing ({shown}): rerun the same "
            "`explain run` with --save-maps to write them again"
        )
    arrays = {}
    for path in paths:
        with np.load(folder / path, allow_pickle=False) as npz:
            arrays[path] = {name: npz[name] for name in npz.files}
    return arrays


def _target_map(arrays: dict, row: dict) -> np.ndarray:
    """The row's map in its image's .npz: the one at the row's place among the image's rows
    (two boxes of one class each have theirs), checked against the class it explains."""
    maps, targets = arrays["maps"], np.atleast_1d(arrays["targets"])
    if maps.ndim == 2:
        return maps
    index = row.get("_map_index", 0)
    if not (index < len(targets) and targets[index] == row.get("target_id")):
        matches = np.flatnonzero(targets == row.get("target_id"))
        if not len(matches):
            raise ValueError(
                f"{row.get('maps')} holds no map of class {row.get('target_id')} ({row.get('target_name')}): the "
                "file is not the run's; rerun the same `explain run` with --save-maps --overwrite"
            )
        index = int(matches[0])
    return maps[index]


def _target_concepts(npz: dict, target_id) -> dict[int, float]:
    """{concept: relevance} of one target in an image's .npz of ``--method crp``: its
    ``concept_ids`` and ``concept_relevances`` are one entry per map (each target's top
    concepts, ``targets`` naming the class of each: ``--target topk:T`` gives T x K), or one
    row per target."""
    ids, values = np.asarray(npz["concept_ids"]), np.asarray(npz["concept_relevances"])
    targets = np.ravel(npz["targets"])
    if ids.size == targets.size:  # per map: the maps of this target
        chosen = np.flatnonzero(targets == target_id)
        return dict(zip(ids.ravel()[chosen].tolist(), values.ravel()[chosen].tolist(), strict=True))
    if ids.ndim == 2 and len(ids) == targets.size:  # per target: its row
        row = int(np.flatnonzero(targets == target_id)[0]) if (targets == target_id).any() else 0
        return dict(zip(ids[row].tolist(), values[row].tolist(), strict=True))
    return dict(zip(ids.ravel().tolist(), values.ravel().tolist(), strict=True))


def _run_concepts(items: list[dict], arrays: dict) -> dict[str, ClassItems]:
    """Each item's vector of concept relevances (the .npz's concept_ids and
    concept_relevances: the run's top concepts per target, 0 for the others), over every
    concept any item names."""
    pairs = []
    for item in items:
        npz = arrays[item["maps"]]
        if "concept_ids" not in npz:
            raise ValueError(
                f"{item['maps']} holds no concept relevances: cluster maps (features='maps'), or run "
                "`explain run --method crp --save-maps`"
            )
        pairs.append(_target_concepts(npz, item.get("target_id")))
    layer = str(items[0].get("layer") or "")
    concepts = sorted({c for pair in pairs for c in pair})
    vectors = np.array([[pair.get(c, 0.0) for c in concepts] for pair in pairs], dtype=np.float64)
    names = [str(item["target_name"]) for item in items]
    groups = _grouped(vectors, names, [0.0] * len(items), [f"{layer}:{c}" for c in concepts])
    for group in groups.values():
        _fill(group, items)
    return groups
