"""The pooled corpus: every Wikipedia paragraph in ../shared/data in one de-duplicated passage file, with the gold
passage ids of each question file.

Sources, in the order they are read (the first copy of a paragraph gives its source; the first non-empty title
wins): NQ-open oracle (``ctxs``), SQuAD dev v1.1 and v2.0 (paragraphs; title from the article), HotpotQA dev
(IRCoT ``contexts``), HippoRAG's HotpotQA train corpus (title -> sentences, joined), MuSiQue (``context_paragraphs``,
no titles) and ``extra_passages/passages.jsonl.gz``. 2WikiMultihopQA is not read: its file holds one merged evidence
block per question with no paragraph boundaries, and its Wikipedia passages are in ``extra_passages`` already.

De-duplication rule. The same paragraph reaches the pool several times: SQuAD v2.0 dev reuses 35 of v1.1 dev's 48
articles; HotpotQA distractor paragraphs recur across questions; ``extra_passages`` holds evidence of held-out
NQ/HotpotQA/MuSiQue questions that overlaps the visible files; and copies differ in white space (IRCoT joins
sentences with two spaces, raw HotpotQA sentences carry leading spaces, DPR passages have double spaces) and in
whether they carry a title at all (MuSiQue's have none). So the key is the **text alone**, Unicode-NFKC-normalised,
white space folded to single spaces and case-folded; titles do not enter the key (a key that used the title only
when both copies have one could not be computed per passage). The stored text keeps its case, with white space
folded. A passage's id is ``"p"`` + the first 12 hex digits of the key's sha1, so ids are stable between builds
and chunking settings. Two copies with the same key and different titles are merged (first title kept) and
counted as ``title_conflicts``.

Output directory: ``passages.jsonl`` (ragate's form), ``gold/<dataset>.jsonl`` (one line per question:
``{"id", "question", "answers", "gold_ids", "dataset"}``; gold ids are *document* ids: when chunking split a gold
paragraph, its chunks are ``"{id}#{n}"``, see :func:`~ragate.retrieval.corpus.document_id`) and ``corpus.json``
(counts, build parameters, input and output checksums), each written atomically, the manifest last.
"""

from __future__ import annotations

import hashlib
import json
import time
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ragate.errors import CorpusFormatError, DataNotFoundError
from ragate.fileio import atomic_writer, json_lines
from ragate.retrieval.corpus import chunk_passages, document_id, read_passages, write_passages
from ragate.retrieval.types import Passage
from ragate.version import __version__

FORMAT_VERSION = 1


@dataclass(frozen=True)
class ChunkSettings:
    """Chunking of long paragraphs; the defaults are TARG's (~1000 characters, 100 overlap, no piece under 200)."""

    size: int = 1000
    overlap: int = 100
    min_size: int = 200


TARG_CHUNKING = ChunkSettings()


@dataclass(frozen=True)
class GoldQuestion:
    """A question of a QA file with the ids of its gold passages in the pooled corpus."""

    id: str
    question: str
    answers: tuple[str, ...]
    gold_ids: tuple[str, ...]
    dataset: str

    def to_json(self) -> str:
        obj = asdict(self)
        obj["answers"], obj["gold_ids"] = list(self.answers), list(self.gold_ids)
        return json.dumps(obj, ensure_ascii=False)


@dataclass(frozen=True)
class SourceCount:
    """How many paragraphs a source file gave (``read``), how many were new to the pool and how many were empty."""

    name: str
    file: str
    read: int
    new: int
    empty: int


@dataclass(frozen=True)
class GoldCoverage:
    """How many questions of a QA file have all their gold passages inside the corpus."""

    dataset: str
    questions: int
    covered: int


@dataclass(frozen=True)
class PooledCorpus:
    """What :func:`build_pooled_corpus` wrote."""

    out_dir: Path
    passages: int  # lines of passages.jsonl (chunks when chunked)
    documents: int  # de-duplicated paragraphs before chunking
    duplicates_removed: int
    title_conflicts: int
    sources: tuple[SourceCount, ...]
    gold: tuple[GoldCoverage, ...]
    chunking: ChunkSettings | None
    sha256: str  # of passages.jsonl
    seconds: float

    @property
    def passages_path(self) -> Path:
        return self.out_dir / "passages.jsonl"

    @property
    def manifest_path(self) -> Path:
        return self.out_dir / "corpus.json"

    def gold_path(self, dataset: str) -> Path:
        return self.out_dir / "gold" / f"{dataset}.jsonl"


# ----------------------------------------------------------------------------------------------- the pool


def fold_space(text: str) -> str:
    return " ".join(text.split())


def dedup_key(text: str) -> str:
    """The de-duplication key of a paragraph: NFKC, white space folded, case-folded (the title does not count)."""
    return unicodedata.normalize("NFKC", fold_space(text)).casefold()


