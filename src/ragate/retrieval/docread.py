"""Reading your documents (:mod:`ragate.retrieval.documents` indexes them): a file's text as documents (txt,
markdown and other markup, html, jsonl, pdf), each document cut into passages, and what a read skipped or warned
about (:class:`DocumentStats`, the :class:`DocumentsWarning` family)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ragate.errors import CorpusFormatError, DataNotFoundError
from ragate.fileio import lone_surrogate
from ragate.retrieval.corpus import MAX_EXAMPLES, chunk_spans
from ragate.retrieval.extract import (
    DamagedFile,
    Extracted,
    decode_text,
    extract_html,
    extract_markdown,
    extract_markup,
    extract_pdf,
    extract_text,
)
from ragate.retrieval.files import SUFFIXES, DocumentFile, NotRegularFile, read_regular
from ragate.retrieval.fit import FitChunker, chunk_spans_for
from ragate.retrieval.lengths import LengthCheck
from ragate.retrieval.pooled import ChunkSettings
from ragate.retrieval.types import Passage

MARKUP = ("rst", "asciidoc", "org", "textile")  # plain-text markup: read as text, titled by its own headings


SKIP_BAD = "pass --skip-bad (skip_bad=True) to skip and count damaged files and lines"


class _BadLine(Exception):
    """A JSONL line that is not a document; the reader adds file and line number."""


class DocumentsWarning(RuntimeWarning):
    """Something :func:`index_documents` or :func:`add_documents` skipped or found wrong (the CLI prints it)."""


class SkippedPathsWarning(DocumentsWarning):
    """Paths under the documents given that were not read: links out of the folders given, dangling links and
    loops, FIFOs, sockets and devices, names that are not UTF-8 (the message lists them)."""


class SkippedFilesWarning(DocumentsWarning):
    """Files of types ragate does not read, empty documents, and damaged files or lines skipped with ``skip_bad``
    (how many of each, the first problems)."""


class PassageLengthWarning(DocumentsWarning):
    """Passages longer than the encoder reads (or than a reader's prompt takes, for BM25): the message says how
    many and the fix (:mod:`ragate.retrieval.lengths`)."""


@dataclass
class DocumentStats:
    """What one :func:`index_documents` / :func:`add_documents` call saw. Mutable on purpose, like
    :class:`~ragate.retrieval.corpus.ReadStats`: the reader fills it in as it goes."""

    files: int = 0  # files read
    documents: int = 0  # documents with text
    passages: int = 0
    empty: int = 0  # documents with no text, skipped
    bad: int = 0  # damaged files and JSONL lines, skipped (skip_bad)
    unchanged: int = 0  # files already in the index with the same content (add)
    replaced: int = 0  # files in the index whose content changed, re-chunked (add)
    unsupported: dict[str, int] = field(default_factory=dict)  # suffix -> files skipped
    examples: list[str] = field(default_factory=list)  # the first few problems, "file[:line]: reason"
    skipped: list[str] = field(default_factory=list)  # "path: why", left out by the link policy
    dropped: list[str] = field(default_factory=list)  # files gone from the paths given (add)
    dropped_passages: int = 0  # the passages of those files, dropped from the index (add)
    chunking: dict[str, Any] = field(default_factory=dict)  # how they were chunked: the manifest's entry
    lengths: LengthCheck | None = None  # the stored passages against the encoder's window (index_documents)

    def note(self, problem: str) -> None:
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(problem)


@dataclass(frozen=True)
class Document:
    """One document: ``key`` is the document part of its passage ids."""

    key: str
    source: str
    title: str
    text: str


@dataclass(frozen=True)
class FileRecord:
    """One line of ``documents.json``: a file the index holds and the passages it gave."""

    source: str
    size: int
    sha256: str
    documents: int
    passages: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "passages": list(self.passages)}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> FileRecord:
        if not isinstance(obj["passages"], list):  # a string would read as one id per character
            raise TypeError(f"'passages' must be a list of passage ids, not {obj['passages']!r}")
        return cls(obj["source"], obj["size"], obj["sha256"], obj["documents"], tuple(obj["passages"]))


def _key(*parts: object) -> str:
    return "d" + hashlib.sha1(":".join(map(str, parts)).encode("utf-8")).hexdigest()[:12]


def read_file(
    doc_file: DocumentFile,
    data: bytes,
    *,
    skip_bad: bool = False,
    stats: DocumentStats | None = None,
    seen: dict[str, str] | None = None,
) -> list[Document]:
    """The documents of one file's bytes (one, or one a line for JSONL); empty ones are counted, not returned.

    ``DamagedFile`` for a file that cannot be read as its type; a bad JSONL line raises
    :class:`CorpusFormatError` naming file and line unless ``skip_bad``. ``seen`` maps the document keys read so
    far to where they came from (JSONL ids must be unique across files).
    """
    stats = stats if stats is not None else DocumentStats()
    seen = seen if seen is not None else {}
    kind = SUFFIXES[doc_file.path.suffix.lower()]
    stem = doc_file.path.stem
    if kind == "jsonl":
        docs = _read_jsonl(doc_file, decode_text(data), skip_bad=skip_bad, stats=stats, seen=seen)
    else:
        extracted: Extracted
        if kind == "pdf":
            extracted = extract_pdf(data, stem)
        elif kind == "html":
            extracted = extract_html(decode_text(data), stem)
        elif kind == "markdown":
            extracted = extract_markdown(decode_text(data), stem)
        elif kind in MARKUP:
            extracted = extract_markup(decode_text(data), stem, kind)
        else:
            extracted = extract_text(decode_text(data), stem)
        key = _key(doc_file.source)
        docs = [Document(key, doc_file.source, extracted.title, extracted.text)]
    kept = [doc for doc in docs if doc.text.strip()]
    stats.empty += len(docs) - len(kept)
    if len(kept) < len(docs):
        stats.note(f"{doc_file.path}: {len(docs) - len(kept)} empty document(s) skipped")
    return kept


def _read_jsonl(
    doc_file: DocumentFile, text: str, *, skip_bad: bool, stats: DocumentStats, seen: dict[str, str]
) -> list[Document]:
    docs = []
    for line_no, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{doc_file.path}:{line_no}"
        try:
            doc = _jsonl_document(line, doc_file.source, line_no)
            if doc.key in seen:
                raise _BadLine(f"duplicate id {doc.key!r} (first at {seen[doc.key]})")
        except _BadLine as bad:
            if not skip_bad:
                raise CorpusFormatError(
                    f'{where}: {bad}. Each line must be {{"text": ..., "title"?: ..., "id"?: ...}}; fix the '
                    f"line, or {SKIP_BAD}"
                ) from None
            stats.bad += 1
            stats.note(f"{where}: {bad}")
            continue
        seen[doc.key] = where
        docs.append(doc)
    return docs


def _jsonl_document(line: str, source: str, line_no: int) -> Document:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as err:
        raise _BadLine(f"not valid JSON ({err.msg} at column {err.colno})") from None
    except (ValueError, RecursionError) as err:  # a number of over 4,300 digits; nesting too deep
        why = "nested too deeply" if isinstance(err, RecursionError) else str(err).split(";")[0]
        raise _BadLine(f"not valid JSON ({why})") from None
    if not isinstance(obj, dict):
        raise _BadLine(f"expected a JSON object, found {type(obj).__name__}")
    if (fault := lone_surrogate(obj)) is not None:
        raise _BadLine(f"{fault} (a \\ud800-style escape without its pair), which is not text")
    text, title, doc_id = obj.get("text"), obj.get("title"), obj.get("id")
    if not isinstance(text, str):
        raise _BadLine('missing "text"' if text is None else '"text" must be a string')
    if title is not None and not isinstance(title, str):
        raise _BadLine('"title" must be a string')
    if doc_id is not None and (
        isinstance(doc_id, bool) or not isinstance(doc_id, str | int) or not str(doc_id)
    ):
        raise _BadLine('"id" must be a non-empty string or an integer')
    key = str(doc_id) if doc_id is not None else _key(source, line_no)
    return Document(key, source, title or "", text)


Chunking = ChunkSettings | FitChunker  # by characters (TARG's chunker), or in the encoder's word pieces


def document_passages(doc: Document, chunking: Chunking) -> list[Passage]:
    """The chunks of a document (TARG's chunker by characters, or to fit the encoder's window), each span trimmed
    of white space at its ends, so that ``doc.text[start:end] == passage.text``; ids ``"{key}#{n}"``."""
    out: list[Passage] = []
    for start, end in chunk_spans_for(doc.text, doc.title, chunking):
        piece = doc.text[start:end]
        start += len(piece) - len(piece.lstrip())
        end -= len(piece) - len(piece.rstrip())
        if start < end:
            out.append(
                Passage(
                    id=f"{doc.key}#{len(out)}",
                    title=doc.title,
                    text=doc.text[start:end],
                    source=doc.source,
                    span=(start, end),
                )
            )
    return out


def character_chunking(
    size: int | None = None, overlap: int | None = None, min_size: int | None = None
) -> ChunkSettings | None:
    """Chunking by characters when any of the three is given (TARG's value for each one not given), checked;
    None when none is (the default: fit the encoder, or TARG's characters for BM25)."""
    if size is None and overlap is None and min_size is None:
        return None
    default = ChunkSettings()
    chunking = ChunkSettings(
        default.size if size is None else size,
        default.overlap if overlap is None else overlap,
        default.min_size if min_size is None else min_size,
    )
    check_chunking(chunking)
    return chunking


def check_chunking(chunking: ChunkSettings) -> None:
    """``ValueError`` naming the flags unless 1 <= overlap < size and 0 <= min <= size."""
    try:
        chunk_spans("", chunking.size, chunking.overlap, chunking.min_size)
    except ValueError:
        raise ValueError(
            "chunk settings need --chunk-size >= 1, 0 <= --chunk-overlap < --chunk-size and "
            f"0 <= --min-chunk <= --chunk-size; got {chunking.size}, {chunking.overlap}, {chunking.min_size}"
        ) from None


def _read_all(
    files: Sequence[DocumentFile],
    chunking: Chunking,
    records: list[FileRecord],
    *,
    skip_bad: bool,
    stats: DocumentStats,
    seen: dict[str, str],
    need_text: bool = True,
) -> Iterator[Passage]:
    """Stream the passages of ``files``, appending each file's record to ``records`` once it is read;
    ``need_text``: no passage at all is an error."""
    for doc_file in files:
        try:
            data = read_regular(doc_file.path)
            docs = read_file(doc_file, data, skip_bad=skip_bad, stats=stats, seen=seen)
        except NotRegularFile as why:  # replaced by a FIFO or a device since it was found
            stats.skipped.append(f"{doc_file.source}: {why}")
            continue
        except DamagedFile as bad:
            if not skip_bad:
                raise CorpusFormatError(f"{doc_file.path}: {bad}; or {SKIP_BAD}") from None
            stats.bad += 1
            stats.note(f"{doc_file.path}: {bad}")
            continue
        stats.files += 1
        ids: list[str] = []
        for doc in docs:
            stats.documents += 1
            for passage in document_passages(doc, chunking):
                ids.append(passage.id)
                stats.passages += 1
                yield passage
        sha = hashlib.sha256(data).hexdigest()
        records.append(FileRecord(doc_file.source, len(data), sha, len(docs), tuple(ids)))
    if need_text and not stats.passages:
        names = ", ".join(str(f.path) for f in files[:3]) + (", ..." if len(files) > 3 else "")
        raise DataNotFoundError(
            f"no text in the documents ({stats.files} files read: {names}; {stats.empty} empty documents, "
            f"{stats.bad} skipped as damaged); check the paths given to --docs"
        )
