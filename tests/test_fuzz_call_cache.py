"""Fuzz: the call cache (one SQLite file of zlib-compressed JSON values). A damaged file is either still usable
(every read returns a stored value or a miss, which is recomputed) or refused, naming the file (issue N)."""

from __future__ import annotations

import itertools
import sqlite3
from pathlib import Path

import pytest
from fuzzing import byte_mutation, fuzz_settings, refused_or_accepted
from hypothesis import given
from hypothesis import strategies as st

from ragate.eval.calls import CallStore

_names = itertools.count()


@pytest.fixture(scope="module")
def cache_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("calls") / "calls.sqlite"
    store = CallStore(path)
    for i in range(40):
        store.put(f"k{i}", {"generations": [{"text": f"answer {i}" * 20}], "seconds": 0.1, "cpu_seconds": 0.1})
    store.close()
    db = sqlite3.connect(path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # every page in the main file
    db.execute("PRAGMA journal_mode=DELETE")
    db.close()
    return path.read_bytes()


def _use(path: Path) -> None:
    store = CallStore(path)
    try:
        for i in range(40):
            value = store.get(f"k{i}")
            assert value is None or isinstance(value, dict)
        store.put("new", {"generations": []})
        assert store.get("new") == {"generations": []}
    finally:
        store.close()


@fuzz_settings
@given(st.data())
def test_fuzz_call_cache_bytes(tmp_path: Path, cache_bytes: bytes, data: st.DataObject) -> None:
    path = tmp_path / f"calls-{next(_names)}.sqlite"
    path.write_bytes(data.draw(byte_mutation(cache_bytes)))
    refused_or_accepted(lambda: _use(path), path)
