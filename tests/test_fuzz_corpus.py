"""Fuzz: corpus files (``ragate index build --corpus``: ragate JSONL, FlashRAG JSONL, DPR TSV, gzipped) and your
own documents (``--docs``: .jsonl, .txt, .md, .html, .pdf, and the index's ``documents.json`` that ``ragate index
add`` reads back; issue N). Each file starts as real passages (tests/data/wiki_passages.jsonl) or the fixture
documents (tests/fixtures/docs). A mutated file is either read as passages an encoder and the index writer can take
(unique non-empty ids, text without lone surrogates; a file whose only change is a BOM in front reads the same),
or refused with a RagateError naming it; ``--skip-bad`` counts what it skips."""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from fuzzing import byte_mutation, dumps, fuzz_settings, json_mutation, refused_or_accepted
from hypothesis import given
from hypothesis import strategies as st

from ragate.errors import CorpusFormatError, DataNotFoundError, IndexFormatError
from ragate.retrieval.corpus import ReadStats, read_passages
from ragate.retrieval.documents import DOCUMENTS, DocumentStats, _read_all, index_documents, read_records
from ragate.retrieval.files import DocumentFile
from ragate.retrieval.pooled import ChunkSettings
from ragate.retrieval.types import Passage

TESTS = Path(__file__).parent
ROWS = [json.loads(line) for line in (TESTS / "data" / "wiki_passages.jsonl").read_text().splitlines()[:4]]
DOCS = TESTS / "fixtures" / "docs"
BOM = b"\xef\xbb\xbf"
_names = itertools.count()


def _jsonl(rows: Any) -> bytes:
    if not isinstance(rows, list):
        return dumps(rows) + b"\n"
    return b"".join(dumps(row) + b"\n" for row in rows)


def _flashrag(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"id": r["id"], "contents": f'"{r["title"]}"\n{r["text"]}'} for r in rows]


def _tsv(rows: list[dict[str, Any]]) -> bytes:
    lines = ["id\ttext\ttitle", *(f"{r['id']}\t{r['text']}\t{r['title']}" for r in rows)]
    return ("\n".join(lines) + "\n").encode()


ORIGINALS = {".jsonl": _jsonl(ROWS), ".flashrag.jsonl": _jsonl(_flashrag(ROWS)), ".tsv": _tsv(ROWS)}


def _well_formed(passages: list[Passage], data: bytes) -> None:
    assert len({p.id for p in passages}) == len(passages)
    for p in passages:
        assert isinstance(p.id, str) and p.id.strip() and isinstance(p.title, str) and isinstance(p.text, str)
        # the index writer and the encoder encode these
        (p.id + p.title + p.text + (p.source or "")).encode("utf-8")
    if not passages:  # nothing read: the file held nothing but blank lines (or a TSV header)
        text = data.removeprefix(BOM).decode("utf-8", "replace").strip()
        assert text in ("", "id\ttext\ttitle"), f"a non-blank corpus gave no passages: {data[:80]!r}"


def _read(tmp_path: Path, data: bytes, suffix: str, *, gz: bool = False) -> list[Passage] | None:
    path = tmp_path / f"corpus-{next(_names)}{suffix}{'.gz' if gz else ''}"
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    passages = refused_or_accepted(lambda: list(read_passages(path)), path)
    if passages is not None:
        _well_formed(passages, data)
    stats = ReadStats()  # --skip-bad: every line is read or counted; only a broken gzip stream stops it
    skipped = refused_or_accepted(lambda: list(read_passages(path, skip_bad=True, stats=stats)), path)
    if skipped is not None:
        _well_formed(skipped, data if not stats.skipped else b"")
        assert stats.passages == len(skipped)
        if passages is not None:
            assert skipped == passages and stats.skipped == 0
    if data == BOM + ORIGINALS.get(suffix, b"-"):
        assert passages == list(read_passages(_write(tmp_path, ORIGINALS[suffix], suffix)))
    return passages


