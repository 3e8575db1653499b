"""Your own documents: find files, extract their text, chunk it (:mod:`ragate.retrieval.docread`), and index it (or
add it to an index).

``index_documents(["notes/", "papers/*.pdf"], "idx/notes")`` finds the files (folders walked, globs expanded:
:mod:`ragate.retrieval.files`), reads ``.txt``, ``.md``/``.markdown``, plain-text markup (``.rst``/``.rest``,
``.adoc``/``.asciidoc``, ``.org``, ``.textile``: as text), ``.html``/``.htm``, ``.jsonl`` (one document a line:
``{"text", "title"?, "id"?}``) and ``.pdf`` (with pypdf; text extraction in :mod:`ragate.retrieval.extract`),
chunks every document and builds a ``bm25``/``dense``/``hybrid`` index of the chunks. For a dense or hybrid
index the chunks fit the encoder's window, counted in its word pieces (:mod:`ragate.retrieval.fit`); for BM25, or
when a character ``chunk_size`` (``chunk_overlap``, ``min_chunk``) is given, TARG's chunker cuts by characters
(:func:`~ragate.retrieval.corpus.chunk_spans`: ~1000 characters, 100 overlap, min 200).

Each passage keeps the document's title, its file (``Passage.source``: the path relative to a folder argument,
as given for a file or a glob match) and its span ``[start, end)`` in the extracted text
(:mod:`ragate.retrieval.extract`). Passage ids are ``"{doc}#{n}"`` for chunk n, where ``doc`` is a JSONL line's
``id`` when it has one, else ``"d"`` + 12 hex digits of the sha1 of the source (and, in a JSONL file, the line
number): stable across rebuilds, and :func:`~ragate.retrieval.corpus.document_id` maps a chunk to its document.

The index directory also holds ``documents.json`` (each file's source, size, sha256 and passage ids), so that
:func:`add_documents` skips unchanged files, re-chunks changed ones, adds new ones without re-encoding the
passages it keeps, and drops the passages of files gone from the folders (and globs) it is given.

Only regular files inside the paths given are read (the link and special-file policy of
:mod:`ragate.retrieval.files`).

What a call skipped and warned about is what ``ragate index build --docs`` prints, given two ways: in the
:class:`DocumentStats` passed as ``stats`` (``unsupported``, ``empty``, ``bad`` with ``examples``, ``skipped``,
``lengths``), and as Python warnings with the CLI's text, so that a call without ``stats`` is not silent:
:class:`SkippedFilesWarning` (files of types ragate does not read, empty documents, damaged files skipped with
``skip_bad``), :class:`SkippedPathsWarning` (paths the link policy left out) and :class:`PassageLengthWarning`
(passages longer than the encoder reads); all are :class:`DocumentsWarning`, a ``RuntimeWarning``, at most one of
each per call. The CLI prints them itself and silences the warnings.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragate.errors import DataNotFoundError, IndexFormatError
from ragate.fileio import lone_surrogate
from ragate.retrieval.corpus import MAX_EXAMPLES, document_id
from ragate.retrieval.dense import HNSWParams
from ragate.retrieval.docread import (  # noqa: F401 (some stay importable here)
    Chunking,
    DocumentStats,
    DocumentsWarning,
    FileRecord,
    PassageLengthWarning,
    SkippedFilesWarning,
    SkippedPathsWarning,
    _read_all,
    character_chunking,
    read_file,
)
from ragate.retrieval.encoders import Encoder
from ragate.retrieval.extract import (
    DamagedFile,
)
from ragate.retrieval.files import SUFFIXES, DocumentFile, NotRegularFile, covers, find_files, read_regular
from ragate.retrieval.fit import FitChunker, chunking_from_manifest, manifest_chunking
from ragate.retrieval.index import (
    IndexKind,
    build_encoder,
    index_encoder,
    index_info,
    index_manifest,
    write_index_files,
    write_updated_index,
)
from ragate.retrieval.lengths import check_passage_lengths
from ragate.retrieval.pooled import ChunkSettings
from ragate.retrieval.store import PASSAGES, iter_passage_file, staged_directory, write_manifest

DOCUMENTS = "documents.json"


# ----------------------------------------------------------------------------------------------- indexing


def _find(paths: Sequence[str], stats: DocumentStats) -> list[DocumentFile]:
    found = find_files(paths)
    for suffix, n in found.unsupported.items():
        stats.unsupported[suffix] = stats.unsupported.get(suffix, 0) + n
    stats.skipped += found.skipped
    return list(found.files)


def skipped_message(skipped: Sequence[str]) -> str:
    """The warning for paths the link and special-file policy left out: how many, and the first few."""
    head = (
        f"skipped {len(skipped):,} path{'' if len(skipped) == 1 else 's'} under --docs that ragate does not read "
        "(it reads regular files inside the folders given: see 'Links and special files' in docs/retrieval.md)"
    )
    lines = [f"  {problem}" for problem in skipped[:MAX_EXAMPLES]]
    if len(skipped) > MAX_EXAMPLES:
        lines.append(f"  ... and {len(skipped) - MAX_EXAMPLES:,} more")
    return "\n".join([head + ":", *lines])


def problem_lines(stats: DocumentStats) -> list[str]:
    """What was skipped as unsupported, empty or damaged, in the lines ``ragate index build --docs`` prints."""
    lines = []
    if stats.unsupported:
        kinds = ", ".join(f"{suffix} {n:,}" for suffix, n in sorted(stats.unsupported.items()))
        lines.append(
            f"skipped {_count(sum(stats.unsupported.values()), 'file')} of unsupported types ({kinds}); "
            f"ragate reads {' '.join(SUFFIXES)}"
        )
    if stats.empty or stats.bad:
        lines.append(
            f"skipped {_count(stats.empty, 'empty document')} and {stats.bad:,} damaged files or lines; "
            "first problems:"
        )
        lines += [f"  {example}" for example in stats.examples]
    return lines


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


@dataclass(frozen=True)
class _Seen:
    """How much a :class:`DocumentStats` held when a call began (a caller may pass one to several calls)."""

    skipped: int
    unsupported: dict[str, int]
    empty: int
    bad: int
    examples: int

    @classmethod
    def of(cls, stats: DocumentStats) -> _Seen:
        return cls(len(stats.skipped), dict(stats.unsupported), stats.empty, stats.bad, len(stats.examples))


def _warn_skipped(stats: DocumentStats, before: _Seen) -> None:
    """One :class:`SkippedPathsWarning` for the paths this call skipped and one :class:`SkippedFilesWarning` for
    the files it skipped (what ``stats`` gained since ``before``), each with the CLI's text."""
    if len(stats.skipped) > before.skipped:
        warnings.warn(skipped_message(stats.skipped[before.skipped :]), SkippedPathsWarning, stacklevel=3)
    unsupported = {
        suffix: n - before.unsupported.get(suffix, 0)
        for suffix, n in stats.unsupported.items()
        if n > before.unsupported.get(suffix, 0)
    }
    this_call = DocumentStats(
        empty=stats.empty - before.empty,
        bad=stats.bad - before.bad,
        unsupported=unsupported,
        examples=stats.examples[before.examples :],
    )
    if lines := problem_lines(this_call):
        warnings.warn("\n".join(lines), SkippedFilesWarning, stacklevel=3)


