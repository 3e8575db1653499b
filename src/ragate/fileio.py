"""File helpers shared by every layer: atomic writes and streaming sha256."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, cast

from tqdm.auto import tqdm

HASH_CHUNK = 1 << 22


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
    by ``fix``."""
    path = Path(path)
    opener: Any = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise error(f"{path}:{line_no}: not valid UTF-8; {fix}") from None
            if not line.strip():
                continue
            try:
                yield line_no, json.loads(line)
            except json.JSONDecodeError as err:
                raise error(
                    f"{path}:{line_no}: not valid JSON ({err.msg} at column {err.colno}); {fix}"
                ) from None


def utf8_text(path: Path | str, error: type[Exception], fix: str) -> str:
    """The whole of a UTF-8 text file (``.gz`` read compressed); invalid UTF-8 raises ``error`` naming the file
    and the line, followed by ``fix``."""
    path = Path(path)
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise error(f"{path}:{line}: not valid UTF-8; {fix}") from None


@contextmanager
def exclusive_lock(lock_path: Path | str, what: str) -> Iterator[None]:
    """Hold an advisory lock (``flock``) on ``lock_path`` for the block, so one process at a time works on
    ``what`` (a run directory, an index's --out); a second gets a :class:`~ragate.errors.RagateError` naming the
    holder's PID. The lock goes with the process, so a killed holder never leaves it taken (only its file,
    which the next holder reuses); the file is removed when the block ends."""
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
