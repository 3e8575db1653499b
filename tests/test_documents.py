"""Your own documents: finding files, extracting text, chunking with spans, the over-long passage warning, named
errors and ``--skip-bad``, ``ragate index build --docs`` + ``ragate search``, and ``ragate index add``.

Real components throughout: the fixture documents in tests/fixtures/docs (see its README), all-MiniLM-L6-v2,
bm25s and FAISS.
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import shutil
import socket
import stat
import subprocess
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from ragate.cli.main import main
from ragate.errors import CorpusFormatError, DataNotFoundError, IndexFormatError, RagateError
from ragate.retrieval.corpus import document_id, passage_json, read_passages
from ragate.retrieval.documents import (
    DOCUMENTS,
    DocumentStats,
    DocumentsWarning,
    PassageLengthWarning,
    SkippedFilesWarning,
    add_documents,
    index_documents,
    problem_lines,
    read_file,
    read_records,
)
from ragate.retrieval.encoders import Encoder
from ragate.retrieval.files import DocumentFile, find_files
from ragate.retrieval.index import index_info, open_index
from ragate.retrieval.lengths import check_passage_lengths
from ragate.retrieval.store import PASSAGES, iter_passage_file, passage_from_json
from ragate.retrieval.types import Passage

FIXTURES = Path(__file__).parent / "fixtures" / "docs"
# a folder's files are named by the folder as given joined with their path below it
SOURCES = {
    "docs/birds.jsonl",
    "docs/green-tea.md",
    "docs/long.txt",
    "docs/sourdough.txt",
    "docs/tidepools.pdf",
    "docs/web/lighthouse.html",
}

pytest.importorskip("pypdf", reason="PDF fixtures need pypdf (pip install 'ragate[docs]')")


class CountingEncoder(Encoder):
    """The real MiniLM encoder, counting the texts it embeds (to show which passages were encoded)."""

    def __init__(self, inner: Encoder) -> None:
        self.inner = inner
        self.model = getattr(inner, "model", None)
        self.name, self.source, self.dim = inner.name, inner.source, inner.dim
        self.query_prefix, self.document_prefix = inner.query_prefix, inner.document_prefix
        self.texts: list[str] = []

    def _embed(self, texts: Sequence[str], *, prefix: str, batch_size: int, progress: bool) -> np.ndarray:
        self.texts += list(texts)
        return self.inner._embed(texts, prefix=prefix, batch_size=batch_size, progress=progress)


@pytest.fixture()
def docs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private copy of the fixture documents that a test may change, named ``docs`` from the working folder (as a
    user passes ``--docs docs``)."""
    shutil.copytree(FIXTURES, tmp_path / "docs")
    monkeypatch.chdir(tmp_path)
    return Path("docs")


def stored(index_dir: Path) -> list[Passage]:
    return list(iter_passage_file(index_dir / PASSAGES))


def extracted_texts(folder: Path) -> dict[str, str]:
    """Document key -> extracted text, read again with the reader the index used."""
    out = {}
    for doc_file in find_files([folder]).files:
        for doc in read_file(doc_file, doc_file.path.read_bytes()):
            out[doc.key] = doc.text
    return out


# ----------------------------------------------------------------------------------------------- reading


def test_mixed_files_give_passages_with_source_and_span(docs: Path, tmp_path: Path) -> None:
    stats = DocumentStats()
    out = index_documents(docs, tmp_path / "ix", "bm25", progress=False, stats=stats)
    passages = stored(out)
    assert {p.source for p in passages} == SOURCES
    assert (stats.files, stats.documents, stats.passages) == (6, 7, len(passages))
    texts = extracted_texts(docs)
    for passage in passages:
        assert passage.span is not None
        start, end = passage.span
        assert texts[document_id(passage.id)][start:end] == passage.text
    titles = {p.source: p.title for p in passages}
    assert titles["docs/green-tea.md"] == "Brewing green tea"
    assert titles["docs/web/lighthouse.html"] == "How a lighthouse lens works"
    assert titles["docs/tidepools.pdf"] == "Life in tide pools"
    assert titles["docs/sourdough.txt"] == "sourdough"
    by_id = {p.id: p for p in passages}
    assert by_id["arctic-tern#0"].title == "Arctic tern" and by_id["arctic-tern#0"].source == "docs/birds.jsonl"
    swift = [p for p in passages if p.title == "Common swift"]
    assert len(swift) == 1 and swift[0].id.startswith("d") and swift[0].id.endswith("#0")
    html = next(p.text for p in passages if p.source == "docs/web/lighthouse.html")
    assert "Augustin Fresnel's lens, first lit in 1823" in html
    assert "analyticsQueue" not in html and "font-family" not in html and "lighthouse lens works" not in html
    assert "Flashing lenses turn on a bed of mercury" in html.split("\n")[-1]
    pdf = next(p.text for p in passages if p.source == "docs/tidepools.pdf")
    assert "Ochre sea stars pry mussels open" in pdf


