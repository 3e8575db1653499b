"""Corpus files, chunking, the shipped demo sample, and the pooled corpus over the real ../shared/data."""

from __future__ import annotations

import gzip
import itertools
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from script_loader import load_script

from ragate.cli.main import main
from ragate.errors import CorpusFormatError, DataNotFoundError
from ragate.retrieval.corpus import (
    ReadStats,
    chunk_passages,
    chunk_spans,
    chunk_text,
    demo_dir,
    detect_format,
    document_id,
    read_passages,
    split_contents,
    write_passages,
)
from ragate.retrieval.pooled import PooledCorpus, build_pooled_corpus, pooled_id
from ragate.retrieval.types import Passage

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
needs_data = pytest.mark.skipif(
    not DATA.is_dir(), reason=f"the real QA data is not at {DATA} (../shared/data)"
)


def _write(path: Path, text: str) -> Path:
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


# ----------------------------------------------------------------------------------------------- readers


@pytest.mark.parametrize("name", ["c.jsonl", "c.jsonl.gz"])
def test_ragate_jsonl(tmp_path: Path, name: str) -> None:
    path = _write(
        tmp_path / name,
        '{"id": "a", "title": "T", "text": "one", "source": "s"}\n\n{"id": 7, "text": "two"}\n',
    )
    assert detect_format(path) == "jsonl"
    assert list(read_passages(path)) == [Passage("a", "T", "one", "s"), Passage("7", "", "two")]


