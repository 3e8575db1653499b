"""Fuzz: an index directory (issue N): its manifest, and every array and JSON file in it, damaged with the
manifest's checksums left stale (what verification must catch) or recorded anew (what a careless or hostile
rebuild of the manifest leaves, which only the files' own checks can catch). The index is a real hybrid one
(bm25s arrays, MiniLM embeddings, the passage store) over 40 passages; each damaged copy is opened and searched.
Accepted: a search returns k passages of the index with finite scores. Refused: an IndexFormatError (or another
RagateError) naming the index."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
from fuzzing import byte_mutation, dumps, fuzz_settings, json_mutation, refused_or_accepted
from hypothesis import given
from hypothesis import strategies as st

_names = itertools.count()


@pytest.fixture(scope="module")
def hybrid(minilm: Any, wiki_passages: list[Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ragate.retrieval.index import build_index

    root = tmp_path_factory.mktemp("fuzz-index") / "hybrid"
    build_index(wiki_passages, root, "hybrid", encoder=minilm, progress=False)
    return root


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def _search(root: Path, minilm: Any, verify: bool, ids: set[str]) -> None:
    from ragate.retrieval.index import open_index

    with open_index(root, encoder=minilm, verify=verify) as index:
        [hits] = index.search(["Who discovered penicillin?"], 3)
        assert len(hits) == 3 and all(h.passage.id in ids for h in hits)
        assert all(math.isfinite(h.score) for h in hits)


def _ids(hybrid: Path) -> set[str]:
    return {json.loads(line)["id"] for line in (hybrid / "passages.jsonl").read_text().splitlines() if line}


def _copy(hybrid: Path, tmp_path: Path) -> Path:
    root = tmp_path / f"ix-{next(_names)}"
    shutil.copytree(hybrid, root)
    return root


@fuzz_settings
@given(st.data())
def test_fuzz_index_manifest(tmp_path: Path, hybrid: Path, minilm: Any, data: st.DataObject) -> None:
    root = _copy(hybrid, tmp_path)
    manifest = json.loads((root / "manifest.json").read_text())
    if data.draw(st.booleans()):
        raw = dumps(data.draw(json_mutation(manifest)))
    else:
        raw = data.draw(byte_mutation(dumps(manifest)))
    (root / "manifest.json").write_bytes(raw)
    refused_or_accepted(lambda: _search(root, minilm, data.draw(st.booleans()), _ids(hybrid)), root)


@fuzz_settings
@given(st.data())
def test_fuzz_index_files(tmp_path: Path, hybrid: Path, minilm: Any, data: st.DataObject) -> None:
    root = _copy(hybrid, tmp_path)
    name = data.draw(st.sampled_from([f for f in _files(hybrid) if f != "manifest.json"]))
    raw = data.draw(byte_mutation((root / name).read_bytes()))
    (root / name).write_bytes(raw)
    if data.draw(st.booleans()):  # the manifest rewritten to match: only the file's own checks are left
        manifest = json.loads((root / "manifest.json").read_text())
        manifest["files"][name] = {"size": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
        (root / "manifest.json").write_text(json.dumps(manifest))
    refused_or_accepted(lambda: _search(root, minilm, data.draw(st.booleans()), _ids(hybrid)), root)