def _path_list(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[str]:
    if isinstance(paths, str | os.PathLike):
        return [os.fspath(paths)]
    return [os.fspath(p) for p in paths]


def _documents_entry(records: Sequence[FileRecord], paths: Sequence[str]) -> dict[str, Any]:
    return {"files": len(records), "documents": sum(r.documents for r in records), "paths": list(paths)}


def _write_records(root: Path, records: Sequence[FileRecord]) -> None:
    with open(root / DOCUMENTS, "w", encoding="utf-8") as f:
        json.dump({"files": [r.to_json() for r in records]}, f, indent=1, ensure_ascii=False)
        f.write("\n")


def read_records(index_dir: Path) -> list[FileRecord]:
    """The files an index built from documents holds (``documents.json``), in the order they were added; one
    that cannot be read as such (not JSON, a field of another type, text that is not Unicode) is an
    :class:`IndexFormatError` naming it."""
    path = Path(index_dir) / DOCUMENTS
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        records = [FileRecord.from_json(obj) for obj in data["files"]]
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as err:
        raise IndexFormatError(
            f"{path} cannot be read ({type(err).__name__}: {err}); rebuild the index"
        ) from None
    fault = next((f for f in [lone_surrogate(data), *map(_record_fault, records)] if f is not None), None)
    if fault is not None:
        raise IndexFormatError(f"{path} cannot be read ({fault}); rebuild the index")
    return records


def _record_fault(record: FileRecord) -> str | None:
    """What is wrong with one entry of ``documents.json``, else None."""
    if not isinstance(record.source, str) or not record.source:
        return f"a file's source must be its name, not {record.source!r}"
    counts = (record.size, record.documents)
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts):
        return f"{record.source}: size and documents must be counts, not {counts}"
    if not isinstance(record.sha256, str) or not re.fullmatch(r"[0-9a-f]{64}", record.sha256):
        return f"{record.source}: sha256 must be 64 hex digits, not {record.sha256!r}"
    if not all(isinstance(p, str) and p for p in record.passages):
        return f"{record.source}: passages must be passage ids"
    return None


