"""The per-question JSONL of a run: one record per (question, method), appended and fsync'ed as it finishes, so a
run killed at any moment loses at most the line it was writing, and a resumed run neither loses nor repeats one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Self

from ragate.errors import RunFormatError
from ragate.fileio import atomic_writer


def read_records(path: Path, *, repair: bool = True) -> list[dict[str, Any]]:
    """Every complete record of ``path`` (none if it does not exist). A last line cut short by a kill (anywhere,
    also inside a multi-byte character) is dropped and the file rewritten without it (atomically), so appending
    can go on (``repair=False``: left as it is, for readers of a run another process may be appending to); a bad
    line anywhere else is a :class:`RunFormatError` naming the line, since that is not what a
    kill leaves behind."""
    if not path.exists():
        return []
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    records: list[dict[str, Any]] = []
    cut = False
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            if number == len(lines) or (number == len(lines) - 1 and not lines[-1]):
                cut = True  # the line a kill interrupted
                continue
            why = err.msg if isinstance(err, json.JSONDecodeError) else "not valid UTF-8"
            raise RunFormatError(
                f"{path}, line {number}: not a JSON record ({why}); move the file aside, or delete that line "
                "and rerun with --resume to answer it again"
            ) from None
    if repair and (cut or (raw and not raw.endswith(b"\n"))):  # readers of a live run pass repair=False
        write_records(path, records)
    return records


def latest(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per (id, method), the last written, in the order first seen. A resumed run retries the
    questions that failed, so a failure can be followed by its answer; the answer is what counts."""
    last: dict[tuple[Any, Any], dict[str, Any]] = {}
    for record in records:
        last[record["id"], record.get("method")] = record
    return list(last.values())


def write_records(path: Path, records: Iterable[dict[str, Any]]) -> None:
    """Replace ``path`` with ``records`` atomically."""
    with atomic_writer(path) as f:
        for record in records:
            f.write((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))


class RecordWriter:
    """Appends one JSON line per record, flushed and fsync'ed before :meth:`append` returns."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("a", encoding="utf-8")

    def append(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def by_method(records: Iterable[dict[str, Any]]) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Records grouped by method, methods in first-seen order."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault(r["method"], []).append(r)
    yield from groups.items()
