"""``ragate index`` (build an index directory, show its verified manifest) and ``ragate search`` (query one)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

SNIPPET_CHARS = 150


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "index", help="build and inspect retrieval indexes", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="index_command", metavar="ACTION", required=True)

    build = commands.add_parser(
        "build", help="index a corpus file as BM25, dense or hybrid (BM25 + dense, RRF)"
    )
    build.add_argument(
        "--corpus", type=Path, required=True, help="passages: ragate/FlashRAG JSONL or DPR TSV"
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
    build.add_argument("--skip-bad", action="store_true", help="skip and count malformed corpus lines")
    build.add_argument("--force", action="store_true", help="replace an existing non-empty --out directory")
    build.add_argument("--batch-size", type=int, default=32, help="encoder batch size (default 32)")
    build.add_argument("--quiet", action="store_true", help="no progress bars")
    build.set_defaults(run=run_build)

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


def run_build(args: argparse.Namespace) -> int:
    from ragate.retrieval.corpus import ReadStats, read_passages
    from ragate.retrieval.dense import HNSWParams
    from ragate.retrieval.index import build_index

    if args.hnsw and args.kind == "bm25":
        from ragate.errors import RagateError

        raise RagateError("--hnsw applies to --kind dense or hybrid, not bm25")
    stats = ReadStats()
    passages = read_passages(args.corpus, format=args.format, skip_bad=args.skip_bad, stats=stats)
    start = time.perf_counter()
    out = build_index(
        passages,
        args.out,
        args.kind,
        encoder=args.encoder,
        hnsw=args.hnsw,
        hnsw_params=HNSWParams(args.hnsw_m, args.ef_construction, args.ef_search),
        batch_size=args.batch_size,
        overwrite=args.force,
        progress=not args.quiet,
        corpus=str(args.corpus),
    )
    seconds = time.perf_counter() - start
    rate = stats.passages / seconds if seconds > 0 else float("inf")
    print(f"indexed {stats.passages:,} passages ({args.kind}) in {seconds:.1f} s: {rate:,.0f} passages/s")
    if stats.skipped:
        print(
            f"skipped {stats.malformed:,} malformed lines and {stats.duplicates:,} duplicate ids; first problems:"
        )
        for example in stats.examples:
            print(f"  {example}")
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
    print(f"corpus     {manifest.get('corpus') or '-'}")
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
