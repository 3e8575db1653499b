"""``ragate corpus``: build the pooled corpus from ../shared/data, and look inside a corpus file."""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_DATA = Path("../shared/data")


def default_out() -> Path:
    """``<ragate home>/corpora/pooled`` (``$RAGATE_HOME``, else ``~/.cache/ragate``)."""
    from ragate.models import ragate_home

    return ragate_home() / "corpora" / "pooled"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "corpus", help="build and inspect passage corpora", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="corpus_command", metavar="ACTION", required=True)

    build = commands.add_parser(
        "build",
        help="pool the Wikipedia paragraphs of ../shared/data into one de-duplicated corpus with gold ids",
    )
    build.add_argument(
        "--data", type=Path, default=DEFAULT_DATA, help=f"the QA data folder (default: {DEFAULT_DATA})"
    )
    build.add_argument(
        "--out", type=Path, default=None, help="output folder (default: <ragate home>/corpora/pooled)"
    )
    build.add_argument(
        "--no-chunk", action="store_true", help="keep paragraphs whole (default: chunk as TARG does)"
    )
    build.add_argument("--chunk-size", type=int, default=1000, help="characters per chunk (default 1000)")
    build.add_argument("--chunk-overlap", type=int, default=100, help="characters of overlap (default 100)")
    build.add_argument("--chunk-min", type=int, default=200, help="shortest trailing chunk (default 200)")
    build.add_argument("--quiet", action="store_true", help="no progress bar")
    build.set_defaults(run=run_build)

    stats = commands.add_parser("stats", help="count the passages and malformed lines of a corpus file")
    stats.add_argument("file", type=Path, help="JSONL (ragate or FlashRAG form) or DPR TSV, optionally .gz")
    stats.add_argument("--format", default="auto", choices=("auto", "jsonl", "flashrag", "tsv"))
    stats.add_argument(
        "--skip-bad", action="store_true", help="skip and count malformed lines instead of stopping"
    )
    stats.set_defaults(run=run_stats)


def run_build(args: argparse.Namespace) -> int:
    from ragate.errors import RagateError
    from ragate.retrieval.pooled import ChunkSettings, build_pooled_corpus

    out = args.out if args.out is not None else default_out()
    chunk = None
    if not args.no_chunk:
        if not 0 <= args.chunk_overlap < args.chunk_size or not 0 <= args.chunk_min <= args.chunk_size:
            raise RagateError(
                "chunk settings need 0 <= --chunk-overlap < --chunk-size and 0 <= --chunk-min <= --chunk-size; "
                f"got {args.chunk_size}, {args.chunk_overlap}, {args.chunk_min}"
            )
        chunk = ChunkSettings(args.chunk_size, args.chunk_overlap, args.chunk_min)
    print(f"building the pooled corpus from {args.data} into {out}")
    result = build_pooled_corpus(args.data, out, chunk=chunk, progress=not args.quiet)

    chunking = f"chunked {chunk.size}/{chunk.overlap}/{chunk.min_size}" if chunk else "not chunked"
    print(f"passages: {result.passages:,} ({result.documents:,} paragraphs, {chunking})")
    print(
        f"duplicates removed: {result.duplicates_removed:,} (same text, white space and case folded; "
        f"{result.title_conflicts} with differing titles)"
    )
    print("per source (paragraphs read / new to the corpus):")
    width = max(len(s.name) for s in result.sources)
    for s in result.sources:
        print(f"  {s.name:<{width}}  {s.read:>6,} / {s.new:>6,}")
    print("gold passages inside the corpus:")
    for g in result.gold:
        print(f"  {g.dataset}: {g.covered:,}/{g.questions:,} questions have their gold passage(s)")
    print(f"wrote {result.passages_path}, {result.out_dir / 'gold'}/, {result.manifest_path}")
    print(f"sha256 {result.sha256}  ({result.seconds:.1f} s)")
    return 0


def run_stats(args: argparse.Namespace) -> int:
    from ragate.retrieval.corpus import ReadStats, read_passages

    stats = ReadStats()
    n_chars = titled = chunks = 0
    for passage in read_passages(args.file, format=args.format, skip_bad=args.skip_bad, stats=stats):
        n_chars += len(passage.text)
        titled += bool(passage.title)
        chunks += "#" in passage.id
    print(f"{args.file}: {stats.passages:,} passages ({stats.format})")
    if stats.passages:
        print(
            f"  mean length {n_chars / stats.passages:.0f} characters; {titled:,} with a title; "
            f"{chunks:,} chunk ids (id#n)"
        )
    print(f"  lines {stats.lines:,}; malformed {stats.malformed:,}; duplicate ids {stats.duplicates:,}")
    for example in stats.examples:
        print(f"  skipped {example}")
    return 0
