"""How a batch job ended: the failures reported on the way, the summary line after Ctrl-C, and the
command line's exit status."""

from __future__ import annotations

import sys

from tqdm import tqdm

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_OUT_OF_MEMORY, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


def exit_code(failed: int, interrupted: bool) -> int:
    """130 when stopped by Ctrl-C, else 1 when some outputs failed, else 0.

    >>> exit_code(0, False), exit_code(2, False), exit_code(2, True)
    (0, 1, 130)
    """
    if interrupted:
        return EXIT_INTERRUPTED
    return EXIT_FAILED if failed else EXIT_OK


def interrupted_summary(text: str) -> str:
    """A summary line ("explain: ...") as it reads after Ctrl-C."""
    return "explain: interrupted, run the same command again to finish. " + text[len("explain: "):]


def report_failure(where: str, error: str) -> None:
    """One failure on stderr, above the progress bar: ``explain: failed: WHERE: ERROR``."""
    tqdm.write(f"explain: failed: {where}: {error}", file=sys.stderr)
