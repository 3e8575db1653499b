"""File helpers shared by every layer: atomic writes and streaming sha256."""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import sys
import tempfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, cast

from tqdm.auto import tqdm

HASH_CHUNK = 1 << 22
BOM = b"\xef\xbb\xbf"


@contextmanager
def atomic_writer(path: Path | str) -> Iterator[IO[bytes]]:
    """A binary file that appears at ``path`` only when the block ends without error: written to a temporary
    file in the same directory, flushed, fsynced, then ``os.replace``-d. ``.gz`` paths are gzip-compressed
    (mtime 0, so equal content gives equal bytes)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as raw:
            if path.name.lower().endswith(".gz"):
                with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
                    yield cast(IO[bytes], gz)
            else:
                yield raw
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def sha256_file(path: Path | str, *, progress: bool = False) -> str:
    """Hex sha256 of a file, read in 4 MiB chunks (with a byte progress bar when ``progress``)."""
    path = Path(path)
    digest = hashlib.sha256()
    with (
        path.open("rb") as f,
        tqdm(
            total=path.stat().st_size,
            unit="B",
            unit_scale=True,
            desc=f"sha256 {path.name}",
            disable=not progress,
        ) as bar,
    ):
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


def json_lines(path: Path | str, error: type[Exception], fix: str) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) for every non-blank line of a JSON-lines file (``.gz`` read compressed); a
    line that is not UTF-8 or not JSON raises ``error`` naming the file and the line (and the column), followed
    by ``fix``. A byte-order mark at the start of the file is dropped."""
    path = Path(path)
    for line_no, raw in enumerate(_raw_lines(path, error), start=1):
        if line_no == 1:
            raw = raw.removeprefix(BOM)  # an editor's byte-order mark is not part of the first line
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise error(f"{path}:{line_no}: not valid UTF-8; {fix}") from None
        if not line.strip():
            continue
        yield line_no, parse_json(line, f"{path}:{line_no}", error, fix)


def _raw_lines(path: Path, error: type[Exception]) -> Iterator[bytes]:
    """The lines of ``path`` as bytes (``.gz`` read compressed); a truncated or corrupt gzip stream raises
    ``error`` naming the file."""
    if path.suffix != ".gz":
        with path.open("rb") as f:
            yield from f
        return
    line_no = 0
    try:
        with gzip.open(path, "rb") as f:
            for line_no, raw in enumerate(f, start=1):
                yield raw
    except (gzip.BadGzipFile, EOFError, zlib.error) as err:
        raise error(
            f"{path}: the gzip stream is truncated or corrupt after line {line_no} ({err}); re-create or "
            "re-download the file"
        ) from None


def utf8_text(path: Path | str, error: type[Exception], fix: str) -> str:
    """The whole of a UTF-8 text file (``.gz`` read compressed); invalid UTF-8 raises ``error`` naming the file
    and the line, followed by ``fix``. A byte-order mark at the start is dropped."""
    path = Path(path)
    raw = path.read_bytes()
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (gzip.BadGzipFile, EOFError, zlib.error) as err:
            raise error(
                f"{path}: the gzip stream is truncated or corrupt ({err}); re-create or re-download the file"
            ) from None
    raw = raw.removeprefix(BOM)  # an editor's byte-order mark is not text
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise error(f"{path}:{line}: not valid UTF-8; {fix}") from None


def parse_json(text: str, where: str, error: type[Exception], fix: str) -> Any:
    """``json.loads(text)``; text that is not JSON raises ``error`` naming ``where``, followed by ``fix``. Besides
    bad syntax that covers what ``json.loads`` raises other than ``JSONDecodeError``: a number of more than 4,300
    digits (``ValueError``) and nesting deeper than the interpreter's recursion limit (``RecursionError``)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        at = f"line {err.lineno} column {err.colno}" if err.lineno > 1 else f"column {err.colno}"
        raise error(f"{where}: not valid JSON ({err.msg} at {at}); {fix}") from None
    except (ValueError, RecursionError) as err:
        why = "nested too deeply" if isinstance(err, RecursionError) else str(err).split(";")[0]
        raise error(f"{where}: not valid JSON ({why}); {fix}") from None


def finite_json(value: Any) -> tuple[Any, int]:
    """``value`` with every NaN or infinity replaced by None (JSON has neither: Python's ``json`` would write
    ``Infinity``, which no JSON parser reads), and how many were replaced."""
    if isinstance(value, float) and not math.isfinite(value):
        return None, 1
    if isinstance(value, dict):
        pairs = [(k, finite_json(v)) for k, v in value.items()]
        return {k: v for k, (v, _) in pairs}, sum(n for _, (_, n) in pairs)
    if isinstance(value, list | tuple):
        items = [finite_json(v) for v in value]
        return [v for v, _ in items], sum(n for _, n in items)
    return value, 0


def lone_surrogate(value: Any) -> str | None:
    """Where a parsed JSON value (strings, lists, objects' keys and values) holds a lone UTF-16 surrogate, which a
    ``\\ud800``-style escape can write but UTF-8 cannot encode (a tokenizer or any UTF-8 writer fails on it): a
    short description of the first such string, else None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            return f"the text {value[max(0, err.start - 20) : err.start + 1]!r} holds a lone surrogate"
        return None
    if isinstance(value, dict):
        value = [*value.keys(), *value.values()]
    for item in value if isinstance(value, list) else ():
        found = lone_surrogate(item)
        if found is not None:
            return found
    return None


@contextmanager
def exclusive_lock(lock_path: Path | str, what: str, *, wait: bool = False) -> Iterator[None]:
    """Hold an advisory lock (``flock``) on ``lock_path`` for the block, so one process at a time works on
    ``what`` (a run directory, an index's --out); a second gets a :class:`~ragate.errors.RagateError` naming the
    holder's PID, or with ``wait`` says on stderr that it waits for that process and then takes the lock (a
    shared first-run artefact, the demo index: the second process then uses what the first built). The lock
    goes with the process, so a killed holder never leaves it taken (only its file, which the next holder
    reuses); the file is removed when the block ends."""
    import fcntl

    from ragate.errors import RagateError

    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            if wait:
                print(f"ragate: waiting for another ragate process (pid {holder}) to finish {what}", file=sys.stderr)
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    if os.stat(lock_path).st_ino == os.fstat(fd).st_ino:
                        break
                except FileNotFoundError:
                    pass
                os.close(fd)
                continue
            os.close(fd)
            raise RagateError(
                f"{what} is in use by another ragate process (pid {holder}): wait for it to finish or stop "
                "it, or use another --out"
            ) from None
        try:
            if os.stat(lock_path).st_ino == os.fstat(fd).st_ino:
                break  # still the file at that path (not one its last holder removed meanwhile)
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        lock_path.unlink(missing_ok=True)  # while still holding it: the next holder makes a new file
        os.close(fd)
