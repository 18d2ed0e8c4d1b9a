"""Which score to explain: turning the ``targets`` argument into class ids and scores."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "CUSTOM_TARGET",
    "Targets",
    "class_index",
    "class_logits",
    "custom_target",
    "did_you_mean",
    "output_rows",
    "select_targets",
]

#: The class id recorded when the score comes from a callable rather than a class.
CUSTOM_TARGET = -1
_INTEGER_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)

Targets = int | str | Sequence[int | str] | Tensor | np.ndarray | Callable[[Tensor], Tensor] | None


def class_index(name: str, class_names: Sequence[str] | None) -> int:
    """The id of the class called ``name`` (exact, then case-insensitive match).

    >>> class_index("Tabby", ["tabby", "tiger cat"])
    0
    """
    if not class_names:
        raise ValueError(
            f"target {name!r} is a class name but the model carries no class names; pass a class "
            "id, or give class_names= to the explainer"
        )
    matches = [i for i, n in enumerate(class_names) if n == name]
    if not matches:
        matches = [i for i, n in enumerate(class_names) if n.lower() == name.lower()]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ValueError(f"class name {name!r} is ambiguous (ids {matches}); pass the class id")
    raise ValueError(f"unknown class name {name!r}{did_you_mean(name, class_names)}")


def did_you_mean(name: str, class_names: Sequence[str]) -> str:
    """The class names closest to ``name`` (case ignored), as the end of an error message ("" where
    none is close).

    >>> did_you_mean("Tabbby", ["tabby", "tiger cat", "espresso"])
    "; did you mean: 'tabby'?"
    """
    names: dict[str, str] = {}
    for known in class_names:
        names.setdefault(known.lower(), known)
    close = difflib.get_close_matches(name.lower(), list(names), n=5, cutoff=0.6)
    return f"; did you mean: {', '.join(repr(names[c]) for c in close)}?" if close else ""


def custom_target(targets: Targets) -> Callable[[Tensor], Tensor] | None:
    """The callable target (a function of the model's output that gives each image's score)
    that ``targets`` is, or None where ``targets`` names classes.

    >>> custom_target(lambda output: output[:, 0]) is not None, custom_target([1, 2]), custom_target(None)
    (True, None, None)
    """
    return targets if callable(targets) and not isinstance(targets, Tensor) else None


def class_logits(output):
    """The class logits in a model output: the output itself, the ``"logits"`` entry of a
    mapping (a Hugging Face ``ModelOutput`` is one), the ``logits`` field of a named tuple
    (torchvision's ``GoogLeNetOutputs``, a model's own), or the one tensor of a mapping that
    holds a single (N, num_classes) tensor under another name (Hugging Face's PP-LCNet
    classifier returns its logits as ``last_hidden_state``); anything else is returned as it is.

    >>> class_logits({"logits": torch.zeros(1, 3)}).shape
    torch.Size([1, 3])
    >>> class_logits({"last_hidden_state": torch.zeros(1, 3)}).shape
    torch.Size([1, 3])
    """
    if isinstance(output, Mapping):
        if "logits" in output:
            return output["logits"]
        tensors = [value for value in output.values() if isinstance(value, Tensor)]
        if len(tensors) == 1 and len(output) == 1 and tensors[0].dim() == 2:
            return tensors[0]
    if isinstance(output, tuple) and "logits" in getattr(output, "_fields", ()):
        return output.logits  # type: ignore[attr-defined]  # a named tuple's field
    return output


def _custom_scores(logits, target: Callable, topk: int | None) -> tuple[Tensor, Tensor]:
    """The scores a callable target picks from the model output, one float per image, with
    :data:`CUSTOM_TARGET` as their ids."""
    if topk is not None:
        raise ValueError("pass either a callable target or topk, not both")
    scores = target(logits)
    n = output_rows(logits)
    if not isinstance(scores, Tensor) or scores.shape != (n,):
        got = tuple(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__
        raise ValueError(f"a callable target must return a tensor of shape ({n},), one score per image; got {got}")
    if not scores.is_floating_point():
        raise ValueError(f"a callable target must return float scores (e.g. logits), got {scores.dtype}")
    ids = torch.full((n,), CUSTOM_TARGET, dtype=torch.long, device=scores.device)
    return scores, ids


def _checked_logits(output, class_names: Sequence[str] | None) -> Tensor:
    """The model output's (N, num_classes) class logits; ValueError where it has none, or
    where ``class_names`` has another length."""
    logits = class_logits(output)
    if not isinstance(logits, Tensor) or logits.dim() != 2:
        got = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise ValueError(
            f"the model returned {got}, not (N, num_classes) logits; pass a callable target "
            "that maps the model output to one score per image"
        )
    num_classes = logits.shape[1]
    if class_names is not None and len(class_names) != num_classes:
        raise ValueError(f"got {len(class_names)} class names for a model with {num_classes} outputs")
    return logits


def select_targets(
    logits: Tensor,
    targets: Targets = None,
    *,
    topk: int | None = None,
    class_names: Sequence[str] | None = None,
) -> tuple[Tensor, Tensor]:
    """Resolve ``targets`` against the model output.

    Returns ``(scores, ids)``: both of shape (N,), or (N, k) when ``topk=k``. ``scores`` is
    still attached to the graph so it can be back-propagated; ``ids`` is a detached long
    tensor, with :data:`CUSTOM_TARGET` where a callable chose the score.

    >>> logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 1.0]])
    >>> select_targets(logits)[1].tolist()
    [1, 0]
    >>> select_targets(logits, topk=2)[1].tolist()
    [[1, 2], [0, 2]]
    >>> select_targets(logits, [2, 2])[0].tolist()
    [1.0, 1.0]
    """
    if isinstance(targets, np.integer):
        targets = int(targets)
    if isinstance(topk, np.integer):
        topk = int(topk)
    custom = custom_target(targets)
    if custom is not None:
        return _custom_scores(logits, custom, topk)
    logits = _checked_logits(logits, class_names)
    n, num_classes = logits.shape
    if topk is not None:
        if targets is not None:
            raise ValueError("pass either targets or topk, not both")
        if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= num_classes:
            raise ValueError(f"topk must be an int between 1 and {num_classes}, got {topk!r}")
        ids = logits.detach().topk(topk, dim=1).indices
    elif targets is None:
        ids = logits.detach().argmax(dim=1)
    else:
        ids = _class_ids(targets, n, num_classes, class_names).to(logits.device)
    rows = torch.arange(n, device=logits.device)
    scores = logits[rows[:, None], ids] if ids.dim() == 2 else logits[rows, ids]
    return scores, ids


def output_rows(output) -> int:
    """The number of images a model output is for: its tensor's first axis, or one dict per
    image (torchvision's detectors).

    >>> output_rows({"out": torch.zeros(3, 21, 8, 8)}), output_rows([{"boxes": torch.zeros(0, 4)}])
    (3, 1)
    """
    if isinstance(output, Tensor):
        return output.shape[0]
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], Tensor):
        return output[0].shape[0]
    if isinstance(output, list) and output and all(isinstance(item, dict) for item in output):
        return len(output)  # one dict per image, as torchvision's detectors return
    if isinstance(output, dict) and output:
        return output_rows(next(iter(output.values())))
    raise ValueError(f"cannot tell the batch size of a model output of type {type(output).__name__}")


def _is_rows(targets) -> bool:
    """Whether ``targets`` holds a list of targets per image: (N, k)."""
    if isinstance(targets, (Tensor, np.ndarray)):
        return targets.ndim == 2
    return (
        isinstance(targets, Sequence)
        and not isinstance(targets, (str, bytes))
        and len(targets) > 0
        and all(
            (isinstance(row, Sequence) and not isinstance(row, (str, bytes)))
            or (isinstance(row, (Tensor, np.ndarray)) and row.ndim == 1)
            for row in targets
        )
    )


def _class_ids(targets, n: int, num_classes: int, class_names) -> Tensor:
    if _is_rows(targets):
        if len(targets) != n:
            raise ValueError(f"got target lists for {len(targets)} images, but there are {n} images")
        rows = [_class_ids(row, len(row), num_classes, class_names) for row in targets]
        if len({len(row) for row in rows}) != 1 or len(rows[0]) == 0:
            raise ValueError("with several targets per image, give every image the same number (at least one)")
        return torch.stack(rows)
    if isinstance(targets, (Tensor, np.ndarray)):
        if targets.ndim == 0:
            targets = targets.item()
        else:
            if targets.ndim != 1:
                raise ValueError(
                    f"targets must be one class per image, shape ({n},), or k per image, shape ({n}, k); "
                    f"got {tuple(targets.shape)}"
                )
            if (isinstance(targets, Tensor) and targets.is_floating_point()) or (
                isinstance(targets, np.ndarray) and targets.dtype.kind not in "iu"
            ):
                raise ValueError(f"targets must hold integer class ids, got dtype {targets.dtype}")
            targets = targets.tolist()
    if isinstance(targets, (int, str)) and not isinstance(targets, bool):
        targets = [targets] * n
    if not isinstance(targets, Sequence) or isinstance(targets, (str, bytes)):
        raise TypeError(
            "targets must be None, a class id, a class name, a list with one of them per image, "
            f"or a callable; got {type(targets).__name__}"
        )
    if len(targets) != n:
        raise ValueError(
            f"got {len(targets)} targets for {n} images; pass one target per image or a single one for all"
        )
    ids = []
    for target in targets:
        if (
            isinstance(target, (Tensor, np.ndarray))
            and target.ndim == 0
            and (target.dtype in _INTEGER_DTYPES if isinstance(target, Tensor) else target.dtype.kind in "iu")
        ):
            target = int(target)  # one element of an id tensor, such as ids[i]
        if isinstance(target, str):
            target = class_index(target, class_names)
        elif isinstance(target, (bool, float)) or not isinstance(target, (int, np.integer)):
            raise TypeError(f"a target must be a class id (int) or a class name (str), not {target!r}")
        if not 0 <= target < num_classes:
            raise ValueError(
                f"class id {target} is out of range: the model has {num_classes} classes (0..{num_classes - 1})"
            )
        ids.append(int(target))
    return torch.tensor(ids, dtype=torch.long)