def test_long_document_is_chunked_and_ids_are_stable(tmp_path: Path) -> None:
    a = index_documents([FIXTURES / "long.txt"], tmp_path / "a", "bm25", progress=False)
    b = index_documents([str(FIXTURES / "long.txt")], tmp_path / "b", "bm25", progress=False)
    passages = stored(a)
    assert len(passages) >= 10
    key = document_id(passages[0].id)
    assert [p.id for p in passages] == [f"{key}#{n}" for n in range(len(passages))]
    assert all(len(p.text) <= 1000 + 200 - 1 for p in passages)
    assert passages[0].span is not None and passages[0].span[0] == 0
    for before, after in itertools.pairwise(passages):
        assert before.span is not None and after.span is not None
        assert after.span[0] < before.span[1]  # chunks overlap
    assert (a / PASSAGES).read_bytes() == (b / PASSAGES).read_bytes()  # same ids and text on a rebuild


def test_span_is_stored_only_when_set(tmp_path: Path) -> None:
    plain = Passage("a", "T", "text", "s")
    assert passage_json(plain) == '{"id": "a", "title": "T", "text": "text", "source": "s"}'
    chunk = Passage("a#0", "T", "text", "s", span=(10, 14))
    assert json.loads(passage_json(chunk))["span"] == [10, 14]
    assert passage_from_json(passage_json(chunk)) == chunk
    assert passage_from_json(passage_json(plain)) == plain
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(passage_json(chunk) + "\n" + passage_json(plain) + "\n", encoding="utf-8")
    assert list(read_passages(corpus)) == [chunk, plain]
    corpus.write_text('{"id": "x", "title": "", "text": "t", "span": [5, 2]}\n', encoding="utf-8")
    with pytest.raises(CorpusFormatError, match=r"c.jsonl:1: .*span"):
        list(read_passages(corpus))


def test_index_documents_reports_what_it_skipped_and_warned_as_the_cli_does(
    docs: Path, tmp_path: Path, minilm: Encoder
) -> None:
    (docs / "photo.png").write_bytes(b"\x89PNG\r\n")
    (docs / "notes.rst").write_text("Notes\n=====\n\nRead, not skipped.\n", encoding="utf-8")
    (docs / "empty.md").write_text("  \n", encoding="utf-8")
    with pytest.warns(SkippedFilesWarning) as caught:  # no stats given: the warning is the report
        index_documents(docs, tmp_path / "a", "bm25", progress=False)
    (message,) = [str(w.message) for w in caught if w.category is SkippedFilesWarning]
    assert message.startswith("skipped 1 file of unsupported types (.png 1); ragate reads .txt .md")
    assert "skipped 1 empty document and 0 damaged files or lines; first problems:" in message
    assert "empty.md: 1 empty document(s) skipped" in message

    stats = DocumentStats()  # given: the same in stats, and the CLI prints the same lines
    with pytest.warns(SkippedFilesWarning):
        index_documents(docs, tmp_path / "b", "bm25", progress=False, stats=stats)
    assert stats.unsupported == {".png": 1} and stats.empty == 1
    assert "\n".join(problem_lines(stats)) == message
    assert stats.lengths is not None and stats.lengths.unit == "characters" and not stats.lengths.should_warn

    # passages longer than the encoder reads: the CLI's warning, and its check in stats
    with pytest.warns(PassageLengthWarning, match="rebuild without a chunk size") as caught:
        index_documents(
            FIXTURES / "long.txt", tmp_path / "c", "dense", encoder=minilm, chunk_size=3000, progress=False, stats=stats
        )
    assert stats.lengths.over >= 4 and stats.lengths.warning(fit=True) in [str(w.message) for w in caught]
    assert all(issubclass(w.category, DocumentsWarning) for w in caught)

    # nothing to report: no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error", DocumentsWarning)
        index_documents(FIXTURES / "long.txt", tmp_path / "d", "dense", encoder=minilm, progress=False)


def test_folders_globs_hidden_and_unsupported_files(docs: Path, tmp_path: Path) -> None:
    (docs / ".hidden.txt").write_text("hidden text", encoding="utf-8")
    (docs / ".git").mkdir()
    (docs / ".git" / "notes.md").write_text("# hidden folder", encoding="utf-8")
    (docs / "photo.png").write_bytes(b"\x89PNG\r\n")
    (docs / "web" / "data.csv").write_text("a,b\n", encoding="utf-8")
    found = find_files([docs])
    assert {f.source for f in found.files} == SOURCES
    assert found.unsupported == {".png": 1, ".csv": 1}
    assert [f.source for f in found.files] == sorted(f.source for f in found.files)
    # a quoted glob is expanded by ragate; matches keep the path as matched
    globbed = find_files([f"{docs}/**/*.html", str(docs / "*.md")])
    assert [f.source for f in globbed.files] == [f"{docs}/web/lighthouse.html", f"{docs}/green-tea.md"]
    # the same file twice is read once
    assert len(find_files([docs, docs / "green-tea.md"]).files) == 6
    with pytest.raises(
        CorpusFormatError, match=r"photo.png: unsupported file type '.png'; ragate reads .txt"
    ):
        find_files([docs / "photo.png"])
    with pytest.raises(DataNotFoundError, match="no such file or folder"):
        find_files([docs / "missing.txt"])
    with pytest.raises(DataNotFoundError, match="no file matches"):
        find_files([str(docs / "*.docx")])
    other = tmp_path / "other"
    other.mkdir()
    (other / "green-tea.md").write_text("# Another tea", encoding="utf-8")
    both = find_files([docs, other]).files  # the same file name in two folders: two sources
    assert {"docs/green-tea.md", f"{other.as_posix()}/green-tea.md"} <= {f.source for f in both}


