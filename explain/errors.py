"""The library's own error for a mistake in what it was asked to do, and what counts as memory
running out."""

import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: The options whose command-line flag is not their name with dashes (``methods`` is set by
#: ``--method``, one method at a time or comma-separated).
FLAG_SPELLINGS = {"methods": "--method", "method_options": "--method-option"}


@dataclass(frozen=True)
class Option:
    """An option that a :class:`UsageError` is about, by its Python name: the field of the
    batch layer's options (``max_memory``, ``methods``), which the caller words as its own
    (``--max-memory`` on the command line, ``max_memory`` for
    :func:`~explain.ray_data.explain_dataset`).

    >>> Option("max_memory").flag, Option("methods").flag
    ('--max-memory', '--method')
    """

    name: str

    @property
    def flag(self) -> str:
        """How the command line spells it: the name with dashes, or ``FLAG_SPELLINGS``'."""
        return FLAG_SPELLINGS.get(self.name) or "--" + self.name.replace("_", "-")


def worded(parts: Iterable[str | Option], names: Mapping[str, str] | None = None) -> str:
    """``parts`` as text, each :class:`Option` called ``names[option.name]``, or where ``names``
    has none (or is None) by its flag: :meth:`UsageError.worded`, for notes that are not errors.

    >>> worded(["leave ", Option("engine"), " ray out"])
    'leave --engine ray out'
    """
    names = names or {}
    return "".join(part if isinstance(part, str) else names.get(part.name, part.flag) for part in parts)


class UsageError(Exception):
    """A mistake in the options; the message says how to fix it.

    The message is its ``parts``: text, and the :class:`Option` s it is about as data, so that
    each caller names them in its own words (:meth:`worded`). ``str(error)`` is the command
    line's wording, each option as its flag; :func:`~explain.ray_data.explain_dataset` words
    the same error with its parameters' names.

    >>> error = UsageError(Option("max_memory"), " 2XB: give a size such as 2GB; see ", Option("device"))
    >>> str(error)
    '--max-memory 2XB: give a size such as 2GB; see --device'
    >>> error.worded({"max_memory": "max_memory"}), error.options
    ('max_memory 2XB: give a size such as 2GB; see --device', (Option(name='max_memory'), Option(name='device')))
    """

    def __init__(self, *parts: str | Option) -> None:
        super().__init__(*parts)  # the parts as the args: the error pickles (Ray) with its options
        self.parts = parts

    @property
    def options(self) -> tuple[Option, ...]:
        """The options the message is about, in its order."""
        return tuple(part for part in self.parts if isinstance(part, Option))

    def worded(self, names: Mapping[str, str] | None = None) -> str:
        """The message with each option called ``names[option.name]``, or where ``names`` has
        none (or is None) by its flag."""
        return worded(self.parts, names)

    def __str__(self) -> str:
        return self.worded()


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
