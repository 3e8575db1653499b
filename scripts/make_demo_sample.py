"""Regenerate ``src/ragate/data/demo/`` (the small real sample that ships with ragate) from ../shared/data.

Deterministic: the same data gives the same bytes. The sample is taken from the pooled corpus built without
chunking (paragraph-level, ids as in a full pooled build):

- the gold passage of the first 60 NQ-open-oracle questions (file order);
- the two supporting paragraphs of the first 20 HotpotQA dev questions, plus their 8 distractor paragraphs each
  (hard negatives: same topic, no answer);
- distractors up to 400 passages: the pooled passages with the smallest ids (a hash, so an unbiased mix of the
  sources), skipping any longer than 1,500 characters and the RetrievalQA pool of extra_passages (it mixes web
  pages of unstated licence with Wikipedia text; everything shipped is Wikipedia).

Run: ``.venv/bin/python scripts/make_demo_sample.py [--data ../shared/data] [--out src/ragate/data/demo]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from ragate.fileio import atomic_writer
from ragate.retrieval.corpus import read_passages, write_passages
from ragate.retrieval.pooled import build_pooled_corpus, pooled_id

REPO = Path(__file__).resolve().parents[1]
N_NQ, N_HOTPOT, TOTAL, MAX_FILLER_CHARS = 60, 20, 400, 1500
EXCLUDED_SOURCES = frozenset({"extra:retrievalqa"})


def _gold_lines(pooled_dir: Path, dataset: str, n: int) -> list[dict[str, Any]]:
    with (pooled_dir / "gold" / f"{dataset}.jsonl").open(encoding="utf-8") as f:
        return [json.loads(line) for _, line in zip(range(n), f, strict=False)]


def make_demo(data_dir: Path, pooled_dir: Path, out_dir: Path) -> tuple[int, int]:
    """Write ``passages.jsonl`` and ``questions.jsonl`` to ``out_dir`` from an unchunked pooled corpus; returns
    (passages, questions)."""
    passages = {p.id: p for p in read_passages(pooled_dir / "passages.jsonl")}
    questions = _gold_lines(pooled_dir, "nq_open_oracle", N_NQ) + _gold_lines(
        pooled_dir, "hotpotqa_dev", N_HOTPOT
    )
    chosen: dict[str, None] = {}
    for q in questions:
        chosen.update(dict.fromkeys(q["gold_ids"]))
    with (data_dir / "hotpotqa" / "dev_subsampled.jsonl").open(encoding="utf-8") as f:
        for _, line in zip(range(N_HOTPOT), f, strict=False):
            chosen.update(dict.fromkeys(pooled_id(c["paragraph_text"]) for c in json.loads(line)["contexts"]))
    for pid in sorted(passages):
        if len(chosen) >= TOTAL:
            break
        passage = passages[pid]
        if (
            pid not in chosen
            and len(passage.text) <= MAX_FILLER_CHARS
            and passage.source not in EXCLUDED_SOURCES
        ):
            chosen[pid] = None
    missing = [pid for pid in chosen if pid not in passages]
    if missing:
        raise SystemExit(f"gold or HotpotQA ids missing from the pooled corpus: {missing[:5]}")
    n = write_passages((passages[pid] for pid in sorted(chosen)), out_dir / "passages.jsonl")
    with atomic_writer(out_dir / "questions.jsonl") as f:
        for q in questions:
            f.write(json.dumps(q, ensure_ascii=False).encode("utf-8") + b"\n")
    return n, len(questions)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--out", type=Path, default=REPO / "src" / "ragate" / "data" / "demo")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        build_pooled_corpus(args.data, Path(tmp), chunk=None, progress=False)
        n, q = make_demo(args.data, Path(tmp), args.out)
    size = sum(p.stat().st_size for p in args.out.glob("*.jsonl"))
    print(f"wrote {n} passages and {q} questions to {args.out} ({size / 1e3:.0f} kB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