def test_an_index_inside_the_folder_is_not_read_as_documents(docs: Path) -> None:
    index_documents(docs, docs / "idx", "bm25", progress=False)
    assert {f.source for f in find_files([docs]).files} == SOURCES


def test_damaged_files_are_named_and_skip_bad_counts_them(docs: Path, tmp_path: Path) -> None:
    (docs / "latin1.txt").write_bytes("Caf\xe9 au lait".encode("latin-1"))
    with pytest.raises(
        CorpusFormatError, match=r"latin1.txt: not valid UTF-8 \(byte 0xe9 at offset 3\).*--skip-bad"
    ):
        index_documents(docs, tmp_path / "ix", "bm25", progress=False)
    (docs / "latin1.txt").unlink()

    with open(docs / "birds.jsonl", "a", encoding="utf-8") as f:
        f.write('{"title": "no text"}\n{"id": "arctic-tern", "text": "a second tern"}\n')
    with pytest.raises(CorpusFormatError, match=r'birds.jsonl:3: missing "text".*--skip-bad'):
        index_documents(docs, tmp_path / "ix", "bm25", progress=False)
    (docs / "broken.pdf").write_bytes(b"%PDF-1.4\nthis is not a PDF body\n")
    (docs / "empty.md").write_text("\n\n", encoding="utf-8")
    (docs / "latin1.txt").write_bytes("Caf\xe9".encode("latin-1"))

    stats = DocumentStats()
    out = index_documents(docs, tmp_path / "ix", "bm25", progress=False, skip_bad=True, stats=stats)
    assert stats.bad == 4  # two JSONL lines (no text, a duplicate id), the PDF, the latin-1 file
    assert stats.empty == 1 and stats.files == 7  # the six fixtures and the empty Markdown file
    problems = "\n".join(stats.examples)
    assert "birds.jsonl:3: missing" in problems and "birds.jsonl:4: duplicate id 'arctic-tern'" in problems
    assert "broken.pdf: not a readable PDF" in problems and "latin1.txt: not valid UTF-8" in problems
    assert {p.source for p in stored(out)} == SOURCES
    with pytest.raises(DataNotFoundError, match="no text in the documents"):
        index_documents(docs / "empty.md", tmp_path / "none", "bm25", progress=False)


def test_a_pdf_without_pypdf_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "pypdf", None)  # as if pypdf were not installed
    with pytest.raises(RagateError, match=r"pip install 'ragate\[docs\]'"):
        index_documents(FIXTURES / "tidepools.pdf", tmp_path / "ix", "bm25", progress=False)


