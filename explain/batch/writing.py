"""Drawing and saving one image's outputs for one method: the overlays (one per target or box)
and, with --save-maps, its maps as .npz. Runs in the local engine's writer threads and in the
Ray actors."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..drawing import overlay
from ..report import ManifestRecord, encode_npz, encode_png
from .storage import OutputDeviceError, OutputFolder


@dataclass
class Job:
    """One image's overlays for one method, with their manifest records (``output`` and ``maps``
    name the files); ``marks`` are per map what :func:`~explain.overlay` draws on top (``boxes``
    and ``labels``, ``outline``)."""

    rows: list[ManifestRecord]
    picture: np.ndarray  # (H, W, 3) uint8; for volumes and signals, what their kind draws on
    maps: np.ndarray  # one map per row
    npz: dict | None
    cmap: str
    alpha: float
    signed: bool = False
    marks: list[dict] | None = None
    #: How a map is drawn and encoded, ``draw(picture, map, cmap, alpha, signed) -> bytes``, for
    #: inputs other than images (see :mod:`~explain.batch.kinds`); None: an image overlay as PNG.
    draw: Callable[..., bytes] | None = None

    def write(self, folder: OutputFolder) -> list[ManifestRecord]:
        """Draw and save the files; the records with their status (ok, or failed with the reason).
        The folder's device refusing the write (a full disk) raises
        :class:`~explain.batch.storage.OutputDeviceError`: that stops the run."""
        try:
            for k, (heat, row) in enumerate(zip(self.maps, self.rows, strict=False)):
                if self.draw is not None:
                    folder.write(str(row.output), self.draw(self.picture, heat, self.cmap, self.alpha, self.signed))
                    continue
                drawn = overlay(
                    self.picture,
                    heat,
                    cmap=self.cmap,
                    alpha=self.alpha,
                    signed=self.signed,
                    **(self.marks[k] if self.marks else {}),
                )
                folder.write(str(row.output), encode_png(drawn))
            if self.npz is not None:
                folder.write(str(self.rows[0].maps), encode_npz(**self.npz))
        except OutputDeviceError:
            raise
        except Exception as error:
            return [row.with_status("failed", f"cannot write output: {error}") for row in self.rows]
        return [row.with_status("ok") for row in self.rows]
