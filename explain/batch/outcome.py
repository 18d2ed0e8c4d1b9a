"""How a batch job ended: the failures reported on the way, the summary line after Ctrl-C, and the
command line's exit status."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterable

from tqdm import tqdm

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_OUT_OF_MEMORY, EXIT_OUTPUT_DEVICE = 0, 1, 2, 3, 4
#: Stopped by Ctrl-C (SIGINT) or by SIGTERM: 128 + the signal's number, as shells report it.
EXIT_INTERRUPTED, EXIT_TERMINATED = 128 + signal.SIGINT, 128 + signal.SIGTERM


def exit_code(
    failed: int, interrupted: bool, device_error: bool = False, out_of_memory: bool = False, terminated: bool = False
) -> int:
    """4 when the output folder's device refused a write (full, read-only, ...), else 130 when
    stopped by Ctrl-C (143 by SIGTERM), else 3 when outputs failed for memory running out
    (the device's limit: every image would need more), else 1 when some outputs failed, else 0.

    >>> exit_code(0, False), exit_code(2, False), exit_code(2, True), exit_code(2, True, device_error=True)
    (0, 1, 130, 4)
    >>> exit_code(2, False, out_of_memory=True), exit_code(2, True, terminated=True)
    (3, 143)
    """
    if device_error:
        return EXIT_OUTPUT_DEVICE
    if interrupted:
        return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
    if out_of_memory:
        return EXIT_OUT_OF_MEMORY
    return EXIT_FAILED if failed else EXIT_OK


def out_of_memory_note(count: int) -> str:
    """What the run says on stderr where ``count`` outputs failed for memory running out."""
    return (
        f"explain: error: {count} output(s) failed for out of memory: this is the device's limit, not the "
        "images': free the device's memory (or raise the process's limit: ulimit -v, a container's), pass a "
        "smaller --max-memory or --batch-size or fewer methods, or --device cpu; the same command makes them "
        "once there is room"
    )


def interrupted_summary(text: str) -> str:
    """A summary line ("explain: ...") as it reads after Ctrl-C: where Ctrl-C came before any
    image was finished, no longer "nothing left to do".

    >>> interrupted_summary("explain: 0 done now, 0 failed; nothing left to do; see out/index.html")
    'explain: interrupted, run the same command again to finish. 0 done now, 0 failed; no images explained; see out/index.html'
    """  # noqa: E501 -- the doctest's expected output is one line
    body = text[len("explain: ") :].replace("nothing left to do", "no images explained")
    return "explain: interrupted, run the same command again to finish. " + body


def stopped_summary(error: Exception, text: str) -> str:
    """A summary line ("explain: ...") as it reads after the output folder's device refused a
    write (:class:`~explain.batch.storage.OutputDeviceError`).

    >>> stopped_summary("cannot write to out: no space left on device", "explain: 2 ok, ...")[:60]
    'explain: stopped: cannot write to out: no space left on devi'
    """
    return (
        f"explain: stopped: {error}; what was written before it is kept: make room there (or make it "
        f"writable) and run the same command again to finish. {text[len('explain: ') :]}"
    )


def report_failure(where: str, error: str) -> None:
    """One failure on stderr, above the progress bar: ``explain: failed: WHERE: ERROR``."""
    tqdm.write(f"explain: failed: {where}: {error}", file=sys.stderr)


def report_failures(rows: Iterable[dict]) -> None:
    """The failed manifest ``rows`` on stderr, each image's once per reason (its methods and
    targets failed alike)."""
    reported = set()
    for row in rows:
        if row["status"] == "failed" and (row["input"], row["error"]) not in reported:
            reported.add((row["input"], row["error"]))
            report_failure(row["input"], row["error"])
