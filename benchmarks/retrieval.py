"""Retrieval quality and cost: recall@k on real questions, build throughput, query latency and peak memory.

    .venv/bin/python benchmarks/retrieval.py [--data ../shared/data] [--synthetic 1000000] [--rebuild]

Stages, each in its own process so that its peak memory (ru_maxrss) is its own:
- ``pooled-bm25`` / ``pooled-dense``: the pooled Wikipedia corpus (``ragate corpus build``, ~24k passages) is
  indexed with BM25 and with dense all-MiniLM-L6-v2 (FAISS flat), and hybrid (RRF) fuses the two. Recall@1/5/20 on
  the NQ-open oracle questions (gold: the oracle passage) and on HotpotQA dev (gold: the two supporting
  paragraphs; recall = share of gold paragraphs in the top k, averaged). Chunks count for their document.
- ``synthetic-bm25`` / ``synthetic-dense``: a synthetic corpus of ``--synthetic`` passages. BM25 texts are drawn
  from the pooled corpus's own word frequencies and length distribution. Encoding a million passages with MiniLM
  would take hours on this machine (see the pooled encoding rate), so the dense index gets synthetic vectors: real
  passage embeddings plus Gaussian noise, re-normalised; queries are still encoded by the real model.
Latency: one query per call (``search([q], 10)``), p50/p99 over ``--latency-queries`` NQ questions; dense
includes query encoding. Indexes are kept under ``$RAGATE_HOME/bench`` and reused unless ``--rebuild``.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ragate.models import ragate_home
from ragate.retrieval.corpus import document_id, read_passages
from ragate.retrieval.index import build_index, open_index
from ragate.retrieval.types import Passage, Retriever

KS = (1, 5, 20)
DATASETS = {"nq_open_oracle": "NQ-open oracle", "hotpotqa_dev": "HotpotQA dev (supporting)"}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def load_gold(corpus_dir: Path, dataset: str) -> list[dict[str, Any]]:
    with (corpus_dir / "gold" / f"{dataset}.jsonl").open() as f:
        return [json.loads(line) for line in f]


def recall_at_k(
    retriever: Retriever, questions: Sequence[dict[str, Any]], ks: Sequence[int]
) -> dict[int, float]:
    """Mean share of each question's gold documents found among the top-k hits (chunks map to documents)."""
    hits = retriever.search([q["question"] for q in questions], max(ks))
    totals = dict.fromkeys(ks, 0.0)
    for q, ranked in zip(questions, hits, strict=True):
        gold = set(q["gold_ids"])
        docs = [document_id(h.id) for h in ranked]
        for k in ks:
            totals[k] += len(gold & set(docs[:k])) / len(gold)
    return {k: totals[k] / len(questions) for k in ks}


def latency(retriever: Retriever, queries: Sequence[str], k: int = 10) -> dict[str, float]:
    retriever.search([queries[0]], k)  # warm-up
    times = []
    for q in queries:
        t0 = time.perf_counter()
        retriever.search([q], k)
        times.append(time.perf_counter() - t0)
    ms = np.array(times) * 1000
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99))}


def timed_build(passages: Any, out: Path, kind: str, n: int, rebuild: bool, **kw: Any) -> dict[str, float]:
    """Build once and record the throughput beside the index, so that later runs can reuse both."""
    record = out.with_suffix(".build.json")
    if out.exists() and record.exists() and not rebuild:
        return dict(json.loads(record.read_text()), reused=1.0)
    t0 = time.perf_counter()
    build_index(passages, out, kind, overwrite=True, progress=True, **kw)  # type: ignore[arg-type]
    seconds = time.perf_counter() - t0
    result = {"build_s": seconds, "passages": float(n), "passages_per_s": n / seconds}
    record.write_text(json.dumps(result))
    return result


# ---- synthetic corpus -------------------------------------------------------------------------------------------


def synthetic_passages(real: Sequence[Passage], n: int, seed: int = 0) -> Iterator[Passage]:
    """``n`` passages of words drawn from the real corpus's unigram frequencies, with its length distribution."""
    rng = np.random.default_rng(seed)
    words: dict[str, int] = {}
    lengths = []
    for p in real:
        toks = p.text.split()
        lengths.append(len(toks))
        for w in toks:
            words[w] = words.get(w, 0) + 1
    vocab = np.array(list(words))
    probs = np.array(list(words.values()), dtype=np.float64)
    probs /= probs.sum()
    lengths_arr = np.array(lengths)
    batch = 10_000
    for start in range(0, n, batch):
        m = min(batch, n - start)
        lens = rng.choice(lengths_arr, size=m)
        flat = rng.choice(len(vocab), size=int(lens.sum()), p=probs)
        pos = 0
        for i, length in enumerate(lens):
            text = " ".join(vocab[flat[pos : pos + length]])
            pos += length
            yield Passage(id=f"s{start + i}", title="", text=text or "empty")


# ---- stages -----------------------------------------------------------------------------------------------------