def index_documents(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    out_dir: str | Path,
    kind: IndexKind = "hybrid",
    *,
    chunk_size: int | None = None,
    chunk_overlap: int | None = None,
    min_chunk: int | None = None,
    encoder: Encoder | str | Path | None = None,
    hnsw: bool = False,
    hnsw_params: HNSWParams | None = None,
    batch_size: int = 32,
    overwrite: bool = False,
    progress: bool = True,
    skip_bad: bool = False,
    stats: DocumentStats | None = None,
) -> Path:
    """Index the documents under ``paths`` (files, folders, globs) in ``out_dir`` (atomically); returns it.

    Chunking: for ``dense`` and ``hybrid``, chunks fit the encoder's window, counted in its word pieces with the
    title (:mod:`ragate.retrieval.fit`), unless one of ``chunk_size``, ``chunk_overlap``, ``min_chunk`` is given:
    then, and for ``bm25``, chunks are about ``chunk_size`` characters, overlap by ``chunk_overlap`` and are never
    under ``min_chunk`` (TARG's 1000, 100 and 200 for those not given). A damaged file (not UTF-8, a bad JSONL line, an unreadable PDF, over
    :data:`~ragate.retrieval.files.MAX_FILE_BYTES`) raises :class:`CorpusFormatError` naming it unless
    ``skip_bad``; ``stats`` receives the counts. Paths the link and special-file policy leaves out (links out of
    the folders given, FIFOs, devices, names that are not UTF-8) are skipped with a :class:`SkippedPathsWarning`
    and listed in ``stats.skipped``. Files of other types and empty documents are skipped, counted in ``stats``
    and warned about in one :class:`SkippedFilesWarning`. The stored passages are then checked against the encoder
    (:func:`ragate.retrieval.lengths.check_passage_lengths`; ``stats.lengths``), with a
    :class:`PassageLengthWarning` when they are too long, as ``ragate index build`` warns.
    """
    by_characters = character_chunking(chunk_size, chunk_overlap, min_chunk)
    path_list = _path_list(paths)
    stats = stats if stats is not None else DocumentStats()
    before = _Seen.of(stats)
    files = _find(path_list, stats)
    enc = build_encoder(kind, encoder)
    chunking: Chunking = by_characters or FitChunker.of(enc) or ChunkSettings()
    stats.chunking = manifest_chunking(chunking)
    records: list[FileRecord] = []
    out_dir = Path(out_dir)
    with staged_directory(out_dir, overwrite=overwrite) as root:
        passages = _read_all(files, chunking, records, skip_bad=skip_bad, stats=stats, seen={})
        n, params = write_index_files(
            root,
            passages,
            kind,
            enc,
            hnsw=hnsw,
            hnsw_params=hnsw_params,
            batch_size=batch_size,
            progress=progress,
        )
        _write_records(root, records)
        extra = {"documents": _documents_entry(records, path_list), "chunking": stats.chunking}
        write_manifest(root, index_manifest(kind, n, enc, params, extra=extra))
    _warn_skipped(stats, before)
    stats.lengths = check = check_passage_lengths(iter_passage_file(out_dir / PASSAGES), enc)
    if check.should_warn:
        fit = by_characters is not None and FitChunker.of(enc) is not None
        warnings.warn(check.warning(fit=fit), PassageLengthWarning, stacklevel=2)
    return out_dir


def _unchanged(doc_file: DocumentFile, record: FileRecord | None) -> bool:
    """Whether the index holds this file with the same bytes; a file that cannot be read now is read again by
    the add, which names what is wrong with it."""
    if record is None:
        return False
    try:
        return record.sha256 == hashlib.sha256(read_regular(doc_file.path)).hexdigest()
    except (DamagedFile, NotRegularFile):
        return False


