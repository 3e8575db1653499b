"""``ragate index`` (build, add to and inspect index directories) and ``ragate search`` (query one).

``index build`` reads a corpus file of passages (``--corpus``) or your own documents (``--docs``, chunked; see
:mod:`ragate.retrieval.documents`), then warns on stderr when passages are longer than the encoder (or the
reader's prompt) takes (:mod:`ragate.retrieval.lengths`). ``index add`` adds new and changed documents to an
index built with ``--docs`` and drops those gone from the folders given. Paths left out by the link and
special-file policy (:mod:`ragate.retrieval.files`) are listed on stderr as a warning.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ragate.retrieval.types import Passage

SNIPPET_CHARS = 150


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "index", help="build and inspect retrieval indexes", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="index_command", metavar="ACTION", required=True)

    build = commands.add_parser(
        "build", help="index a corpus file or your own documents as BM25, dense or hybrid (BM25 + dense, RRF)"
    )
    source = build.add_mutually_exclusive_group(required=True)
    source.add_argument("--corpus", type=Path, help="passages: ragate/FlashRAG JSONL or DPR TSV")
    source.add_argument(
        "--docs",
        nargs="+",
        metavar="PATH",
        help="your own documents: files, folders (recursive) or globs of .txt .md .rst .adoc .org .html .jsonl .pdf; "
        "chunked",
    )
    build.add_argument("--kind", choices=("bm25", "dense", "hybrid"), required=True)
    build.add_argument("--out", type=Path, required=True, help="index directory to create")
    build.add_argument(
        "--encoder",
        default=None,
        help="dense/hybrid: all-MiniLM-L6-v2 (default) or a local sentence-transformers directory",
    )
    build.add_argument(
        "--hnsw", action="store_true", help="dense/hybrid: approximate HNSW instead of exact flat"
    )
    build.add_argument("--hnsw-m", type=int, default=32, help="HNSW neighbours per node (default 32)")
    build.add_argument("--ef-construction", type=int, default=200, help="HNSW build beam (default 200)")
    build.add_argument("--ef-search", type=int, default=128, help="HNSW search beam (default 128)")
    build.add_argument("--format", default="auto", choices=("auto", "jsonl", "flashrag", "tsv"))
    _chunk_flags(build)
    build.add_argument(
        "--skip-bad", action="store_true", help="skip and count malformed corpus lines or damaged documents"
    )
    build.add_argument("--force", action="store_true", help="replace an existing non-empty --out directory")
    build.add_argument("--batch-size", type=int, default=32, help="encoder batch size (default 32)")
    build.add_argument("--quiet", action="store_true", help="no progress bars")
    build.set_defaults(run=run_build)

    add = commands.add_parser(
        "add",
        help="add new and changed documents to an index built with --docs, drop those gone from its folders "
        "(old passages kept as encoded)",
    )
    add.add_argument("dir", type=Path, help="index directory built by `ragate index build --docs`")
    add.add_argument("--docs", nargs="+", metavar="PATH", required=True, help="files, folders or globs")
    add.add_argument(
        "--encoder", default=None, help="the index's encoder, if it moved (default: as recorded)"
    )
    add.add_argument("--skip-bad", action="store_true", help="skip and count damaged documents")
    add.add_argument("--batch-size", type=int, default=32, help="encoder batch size (default 32)")
    add.add_argument("--quiet", action="store_true", help="no progress bars")
    add.set_defaults(run=run_add)

    info = commands.add_parser("info", help="print an index's manifest after verifying its files")
    info.add_argument("dir", type=Path)
    info.add_argument("--json", action="store_true", help="the manifest as JSON")
    info.add_argument("--no-verify", action="store_true", help="check file sizes only, not sha256")
    info.set_defaults(run=run_info)

    search = subparsers.add_parser("search", help="search an index directory", description="Search an index.")
    search.add_argument("dir", type=Path, help="index directory (ragate index build)")
    search.add_argument("query", nargs="+", help="one or more queries")
    search.add_argument("-k", type=int, default=5, help="hits per query (default 5)")
    search.add_argument("--json", action="store_true", help="one JSON object per query")
    search.add_argument("--encoder", default=None, help="override the encoder recorded in the index")
    search.add_argument("--no-verify", action="store_true", help="skip the sha256 check of the index files")
    search.set_defaults(run=run_search)


def _chunk_flags(parser: argparse.ArgumentParser) -> None:
    chunk = parser.add_argument_group(
        "chunking",
        "--docs chunks for a dense or hybrid index to fit the encoder's window, counted in its word pieces; these "
        "flags chunk by characters instead (TARG's chunker), which is the default for bm25. With --corpus, "
        "chunking is on only when a flag is given.",
    )
    chunk.add_argument("--chunk-size", type=int, default=None, help="characters per chunk (default 1000)")
    chunk.add_argument("--chunk-overlap", type=int, default=None, help="characters of overlap (default 100)")
    chunk.add_argument(
        "--min-chunk", "--chunk-min", dest="min_chunk", type=int, default=None,
        help="no chunk shorter than this: a shorter tail joins the chunk before it (default 200)",
    )  # fmt: skip


def _chunking(args: argparse.Namespace) -> Any:
    """The character chunk settings the flags ask for (TARG's for the flags not given); ``None`` without any chunk
    flag (``--docs``: fit the encoder, or characters for bm25; ``--corpus``: no chunking)."""
    from ragate.errors import RagateError
    from ragate.retrieval.documents import character_chunking

    try:
        return character_chunking(args.chunk_size, args.chunk_overlap, args.min_chunk)
    except ValueError as err:
        raise RagateError(str(err)) from None


def run_build(args: argparse.Namespace) -> int:
    from ragate.errors import RagateError
    from ragate.retrieval.dense import HNSWParams
    from ragate.retrieval.index import build_encoder
    from ragate.retrieval.lengths import check_passage_lengths
    from ragate.retrieval.store import PASSAGES, iter_passage_file

    if args.hnsw and args.kind == "bm25":
        raise RagateError("--hnsw applies to --kind dense or hybrid, not bm25")
    if args.docs and args.format != "auto":
        raise RagateError("--format applies to --corpus; --docs reads each file by its extension")
    chunking = _chunking(args)
    encoder = build_encoder(args.kind, args.encoder)
    common: dict[str, Any] = {
        "encoder": encoder,
        "hnsw": args.hnsw,
        "hnsw_params": HNSWParams(args.hnsw_m, args.ef_construction, args.ef_search),
        "batch_size": args.batch_size,
        "overwrite": args.force,
        "progress": not args.quiet,
    }
    start = time.perf_counter()
    check = None
    if args.docs:
        out, count, report, check = _build_from_documents(args, chunking, common)
    else:
        out, count, report = _build_from_corpus(args, chunking, common)
    seconds = time.perf_counter() - start
    rate = count / seconds if seconds > 0 else float("inf")
    print(f"indexed {count:,} passages ({args.kind}) in {seconds:.1f} s: {rate:,.0f} passages/s")
    for line in report:
        print(line)
    if check is None:  # --docs: index_documents checked them
        check = check_passage_lengths(iter_passage_file(out / PASSAGES), encoder, progress=not args.quiet)
    if check.should_warn:
        print(f"ragate: warning: {check.warning(fit=bool(args.docs))}", file=sys.stderr)
    print(out)
    return 0


def _build_from_corpus(
    args: argparse.Namespace, chunking: Any, common: dict[str, Any]
) -> tuple[Path, int, list[str]]:
    from ragate.retrieval.corpus import ReadStats, chunk_passages, read_passages
    from ragate.retrieval.index import build_index

    stats = ReadStats()
    passages: Iterable[Passage] = read_passages(
        args.corpus, format=args.format, skip_bad=args.skip_bad, stats=stats
    )
    counted: list[int] = [0]
    if chunking is not None:
        passages = _counting(
            chunk_passages(passages, chunking.size, chunking.overlap, chunking.min_size), counted
        )
    out = build_index(passages, args.out, args.kind, corpus=str(args.corpus), chunking=chunking, **common)
    report = []
    if chunking is not None:
        report.append(
            f"chunked {stats.passages:,} corpus passages into {counted[0]:,} ({_describe(chunking)})"
        )
    if stats.skipped:
        report.append(
            f"skipped {stats.malformed:,} malformed lines and {stats.duplicates:,} duplicate ids; first problems:"
        )
        report += [f"  {example}" for example in stats.examples]
    return out, counted[0] if chunking is not None else stats.passages, report


def _counting(passages: Iterable[Passage], counter: list[int]) -> Iterator[Passage]:
    for passage in passages:
        counter[0] += 1
        yield passage


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def _describe(chunking: Any) -> str:
    from ragate.retrieval.fit import describe_chunking, manifest_chunking

    return describe_chunking(manifest_chunking(chunking))


def _build_from_documents(
    args: argparse.Namespace, chunking: Any, common: dict[str, Any]
) -> tuple[Path, int, list[str], Any]:
    from ragate.retrieval.documents import DocumentStats, DocumentsWarning, index_documents, problem_lines

    stats = DocumentStats()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DocumentsWarning)  # printed below from stats, as the CLI's lines
        try:
            out = index_documents(
                args.docs,
                args.out,
                args.kind,
                chunk_size=None if chunking is None else chunking.size,
                chunk_overlap=None if chunking is None else chunking.overlap,
                min_chunk=None if chunking is None else chunking.min_size,
                skip_bad=args.skip_bad,
                stats=stats,
                **common,
            )
        finally:
            _warn_skipped(stats)
    from ragate.retrieval.fit import describe_chunking

    summary = (
        f"read {_count(stats.files, 'file')}: {_count(stats.documents, 'document')}, "
        f"{_count(stats.passages, 'passage')} "
        f"({describe_chunking(stats.chunking)})"
    )
    return out, stats.passages, [summary, *problem_lines(stats)], stats.lengths


def _warn_skipped(stats: Any) -> None:
    """The paths the link and special-file policy left out, on stderr (the same text Python's warning has)."""
    from ragate.retrieval.documents import skipped_message

    if stats.skipped:
        print(f"ragate: warning: {skipped_message(stats.skipped)}", file=sys.stderr)


def run_add(args: argparse.Namespace) -> int:
    from ragate.retrieval.documents import DocumentStats, DocumentsWarning, add_documents, problem_lines
    from ragate.retrieval.store import read_manifest

    stats = DocumentStats()
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DocumentsWarning)  # printed below from stats, as the CLI's lines
        try:
            out = add_documents(
                args.dir,
                args.docs,
                encoder=args.encoder,
                batch_size=args.batch_size,
                progress=not args.quiet,
                skip_bad=args.skip_bad,
                stats=stats,
            )
        finally:
            _warn_skipped(stats)
    seconds = time.perf_counter() - start
    new = stats.files - stats.replaced
    if stats.dropped:
        names = ", ".join(stats.dropped[:10]) + (", ..." if len(stats.dropped) > 10 else "")
        print(
            f"dropped {_count(stats.dropped_passages, 'passage')} of {_count(len(stats.dropped), 'file')} no "
            f"longer in {', '.join(args.docs)}: {names}"
        )
    if stats.files or stats.bad:
        print(
            f"added {_count(new, 'new file')} and {_count(stats.replaced, 'changed file')} in {seconds:.1f} s: "
            f"{_count(stats.documents, 'document')}, {_count(stats.passages, 'passage')}; "
            f"{_count(stats.unchanged, 'file')} unchanged"
        )
    elif not stats.dropped:
        print(f"nothing to add: {_count(stats.unchanged, 'file')} unchanged")
    for line in problem_lines(stats):
        print(line)
    manifest = read_manifest(out)
    documents = manifest["documents"]
    print(
        f"the index holds {_count(manifest['passages'], 'passage')} of "
        f"{_count(documents['documents'], 'document')} in {_count(documents['files'], 'file')}"
    )
    print(out)
    return 0


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def run_info(args: argparse.Namespace) -> int:
    from ragate.retrieval.index import index_info

    manifest = index_info(args.dir, verify=not args.no_verify)
    if args.json:
        print(json.dumps(manifest, indent=2, ensure_ascii=False))
        return 0
    encoder = manifest.get("encoder")
    print(f"index      {args.dir}")
    print(f"kind       {manifest['kind']}")
    print(f"passages   {manifest['passages']:,}")
    if encoder:
        print(f"encoder    {encoder['name']} ({encoder['dim']}-d, from {encoder['source']})")
        print(f"prefixes   query {encoder['query_prefix']!r}, passage {encoder['document_prefix']!r}")
    print(f"params     {json.dumps(manifest['params'])}")
    documents = manifest.get("documents")
    if documents:
        paths = " ".join(documents.get("paths") or [])
        print(f"documents  {documents['documents']:,} in {documents['files']:,} files (from {paths})")
    else:
        print(f"corpus     {manifest.get('corpus') or '-'}")
    if manifest.get("chunking"):
        from ragate.retrieval.fit import describe_chunking

        print(f"chunking   {describe_chunking(manifest['chunking'])}")
    print(f"built      {manifest['created_at']} by ragate {manifest['ragate_version']}")
    print(f"format     {manifest['format']} v{manifest['format_version']}")
    check = "size checked" if args.no_verify else "size and sha256 verified"
    print(f"files      ({check})")
    for name, entry in manifest["files"].items():
        print(f"  {name:<32} {_size(entry['size']):>10}  {entry['sha256'][:16]}")
    return 0


def _hit_json(hit: Any) -> dict[str, Any]:
    p = hit.passage
    return {"rank": hit.rank, "score": hit.score, "id": p.id, "title": p.title, "text": p.text}


def run_search(args: argparse.Namespace) -> int:
    from ragate.retrieval.index import open_index

    if args.k < 1:
        from ragate.errors import RagateError

        raise RagateError(f"-k must be at least 1, got {args.k}")
    if any(not q.strip() for q in args.query):
        from ragate.errors import RagateError

        raise RagateError("a query is empty: pass a non-empty search string")
    with open_index(args.dir, encoder=args.encoder, verify=not args.no_verify) as retriever:
        start = time.perf_counter()
        results = retriever.search(args.query, args.k)
        seconds = time.perf_counter() - start
    for query, hits in zip(args.query, results, strict=True):
        if args.json:
            print(json.dumps({"query": query, "hits": [_hit_json(h) for h in hits]}, ensure_ascii=False))
            continue
        print(f"query: {query}")
        for hit in hits:
            text = " ".join(hit.passage.text.split())
            snippet = text if len(text) <= SNIPPET_CHARS else text[: SNIPPET_CHARS - 1] + "…"
            print(f"{hit.rank:>3}  {hit.score:8.4f}  {hit.id}  {hit.passage.title}")
            print(f"     {snippet}")
    if not args.json:
        print(f"({len(args.query)} queries in {seconds * 1000:.0f} ms)")
    return 0
