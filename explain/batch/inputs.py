"""Finding the images: inputs from files, folders, globs and lists, and their output names
(the tree of the inputs mirrored under --out). Free of torch: the Ray engine's driver plans with it."""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from ..images import IMAGE_EXTENSIONS
from ..options import MODEL_FILE_SUFFIXES, VIDEO_MODELS
from ..text_files import MAX_LINE, bounded_lines

#: Files of volumes, videos and signals, found in folders for models that may take them
#: (see :mod:`~explain.batch.kinds`).
ARRAY_AND_VIDEO_EXTENSIONS = frozenset({".npy", ".gif"})
#: The start of the names of the Ray engine's plan folders (and its actors' rows) under --out.
PLAN_PREFIX = ".explain-ray-plan-"
#: What makes a folder the output folder of an explain command, so that a folder found among
#: the inputs is skipped rather than its overlays explained: both files of a pair (explain
#: run's manifest and explorer, explain evaluate's scores and explorer), the lease of a run
#: on a folder given by URI (:data:`~explain.batch.guards.LEASE`), or a Ray plan folder.
RUN_FOLDER_FILES = (("manifest.jsonl", "index.html"), ("scores.csv", "index.html"))
RUN_FOLDER_LEASE = ".explain.lock"


def run_folder_marks(names: set[str]) -> str | None:
    """What among a folder's ``names`` shows it to be a run's output folder, in words; None
    where nothing does.

    >>> run_folder_marks({"manifest.jsonl", "index.html", "a.png"})
    'manifest.jsonl and index.html'
    >>> run_folder_marks({"manifest.jsonl", "a.png"}) is None
    True
    """
    for pair in RUN_FOLDER_FILES:
        if all(name in names for name in pair):
            return " and ".join(pair)
    if RUN_FOLDER_LEASE in names:
        return RUN_FOLDER_LEASE
    return next((f"{name}/" for name in sorted(names) if name.startswith(PLAN_PREFIX)), None)


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
        #: Other runs' output folders found among the inputs (skipped): absolute path -> the
        #: folder as the inputs named it, and what shows it to be one
        self.run_folders: dict[str, tuple[str, str]] = {}
        self._plain_folders: set[str] = set()  # folders of glob matches, read and found plain
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
        for folder, marks in self.run_folders.values():
            print(
                f"explain: skipped {folder}: the output folder of another run (it holds {marks}); "
                "name its files to explain them",
                file=sys.stderr,
            )
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
            for path, error in self._walk_images(argument):
                yield path, argument, error
        elif os.path.exists(argument):
            yield argument, None, None
        elif any(char in argument for char in "*?["):
            import glob

            matches = sorted(glob.glob(argument, recursive=True))
            if not matches and not from_list:
                raise UsageError(f"no files match {argument!r}")
            top = os.path.abspath(_fixed_part(argument))
            for match in matches:
                if self._below_run_folder(match, top):
                    continue
                if os.path.isdir(match):
                    for path, error in self._walk_images(match):
                        yield path, match, error
                elif Path(match).suffix.lower() in self.extensions:
                    yield match, None, None
        elif from_list:
            yield argument, None, "file not found"
        else:
            raise UsageError(f"{argument}: no such file or folder")

    def _is_run_folder(self, folder: str, names: set[str] | None = None) -> bool:
        """Whether ``folder`` is another run's output folder (``names``: its entries, where
        known); those found are kept for the note (as the inputs named them), and the folders
        that a glob's matches lie in are read once."""
        key = os.path.abspath(folder)
        if key in self.run_folders or key in self._plain_folders:
            return key in self.run_folders
        if _inside(key, self.out_abs):  # this run's own, left out apart
            return False
        if names is None:
            try:
                names = set(os.listdir(folder))
            except OSError:
                names = set()
            self._plain_folders.add(key)
        marks = run_folder_marks(names)
        if marks is not None:
            self.run_folders[key] = (folder, marks)
        return marks is not None

    def _below_run_folder(self, path: str, top: str) -> bool:
        """Whether a glob's match ``path`` lies in a run's output folder below ``top``, the
        folder the glob's fixed part names (which the user pointed to on purpose)."""
        folder = path if os.path.isdir(path) else os.path.dirname(path)
        while folder and _inside(os.path.abspath(folder), top) and os.path.abspath(folder) != top:
            if self._is_run_folder(folder):
                return True
            folder = os.path.dirname(folder)
        return False

    def _walk_images(self, folder: str) -> list[tuple[str, str | None]]:
        """(path, error) of the files with the listing's extensions under ``folder``, sorted,
        skipping hidden entries, the output folder and other runs' output folders; a subfolder
        that cannot be listed is one entry with its error."""
        found: list[tuple[str, str | None]] = []

        def unlisted(error: OSError) -> None:
            reason = (
                "permission denied" if isinstance(error, PermissionError) else (error.strerror or str(error)).lower()
            )
            found.append((error.filename or folder, f"cannot list this folder: {reason}"))

        for root, dirs, files in os.walk(folder, onerror=unlisted):
            if self._is_run_folder(root, {*dirs, *files}):
                dirs.clear()
                continue
            dirs[:] = sorted(
                d
                for d in dirs
                if not d.startswith(".") and not _inside(os.path.abspath(os.path.join(root, d)), self.out_abs)
            )
            found.extend(
                (os.path.join(root, name), None)
                for name in sorted(files)
                if not name.startswith(".") and Path(name).suffix.lower() in self.extensions
            )
        return found


def _fixed_part(pattern: str) -> str:
    """The folder a glob pattern names before its first wildcard (``.`` where it starts with one).

    >>> _fixed_part("photos/*/x.png"), _fixed_part("**/*.png")
    ('photos', '.')
    """
    import glob

    fixed: list[str] = []
    for part in pattern.split(os.sep):
        if glob.has_magic(part):
            break
        fixed.append(part)
    return os.sep.join(fixed) or (os.sep if pattern.startswith(os.sep) else ".")


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


#: The longest line of a list file (:data:`~explain.text_files.MAX_LINE`).
MAX_LIST_LINE = MAX_LINE


def _read_list(list_file: str) -> Iterator[str]:
    """The entries of a list file, one per line, read as a stream; blank lines and # comments
    skipped. Bytes that are not UTF-8 are kept as the surrogate escapes Python uses for such
    file names (``os.fsdecode``), so they name the same files."""
    lines = bounded_lines(list_file, f"list file @{list_file}", "give a text file with one image path per line")
    try:
        # the first line read before the loop, so that only opening's errors become this usage error
        first = next(lines, None)
    except OSError as error:
        raise UsageError(f"cannot read list file @{list_file}: {error.strerror or error}") from None
    except ValueError as error:
        raise UsageError(str(error)) from None
    if first is None:
        return
    try:
        for line in itertools.chain([first], lines):
            if line.strip() and not line.lstrip().startswith("#"):
                yield line.strip()
    except ValueError as error:
        raise UsageError(str(error)) from None