def add_documents(
    index_dir: str | Path,
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    *,
    encoder: Encoder | str | Path | None = None,
    batch_size: int = 32,
    progress: bool = True,
    skip_bad: bool = False,
    stats: DocumentStats | None = None,
) -> Path:
    """Add the files under ``paths`` to an index built by :func:`index_documents`, in place and atomically.

    A file whose source name and sha256 the index already holds is skipped; a changed one replaces its old
    passages; a new one is added. A file the index holds that is gone from a folder given (deleted, renamed,
    or now left out by the link policy), or no longer matched by a glob given, has its passages dropped
    (``stats.dropped``). Kept passages keep their embedding rows (copied, not re-encoded); BM25 and HNSW are
    rebuilt over the whole store. Chunking is the index's. Files the index holds that ``paths`` do not cover
    stay. Nothing is written when nothing changed. Skipped paths and files are reported as by
    :func:`index_documents`.
    """
    index_dir = Path(index_dir)
    stats = stats if stats is not None else DocumentStats()
    before = _Seen.of(stats)
    manifest = index_info(index_dir)
    if not manifest.get("documents") or not manifest.get("chunking"):
        raise IndexFormatError(
            f"{index_dir} was not built from documents (ragate index build --docs): only such an index records "
            "its files; build one with `ragate index build --docs PATH ... --out DIR`"
        )
    enc = index_encoder(index_dir, manifest, encoder) if manifest["kind"] != "bm25" else None
    try:
        chunking = chunking_from_manifest(manifest["chunking"], enc)
    except (KeyError, TypeError, ValueError) as err:
        raise IndexFormatError(f"{index_dir}: cannot chunk new documents as the index did ({err})") from None
    stats.chunking = dict(manifest["chunking"])
    old = read_records(index_dir)
    by_source = {r.source: r for r in old}
    path_list = _path_list(paths)
    found = _find(path_list, stats)
    present = {f.source for f in found}
    gone = {r.source for r in old if r.source not in present and covers(path_list, r.source)}
    todo: list[DocumentFile] = []
    replaced: set[str] = set()
    for doc_file in found:
        record = by_source.get(doc_file.source)
        if _unchanged(doc_file, record):
            stats.unchanged += 1
        else:
            todo.append(doc_file)
            if record is not None:
                replaced.add(record.source)
    seen = {
        document_id(p): f"{r.source} (in the index)"
        for r in old
        if r.source not in replaced and r.source not in gone
        for p in r.passages
    }
    records: list[FileRecord] = []
    new = list(_read_all(todo, chunking, records, skip_bad=skip_bad, stats=stats, seen=seen, need_text=False))
    _warn_skipped(stats, before)
    if not records and not gone:  # nothing new, or every new or changed file was damaged and skipped
        return index_dir
    replaced &= {r.source for r in records}  # a changed file skipped as damaged keeps its old passages
    stats.replaced = len(replaced)
    kept = [r for r in old if r.source not in replaced and r.source not in gone]
    stats.dropped += [r.source for r in old if r.source in gone]
    stats.dropped_passages += sum(len(r.passages) for r in old if r.source in gone)
    keep_ids = [pid for r in kept for pid in r.passages]
    if not keep_ids and not new:
        raise DataNotFoundError(
            f"every file {index_dir} holds is gone from {', '.join(path_list)}, and nothing new was found there: "
            "an index cannot be empty; build a new one from your documents (ragate index build --docs)"
        )
    with staged_directory(index_dir, overwrite=True) as root:
        if index_info(index_dir, verify=False) != manifest:
            raise IndexFormatError(f"{index_dir} changed while files were being added; run the add again")
        n, params = write_updated_index(
            root, index_dir, manifest, keep_ids, new, enc, batch_size=batch_size, progress=progress
        )
        all_records = kept + records
        _write_records(root, all_records)
        paths_before = manifest["documents"].get("paths") or []
        documents = _documents_entry(
            all_records, [*paths_before, *(p for p in path_list if p not in paths_before)]
        )
        extra = {"documents": documents, "chunking": manifest["chunking"]}
        write_manifest(root, index_manifest(manifest["kind"], n, enc, params, extra=extra))
    return index_dir