def pooled_id(text: str) -> str:
    """The stable id of a paragraph: ``"p"`` + 12 hex digits of the sha1 of its :func:`dedup_key`."""
    return "p" + hashlib.sha1(dedup_key(text).encode("utf-8")).hexdigest()[:12]


class _Pool:
    """Paragraphs by id, in first-seen order (local to one build)."""

    def __init__(self) -> None:
        self.passages: dict[str, Passage] = {}
        self.read = self.new = self.empty = self.duplicates = self.title_conflicts = 0

    def add(self, title: str, text: str, source: str) -> str | None:
        """Add a paragraph; its id, or None when the text is empty."""
        self.read += 1
        text, title = fold_space(text), fold_space(title)
        if not text:
            self.empty += 1
            return None
        pid = pooled_id(text)
        kept = self.passages.get(pid)
        if kept is None:
            self.passages[pid] = Passage(id=pid, title=title, text=text, source=source)
            self.new += 1
        else:
            self.duplicates += 1
            if title and not kept.title:
                self.passages[pid] = Passage(id=pid, title=title, text=kept.text, source=kept.source)
            elif title and dedup_key(title) != dedup_key(kept.title):
                self.title_conflicts += 1
        return pid


# ----------------------------------------------------------------------------------------------- sources

Reader = Callable[[Path, _Pool, str], list[GoldQuestion]]


def _json_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    return json_lines(path, CorpusFormatError, "restore the file")


def _unique(items: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(item for item in items if item))


def _question(
    dataset: str, qid: object, question: str, answers: list[str], gold: list[str | None]
) -> GoldQuestion:
    return GoldQuestion(str(qid), question, _unique(answers), _unique([g for g in gold if g]), dataset)


def _read_nq_oracle(path: Path, pool: _Pool, name: str) -> list[GoldQuestion]:
    """lost-in-the-middle's NQ-open oracle: ``ctxs[0]`` is the gold passage (``isgold``)."""
    out = []
    for i, (_, row) in enumerate(_json_lines(path)):
        gold = pool.add(row["ctxs"][0]["title"], row["ctxs"][0]["text"], name)
        out.append(_question(name, i, row["question"], row["answers"], [gold]))
    return out


def _read_squad(path: Path, pool: _Pool, name: str) -> list[GoldQuestion]:
    """SQuAD: each question's gold is its paragraph; titles are URL names (``Fresno,_California``)."""
    with path.open(encoding="utf-8") as f:
        data = json.load(f)["data"]
    out = []
    for article in data:
        title = article["title"].replace("_", " ")
        for paragraph in article["paragraphs"]:
            gold = pool.add(title, paragraph["context"], name)
            for qa in paragraph["qas"]:
                answers = [] if qa.get("is_impossible") else [a["text"] for a in qa["answers"]]
                out.append(_question(name, qa["id"], qa["question"], answers, [gold]))
    return out


def _read_hotpot_ircot(path: Path, pool: _Pool, name: str) -> list[GoldQuestion]:
    """HotpotQA dev in IRCoT's format: 10 ``contexts`` each; gold = the ``is_supporting`` ones."""
    out = []
    for _, row in _json_lines(path):
        gold = [pool.add(c["title"], c["paragraph_text"], name) for c in row["contexts"]]
        supporting = [g for g, c in zip(gold, row["contexts"], strict=True) if c["is_supporting"]]
        answers = [span for obj in row["answers_objects"] for span in obj["spans"]]
        out.append(_question(name, row["question_id"], row["question_text"], answers, supporting))
    return out


def _read_hipporag(path: Path, pool: _Pool, name: str) -> list[GoldQuestion]:
    """HippoRAG's HotpotQA subset: ``*_corpus.json`` maps title -> sentences; the questions' supporting facts
    name the gold titles."""
    with path.open(encoding="utf-8") as f:
        corpus: dict[str, list[str]] = json.load(f)
    ids = {title: pool.add(title, "".join(sentences), name) for title, sentences in corpus.items()}
    with path.with_name(path.name.replace("_corpus", "")).open(encoding="utf-8") as f:
        questions = json.load(f)
    return [
        _question(
            name, q["_id"], q["question"], [q["answer"]], [ids.get(t) for t, _ in q["supporting_facts"]]
        )
        for q in questions
    ]


def _read_musique(path: Path, pool: _Pool, name: str) -> list[GoldQuestion]:
    """MuSiQue sample: 2-4 gold-looking ``context_paragraphs`` per question, no titles."""
    out = []
    for _, row in _json_lines(path):
        gold = [pool.add("", text, name) for text in row["context_paragraphs"]]
        out.append(_question(name, row["idx"], row["question"], [row["answer"]], gold))
    return out


def _read_extra(path: Path, pool: _Pool, name: str) -> list[GoldQuestion]:
    """Passages only; each keeps its own source tag as ``extra:<tag>``."""
    for passage in read_passages(path, format="jsonl"):
        pool.add(passage.title, passage.text, f"{name}:{passage.source}" if passage.source else name)
    return []


