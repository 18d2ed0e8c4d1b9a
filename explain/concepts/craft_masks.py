"""CRAFT's importances (:mod:`explain.concepts.craft`): the class's logit with each image's
concept coefficients multiplied by masks, the layers after the target replayed
(:class:`~explain.methods.layer_replay.LayerReplay`) in the cheapest way the model allows."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from ..methods import LayerReplay
from ..targets import class_logits
from ..tokens import TokenLayout
from .sobol import jansen_total_indices

__all__ = ["REPLAY_BYTES", "ConceptMasking"]

#: The memory the masked activations of one replay pass may take (rows of all the images'
#: designs together: few passes of many rows are faster than many of a few).
REPLAY_BYTES = 2**28


@dataclass
class ConceptMasking:
    """The class's logit of each image with its concept coefficients multiplied by masks,
    the later layers replayed in as many rows a pass as ``REPLAY_BYTES`` hold."""

    replay: LayerReplay
    bank: Tensor  # (k, C) the concepts (CraftConcepts.bank)
    layout: TokenLayout  # where the layer's positions lie in its output
    target: int  # the class
    coefficients: Tensor  # (N, k, positions)
    negative: Tensor | None  # (N, C, h, w) the part the concepts leave as it was
    layer_output: Tensor

    def importances(self, masks: Tensor) -> Tensor:
        """(N, k) each image's total-order Sobol indices over ``masks`` (:func:`.sobol_designs`)."""
        k = self.coefficients.shape[1]
        basis = torch.cat([torch.zeros(1, k), torch.eye(k)]).to(masks)  # no concept, each alone
        affine = self.replay.affine  # (each traces the tail: once)
        start = None if affine else self.replay.affine_start()
        if affine:
            # the layers after are affine in the activation, itself linear in the mask: the
            # logit of any mask m is f(0) + sum_j m_j (f(e_j) - f(0)), from k + 1 replays an
            # image instead of one a mask (equal up to float rounding)
            outputs = self(basis)
            scores = outputs[:, :1] + (outputs[:, 1:] - outputs[:, :1]) @ masks.T
        elif start is not None:
            scores = self._through(start, basis, masks)
        else:
            scores = self(masks)
        return torch.stack([jansen_total_indices(row, k) for row in scores.cpu()])

    def __call__(self, masks: Tensor) -> Tensor:
        """(N, len(masks)) the logits, ``masks`` (M, k)."""
        logits = [self._logit(self.replay(changed, rows)) for rows, changed in self._changed(masks)]
        return torch.cat(logits).view(len(self.coefficients), -1)

    def _changed(self, masks: Tensor) -> Iterator[tuple[Tensor, Tensor]]:
        """(rows, activations in the layer's layout) of every image with its coefficients
        multiplied by each mask, as many rows at a time as ``REPLAY_BYTES`` hold."""
        n, device = len(self.coefficients), self.coefficients.device
        owners = torch.arange(n, device=device).repeat_interleave(len(masks))
        designs = torch.arange(len(masks), device=device).repeat(n)
        step = max(1, min(len(owners), REPLAY_BYTES // (4 * 3 * self.layer_output[0].numel())))
        bank = self.bank.to(self.coefficients).T  # (C, k)
        layout, tokens = self.layout, self.layout.kind == "tokens"
        for start in range(0, len(owners), step):
            rows, mask = owners[start : start + step], masks[designs[start : start + step]]
            changed = (bank @ (mask[:, :, None] * self.coefficients[rows])).view(len(rows), *self.shape)
            if self.negative is not None:
                changed = changed + self.negative[rows]
            like = self.layer_output[rows] if tokens else self.layer_output  # read for tokens only
            yield rows, layout.to_layer(changed, like)

    def _through(self, start: tuple, basis: Tensor, masks: Tensor) -> Tensor:
        """(N, len(masks)) the logits where the later layers start affine: what that start
        passes on for each mask is the masks' weighted sum of its values for the ``basis``
        (k + 1 runs of the start an image), then only the rest runs for each mask. Checked
        first on the basis against the replays (else every mask is replayed, with a warning)."""
        head, rest = start
        passed = [head(changed, rows) for rows, changed in self._changed(basis)]
        n, owners = len(self.coefficients), torch.arange(len(self.coefficients), device=masks.device)
        values = [torch.cat(parts).view(n, len(basis), *parts[0].shape[1:]) for parts in zip(*passed, strict=True)]
        dtype = values[0].dtype  # the model's; mixed in float32
        split = rest([value.flatten(0, 1).clone() for value in values], owners.repeat_interleave(len(basis)))
        replayed = self(basis)
        scale = float(replayed.abs().max()) if replayed.numel() else 0.0  # (the logits' own scale)
        if not torch.allclose(self._logit(split).view(n, -1), replayed, rtol=1e-3, atol=1e-4 * max(scale, 1e-30)):
            warnings.warn(
                "the layers after the target split where they stop being affine did not reproduce "
                "the replays; replaying every mask instead (slower, same result)",
                RuntimeWarning,
                stacklevel=4,
            )
            return self(masks)
        flat = [value.flatten(2).float() for value in values]  # each (N, k + 1, size)
        per = max(1, REPLAY_BYTES // (4 * len(masks) * sum(value.shape[2] for value in flat)))  # images a pass
        scores = []
        for first in range(0, n, per):
            images = owners[first : first + per]
            mixed = [
                (value[images, :1] + masks.float() @ (value[images, 1:] - value[images, :1]))
                .reshape(-1, *full.shape[2:])
                .to(dtype)
                for value, full in zip(flat, values, strict=True)
            ]
            scores.append(self._logit(rest(mixed, images.repeat_interleave(len(masks)))).view(len(images), -1))
        return torch.cat(scores)

    def _logit(self, output) -> Tensor:
        return class_logits(output)[:, self.target].float()

    @property
    def shape(self) -> tuple[int, ...]:
        """(C, h, w) of the layer's grid."""
        h_w = self.layout.to_spatial(self.layer_output[:1]).shape[2:]
        return (self.bank.shape[1], *h_w)
