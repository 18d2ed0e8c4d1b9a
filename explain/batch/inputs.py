"""Finding the images: inputs from files, folders, globs and lists, and their output names
(the tree of the inputs mirrored under --out). Free of torch: the Ray engine's driver plans with it."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from ..images import IMAGE_EXTENSIONS
from ..options import MODEL_FILE_SUFFIXES, VIDEO_MODELS

#: Files of volumes, videos and signals, found in folders for models that may take them
#: (see :mod:`~explain.batch.kinds`).
ARRAY_AND_VIDEO_EXTENSIONS = frozenset({".npy", ".gif"})


@dataclass
class Source:
    """One input image and where its outputs go."""

    input: str  # as found from the command line; the manifest's `input`
    path: str  # absolute
    base: str = ""  # absolute: the folder argument it was found in, else its own folder
    folder: str = ""  # output subfolder that mirrors the input tree, posix style
    stem: str = ""  # start of its output names
    error: str | None = None
    listed: bool = False  # found in a folder or by a glob, rather than named


def input_extensions(model: str) -> frozenset[str]:
    """The extensions of the files folders are searched for, for the model ``model`` names:
    images, and for a video model or a model file (which may take volumes or signals) .npy
    arrays and videos too, which the run keeps or leaves out once it knows what the model takes."""
    maybe_arrays = model in VIDEO_MODELS or Path(model).suffix.lower() in MODEL_FILE_SUFFIXES
    return IMAGE_EXTENSIONS | ARRAY_AND_VIDEO_EXTENSIONS if maybe_arrays else frozenset(IMAGE_EXTENSIONS)


def collect_inputs(arguments: list[str], out_dir: Path, extensions: frozenset[str] | None = None) -> list[Source]:
    """Expand files, folders, globs and @lists into sources, without duplicates, and lay out
    their outputs (see :class:`InputListing`); folders are searched for ``extensions``
    (default: images)."""
    return list(InputListing(arguments, out_dir, extensions))


class InputListing:
    """The images that files, folders, globs and @lists name, as a stream of sources without
    duplicates, with their outputs laid out: the tree under the common parent of the folder
    arguments (and of the files' own folders) is mirrored under --out, and names that would
    clash get the extension or an underscore.

    Nothing is held whole, so that a list of millions of paths plans in bounded memory: the
    inputs are expanded once per pass (one to find the common parent, one to count the names
    that clash, one to yield), and the passes remember paths and names by their hashes.
    Mistakes in the arguments (a missing file or folder, a glob that matches nothing) are
    :class:`UsageError` s raised when the listing is made. Images inside ``out_dir`` are left
    out (``None``: an output folder given by URI, which holds no input).
    """

    def __init__(self, arguments: list[str], out_dir: Path | None, extensions: frozenset[str] | None = None):
        self.arguments = list(arguments)
        self.extensions = frozenset(IMAGE_EXTENSIONS) if extensions is None else extensions
        self.out_abs = os.path.abspath(out_dir) if out_dir is not None else None
        root = present_root = None
        self.count = self.failed = 0
        missing: list[str] = []
        for source in self._expanded():
            self.count += 1
            root = source.base if root is None else os.path.commonpath([root, source.base])
            if source.error is None:
                present_root = source.base if present_root is None else os.path.commonpath([present_root, source.base])
            elif len(missing) < 3:
                missing.append(f"{source.input} ({source.error})")
            self.failed += source.error is not None
        if not self.count:
            raise UsageError(
                f"no images found in {' '.join(arguments)}; folders are searched (recursively, hidden files "
                f"left out) for files ending {extension_list(self.extensions)} (in any case)"
            )
        self.root = present_root if present_root is not None else root
        if missing:
            shown = ", ".join(missing) + (", ..." if self.failed > len(missing) else "")
            print(
                f"explain: {self.failed} input(s) cannot be read and are recorded as failed: {shown}", file=sys.stderr
            )

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[Source]:
        once: set[int] = set()
        clashing: set[int] = set()
        for source in self._expanded():
            key = hash((self._folder(source), Path(utf8_name(source.path)).stem.lower()))
            (clashing if key in once else once).add(key)
        del once
        taken: set[int] = set()
        for source in self._expanded():
            source.folder = self._folder(source)
            name = Path(utf8_name(source.path)).name
            unique = hash((source.folder, Path(name).stem.lower())) not in clashing
            source.stem = Path(name).stem if unique else name
            while hash((source.folder, source.stem.lower())) in taken:  # e.g. a.png and a.png.jpg beside a.jpg
                source.stem += "_"
            taken.add(hash((source.folder, source.stem.lower())))
            yield source

    def inputs(self) -> Iterator[str]:
        """The inputs as found (the manifest's ``input``), in one expansion, not laid out."""
        for source in self._expanded():
            yield source.input

    def _folder(self, source: Source) -> str:
        folder = os.path.relpath(os.path.dirname(source.path), self.root)
        return "" if folder == "." or folder.startswith("..") else Path(utf8_name(folder)).as_posix()

    def _expanded(self) -> Iterator[Source]:
        """The sources in argument order, each path once; folder and stem not laid out yet."""
        seen: set[int] = set()
        for argument in self.arguments:
            for path, base, error in self._expand(argument, from_list=False):
                absolute = os.path.abspath(path)
                key = hash(absolute)
                if key not in seen and not _inside(absolute, self.out_abs):
                    seen.add(key)
                    base_folder = os.path.abspath(base or os.path.dirname(absolute))
                    yield Source(path, absolute, base_folder, error=error, listed=base is not None)

    def _expand(self, argument: str, from_list: bool) -> Iterator[tuple[str, str | None, str | None]]:
        """(path, the folder argument it was found in, error) for each image an argument names."""
        if argument.startswith("@") and not from_list:
            for line in _read_list(argument[1:]):
                yield from self._expand(line, from_list=True)
        elif os.path.isdir(argument):
            for path, error in _walk_images(argument, self.out_abs, self.extensions):
                yield path, argument, error
        elif os.path.exists(argument):
            yield argument, None, None
        elif any(char in argument for char in "*?["):
            import glob

            matches = sorted(glob.glob(argument, recursive=True))
            if not matches and not from_list:
                raise UsageError(f"no files match {argument!r}")
            for match in matches:
                if os.path.isdir(match):
                    for path, error in _walk_images(match, self.out_abs, self.extensions):
                        yield path, match, error
                elif Path(match).suffix.lower() in self.extensions:
                    yield match, None, None
        elif from_list:
            yield argument, None, "file not found"
        else:
            raise UsageError(f"{argument}: no such file or folder")


#: The extensions a message about what folders are searched for names first.
COMMON_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff", ".gif", ".npy")


def extension_list(extensions: frozenset[str]) -> str:
    """``extensions`` for a message: the common ones first, then the rest in order.

    >>> extension_list(frozenset({".qoi", ".png", ".avif", ".jpg"}))
    '.jpg, .png, .avif, .qoi'
    """
    common = [extension for extension in COMMON_EXTENSIONS if extension in extensions]
    return ", ".join(common + sorted(extensions - set(common)))


def utf8_name(name: str) -> str:
    r"""``name`` as an output name: the bytes of a file name that are not UTF-8 (which Python
    holds as surrogate escapes) become U+FFFD, so that every output name is valid UTF-8, as
    object stores, HTML and JSON readers need. The input keeps its own name in the manifest.

    >>> utf8_name(os.fsdecode(b"caf\xe9.png")) == "caf\ufffd.png"
    True
    """
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _inside(path: str, folder: str | None) -> bool:
    if folder is None:
        return False
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


#: The longest line of a list file: a path is at most 4096 bytes on Linux (PATH_MAX).
MAX_LIST_LINE = 16384


def _read_list(list_file: str) -> Iterator[str]:
    """The entries of a list file, one per line, read as a stream; blank lines and # comments
    skipped. Bytes that are not UTF-8 are kept as the surrogate escapes Python uses for such
    file names (``os.fsdecode``), so they name the same files."""
    try:
        # opened before the `with`, so that only open's errors become the usage error
        file = open(list_file, encoding="utf-8", errors="surrogateescape")  # noqa: SIM115
    except OSError as error:
        raise UsageError(f"cannot read list file @{list_file}: {error.strerror or error}") from None
    with file:
        number = 0
        while line := file.readline(MAX_LIST_LINE + 1):
            number += 1
            if len(line) > MAX_LIST_LINE and not line.endswith("\n"):
                raise UsageError(
                    f"list file @{list_file}: line {number} is longer than {MAX_LIST_LINE} characters, "
                    "so it is no path; give a text file with one image path per line"
                )
            if "\0" in line:
                raise UsageError(
                    f"list file @{list_file}: line {number} holds a NUL byte; give a text file with one "
                    "image path per line"
                )
            if line.strip() and not line.lstrip().startswith("#"):
                yield line.strip()


def _walk_images(folder: str, out_abs: str | None, extensions: frozenset[str]) -> list[tuple[str, str | None]]:
    """(path, error) of the files with ``extensions`` under ``folder``, sorted, skipping hidden
    entries and the output folder; a subfolder that cannot be listed is one entry with its error."""
    found: list[tuple[str, str | None]] = []

    def unlisted(error: OSError) -> None:
        reason = "permission denied" if isinstance(error, PermissionError) else (error.strerror or str(error)).lower()
        found.append((error.filename or folder, f"cannot list this folder: {reason}"))

    for root, dirs, files in os.walk(folder, onerror=unlisted):
        dirs[:] = sorted(
            d for d in dirs if not d.startswith(".") and not _inside(os.path.abspath(os.path.join(root, d)), out_abs)
        )
        found.extend(
            (os.path.join(root, name), None)
            for name in sorted(files)
            if not name.startswith(".") and Path(name).suffix.lower() in extensions
        )
    return found