def _write(tmp_path: Path, data: bytes, suffix: str) -> Path:
    path = tmp_path / f"corpus-{next(_names)}{suffix}"
    path.write_bytes(data)
    return path


# ------------------------------------------------------------------------------------------------ the properties


@fuzz_settings
@given(st.data())
def test_fuzz_corpus_bytes(tmp_path: Path, data: st.DataObject) -> None:
    suffix = data.draw(st.sampled_from(sorted(ORIGINALS)))
    _read(tmp_path, data.draw(byte_mutation(ORIGINALS[suffix])), suffix)


@fuzz_settings
@given(st.data())
def test_fuzz_corpus_values(tmp_path: Path, data: st.DataObject) -> None:
    rows = ROWS if data.draw(st.booleans()) else _flashrag(ROWS)
    _read(tmp_path, _jsonl(data.draw(json_mutation(rows))), ".jsonl")


@fuzz_settings
@given(st.data())
def test_fuzz_gzipped_corpus(tmp_path: Path, data: st.DataObject) -> None:
    if data.draw(st.booleans()):  # the compressed stream damaged
        path = tmp_path / f"corpus-{next(_names)}.jsonl.gz"
        path.write_bytes(data.draw(byte_mutation(gzip.compress(ORIGINALS[".jsonl"], mtime=0))))
        passages = refused_or_accepted(lambda: list(read_passages(path)), path)
        if passages is not None:
            _well_formed(passages, gzip.decompress(path.read_bytes()))
    else:
        _read(tmp_path, data.draw(byte_mutation(ORIGINALS[".jsonl"])), ".jsonl", gz=True)


DOC_FILES = ["birds.jsonl", "green-tea.md", "sourdough.txt", "web/lighthouse.html", "tidepools.pdf"]


def _documents(path: Path) -> list[Passage]:
    """The reading half of ``index_documents``: one file's documents, chunked into passages (TARG's sizes)."""
    files = [DocumentFile(path, path.name)]
    chunking = ChunkSettings(1000, 100, 200)
    return list(_read_all(files, chunking, [], skip_bad=False, stats=DocumentStats(), seen={}))


def _read_docs(tmp_path: Path, name: str, data: bytes) -> None:
    path = tmp_path / f"doc-{next(_names)}{Path(name).suffix}"
    path.write_bytes(data)
    passages = refused_or_accepted(lambda: _documents(path), path)
    if passages is not None:
        assert passages, "an accepted document file gave no passages"
        _well_formed(passages, data)
        assert all(p.source == path.name and p.span is not None for p in passages)


@fuzz_settings
@given(st.data())
def test_fuzz_document_files(tmp_path: Path, data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(DOC_FILES))
    original = (DOCS / name).read_bytes()
    if name.endswith(".jsonl") and data.draw(st.booleans()):
        rows = [json.loads(line) for line in original.decode().splitlines()]
        mutated = _jsonl(data.draw(json_mutation(rows)))
    else:
        mutated = data.draw(byte_mutation(original))
    _read_docs(tmp_path, name, mutated)


