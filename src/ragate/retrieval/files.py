"""Which files ``ragate index build --docs PATH ...`` reads: files, folders and globs, in a fixed order.

- A file is read as named; its source name (``Passage.source``) is the path as given, normalised (``./a.md`` ->
  ``a.md``). An unsupported suffix on a named file is an error that lists the supported ones.
- A folder is walked recursively in sorted order; hidden files and folders (a name starting with ``.``) and
  folders that hold a ragate index are skipped; each file's source name is the folder as given joined with its
  path below it (``my_docs/a.md``), the same name the file gets when it is named on its own.
- A glob (``*``, ``?``, ``[``; ``**`` matches folders recursively) is expanded here too, so a quoted pattern
  works; matches are sorted and named as matched, a matched folder is walked (its files named below the
  match), hidden names match only a pattern that names them.

Inside folders and glob matches a file with an unsupported suffix is skipped and counted. The same file reached
twice (a folder and a file in it) is read once; two different files with one source name are an error.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ragate.errors import CorpusFormatError, DataNotFoundError
from ragate.retrieval.store import MANIFEST, PASSAGES

# suffix -> reader (see ragate.retrieval.documents.read_file)
SUFFIXES = {
    ".txt": "text",
    ".md": "markdown",
    ".markdown": "markdown",
    ".html": "html",
    ".htm": "html",
    ".jsonl": "jsonl",
    ".pdf": "pdf",
}
NO_SUFFIX = "(no extension)"


@dataclass(frozen=True)
class DocumentFile:
    """A file to read: where it is, and the source name its passages carry."""

    path: Path
    source: str


@dataclass(frozen=True)
class FoundFiles:
    """The supported files, in reading order, and how many files of each unsupported suffix were skipped."""

    files: tuple[DocumentFile, ...]
    unsupported: dict[str, int]


def find_files(paths: Sequence[str | os.PathLike[str]]) -> FoundFiles:
    """The supported files under ``paths`` (files, folders, globs), in argument order, each folder sorted.

    :class:`DataNotFoundError` for a path that does not exist or a glob that matches nothing, or two files with
    one source name; :class:`CorpusFormatError` for a named file of an unsupported type.
    """
    unsupported: dict[str, int] = {}
    out: dict[Path, DocumentFile] = {}
    for arg in paths:
        path = Path(arg).expanduser()
        found: Iterable[DocumentFile]
        if path.is_file():
            if path.suffix.lower() not in SUFFIXES:
                raise CorpusFormatError(
                    f"{path}: unsupported file type {path.suffix or NO_SUFFIX!r}; ragate reads "
                    f"{', '.join(SUFFIXES)} (convert the file, or pass its folder to skip such files)"
                )
            found = [DocumentFile(path, _normal(path))]
        elif path.is_dir():
            found = _walk(path, unsupported, prefix=_folder_prefix(path))
        elif any(c in str(arg) for c in "*?["):
            found = _glob(str(path), unsupported)
        else:
            raise DataNotFoundError(f"{arg}: no such file or folder; check the paths given to --docs")
        for doc_file in found:
            out.setdefault(doc_file.path.resolve(), doc_file)
    sources: dict[str, Path] = {}
    for doc_file in out.values():
        other = sources.setdefault(doc_file.source, doc_file.path)
        if other != doc_file.path:
            raise DataNotFoundError(
                f"{other} and {doc_file.path} would both be stored as {doc_file.source!r}: pass their common "
                "parent folder instead of the two folders, so that the names differ"
            )
    return FoundFiles(tuple(out.values()), unsupported)


def _normal(path: str | Path) -> str:
    return Path(os.path.normpath(path)).as_posix()


def _folder_prefix(folder: Path) -> str:
    """The start of the source names of a folder's files: the folder as given (``my_docs/``; none for ``.``), so
    that a source is a path the user can open, and the same file has the same name whichever way it is named."""
    name = _normal(folder)
    return "" if name == "." else name + "/"


def _is_index(directory: Path) -> bool:
    return (directory / MANIFEST).is_file() and (directory / PASSAGES).is_file()


def _supported(path: Path, unsupported: dict[str, int]) -> bool:
    suffix = path.suffix.lower()
    if suffix in SUFFIXES:
        return True
    key = suffix or NO_SUFFIX
    unsupported[key] = unsupported.get(key, 0) + 1
    return False


def _walk(root: Path, unsupported: dict[str, int], prefix: str = "") -> Iterator[DocumentFile]:
    """The files under ``root``, sorted by their source names: ``prefix`` + the path relative to ``root``."""
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and not _is_index(here / d)]
        found += [
            (prefix + (here / f).relative_to(root).as_posix(), here / f)
            for f in filenames
            if not f.startswith(".")
        ]
    for rel, path in sorted(found):
        if _supported(path, unsupported):
            yield DocumentFile(path, rel)


def _glob(pattern: str, unsupported: dict[str, int]) -> Iterator[DocumentFile]:
    matches = sorted(glob.glob(pattern, recursive=True))
    if not matches:
        raise DataNotFoundError(f"{pattern}: no file matches this pattern; check the globs given to --docs")
    for match in matches:
        path = Path(match)
        if path.is_dir():  # named by the pattern: its files keep the folder in their source names
            yield from _walk(path, unsupported, prefix=_folder_prefix(path))
        elif path.is_file() and _supported(path, unsupported):
            yield DocumentFile(path, _normal(match))
