"""The library's own error for a mistake in what it was asked to do, and what counts as memory
running out."""

import sys


class UsageError(Exception):
    """A mistake in the options; the message says how to fix it."""


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is memory running out: torch's ``OutOfMemoryError`` (CUDA, MPS), an
    allocation of CPU memory that failed (the ``RuntimeError`` of torch's CPU allocator, under
    ``ulimit -v`` or a container's limit) or Python's ``MemoryError``.

    >>> is_out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes"))
    True
    >>> is_out_of_memory(RuntimeError("shape mismatch"))
    False
    """
    torch = sys.modules.get("torch")
    if isinstance(error, MemoryError) or (torch is not None and isinstance(error, torch.OutOfMemoryError)):
        return True
    return isinstance(error, RuntimeError) and "can't allocate memory" in str(error)


def out_of_memory_reason(reason: str) -> bool:
    """Whether a failure recorded as ``"Type: message"`` is memory running out."""
    return reason.startswith(("OutOfMemoryError:", "MemoryError")) or "can't allocate memory" in reason


def first_line(error: BaseException) -> str:
    """The first line of ``error``'s message, or its type's name where it has none (a bare
    ``MemoryError()``).

    >>> first_line(RuntimeError("shape mismatch\\nat layer 3")), first_line(MemoryError())
    ('shape mismatch', 'MemoryError')
    """
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