def test_flashrag_contents(tmp_path: Path) -> None:
    rows = [
        {"id": "0", "contents": '"Aaron"\nAaron is a prophet.'},
        {"id": "1", "contents": "Abba\nA band."},
        {"id": "2", "contents": "no title line"},
    ]
    path = _write(tmp_path / "f.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    assert detect_format(path) == "flashrag"
    got = [(p.id, p.title, p.text) for p in read_passages(path)]
    assert got == [
        ("0", "Aaron", "Aaron is a prophet."),
        ("1", "Abba", "A band."),
        ("2", "", "no title line"),
    ]
    assert split_contents('"Quoted "inner" title"\ntext') == ('Quoted "inner" title', "text")


@pytest.mark.parametrize("name", ["psgs.tsv", "psgs.tsv.gz"])
def test_dpr_tsv_with_header_and_quotes(tmp_path: Path, name: str) -> None:
    text = 'id\ttext\ttitle\n1\t"Aaron ( or ; ""Ahärôn"") is a prophet"\tAaron\n2\tplain text\tB\n'
    path = _write(tmp_path / name, text)
    assert detect_format(path) == "tsv"
    got = list(read_passages(path))
    assert got == [
        Passage("1", "Aaron", 'Aaron ( or ; "Ahärôn") is a prophet'),
        Passage("2", "B", "plain text"),
    ]


@pytest.mark.parametrize(
    ("name", "content", "line", "reason"),
    [
        ("a.jsonl", '{"id": "a", "text": "x"}\n{"id": "b", "text": \n', 2, "not valid JSON"),
        ("b.jsonl", '{"id": "a", "text": "x"}\n{"id": "b"}\n', 2, 'missing "text"'),
        ("c.jsonl", '{"id": "a", "text": 3}\n', 1, '"text" must be a string'),
        ("d.jsonl", '["a", "x"]\n', 1, "expected a JSON object"),
        ("e.tsv", "1\tx\tT\n2\tonly two\n", 2, "expected 3 tab-separated columns"),
        (
            "f.jsonl",
            '{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n',
            2,
            "duplicate id 'a' (first on line 1)",
        ),
        ("g.jsonl", '{"id": "a", "text": "x"}\n{"id": "b", "te', 2, "the file looks truncated"),
        ("h.jsonl.gz", '{"id": "a", "text": "x"}\n{"id": "b", "te', 2, "the file looks truncated"),
    ],
)
def test_malformed_line_names_file_and_line(
    tmp_path: Path, name: str, content: str, line: int, reason: str
) -> None:
    path = _write(tmp_path / name, content)
    with pytest.raises(CorpusFormatError) as err:
        list(read_passages(path))
    message = str(err.value)
    assert f"{path}:{line}: " in message and reason in message and "--skip-bad" in message


def test_skip_bad_counts(tmp_path: Path) -> None:
    lines = [
        '{"id": "a", "text": "x"}',
        "not json",
        '{"id": "b"}',
        '{"id": "a", "text": "again"}',
        '{"id": "c", "text": "y"}',
        b"\xff\xfe".decode("latin-1"),
        '{"id": "d", "te',
    ]
    path = tmp_path / "bad.jsonl"
    path.write_bytes(("\n".join(lines[:5]) + "\n").encode() + b"\xff\xfe\n" + lines[6].encode())
    stats = ReadStats()
    ids = [p.id for p in read_passages(path, skip_bad=True, stats=stats)]
    assert ids == ["a", "c"]
    assert (stats.passages, stats.malformed, stats.duplicates, stats.lines, stats.skipped) == (2, 4, 1, 7, 5)
    assert stats.examples[0] == f"{path}:2: not valid JSON (Expecting value at column 1)"
    assert any(":6: not valid UTF-8" in e for e in stats.examples)


def test_truncated_gzip_stream(tmp_path: Path) -> None:
    full = gzip.compress(b"".join(b'{"id": "%d", "text": "passage %d"}\n' % (i, i) for i in range(5000)))
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(full[: len(full) // 2])
    with pytest.raises(CorpusFormatError, match="truncated or corrupt"):
        list(read_passages(path, skip_bad=True))


def test_missing_file_and_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match="no corpus file"):
        list(read_passages(tmp_path / "nope.jsonl"))
    path = _write(tmp_path / "x.txt", "just words\n")
    with pytest.raises(CorpusFormatError, match="--format"):
        list(read_passages(path))


@pytest.mark.parametrize("name", ["out.jsonl", "out.jsonl.gz"])
def test_write_round_trip_is_atomic(tmp_path: Path, name: str) -> None:
    passages = [Passage("a", "Tïtle", "text with\nnewline and \t tab", "src"), Passage("b", "", "x")]
    path = tmp_path / "sub" / name
    assert write_passages(passages, path) == 2
    assert list(read_passages(path)) == passages

    def failing() -> object:
        yield Passage("c", "", "y")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        write_passages(failing(), path)  # type: ignore[arg-type]
    assert list(read_passages(path)) == passages  # the old file is intact
    assert sorted(p.name for p in path.parent.iterdir()) == [name]  # no temporary file left behind


# ----------------------------------------------------------------------------------------------- chunking


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet=st.sampled_from("abcdef .!?\n"), max_size=3000),
    size=st.integers(10, 1200),
    overlap_frac=st.floats(0, 0.5),
    min_frac=st.floats(0, 1),
)
def test_chunk_properties(text: str, size: int, overlap_frac: float, min_frac: float) -> None:
    overlap, min_size = int(size * overlap_frac), int(size * min_frac)
    spans = chunk_spans(text, size, overlap, min_size)
    assert chunk_text(text, size, overlap, min_size) == [text[a:b] for a, b in spans]
    if not text:
        assert spans == []
        return
    assert spans[0][0] == 0 and spans[-1][1] == len(text)  # covers the text ...
    if len(text) <= size:
        assert spans == [(0, len(text))]
    for (a0, b0), (a1, b1) in itertools.pairwise(spans):
        assert a0 < a1 and b0 < b1
        assert overlap <= b0 - a1 <= overlap + overlap // 5  # ... with no gap, and the overlap asked for
        assert b0 - a0 <= size  # only the last chunk may take in a short tail
        assert b1 - b0 >= min_size  # every chunk after the first brings at least min_size new characters
    assert all(b - a <= size + max(min_size - 1, 0) for a, b in spans)


def test_chunks_cut_at_sentence_ends() -> None:
    text = " ".join(f"Sentence number {i} says something about the topic." for i in range(60))
    chunks = chunk_text(text)
    assert len(chunks) == 4
    assert all(c.endswith(".") for c in chunks)
    assert all(len(c) <= 1000 for c in chunks[:-1]) and 200 <= len(chunks[-1])
    assert chunk_text("short") == ["short"] and chunk_text("") == []
    with pytest.raises(ValueError, match="overlap < size"):
        chunk_text(text, size=100, overlap=100)


def test_chunk_passages_ids() -> None:
    long = Passage("doc", "Title", "word " * 500, "src")
    out = list(chunk_passages([Passage("short", "", "fits"), long, Passage("empty", "", "")]))
    assert out[0] == Passage("short", "", "fits")
    assert [p.id for p in out[1:]] == ["doc#0", "doc#1", "doc#2"]
    assert all(p.title == "Title" and p.source == "src" for p in out[1:])
    assert {document_id(p.id) for p in out} == {"short", "doc"}
    assert document_id("a#b") == "a#b"