@dataclass(frozen=True)
class Source:
    name: str
    file: str  # relative to the data directory
    reader: Reader
    has_questions: bool = True


SOURCES: tuple[Source, ...] = (
    Source("nq_open_oracle", "nq_open_oracle/nq-open-oracle.jsonl.gz", _read_nq_oracle),
    Source("squad_v1_dev", "squad/dev-v1.1.reconstructed.json", _read_squad),
    Source("squad_v2_dev", "squad/dev-v2.0.reconstructed.json", _read_squad),
    Source("hotpotqa_dev", "hotpotqa/dev_subsampled.jsonl", _read_hotpot_ircot),
    Source("hipporag_hotpotqa_train", "hipporag_subsets/hotpotqa_train_corpus.json", _read_hipporag),
    Source("musique", "musique/sagekg_musique_500.parsed.jsonl", _read_musique),
    Source("extra", "extra_passages/passages.jsonl.gz", _read_extra, has_questions=False),
)


def _input_files(source: Source) -> tuple[str, ...]:
    if source.reader is _read_hipporag:
        return source.file, source.file.replace("_corpus", "")
    return (source.file,)


# ----------------------------------------------------------------------------------------------- the build


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def build_pooled_corpus(
    data_dir: Path | str,
    out_dir: Path | str,
    *,
    chunk: ChunkSettings | None = TARG_CHUNKING,
    progress: bool = True,
) -> PooledCorpus:
    """Pool the Wikipedia paragraphs of ``data_dir`` (../shared/data) into ``out_dir``; see the module docstring
    for the sources, the de-duplication rule and the layout. ``chunk=None`` keeps paragraphs whole."""
    t0 = time.perf_counter()
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    if not data_dir.is_dir():
        raise DataNotFoundError(
            f"no QA data folder at {data_dir.resolve()}: the pooled corpus is built from the files of "
            "../shared/data (SQuAD, NQ-open oracle, HotpotQA, HippoRAG, MuSiQue, extra_passages); pass --data DIR"
        )
    missing = [f for s in SOURCES for f in _input_files(s) if not (data_dir / f).is_file()]
    if missing:
        raise DataNotFoundError(
            f"the QA data is expected in {data_dir.resolve()} but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} missing there; pass --data DIR (the folder of ../shared/data)"
        )
    pool = _Pool()
    counts: list[SourceCount] = []
    questions: dict[str, list[GoldQuestion]] = {}
    for source in tqdm(SOURCES, desc="pooling", unit="file", disable=not progress):
        before = (pool.read, pool.new, pool.empty)
        found = source.reader(data_dir / source.file, pool, source.name)
        if source.has_questions:
            questions[source.name] = found
        counts.append(
            SourceCount(
                source.name,
                source.file,
                *(a - b for a, b in zip((pool.read, pool.new, pool.empty), before, strict=True)),
            )
        )

    documents = list(pool.passages.values())
    final = list(chunk_passages(documents, chunk.size, chunk.overlap, chunk.min_size)) if chunk else documents
    inside = {document_id(p.id) for p in final}
    coverage = tuple(
        GoldCoverage(name, len(qs), sum(1 for q in qs if q.gold_ids and set(q.gold_ids) <= inside))
        for name, qs in questions.items()
    )

    write_passages(final, out_dir / "passages.jsonl")
    for name, qs in questions.items():
        with atomic_writer(out_dir / "gold" / f"{name}.jsonl") as f:
            f.writelines(q.to_json().encode("utf-8") + b"\n" for q in qs)
    sha = _sha256(out_dir / "passages.jsonl")
    result = PooledCorpus(
        out_dir=out_dir,
        passages=len(final),
        documents=len(documents),
        duplicates_removed=pool.duplicates,
        title_conflicts=pool.title_conflicts,
        sources=tuple(counts),
        gold=coverage,
        chunking=chunk,
        sha256=sha,
        seconds=round(time.perf_counter() - t0, 2),
    )
    manifest = {
        "kind": "ragate-pooled-corpus",
        "format_version": FORMAT_VERSION,
        "ragate_version": __version__,
        "passages_file": "passages.jsonl",
        "passages_sha256": sha,
        "passages": result.passages,
        "documents": result.documents,
        "paragraphs_read": pool.read,
        "empty_skipped": pool.empty,
        "duplicates_removed": result.duplicates_removed,
        "title_conflicts": result.title_conflicts,
        "chunking": asdict(chunk) if chunk else None,
        "dedup": "text only: NFKC, white space folded, case-folded; id = 'p' + sha1(key)[:12]",
        "sources": [asdict(c) for c in counts],
        "gold": {
            c.dataset: {"file": f"gold/{c.dataset}.jsonl", "questions": c.questions, "covered": c.covered}
            for c in coverage
        },
        "inputs": {f: _sha256(data_dir / f) for s in SOURCES for f in _input_files(s)},
    }
    with atomic_writer(out_dir / "corpus.json") as f:
        f.write((json.dumps(manifest, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))
    return result