def test_bad_chunk_settings(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--chunk-overlap < --chunk-size"):
        index_documents(FIXTURES, tmp_path / "ix", "bm25", chunk_size=100, chunk_overlap=100)


# ----------------------------------------------------------------------------------------------- lengths


def test_length_check_by_tokens(tmp_path: Path, minilm: Encoder) -> None:
    long_chunks = index_documents(
        FIXTURES / "long.txt", tmp_path / "big", "bm25", chunk_size=3000, progress=False
    )
    check = check_passage_lengths(stored(long_chunks), minilm)
    assert check.unit == "word pieces" and check.limit == 256 and check.passages == len(stored(long_chunks))
    assert check.over >= check.passages - 1 and check.longest > 500 and check.should_warn
    assert 500 <= check.suggested_chunk_size <= 1200
    message = check.warning()
    assert "all-MiniLM-L6-v2 reads the first 256" in message
    assert f"--chunk-size {check.suggested_chunk_size}" in message

    default = index_documents(FIXTURES, tmp_path / "default", "bm25", progress=False)
    fine = check_passage_lengths(stored(default), minilm)
    assert not fine.should_warn and fine.longest <= 256 * 5 // 4


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
def test_chunks_fit_the_encoder_window_by_default(tmp_path: Path, minilm: Encoder, kind: str) -> None:
    stats = DocumentStats()
    out = index_documents(FIXTURES, tmp_path / kind, kind, encoder=minilm, progress=False, stats=stats)
    passages = stored(out)
    check = check_passage_lengths(passages, minilm)
    assert check.unit == "word pieces" and check.over == 0 and check.longest <= 256 and not check.should_warn
    assert stats.chunking == index_info(out)["chunking"] == {
        "unit": "word pieces", "size": 256, "overlap": 25, "min_size": 51, "encoder": "all-MiniLM-L6-v2",
    }  # fmt: skip
    texts = extracted_texts(FIXTURES)
    long = sorted((p for p in passages if p.source.endswith("long.txt")), key=lambda p: int(p.id.split("#")[1]))
    assert len(long) >= 10
    spans = [p.span for p in long]
    assert spans[0] is not None and spans[0][0] == 0
    assert spans[-1] is not None and spans[-1][1] == len(texts[document_id(long[0].id)].rstrip())
    for before, after in itertools.pairwise(spans):  # every character is in a chunk: each starts inside the last
        assert before is not None and after is not None and before[0] < after[0] < before[1]
    for passage in passages:
        assert passage.span is not None
        assert texts[document_id(passage.id)][passage.span[0] : passage.span[1]] == passage.text
    # the old chunking stays an explicit option: any character flag chunks by characters
    by_chars = index_documents(FIXTURES, tmp_path / "chars", kind, encoder=minilm, chunk_size=3000, progress=False)
    assert index_info(by_chars)["chunking"] == {"size": 3000, "overlap": 100, "min_size": 200}
    assert check_passage_lengths(stored(by_chars), minilm).over > 0


def test_fit_chunks_hold_a_long_title_and_text_with_many_pieces_per_character(minilm: Encoder) -> None:
    """Identifiers and numbers take many word pieces a character: the chunks still fit, title included."""
    from ragate.retrieval.fit import FitChunker

    chunker = FitChunker.of(minilm)
    assert chunker is not None
    words = [f"ffi_prep_cif_var{i}(0x{i * 7919:x}, FFI_TYPE_UINT{8 * (i % 8)})" for i in range(400)]
    text = " ".join(words) + ". " + "Plain words follow here. " * 300
    title = "libffi reference: " + " ".join(words[:3])  # ~60 word pieces
    spans = chunker.spans(text, title)
    tokenizer = minilm.model.tokenizer  # type: ignore[attr-defined]
    chunks = [chunker.contents(title, text[a:b].strip()) for a, b in spans]
    lengths = [len(ids) for ids in tokenizer(chunks, verbose=False)["input_ids"]]
    assert max(lengths) <= 256 and len(spans) > 10
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    assert chunker.spans("   \n ", "t") == [] and chunker.spans("short text", "t") == [(0, 10)]


def test_length_check_by_characters() -> None:
    text = (FIXTURES / "long.txt").read_text(encoding="utf-8")
    whole = [Passage("long", "long", text), Passage("short", "", "a short passage")]
    check = check_passage_lengths(whole)
    assert (check.unit, check.limit, check.over, check.longest_id) == ("characters", 2000, 1, "long")
    assert check.should_warn and "--chunk-size 1000" in check.warning()
    assert not check_passage_lengths(whole[1:]).should_warn


def test_cli_warns_for_over_long_passages(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "big"
    argv = ["index", "build", "--docs", str(FIXTURES / "long.txt"), "--kind", "dense", "--out", str(out)]
    assert main([*argv, "--chunk-size", "3000", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "read 1 file: 1 document, 5 passages (chunks of ~3,000 characters" in captured.out
    assert "ragate: warning: " in captured.err and "longer than 256 word pieces" in captured.err
    assert "rebuild without a chunk size, which fits each chunk to the encoder's window" in captured.err
    assert main([*argv[:-1], str(tmp_path / "fit"), "--quiet"]) == 0  # which it does
    captured = capsys.readouterr()
    assert "warning" not in captured.err and "chunks of at most 256 word pieces" in captured.out

    # a corpus of whole documents: the bm25 rule, by characters
    corpus = tmp_path / "whole.jsonl"
    text = (FIXTURES / "long.txt").read_text(encoding="utf-8")
    corpus.write_text(passage_json(Passage("long", "Long", text)) + "\n", encoding="utf-8")
    argv = ["index", "build", "--corpus", str(corpus), "--kind", "bm25", "--out", str(tmp_path / "c")]
    assert main([*argv, "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "ragate: warning: 1 of 1 passages is longer than 2,000 characters" in err
    assert "--chunk-size 1000" in err

    # the same corpus chunked with a chunk flag: no warning, chunking recorded
    assert main([*argv[:-1], str(tmp_path / "chunked"), "--chunk-size", "1000", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "warning" not in captured.err and "chunked 1 corpus passages into" in captured.out
    manifest = index_info(tmp_path / "chunked")
    assert manifest["chunking"] == {"size": 1000, "overlap": 100, "min_size": 200}
    assert "chunking" not in index_info(tmp_path / "c") and "documents" not in index_info(tmp_path / "c")


# ----------------------------------------------------------------------------------------------- CLI


def test_cli_build_info_search(docs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (docs / "photo.png").write_bytes(b"\x89PNG\r\n")
    out = tmp_path / "ix"
    assert (
        main(["index", "build", "--docs", str(docs), "--kind", "hybrid", "--out", str(out), "--quiet"]) == 0
    )
    captured = capsys.readouterr()
    assert "read 6 files: 7 documents" in captured.out and "indexed" in captured.out
    assert "skipped 1 file of unsupported types (.png 1)" in captured.out
    assert "warning" not in captured.err  # the default chunks fit MiniLM's window
    fit = "chunks of at most 256 word pieces of all-MiniLM-L6-v2 (its window, title included), 25 overlap, min 51"
    assert f"passages ({fit})" in captured.out

    assert main(["index", "info", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"documents  7 in 6 files (from {docs})" in printed
    assert f"chunking   {fit}" in printed and DOCUMENTS in printed

    questions = [
        "What water temperature should green tea be brewed at?",
        "How do sea stars open mussels?",
        "Which animal makes the longest migration?",
        "Who invented the lens with rings of glass prisms used in lighthouses?",
    ]
    assert main(["search", str(out), *questions, "--json", "-k", "3"]) == 0
    firsts = [json.loads(line)["hits"][0] for line in capsys.readouterr().out.splitlines()]
    by_id = {p.id: p for p in stored(out)}
    assert [by_id[hit["id"]].source for hit in firsts] == [
        "docs/green-tea.md",
        "docs/tidepools.pdf",
        "docs/birds.jsonl",
        "docs/web/lighthouse.html",
    ]
    assert firsts[2]["id"] == "arctic-tern#0"

    (docs / "broken.pdf").write_bytes(b"%PDF-1.4\nnot a pdf\n")
    argv = ["index", "build", "--docs", str(docs), "--kind", "bm25", "--out", str(tmp_path / "b"), "--quiet"]
    assert main(argv) == 2
    assert "broken.pdf: not a readable PDF" in capsys.readouterr().err
    assert main([*argv, "--skip-bad"]) == 0
    assert "skipped 0 empty documents and 1 damaged files or lines" in capsys.readouterr().out
    both = ["index", "build", "--docs", str(docs), "--corpus", "c.jsonl", "--kind", "bm25", "--out", "x"]
    with pytest.raises(SystemExit):
        main(both)
    assert "not allowed with argument" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------- adding


def _split_docs(root: Path) -> tuple[Path, Path]:
    """``first``: the fixtures without birds.jsonl and with an older sourdough.txt; ``final``: all fixtures."""
    first = Path(shutil.copytree(FIXTURES, root / "first"))
    (first / "birds.jsonl").unlink()
    sourdough = first / "sourdough.txt"
    sourdough.write_text(sourdough.read_text(encoding="utf-8")[:300], encoding="utf-8")
    return first, Path(shutil.copytree(FIXTURES, root / "final"))


def test_add_equals_a_fresh_build_without_re_encoding(
    tmp_path: Path, minilm: Encoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    first, final = _split_docs(Path("."))
    counting = CountingEncoder(minilm)
    index = index_documents(first, tmp_path / "ix", "hybrid", encoder=counting, hnsw=True, progress=False)
    built_first = {p.id: p for p in stored(index)}
    assert len(counting.texts) == len(built_first)

    # the user copies the new and changed files into the folder and adds the folder again
    shutil.copy(final / "birds.jsonl", first / "birds.jsonl")
    shutil.copy(final / "sourdough.txt", first / "sourdough.txt")
    counting.texts.clear()
    stats = DocumentStats()
    assert add_documents(index, [first], encoder=counting, progress=False, stats=stats) == index
    assert (stats.unchanged, stats.replaced, stats.files) == (4, 1, 2)
    new_ids = {p.id for p in stored(index) if p.source in ("first/sourdough.txt", "first/birds.jsonl")}
    assert len(counting.texts) == len(new_ids) == 3  # only the new and changed files' passages were encoded
    assert sorted(counting.texts) == sorted(p.contents for p in stored(index) if p.id in new_ids)

    # a fresh build of the folder as it is now (source names, and so ids, come from the folder's name)
    fresh = index_documents(first, tmp_path / "fresh", "hybrid", encoder=minilm, hnsw=True, progress=False)
    added, rebuilt = stored(index), stored(fresh)
    assert sorted(added, key=lambda p: p.id) == sorted(rebuilt, key=lambda p: p.id)
    with open_index(index, encoder=minilm) as a, open_index(fresh, encoder=minilm) as b:  # verifies the files
        ids = [p.id for p in rebuilt]
        np.testing.assert_allclose(a.passage_embeddings(ids), b.passage_embeddings(ids), atol=1e-6)
        question = ["Which animal makes the longest migration?"]
        assert [h.id for h in a.search(question, 5)[0]] == [h.id for h in b.search(question, 5)[0]]
        assert a.search(question, 1)[0][0].id == "arctic-tern#0"
    records = {r.source: r for r in read_records(index)}
    assert records == {r.source: r for r in read_records(fresh)}
    manifest = index_info(index)
    assert manifest["documents"]["files"] == 6 and manifest["documents"]["documents"] == 7
    assert (index / "hnsw.faiss").is_file() and manifest["params"]["hnsw"]

    # nothing changed: nothing is encoded or written
    counting.texts.clear()
    stats = DocumentStats()
    add_documents(index, [first], encoder=counting, progress=False, stats=stats)
    assert stats.unchanged == 6 and counting.texts == [] and index_info(index) == manifest


def test_cli_add(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first, final = _split_docs(tmp_path)
    out = tmp_path / "ix"
    assert main(["index", "build", "--docs", str(first), "--kind", "bm25", "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["index", "add", str(out), "--docs", str(final / "birds.jsonl"), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "added 1 new file and 0 changed files" in printed and "2 documents, 2 passages" in printed
    assert "the index holds" in printed and "of 7 documents in 6 files" in printed
    assert main(["index", "add", str(out), "--docs", str(final / "birds.jsonl"), "--quiet"]) == 0
    assert "nothing to add: 1 file unchanged" in capsys.readouterr().out
    assert main(["search", str(out), "swifts sleep while gliding", "-k", "1"]) == 0
    assert "Common swift" in capsys.readouterr().out

    corpus_index = tmp_path / "corpus"
    corpus = Path(__file__).parent / "data" / "wiki_passages.jsonl"
    assert (
        main(["index", "build", "--corpus", str(corpus), "--kind", "bm25", "--out", str(corpus_index)]) == 0
    )
    capsys.readouterr()
    assert main(["index", "add", str(corpus_index), "--docs", str(final / "birds.jsonl")]) == 2
    assert "was not built from documents" in capsys.readouterr().err


def test_rebuild_hint_names_the_documents(tmp_path: Path) -> None:
    out = index_documents(FIXTURES / "green-tea.md", tmp_path / "ix", "bm25", chunk_size=500, progress=False)
    with open(out / PASSAGES, "ab") as f:
        f.write(b" ")
    with pytest.raises(IndexFormatError) as info:
        open_index(out)
    message = str(info.value)
    assert f"--docs {FIXTURES / 'green-tea.md'}" in message
    assert "--chunk-size 500 --chunk-overlap 100 --min-chunk 200" in message


def test_document_file_reading_is_exact() -> None:
    doc_file = DocumentFile(FIXTURES / "green-tea.md", "green-tea.md")
    (doc,) = read_file(doc_file, doc_file.path.read_bytes())
    assert doc.title == "Brewing green tea"  # the first '# ' heading; the one in the code block is not it
    assert doc.text == (FIXTURES / "green-tea.md").read_text(encoding="utf-8")


MARKUP_FILES = {  # name -> (text, the title it must get)
    "install.rst": (
        ".. _install:\n\n==========\nInstalling\n==========\n\nRun ``pip install kettle``. The glob weight is 50.\n",
        "Installing",
    ),
    "notes.rest": ("Some notes\n----------\n\nReST with the other suffix.\n", "Some notes"),
    "guide.adoc": (
        ":toc:\n\n= Operator Guide\n\n== Starting\n\nStart the engine with `kettle up`.\n",
        "Operator Guide",
    ),
    "todo.org": ("#+TITLE: Garden plans\n\n* Spring\nSow the tomatoes in March.\n", "Garden plans"),
    "heads.org": ("* Autumn chores\nRake the leaves.\n", "Autumn chores"),
    "page.textile": ("h1(#top). Brewing log\n\np. Boil at *100 C*.\n", "Brewing log"),
    "untitled.rst": ("No heading here, only a paragraph of reStructuredText with *emphasis*.\n", "untitled"),
}


def test_plain_text_markup_is_read_as_text_with_its_title(tmp_path: Path) -> None:
    folder = tmp_path / "markup"
    folder.mkdir()
    for name, (text, _) in MARKUP_FILES.items():
        (folder / name).write_text(text, encoding="utf-8")
    stats = DocumentStats()
    out = index_documents(folder, tmp_path / "ix", "bm25", progress=False, stats=stats)
    assert stats.unsupported == {} and stats.files == len(MARKUP_FILES)
    by_file = {Path(p.source).name: p for p in stored(out)}
    for name, (text, title) in MARKUP_FILES.items():
        assert by_file[name].title == title, name
        assert by_file[name].text == text.strip()  # the markup is kept as it is, like Markdown's
    found = find_files([folder / "install.rst"]).files  # a file named on its own is read too
    assert [f.source for f in found] == [(folder / "install.rst").as_posix()]


# ----------------------------------------------------------------------------------------------- links and special files

TEXT = "Plain notes about growing tomatoes in a small garden, watered every morning."
SECRET = "TOP SECRET: the launch code is 0000, kept outside the documents folder."


def _folder(root: Path) -> Path:
    """``root/d`` with one ordinary document, and ``root/secret/s.txt`` outside it."""
    (root / "d").mkdir()
    (root / "d" / "a.txt").write_text(TEXT, encoding="utf-8")
    (root / "secret").mkdir()
    (root / "secret" / "s.txt").write_text(SECRET, encoding="utf-8")
    return root / "d"


def _ragate(args: Sequence[str], cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The CLI in a child process with its memory capped (4 GB of address space) and a time limit: a build that
    hangs or reads without end fails the test instead of stalling or exhausting the machine."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    code = "import sys; from ragate.cli.main import main; sys.exit(main(sys.argv[1:]))"
    try:
        return subprocess.run(  # noqa: PLW1510 (the callers check the exit status, with the output)
            [sys.executable, "-c", code, *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=cap,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"`ragate {' '.join(args)}` was still running after {timeout} s")


def _sources(index_dir: Path) -> set[str]:
    return {p.source or "" for p in stored(index_dir)}


def test_a_file_link_loop_is_skipped_with_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = _folder(tmp_path)
    (d / "loop1.txt").symlink_to("loop2.txt")
    (d / "loop2.txt").symlink_to("loop1.txt")
    monkeypatch.chdir(tmp_path)
    stats = DocumentStats()
    with pytest.warns(RuntimeWarning, match="loop1.txt"):
        out = index_documents("d", tmp_path / "ix", "bm25", progress=False, stats=stats)
    assert _sources(out) == {"d/a.txt"}
    assert any(s.startswith("d/loop1.txt: ") and "loop" in s for s in stats.skipped), stats.skipped


def test_a_glob_does_not_follow_folder_links(tmp_path: Path) -> None:
    d = _folder(tmp_path)
    (d / "x").mkdir()
    (d / "x" / "b.md").write_text(TEXT, encoding="utf-8")
    (d / "x" / "up").symlink_to("..")  # a loop: d/x/up/x/up/...
    (d / "x" / "self").symlink_to("../x")
    (d / "out").symlink_to("../secret")  # a folder outside
    args = ["index", "build", "--docs", "d/**", "--kind", "bm25", "--out", "ix", "--quiet"]
    result = _ragate(args, tmp_path)
    assert result.returncode == 0, result.stderr
    assert _sources(tmp_path / "ix") == {"d/a.txt", "d/x/b.md"}
    assert "d/out: a link to a folder outside the folders given to --docs" in result.stderr


def test_a_link_to_dev_zero_is_skipped(tmp_path: Path) -> None:
    d = _folder(tmp_path)
    (d / "z.txt").symlink_to("/dev/zero")
    args = ["index", "build", "--docs", "d", "--kind", "bm25", "--out", "ix", "--quiet"]
    result = _ragate(args, tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert _sources(tmp_path / "ix") == {"d/a.txt"}
    assert "d/z.txt: a link to /dev/zero, outside the folders given to --docs" in result.stderr


def test_devices_and_sockets_in_the_folder_are_skipped_without_reading_them(tmp_path: Path) -> None:
    d = _folder(tmp_path)
    try:
        os.mknod(d / "zero.txt", stat.S_IFCHR | 0o666, os.makedev(1, 5))  # the device /dev/zero is
    except PermissionError:
        pytest.skip("creating a device file needs root")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(d / "sock.md"))
        stats = DocumentStats()
        with pytest.warns(RuntimeWarning, match="a character device"):
            out = index_documents(d, tmp_path / "ix", "bm25", progress=False, stats=stats)
    assert f"{d.as_posix()}/zero.txt: a character device, not a regular file" in stats.skipped
    assert f"{d.as_posix()}/sock.md: a socket, not a regular file" in stats.skipped
    assert _sources(out) == {f"{d.as_posix()}/a.txt"}


@pytest.mark.parametrize("skip_bad", [False, True])
def test_a_fifo_is_skipped_without_opening_it(tmp_path: Path, skip_bad: bool) -> None:
    d = _folder(tmp_path)
    os.mkfifo(d / "pipe.txt")
    args = ["index", "build", "--docs", "d", "--kind", "bm25", "--out", "ix", "--quiet"]
    result = _ragate([*args, "--skip-bad"] if skip_bad else args, tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    assert _sources(tmp_path / "ix") == {"d/a.txt"}
    assert "ragate: warning: skipped 1 path" in result.stderr
    assert "d/pipe.txt: a named pipe (FIFO), not a regular file" in result.stderr


def test_a_named_fifo_is_an_error(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.txt")
    with pytest.raises(CorpusFormatError, match=r"pipe.txt: a named pipe \(FIFO\), not a regular file"):
        find_files([tmp_path / "pipe.txt"])


def test_a_dangling_link_is_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = _folder(tmp_path)
    (d / "gone.txt").symlink_to("nowhere.txt")
    out = tmp_path / "ix"
    assert main(["index", "build", "--docs", str(d), "--kind", "bm25", "--out", str(out), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert f"{d.as_posix()}/gone.txt: a link to nowhere.txt, which does not exist" in err
    assert _sources(out) == {f"{d.as_posix()}/a.txt"}


def test_a_file_name_that_is_not_utf8_is_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = _folder(tmp_path)
    (d / os.fsdecode(b"caf\xe9.txt")).write_bytes(b"Notes on coffee from a Latin-1 file name.")
    (d / os.fsdecode(b"sub\xff")).mkdir()
    (d / os.fsdecode(b"sub\xff") / "inner.txt").write_bytes(b"Below a folder with a Latin-1 name.")
    out = tmp_path / "ix"
    assert main(["index", "build", "--docs", str(d), "--kind", "bm25", "--out", str(out), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert f"{d.as_posix()}/caf\\xe9.txt: its name is not UTF-8" in err and "convmv" in err
    assert f"{d.as_posix()}/sub\\xff: its name is not UTF-8" in err
    assert _sources(out) == {f"{d.as_posix()}/a.txt"}
    assert main(["index", "add", str(out), "--docs", str(d), "--quiet"]) == 0
    assert "its name is not UTF-8" in capsys.readouterr().err


def test_a_link_out_of_the_folder_is_not_indexed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = _folder(tmp_path)
    (d / "s.txt").symlink_to("../secret/s.txt")
    (d / "sub").mkdir()
    (d / "sub" / "a-again.txt").symlink_to("../a.txt")  # inside: the same file, read once under its own name
    (d / "sub" / "alias.txt").symlink_to("../../d/x.notes")  # inside, reached only through the link
    (d / "x.notes").write_text("Notes kept under an extension ragate does not read.", encoding="utf-8")
    out = tmp_path / "ix"
    assert main(["index", "build", "--docs", str(d), "--kind", "bm25", "--out", str(out), "--quiet"]) == 0
    err = capsys.readouterr().err
    target = (tmp_path / "secret" / "s.txt").as_posix()
    assert f"{d.as_posix()}/s.txt: a link to {target}, outside the folders given to --docs" in err
    assert _sources(out) == {f"{d.as_posix()}/a.txt", f"{d.as_posix()}/sub/alias.txt"}
    assert not any("SECRET" in p.text for p in stored(out))
    # with the folder it leads to given too, the link leads inside: the file is read once, under its own name
    both = index_documents([d, tmp_path / "secret"], tmp_path / "both", "bm25", progress=False)
    assert _sources(both) == _sources(out) | {f"{tmp_path.as_posix()}/secret/s.txt"}


def test_a_file_over_the_size_cap_is_refused(tmp_path: Path) -> None:
    d = _folder(tmp_path)
    with open(d / "huge.txt", "wb") as f:
        f.truncate(256 * 2**20 + 1)  # sparse: nothing is written to disk
    with pytest.raises(CorpusFormatError, match=r"huge.txt: 256.0 MB, over the 256 MB .*--skip-bad"):
        index_documents(d, tmp_path / "ix", "bm25", progress=False)
    stats = DocumentStats()
    out = index_documents(d, tmp_path / "ix", "bm25", progress=False, skip_bad=True, stats=stats)
    assert stats.bad == 1 and _sources(out) == {f"{d.as_posix()}/a.txt"}


def test_add_drops_the_passages_of_deleted_and_renamed_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    d = Path("d")
    d.mkdir()
    (d / "a.txt").write_text("Apples ripen in autumn orchards.", encoding="utf-8")
    (d / "b.txt").write_text("Beekeepers harvest honey in summer.", encoding="utf-8")
    (d / "c.jsonl").write_text('{"id": "cherry", "text": "Cherries blossom in spring."}\n', encoding="utf-8")
    other = tmp_path / "other.md"
    other.write_text("# Other\nA file named on its own, kept by an add of d.", encoding="utf-8")
    build = ["index", "build", "--docs", "d", str(other), "--kind", "bm25", "--out", "ix", "--quiet"]
    assert main(build) == 0
    capsys.readouterr()
    (d / "b.txt").unlink()
    (d / "c.jsonl").rename(d / "renamed.jsonl")  # the same ids under a new name
    assert main(["index", "add", "ix", "--docs", "d", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "dropped 2 passages of 2 files no longer in d: d/b.txt, d/c.jsonl" in printed
    assert _sources(Path("ix")) == {"d/a.txt", "d/renamed.jsonl", other.as_posix()}
    assert {r.source for r in read_records(Path("ix"))} == {"d/a.txt", "d/renamed.jsonl", other.as_posix()}
    assert main(["search", "ix", "honey", "--json", "-k", "3"]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert all("honey" not in hit["text"] for hit in hits)

    stats = DocumentStats()  # from Python: the same counts; nothing else changed
    (d / "a.txt").unlink()
    add_documents("ix", ["d"], progress=False, stats=stats)
    assert stats.dropped == ["d/a.txt"] and stats.dropped_passages == 1
    assert _sources(Path("ix")) == {"d/renamed.jsonl", other.as_posix()}
