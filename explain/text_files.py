"""Reading the text files a user hands in (an ``@list`` of images, ``--labels``, ``--regions``)
in bounded memory: line by line, each line at most :data:`MAX_LINE` characters, so that a file
without line ends (``/dev/zero``, a binary file given by mistake) is refused at its first long
line rather than read whole; and CSV records (:func:`csv_records`) with the csv module's field
limit. Every refusal is a ``ValueError`` that names the file and the line."""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator

__all__ = ["MAX_LINE", "bounded_lines", "csv_records"]

#: The longest line of a file a user hands in: a path is at most 4096 bytes on Linux
#: (PATH_MAX), and a CSV line of a path and a few numbers or a class name is not much longer.
MAX_LINE = 16384


def bounded_lines(path: str | os.PathLike, what: str, hint: str, *, newline: str | None = None) -> Iterator[str]:
    """The lines of the text file at ``path`` (UTF-8, a BOM dropped; bytes that are not UTF-8
    kept as the surrogate escapes Python uses for such file names), read as a stream, line
    ends kept. A line over :data:`MAX_LINE` characters or with a NUL byte is a ``ValueError``:
    ``"{what}: line N is longer than 16384 characters; {hint}"``. ``newline`` is :func:`open`'s
    (``""`` for the csv module). A file that cannot be opened raises the ``OSError``."""
    with open(path, encoding="utf-8-sig", errors="surrogateescape", newline=newline) as file:
        number = 0
        while line := file.readline(MAX_LINE + 1):
            number += 1
            if len(line) > MAX_LINE and not line.endswith(("\n", "\r")):
                raise ValueError(f"{what}: line {number} is longer than {MAX_LINE} characters; {hint}")
            if "\0" in line:
                raise ValueError(f"{what}: line {number} holds a NUL byte; {hint}")
            yield line


def csv_records(path: str | os.PathLike, what: str, hint: str) -> Iterator[tuple[int, list[str]]]:
    """(line number, cells) of each record of the CSV file at ``path``, read as a stream by the
    csv module (a quoted cell may hold commas, line ends and any character, U+2028 included),
    within :func:`bounded_lines`' limits and the csv module's field limit
    (``csv.field_size_limit()``); a malformed record is a ``ValueError`` naming ``what`` and the
    line. The number is the record's last line."""
    reader = csv.reader(bounded_lines(path, what, hint, newline=""))
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as error:
            raise ValueError(f"{what}: line {reader.line_num}: {error}; {hint}") from None
        yield reader.line_num, cells
