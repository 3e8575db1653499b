"""Which files ``ragate index build --docs PATH ...`` reads: files, folders and globs, in a fixed order.

- A file is read as named; its source name (``Passage.source``) is the path as given, normalised (``./a.md`` ->
  ``a.md``). An unsupported suffix on a named file is an error that lists the supported ones, and so is a named
  path that is not a regular file (a FIFO, a device).
- A folder is walked recursively in sorted order; hidden files and folders (a name starting with ``.``) and
  folders that hold a ragate index are skipped; each file's source name is the folder as given joined with its
  path below it (``my_docs/a.md``), the same name the file gets when it is named on its own.
- A glob (``*``, ``?``, ``[``; ``**`` matches folders recursively) is expanded here too, so a quoted pattern
  works; matches are sorted and named as matched, a matched folder is walked (its files named below the
  match), hidden names match only a pattern that names them.

Links and special files (one policy for folders and globs): only regular files are read, and nothing outside
the paths given. Inside a folder or below a glob's fixed part,

- a FIFO, socket or device is skipped with a warning, found with ``lstat``/``stat`` and never opened;
- a link is followed only when its target is inside one of the folders (or glob bases, or files) given; a link
  out, a dangling link and a link loop are skipped with a warning. A link to a folder is not walked (the folder
  it points to inside the paths given is walked under its own name), except when a glob matches the link
  itself; so a walk never meets a folder twice and cannot loop;
- a name that is not UTF-8 (which no index file could store) is skipped with a warning that shows its bytes.

Inside folders and glob matches a file with an unsupported suffix is skipped and counted. The same file reached
twice (a folder and a file in it, a link and its target) is read once, under its own name rather than a link's;
two different files with one source name are an error. :func:`read_regular` reads a found file: it opens it
without blocking, refuses anything but a regular file, and refuses one over :data:`MAX_FILE_BYTES`.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ragate.errors import CorpusFormatError, DataNotFoundError
from ragate.retrieval.extract import DamagedFile
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
    # plain-text markup, read as text (the title from its own heading syntax)
    ".rst": "rst",
    ".rest": "rst",
    ".adoc": "asciidoc",
    ".asciidoc": "asciidoc",
    ".org": "org",
    ".textile": "textile",
}
NO_SUFFIX = "(no extension)"
MAX_FILE_BYTES = 256 * 2**20  # one file's bytes are read whole: a larger file is refused, not read
UTF8_FIX = "rename it to UTF-8 (e.g. `convmv -f latin1 -t utf-8 --notest NAME`)"


class NotRegularFile(Exception):
    """A path that is not a regular file (found so when it was opened); the message says what it is."""


@dataclass(frozen=True)
class DocumentFile:
    """A file to read: where it is, and the source name its passages carry."""

    path: Path
    source: str


@dataclass(frozen=True)
class FoundFiles:
    """The supported files, in reading order, how many files of each unsupported suffix were skipped, and the
    paths the link and special-file policy left out (``"path: why"``)."""

    files: tuple[DocumentFile, ...]
    unsupported: dict[str, int]
    skipped: tuple[str, ...] = ()


def shown(path: str | os.PathLike[str]) -> str:
    """A path as text that prints and encodes as UTF-8: bytes of a name that are not UTF-8 as ``\\xNN``."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # os.fsdecode turned bytes that are not UTF-8 into lone surrogates
        return False
    return True


def special_kind(mode: int) -> str:
    """What a file that is not regular is, for a message."""
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "a special file"


