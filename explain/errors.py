"""The library's own error for a mistake in what it was asked to do, and what counts as memory
running out."""

import re
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
    """Whether a failure recorded as ``"Type: message"`` (or by :func:`failure_reason`) is
    memory running out."""
    return reason.startswith((OUT_OF_MEMORY, "OutOfMemoryError:", "MemoryError")) or "can't allocate memory" in reason


#: How :func:`failure_reason` starts the reason of a failure for memory running out.
OUT_OF_MEMORY = "out of memory: "


def failure_reason(error: BaseException) -> str:
    """How a failed output records ``error``: ``"Type: message"``, or where memory ran out
    ``"out of memory: ..."`` in words (the CPU allocator's text says what it could not have).

    >>> failure_reason(ValueError("bad target"))
    'ValueError: bad target'
    >>> failure_reason(RuntimeError("[enforce fail at alloc_cpu.cpp:117] . DefaultCPUAllocator: can't allocate "
    ...                             "memory: you tried to allocate 822083584 bytes. Error code 12"))
    'out of memory: the CPU allocator could not have 784 MiB more'
    """
    if not is_out_of_memory(error):
        return f"{type(error).__name__}: {error}"
    asked = re.search(r"tried to allocate (\d+) bytes", str(error))
    if asked:
        return f"{OUT_OF_MEMORY}the CPU allocator could not have {int(asked.group(1)) / 2**20:,.0f} MiB more"
    return OUT_OF_MEMORY + first_line(error)


def first_line(error: BaseException) -> str:
    """The first line of ``error``'s message, or its type's name where it has none (a bare
    ``MemoryError()``).

    >>> first_line(RuntimeError("shape mismatch\\nat layer 3")), first_line(MemoryError())
    ('shape mismatch', 'MemoryError')
    """
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
