"""What the commands share: the argument types of the parser, the check of an analysis's
``--out``, and the rewording of a library message with the command line's flags."""

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


def as_flags(message: str, flags: dict[str, str]) -> str:
    """``message`` (a library error's) with each of the library's words in ``flags`` replaced
    by the command line's (``{"relu=True": "--relu"}``)."""
    for words, flag in flags.items():
        message = message.replace(words, flag)
    return message
