"""The device a model is loaded onto, checked before the model is built: a device that this
machine lacks is a ``ValueError`` that says what to pass, not torch's error from deep inside
``Module.to``."""

from __future__ import annotations

import torch

__all__ = ["checked_device"]


def checked_device(device: torch.device | str) -> torch.device:
    """``device`` as a :class:`torch.device`, where this machine has it.

    >>> checked_device("cpu")
    device(type='cpu')
    >>> checked_device("gpu")
    Traceback (most recent call last):
    ...
    ValueError: unknown device 'gpu'; pass 'cpu', 'cuda', 'cuda:N' or 'mps'
    """
    try:
        found = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {device!r}; pass 'cpu', 'cuda', 'cuda:N' or 'mps'") from None
    if found.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch is a CPU-only build" if torch.version.cuda is None else "no CUDA device or driver found"
            raise ValueError(
                f"device={str(device)!r}: CUDA is not available on this machine ({why}); pass device='cpu'"
            )
        count = torch.cuda.device_count()
        if found.index is not None and found.index >= count:
            raise ValueError(
                f"device={str(device)!r}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
            )
    if found.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(
            f"device={str(device)!r}: MPS (Apple GPUs) is not available on this machine; pass device='cpu'"
        )
    return found