@pytest.fixture(scope="module")
def documents_json(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The documents.json of a real BM25 index of the fixture documents."""
    out = index_documents(DOCS, tmp_path_factory.mktemp("docs") / "ix", "bm25", progress=False)
    return (out / DOCUMENTS).read_bytes()


@fuzz_settings
@given(st.data())
def test_fuzz_documents_json(tmp_path: Path, documents_json: bytes, data: st.DataObject) -> None:
    if data.draw(st.booleans()):
        mutated = data.draw(byte_mutation(documents_json))
    else:
        mutated = dumps(data.draw(json_mutation(json.loads(documents_json))))
    index_dir = tmp_path / f"ix-{next(_names)}"
    index_dir.mkdir()
    (index_dir / DOCUMENTS).write_bytes(mutated)
    records = refused_or_accepted(lambda: read_records(index_dir), index_dir / DOCUMENTS)
    for r in records or []:
        assert isinstance(r.source, str) and r.source and len(r.sha256) == 64
        assert isinstance(r.size, int) and r.size >= 0 and all(isinstance(p, str) and p for p in r.passages)
        json.dumps(r.to_json(), ensure_ascii=False).encode("utf-8")  # written back by `ragate index add`


# ------------------------------------------------------------------------------------- faults the fuzzing found


def test_a_bom_in_front_of_a_corpus_reads_as_the_same_file(tmp_path: Path) -> None:
    """A BOM used to make a JSONL corpus "neither JSON nor tab-separated" and, in DPR's TSV, to turn the header
    into a passage with id '\\ufeffid'."""
    for suffix, data in ORIGINALS.items():
        assert list(read_passages(_write(tmp_path, BOM + data, suffix))) == list(
            read_passages(_write(tmp_path, data, suffix))
        )


def test_a_lone_surrogate_in_a_passage_is_refused_naming_the_line(tmp_path: Path) -> None:
    """``"text": "x\\udc80"`` used to be accepted, and the index writer then failed with UnicodeEncodeError."""
    rows = [*ROWS[:2], {**ROWS[2], "text": "Eiffel \udc80 Tower"}]
    path = _write(tmp_path, _jsonl(rows), ".jsonl")
    with pytest.raises(CorpusFormatError, match=r"corpus-\d+\.jsonl:3: the text .*lone surrogate"):
        list(read_passages(path))
    stats = ReadStats()
    assert len(list(read_passages(path, skip_bad=True, stats=stats))) == 2 and stats.malformed == 1
    docs = tmp_path / "docs.jsonl"
    docs.write_bytes(_jsonl([{"text": "a \ud800 document"}]))
    with pytest.raises(CorpusFormatError, match=r"docs\.jsonl:1: the text .*lone surrogate"):
        _documents(docs)


def test_a_number_too_long_is_a_bad_line_not_a_traceback(tmp_path: Path) -> None:
    """``"id": 99...9`` (5,000 digits) used to escape json.loads as ValueError."""
    path = _write(tmp_path, b'{"id": ' + b"9" * 5000 + b', "text": "t"}\n', ".jsonl")
    with pytest.raises(CorpusFormatError, match=r":1: not valid JSON \(Exceeds the limit"):
        list(read_passages(path))
    docs = tmp_path / "docs.jsonl"
    docs.write_bytes(b'{"id": ' + b"9" * 5000 + b', "text": "t"}\n')
    with pytest.raises(CorpusFormatError, match=r"docs\.jsonl:1: not valid JSON"):
        _documents(docs)


def test_documents_without_text_are_refused_naming_them(tmp_path: Path) -> None:
    """A document file with no text (here a blank Markdown file) was refused without naming it."""
    blank = tmp_path / "blank.md"
    blank.write_text("\n\n", encoding="utf-8")
    with pytest.raises(DataNotFoundError, match=r"no text in the documents \(1 files read: .*blank\.md"):
        _documents(blank)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"passages": "p1#0"}, r"'passages' must be a list"),
        ({"sha256": 7}, r"sha256 must be 64 hex digits"),
        ({"size": "12"}, r"size and documents must be counts"),
        ({"source": "a\ud800"}, r"lone surrogate"),
    ],
)
def test_a_damaged_documents_json_is_refused_naming_it(
    tmp_path: Path, documents_json: bytes, change: dict[str, Any], message: str
) -> None:
    """Each used to load: a string of passages as one id per character, the others to fail later in `ragate
    index add` (comparing a sha256 with 7, writing a lone surrogate back)."""
    data = json.loads(documents_json)
    data["files"][0] |= change
    (tmp_path / DOCUMENTS).write_bytes(dumps(data))
    with pytest.raises(IndexFormatError, match=r"documents\.json cannot be read \(.*" + message):
        read_records(tmp_path)