def stage(name: str, args: argparse.Namespace) -> dict[str, Any]:
    bench = ragate_home() / "bench" / "retrieval"
    bench.mkdir(parents=True, exist_ok=True)
    corpus_dir = Path(args.corpus_dir)
    corpus_file = corpus_dir / "passages.jsonl"
    n_real = sum(1 for _ in corpus_file.open("rb"))
    nq = load_gold(corpus_dir, "nq_open_oracle")
    lat_queries = [q["question"] for q in nq[: args.latency_queries]]
    out: dict[str, Any] = {"stage": name}
    if name in ("pooled-bm25", "pooled-dense"):
        kind = name.split("-")[1]
        out["build"] = timed_build(
            read_passages(corpus_file), bench / name, kind, n_real, args.rebuild, corpus=str(corpus_file)
        )
        with open_index(bench / name) as r:
            out["recall"] = {d: recall_at_k(r, load_gold(corpus_dir, d), KS) for d in DATASETS}
            out["latency"] = latency(r, lat_queries)
    elif name == "pooled-hybrid":
        from ragate.retrieval.hybrid import HybridRetriever

        bm25, dense = open_index(bench / "pooled-bm25"), open_index(bench / "pooled-dense")
        with HybridRetriever(bm25, dense) as r:  # type: ignore[arg-type]
            out["recall"] = {d: recall_at_k(r, load_gold(corpus_dir, d), KS) for d in DATASETS}
            out["latency"] = latency(r, lat_queries)
    elif name == "synthetic-bm25":
        real = list(read_passages(corpus_file))
        target = bench / f"synthetic-{args.synthetic}-bm25"
        out["build"] = timed_build(
            synthetic_passages(real, args.synthetic), target, "bm25", args.synthetic, args.rebuild
        )
        del real
        with open_index(target, verify=False) as r:
            out["latency"] = latency(r, lat_queries)
    elif name == "synthetic-dense":
        out.update(synthetic_dense(bench, args, lat_queries))
    out["peak_rss_mb"] = peak_rss_mb()
    return out


def synthetic_dense(bench: Path, args: argparse.Namespace, lat_queries: list[str]) -> dict[str, Any]:
    """A flat dense index over synthetic vectors, sharing the synthetic BM25 index's passage store."""
    from ragate.retrieval.dense import DenseRetriever
    from ragate.retrieval.encoders import load_encoder
    from ragate.retrieval.store import PassageStore, load_array

    store_dir = bench / f"synthetic-{args.synthetic}-bm25"
    real = load_array(bench / "pooled-dense" / "embeddings.npy")
    vec_file = bench / f"synthetic-{args.synthetic}-embeddings.npy"
    t0 = time.perf_counter()
    if not vec_file.exists() or args.rebuild:
        rng = np.random.default_rng(1)
        out = np.lib.format.open_memmap(
            vec_file, mode="w+", dtype=np.float32, shape=(args.synthetic, real.shape[1])
        )
        for start in range(0, args.synthetic, 50_000):
            m = min(50_000, args.synthetic - start)
            v = real[rng.integers(0, len(real), m)] + rng.normal(0, 0.05, (m, real.shape[1])).astype(
                np.float32
            )
            out[start : start + m] = v / np.linalg.norm(v, axis=1, keepdims=True)
        out.flush()
        del out
    write_s = time.perf_counter() - t0
    store = PassageStore.open(store_dir)
    with DenseRetriever(load_array(vec_file), store, load_encoder()) as r:
        return {"vectors_write_s": write_s, "latency": latency(r, lat_queries)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/data", help="the shared QA data folder")
    parser.add_argument(
        "--corpus-dir", default=None, help="pooled corpus (default: <ragate home>/corpora/pooled)"
    )
    parser.add_argument("--synthetic", type=int, default=1_000_000, help="synthetic corpus size (0: skip)")
    parser.add_argument("--latency-queries", type=int, default=200)
    parser.add_argument("--rebuild", action="store_true", help="rebuild indexes even if present")
    parser.add_argument("--stage", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.corpus_dir = args.corpus_dir or str(ragate_home() / "corpora" / "pooled")
    if args.stage:
        print(json.dumps(stage(args.stage, args)))
        return
    if not (Path(args.corpus_dir) / "passages.jsonl").exists():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "ragate.cli.main",
                "corpus",
                "build",
                "--data",
                args.data,
                "--out",
                args.corpus_dir,
            ],
            check=True,
        )
    stages = ["pooled-bm25", "pooled-dense", "pooled-hybrid"]
    if args.synthetic:
        stages += ["synthetic-bm25", "synthetic-dense"]
    results = {}
    for name in stages:
        cmd = [
            sys.executable,
            __file__,
            "--stage",
            name,
            "--corpus-dir",
            args.corpus_dir,
            "--synthetic",
            str(args.synthetic),
            "--latency-queries",
            str(args.latency_queries),
        ]
        cmd += ["--rebuild"] if args.rebuild else []
        proc = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
        results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"[{name}] done: {json.dumps(results[name])}", file=sys.stderr)
    report(results, args)


def report(results: dict[str, Any], args: argparse.Namespace) -> None:
    print("## Recall@k (share of gold passages in the top k)\n")
    print("| retriever | " + " | ".join(f"{DATASETS[d]} R@{k}" for d in DATASETS for k in KS) + " |")
    print("|---" * (1 + len(DATASETS) * len(KS)) + "|")
    for kind in ("bm25", "dense", "hybrid"):
        rec = results[f"pooled-{kind}"]["recall"]
        print(f"| {kind} | " + " | ".join(f"{rec[d][str(k)]:.3f}" for d in DATASETS for k in KS) + " |")
    print("\n## Cost\n")
    print("| corpus | retriever | passages | build passages/s | query p50 ms | query p99 ms | peak RSS MB |")
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        corpus, kind = name.split("-", 1)
        build = r.get("build", {})
        n = int(build.get("passages", args.synthetic if corpus == "synthetic" else 0)) or "-"
        rate = f"{build['passages_per_s']:.0f}" if "passages_per_s" in build else "-"
        if kind == "dense" and corpus == "synthetic":
            rate = "n/a (synthetic vectors)"
        print(
            f"| {corpus} | {kind} | {n} | {rate} | {r['latency']['p50_ms']:.1f} | {r['latency']['p99_ms']:.1f} | "
            f"{r['peak_rss_mb']:.0f} |"
        )


if __name__ == "__main__":
    main()
