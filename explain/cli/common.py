"""What the commands share: the argument types of the parser, and the check of an analysis's
``--out``."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import UsageError


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def check_out(out: Path, *written) -> None:
    """Refuse, before the work, an ``--out`` that an analysis's writer would not replace (a
    folder of other files: :func:`explain.analysis.files.check_replaceable`, which takes
    ``written``: its marker file, the files it writes and what it holds)."""
    from ..analysis.files import check_replaceable

    try:
        check_replaceable(out.absolute(), *written)
    except ValueError as error:
        raise UsageError(f"--out {error}") from None