def read_regular(path: Path, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file. Opened without blocking (a FIFO put in its place since it was found does not
    hang the read) and checked by ``fstat`` before reading: :class:`NotRegularFile` for anything else,
    ``DamagedFile`` for a file over ``limit`` bytes or one that cannot be opened."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        raise DamagedFile(f"cannot be opened ({err.strerror}); check that it exists and that you may read it")
    with open(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFile(f"{special_kind(info.st_mode)}, not a regular file")
        data = f.read(limit + 1) if info.st_size <= limit else b""
    if info.st_size > limit or len(data) > limit:
        size = max(info.st_size, len(data))
        raise DamagedFile(
            f"{size / 2**20:,.1f} MB, over the {limit // 2**20:,} MB ragate reads from one file; split it into "
            "smaller files"
        )
    return data


# ----------------------------------------------------------------------------------------------- finding


@dataclass
class _Search:
    """One :func:`find_files` call: the real paths links may lead into, and what it counts and skips."""

    roots: tuple[str, ...]
    unsupported: dict[str, int] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    def inside(self, target: str) -> bool:
        return any(target == root or target.startswith(root.rstrip("/") + "/") for root in self.roots)

    def supported(self, name: str) -> bool:
        suffix = Path(name).suffix.lower()
        if suffix in SUFFIXES:
            return True
        key = suffix or NO_SUFFIX
        self.unsupported[key] = self.unsupported.get(key, 0) + 1
        return False


@dataclass(frozen=True)
class _Entry:
    """One name met in a folder: a folder (``dir``, ``linked-dir``: a link to one inside the paths given), a
    regular file (``file``, ``linked-file``) or a path the policy leaves out (``skip``, with ``why``)."""

    rel: tuple[str, ...]
    path: Path
    kind: Literal["dir", "file", "linked-dir", "linked-file", "skip"]
    why: str = ""
    folder: bool = False  # a skipped folder (or a link to one)


def _classify(path: Path, rel: tuple[str, ...], search: _Search) -> _Entry:
    """What one path below a folder is under the policy; ``lstat``/``stat`` only, nothing is opened."""
    try:
        info = path.lstat()
    except OSError as err:
        return _Entry(rel, path, "skip", f"cannot be read ({err.strerror})")
    linked = stat.S_ISLNK(info.st_mode)
    if linked:
        try:
            target = os.path.realpath(path, strict=True)
            info = os.stat(target)
        except OSError as err:
            if err.errno == errno.ELOOP:
                return _Entry(rel, path, "skip", "a link that loops back on itself")
            why = (
                "which does not exist"
                if err.errno == errno.ENOENT
                else f"which cannot be followed ({err.strerror})"
            )
            return _Entry(rel, path, "skip", f"a link to {shown(os.readlink(path))}, {why}")
        if not search.inside(target):
            if stat.S_ISDIR(info.st_mode):
                why = f"a link to a folder outside the folders given to --docs ({shown(target)})"
                return _Entry(rel, path, "skip", why, folder=True)
            return _Entry(
                rel, path, "skip", f"a link to {shown(target)}, outside the folders given to --docs"
            )
    folder = stat.S_ISDIR(info.st_mode)
    if not _utf8(rel[-1]):
        return _Entry(rel, path, "skip", f"its name is not UTF-8; {UTF8_FIX}", folder=folder)
    if folder:
        return _Entry(rel, path, "linked-dir" if linked else "dir", folder=True)
    if stat.S_ISREG(info.st_mode):
        return _Entry(rel, path, "linked-file" if linked else "file")
    return _Entry(rel, path, "skip", f"{special_kind(info.st_mode)}, not a regular file")


def _is_index(directory: Path) -> bool:
    return (directory / MANIFEST).is_file() and (directory / PASSAGES).is_file()


def _scan(
    top: Path,
    search: _Search,
    *,
    hidden: bool = False,
    descend: Callable[[tuple[str, ...]], bool] | None = None,
) -> Iterator[_Entry]:
    """Every name below ``top`` (hidden ones only if ``hidden``), folders before what is in them, without
    entering a link to a folder, a folder holding an index, a folder seen before (a bind mount's loop) or one
    ``descend`` refuses."""
    seen: set[tuple[int, int]] = set()
    stack: list[tuple[tuple[str, ...], Path]] = [((), top)]
    while stack:
        rel, here = stack.pop()
        try:
            info = os.stat(here)
            if (info.st_dev, info.st_ino) in seen:
                continue
            seen.add((info.st_dev, info.st_ino))
            with os.scandir(here) as listing:
                names = sorted(entry.name for entry in listing)
        except OSError as err:
            yield _Entry(rel, here, "skip", f"cannot be listed ({err.strerror})", folder=True)
            continue
        below: list[tuple[tuple[str, ...], Path]] = []
        for name in names:
            if name.startswith(".") and not hidden:
                continue
            entry = _classify(here / name, (*rel, name), search)
            if entry.kind == "dir" and _is_index(entry.path):
                continue
            yield entry
            if entry.kind == "dir" and (descend is None or descend(entry.rel)):
                below.append((entry.rel, entry.path))
        stack.extend(reversed(below))


def _walk(folder: Path, search: _Search, prefix: str) -> Iterator[tuple[DocumentFile, bool]]:
    """The supported files below ``folder``, sorted by their source names: ``prefix`` + the path below it; each
    with whether it was reached through a link."""
    found: list[tuple[str, Path, bool]] = []
    for entry in _scan(folder, search):
        source = prefix + "/".join(entry.rel)
        if entry.kind in ("file", "linked-file"):
            if search.supported(entry.rel[-1]):
                found.append((source, entry.path, entry.kind == "linked-file"))
        elif entry.kind == "skip" and (entry.folder or search.supported(entry.rel[-1])):
            search.skipped.append(f"{shown(source)}: {entry.why}")
    for source, path, linked in sorted(found):
        yield DocumentFile(path, source), linked


def _magic(text: str) -> bool:
    return any(c in text for c in "*?[")


def _split_glob(pattern: Path) -> tuple[Path, tuple[str, ...]]:
    """A glob's fixed folder (the parts before the first one with a wildcard) and the parts from there on."""
    parts = pattern.parts
    first = next(i for i, part in enumerate(parts) if _magic(part))
    return (Path(*parts[:first]) if first else Path(".")), parts[first:]


def _part_matches(pattern: str, name: str) -> bool:
    return fnmatch.fnmatchcase(name, pattern) and (not name.startswith(".") or pattern.startswith("."))


def glob_matches(pattern: Sequence[str], parts: Sequence[str], *, partial: bool = False) -> bool:
    """Whether the path ``parts`` matches the glob ``pattern`` (both split at ``/``) as :func:`glob.glob` with
    ``recursive=True`` matches: ``**`` is any number of folders, no wildcard matches a hidden name unless the
    pattern's part starts with ``.``. ``partial``: whether ``parts`` can be the start of a match."""
    if not parts:
        return partial or all(p == "**" for p in pattern)
    if not pattern:
        return False
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return glob_matches(rest, parts, partial=partial) or (
            not parts[0].startswith(".") and glob_matches(pattern, parts[1:], partial=partial)
        )
    return _part_matches(head, parts[0]) and glob_matches(rest, parts[1:], partial=partial)


def _glob(pattern: Path, search: _Search) -> Iterator[tuple[DocumentFile, bool]]:
    """The files a glob matches, and the files of the folders it matches, under the same policy as a walk."""
    base, parts = _split_glob(pattern)
    matched: list[tuple[str, _Entry]] = []
    if base.is_dir():
        if glob_matches(parts, ()):
            matched.append((_normal(base), _Entry((), base, "dir")))
        else:

            def descend(rel: tuple[str, ...]) -> bool:  # a folder a match may lie in, not one matched whole
                return glob_matches(parts, rel, partial=True) and not glob_matches(parts, rel)

            for entry in _scan(base, search, hidden=True, descend=descend):
                skipped_folder = entry.folder and entry.kind == "skip"
                if glob_matches(parts, entry.rel) or (skipped_folder and descend(entry.rel)):
                    matched.append((_normal(base.joinpath(*entry.rel)), entry))
    if not matched:
        raise DataNotFoundError(f"{pattern}: no file matches this pattern; check the globs given to --docs")
    for source, entry in sorted(matched, key=lambda m: m[0]):
        if entry.kind in ("dir", "linked-dir"):  # a folder matched: its files keep it in their source names
            for doc_file, linked in _walk(entry.path, search, _folder_prefix(Path(source))):
                yield doc_file, linked or entry.kind == "linked-dir"
        elif entry.kind == "skip":
            if entry.folder or search.supported(source):
                search.skipped.append(f"{shown(source)}: {entry.why}")
        elif search.supported(source):
            yield DocumentFile(entry.path, source), entry.kind == "linked-file"


def _normal(path: str | Path) -> str:
    return Path(os.path.normpath(path)).as_posix()


def _folder_prefix(folder: Path) -> str:
    """The start of the source names of a folder's files: the folder as given (``my_docs/``; none for ``.``), so
    that a source is a path the user can open, and the same file has the same name whichever way it is named."""
    name = _normal(folder)
    return "" if name == "." else name + "/"


def _root(path: Path) -> str | None:
    """The real path of a folder or file given (a glob: its fixed folder), which links may lead into."""
    if not os.path.exists(path) and _magic(str(path)):
        path = _split_glob(path)[0]
    return os.path.realpath(path) if os.path.exists(path) else None


def _named(path: Path, arg: str | os.PathLike[str], search: _Search) -> Iterator[tuple[DocumentFile, bool]]:
    """The files one argument names: a file, a folder or a glob."""
    try:
        info = os.stat(path)
    except OSError:
        info = None
    if info is None and _magic(str(path)):
        yield from _glob(path, search)
    elif info is None:
        if os.path.lexists(path):
            raise DataNotFoundError(
                f"{path}: a link that leads nowhere (its target is missing, or it loops); fix the link or leave "
                "it out of --docs"
            )
        raise DataNotFoundError(f"{arg}: no such file or folder; check the paths given to --docs")
    elif stat.S_ISDIR(info.st_mode):
        yield from _walk(path, search, _folder_prefix(path))
    elif not stat.S_ISREG(info.st_mode):
        raise CorpusFormatError(
            f"{path}: {special_kind(info.st_mode)}, not a regular file; ragate reads regular files only "
            "(save the text to a file and pass that)"
        )
    elif path.suffix.lower() not in SUFFIXES:
        raise CorpusFormatError(
            f"{path}: unsupported file type {path.suffix or NO_SUFFIX!r}; ragate reads "
            f"{', '.join(SUFFIXES)} (convert the file, or pass its folder to skip such files)"
        )
    else:
        yield DocumentFile(path, _normal(path)), False


def find_files(paths: Sequence[str | os.PathLike[str]]) -> FoundFiles:
    """The supported files under ``paths`` (files, folders, globs), in argument order, each folder sorted.

    :class:`DataNotFoundError` for a path that does not exist or a glob that matches nothing, or two files with
    one source name; :class:`CorpusFormatError` for a named file of an unsupported type or one that is not a
    regular file. What the link and special-file policy leaves out is in ``skipped``.
    """
    named = [Path(arg).expanduser() for arg in paths]
    for path in named:
        if not _utf8(str(path)):
            raise DataNotFoundError(
                f"{shown(path)}: the path is not UTF-8, which an index cannot store; {UTF8_FIX}"
            )
    search = _Search(tuple(root for root in map(_root, named) if root is not None))
    out: dict[str, DocumentFile] = {}
    through_link: set[str] = set()
    for arg, path in zip(paths, named, strict=True):
        for doc_file, linked in _named(path, arg, search):
            real = os.path.realpath(doc_file.path)
            if real in out and (linked or real not in through_link):
                continue  # read once: under the name that reached it first, or its own name over a link's
            out[real] = doc_file
            if linked:
                through_link.add(real)
            else:
                through_link.discard(real)
    sources: dict[str, Path] = {}
    for doc_file in out.values():
        other = sources.setdefault(doc_file.source, doc_file.path)
        if other != doc_file.path:
            raise DataNotFoundError(
                f"{other} and {doc_file.path} would both be stored as {doc_file.source!r}: pass their common "
                "parent folder instead of the two folders, so that the names differ"
            )
    return FoundFiles(tuple(out.values()), search.unsupported, tuple(search.skipped))


def covers(paths: Sequence[str | os.PathLike[str]], source: str) -> bool:
    """Whether a file named ``source`` would be found under ``paths`` if it were there: it is below a folder
    given, matched by a glob given (or below a folder one matches), or is a file given."""
    parts = tuple(source.split("/"))
    for arg in paths:
        path = Path(arg).expanduser()
        if path.is_dir():
            prefix = _folder_prefix(path)
            if source.startswith(prefix) or (not prefix and not source.startswith(("/", "../"))):
                return True
        elif not path.exists() and _magic(str(path)):
            pattern = tuple(_normal(path).split("/"))
            if any(glob_matches(pattern, parts[:n]) for n in range(1, len(parts) + 1)):
                return True
        elif source == _normal(path):
            return True
    return False