# ----------------------------------------------------------------------------------------------- demo sample


def test_demo_sample_ships_with_gold_inside() -> None:
    files = {p.name for p in demo_dir().iterdir()}
    assert {"passages.jsonl", "questions.jsonl", "README.md"} <= files
    passages = {p.id: p for p in read_passages(demo_dir() / "passages.jsonl")}
    assert 350 <= len(passages) <= 450
    assert all(pid == pooled_id(p.text) for pid, p in passages.items())
    questions = [json.loads(line) for line in (demo_dir() / "questions.jsonl").open(encoding="utf-8")]
    assert {q["dataset"] for q in questions} == {"nq_open_oracle", "hotpotqa_dev"}
    for q in questions:
        assert q["question"] and q["answers"] and q["gold_ids"]
        assert set(q["gold_ids"]) <= passages.keys(), q["id"]
    assert sum(p.stat().st_size for p in demo_dir().iterdir()) < 1_000_000


# ----------------------------------------------------------------------------------------------- real data


@pytest.fixture(scope="session")
def pooled(tmp_path_factory: pytest.TempPathFactory) -> PooledCorpus:
    if not DATA.is_dir():
        pytest.skip(f"the real QA data is not at {DATA} (../shared/data)")
    return build_pooled_corpus(DATA, tmp_path_factory.mktemp("pooled"), progress=False)


@needs_data
def test_pooled_corpus_over_real_data(pooled: PooledCorpus) -> None:
    assert 20_000 <= pooled.documents <= 30_000 and pooled.passages >= pooled.documents
    assert pooled.duplicates_removed > 1_000  # SQuAD v2.0 dev repeats v1.1 dev's paragraphs, for one
    coverage = {g.dataset: g for g in pooled.gold}
    assert coverage["nq_open_oracle"].questions == coverage["nq_open_oracle"].covered == 1750
    assert all(g.covered == g.questions > 0 for g in pooled.gold)

    ids = [p.id for p in read_passages(pooled.passages_path)]
    assert len(ids) == len(set(ids)) == pooled.passages
    assert all(re.fullmatch(r"p[0-9a-f]{12}(#\d+)?", i) for i in ids)
    documents = {document_id(i) for i in ids}
    for dataset in coverage:
        for line in pooled.gold_path(dataset).open(encoding="utf-8"):
            assert set(json.loads(line)["gold_ids"]) <= documents

    manifest = json.loads(pooled.manifest_path.read_text())
    assert manifest["passages_sha256"] == pooled.sha256 and manifest["passages"] == pooled.passages
    assert manifest["gold"]["nq_open_oracle"] == {
        "file": "gold/nq_open_oracle.jsonl",
        "questions": 1750,
        "covered": 1750,
    }


@needs_data
def test_demo_sample_regenerates_from_the_data(tmp_path: Path) -> None:
    script = load_script(REPO / "scripts" / "make_demo_sample.py", "make_demo_sample")
    assert script.main(["--data", str(DATA), "--out", str(tmp_path)]) == 0
    for name in ("passages.jsonl", "questions.jsonl"):
        assert (tmp_path / name).read_bytes() == (demo_dir() / name).read_bytes(), name


# ----------------------------------------------------------------------------------------------- CLI


@needs_data
def test_cli_corpus_build(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["corpus", "build", "--data", str(DATA), "--out", str(tmp_path), "--no-chunk", "--quiet"]) == 0
    )
    out = capsys.readouterr().out
    assert "nq_open_oracle: 1,750/1,750 questions have their gold passage" in out
    assert "duplicates removed" in out and "not chunked" in out
    assert (tmp_path / "corpus.json").is_file()


def test_cli_missing_data_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["corpus", "build", "--data", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "no QA data folder at" in err and "--data" in err


def test_cli_corpus_stats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path / "c.jsonl", '{"id": "a", "title": "T", "text": "abc"}\nbroken\n')
    assert main(["corpus", "stats", str(path)]) == 2
    assert f"{path}:2" in capsys.readouterr().err
    assert main(["corpus", "stats", str(path), "--skip-bad"]) == 0
    out = capsys.readouterr().out
    assert "1 passages (jsonl)" in out and "malformed 1" in out
