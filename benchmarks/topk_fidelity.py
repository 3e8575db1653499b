"""What a gate loses when the backend gives only the top-k logprobs, or none (issue I.3).

    .venv/bin/python benchmarks/topk_fidelity.py run --dataset nq-open-oracle --questions 200 \
        --model qwen2.5-coder-1.5b --index ~/.cache/ragate/indexes/pooled-dense --out DIR [--workers 2]
    .venv/bin/python benchmarks/topk_fidelity.py table DIR [DIR ...] [--plot FILE.png] [--budget 0.3]

``run`` answers each question with Qwen2.5-Coder-1.5B on llama.cpp, which gives the full next-token
distribution, and keeps, for every step of every gate's generation, the exact entropy and the top-20
log-probabilities: the DTR closed-book answer (no-retrieval; UGT's NLL), TARG's 20-token draft (entropy,
margin), the LLM judge's reply (P(yes)) and the verbalised-confidence reply (no logprobs needed), plus the
standard-rag answer (question top-3), so that the accuracy of retrieving is known for each question. One JSON
line per question in ``DIR/part-W.jsonl`` (resumable: rerun the same command after a kill); ``--workers N``
runs N processes, each pinned to one core with a one-thread engine. The runs behind docs/methods.md are in
``benchmarks/results/topk/{nq,hotpotqa}/part-W.jsonl.gz`` (``table`` reads them as they are).

``table`` recomputes every gate's score from the full distribution and from only the top k (k = 1, 2, 5, 10,
20; "none": no logprobs, where a text-only form exists) and prints, per dataset and gate: AUROC for "the
closed-book answer is wrong" (with its paired bootstrap interval against the exact score), agreement of the
retrieve/skip decisions with the exact score's at the default tau and at a tau calibrated to ``--budget``
(each form calibrated on its own scores, as a user of that API would), and the accuracy at that budget. Three
estimators of entropy from the top k are compared (:func:`ragate.uncertainty.topk_entropy`: lumped, capped,
uniform). ``--plot`` draws the accuracy/retrieval frontier (threshold swept) of the exact and top-20 forms.
Correctness is the eval's "acc" (gold answer contained in the extracted answer).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ragate.backends.base import Backend
from ragate.gates.verbal import parse_probability
from ragate.types import Generation, GenerationRequest
from ragate.uncertainty import DEFAULT_MARGIN_BETA, margin, topk_entropy

KS = (20, 10, 5, 2, 1)
TOP = 20
QWEN_VOCAB = 151936  # Qwen2.5's vocabulary (the uniform tail's upper bound)
STAGES = {  # method -> the stage whose generation the gate scores
    "no-retrieval": "answer",
    "targ-entropy": "draft",
    "llm-judge": "judge",
    "verbal-confidence": "verbal",
}


# -- run ---------------------------------------------------------------------------------------------------------
class Recorder(Backend):
    """``inner`` asked for the top-20 alternatives on every greedy call, each generation kept in ``seen``."""

    def __init__(self, inner: Backend) -> None:
        self.inner, self.engine, self.model = inner, inner.engine, inner.model
        self.capabilities = inner.capabilities
        self.seen: list[Generation] = []

    def _generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        wider = [replace(r, top_logprobs=TOP) if r.greedy else r for r in requests]
        gens = self.inner.generate(wider)
        self.seen.extend(gens)
        return gens

    def clear_cache(self) -> None:
        self.inner.clear_cache()


def _steps(g: Generation) -> dict[str, Any]:
    return {
        "text": g.text,
        "logprobs": [round(x, 5) for x in g.logprobs],
        "entropies": [round(x, 5) for x in (g.entropies or ())],
        "top": [[[t.token, round(t.logprob, 5)] for t in step] for step in g.top_logprobs],
    }


def answer_one(example: Any, lm: Recorder, retriever: Any) -> dict[str, Any]:
    from ragate.eval.metrics import score
    from ragate.methods import decide, get_method, run_method
    from ragate.text import extract_answer

    row: dict[str, Any] = {"id": example.id, "dataset": example.dataset, "question": example.question}
    for method in STAGES:
        lm.seen.clear()
        lm.clear_cache()
        if method == "no-retrieval":
            trace = run_method(get_method(method), example.question, lm, retriever)
            row["closed"] = score(extract_answer(trace.answer), example.answers, example.kind, example.label)
            row["closed_answer"] = trace.answer
        else:
            decide(get_method(method), example.question, lm, retriever)
        row[method] = _steps(lm.seen[0])
    lm.clear_cache()
    trace = run_method(get_method("standard-rag"), example.question, lm, retriever)
    row["rag"] = score(extract_answer(trace.answer), example.answers, example.kind, example.label)
    row["rag_answer"] = trace.answer
    return row


def read_rows(folder: Path) -> list[dict[str, Any]]:
    rows = []
    for part in sorted([*folder.glob("part-*.jsonl"), *folder.glob("part-*.jsonl.gz")]):
        raw = gzip.decompress(part.read_bytes()) if part.suffix == ".gz" else part.read_bytes()
        for line in raw.decode("utf-8", errors="replace").splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass  # a line cut by a kill: answered again on resume
    return rows


def run_shard(args: argparse.Namespace) -> int:
    from ragate.backends import load_backend
    from ragate.eval.datasets import load_dataset
    from ragate.eval.workers import worker_cores
    from ragate.retrieval.index import open_index

    shard, workers = args.shard
    if workers > 1:
        os.sched_setaffinity(
            0, {worker_cores(workers)[shard]}
        )  # the core `ragate eval --workers` would give it
    examples = load_dataset(args.dataset, limit=args.questions)
    done = {r["id"] for r in read_rows(args.out)}
    todo = [e for i, e in enumerate(examples) if i % workers == shard and e.id not in done]
    part = args.out / f"part-{shard}.jsonl"
    with (
        load_backend(args.model, "llama.cpp", n_threads=1 if workers > 1 else None) as inner,
        open_index(args.index) as retriever,
        part.open("a", encoding="utf-8") as out,
    ):
        lm = Recorder(inner)
        for n, example in enumerate(todo, 1):
            out.write(json.dumps(answer_one(example, lm, retriever), ensure_ascii=False) + "\n")
            out.flush()
            os.fsync(out.fileno())
            print(f"[shard {shard}] {n}/{len(todo)}", file=sys.stderr, flush=True)
    return 0


def run(args: argparse.Namespace) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    if args.shard is not None:
        return run_shard(args)
    if args.workers == 1:
        args.shard = (0, 1)
        return run_shard(args)
    base = [sys.executable, __file__, "run", "--dataset", args.dataset, "--questions", str(args.questions),
            "--model", args.model, "--index", str(args.index), "--out", str(args.out)]  # fmt: skip
    procs = [subprocess.Popen([*base, "--shard", f"{w}/{args.workers}"]) for w in range(args.workers)]
    codes = [p.wait() for p in procs]
    return max(codes)


# -- scores ----------------------------------------------------------------------------------------------------
def _entropy(step_top: list[list[Any]], exact: float | None, k: int | None, tail: str) -> float | None:
    if k is None:
        return exact
    return topk_entropy([lp for _, lp in step_top[:k]], tail=tail, vocab_size=QWEN_VOCAB)  # type: ignore[arg-type]


def score_forms(row: dict[str, Any]) -> dict[str, float | None]:
    """Every gate's score under every form: 'exact', 'top-K' (entropy: 'top-K/tail'), 'none'."""
    out: dict[str, float | None] = {}
    a, d, j, v = row["no-retrieval"], row["targ-entropy"], row["llm-judge"], row["verbal-confidence"]
    nll = -sum(a["logprobs"]) / max(1, len(a["logprobs"])) if a["logprobs"] else math.inf
    for form in ("exact", *(f"top-{k}" for k in KS)):
        out[f"ugt|{form}"] = nll  # the chosen tokens' logprobs come with any logprobs at all
    out["ugt|none"] = None
    steps = range(min(20, len(d["top"])))
    if steps:
        out["targ-entropy|exact"] = float(np.mean([d["entropies"][t] for t in steps]))
        for k in KS:
            for tail in ("lumped", "capped", "uniform"):
                vals = [_entropy(d["top"][t], None, k, tail) for t in steps]
                out[f"targ-entropy|top-{k}/{tail}"] = float(np.mean(vals))  # type: ignore[arg-type]
        gaps = [margin([lp for _, lp in d["top"][t][:2]]) for t in steps]
        u = float(np.mean([math.exp(-g / DEFAULT_MARGIN_BETA) for g in gaps]))
        for form in ("exact", *(f"top-{k}" for k in KS if k >= 2)):
            out[f"targ-margin|{form}"] = u
        out["targ-margin|top-1"] = None
    out["targ-entropy|none"] = out["targ-margin|none"] = None
    for form, k in (("exact", None), *((f"top-{k}", k) for k in KS)):
        top = j["top"][0][:k] if j["top"] else []
        yes = sum(math.exp(lp) for t, lp in top if t.strip().lower() == "yes")
        no = sum(math.exp(lp) for t, lp in top if t.strip().lower() == "no")
        out[f"llm-judge|{form}"] = yes / (yes + no) if yes + no > 0 else 0.5
    first = (j["text"].strip().lower().split() or [""])[0].strip(".,!")
    out["llm-judge|none"] = {"yes": 1.0, "no": 0.0}.get(first, 0.5)
    p = parse_probability(v["text"])
    out["verbal-confidence|none"] = 1.0 if p is None else 1.0 - p
    return out


def auroc(scores: np.ndarray, wrong: np.ndarray) -> float:
    """P(score of a wrong answer > score of a right one), ties counted half (Mann-Whitney U / (n1 n0))."""
    from scipy.stats import rankdata

    n1, n0 = int(wrong.sum()), int((~wrong).sum())
    if n1 == 0 or n0 == 0:
        return math.nan
    ranks = rankdata(scores)
    return float((ranks[wrong].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def paired_auroc_ci(
    a: np.ndarray, b: np.ndarray, wrong: np.ndarray, samples: int = 1000, seed: int = 0
) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    n, diffs = len(wrong), []
    for _ in range(samples):
        i = rng.integers(0, n, n)
        diffs.append(auroc(a[i], wrong[i]) - auroc(b[i], wrong[i]))
    lo, hi = np.nanpercentile(diffs, [2.5, 97.5])
    return float(lo), float(hi)


DEFAULT_TAU = {
    "ugt": 0.001,
    "targ-entropy": 0.8,
    "targ-margin": 0.25,
    "llm-judge": 0.5,
    "verbal-confidence": 0.5,
}


def table(args: argparse.Namespace) -> int:
    from scipy.stats import spearmanr

    rows_by_set: dict[str, list[dict[str, Any]]] = {}
    for folder in args.dirs:
        for row in read_rows(folder):
            rows_by_set.setdefault(row["dataset"], []).append(row)
    if not rows_by_set:
        print(f"no answered questions in {', '.join(map(str, args.dirs))}: run `topk_fidelity.py run` first")
        return 2
    plots: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    for dataset, rows in rows_by_set.items():
        forms = [score_forms(r) for r in rows]
        wrong = np.array([r["closed"]["acc"] < 1 for r in rows])
        closed = np.array([r["closed"]["acc"] for r in rows])
        rag = np.array([r["rag"]["acc"] for r in rows])
        print(f"\n### {dataset}: n = {len(rows)}, closed-book acc {closed.mean():.3f}, always-retrieve acc "
              f"{rag.mean():.3f}, closed-book wrong {wrong.mean():.3f}\n")  # fmt: skip
        print(f"| gate | form | AUROC | Δ AUROC vs exact [95% CI] | Spearman vs exact | decisions agree "
              f"(default τ) | decisions agree (budget {args.budget:g}) | acc at budget |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|")
        keys = sorted(
            {k for f in forms for k in f}, key=lambda k: (k.split("|")[0], _form_order(k.split("|")[1]))
        )
        for key in keys:
            gate, form = key.split("|")
            values = [f.get(key) for f in forms]
            if any(v is None for v in values):
                print(f"| {gate} | {form} | unavailable | | | | | |")
                continue
            s = np.array(values, dtype=float)
            exact_key = f"{gate}|exact" if f"{gate}|exact" in forms[0] else key
            e = np.array([f[exact_key] for f in forms], dtype=float)
            a = auroc(s, wrong)
            delta = rho = ""
            if exact_key != key and np.allclose(s, e, rtol=0, atol=1e-9):
                delta, rho = "0 (the same scores)", "1"
            elif exact_key != key:
                lo, hi = paired_auroc_ci(s, e, wrong, args.resamples, args.seed)
                verdict = "" if lo > 0 or hi < 0 else " (not established)"
                delta = f"{a - auroc(e, wrong):+.3f} [{lo:+.3f}, {hi:+.3f}]{verdict}"
                rho = f"{spearmanr(s, e).statistic:.3f}"
            tau = DEFAULT_TAU[gate]
            agree_default = float(np.mean((s > tau) == (e > tau)))
            ts, te = np.quantile(s, 1 - args.budget), np.quantile(e, 1 - args.budget)
            agree_budget = float(np.mean((s > ts) == (e > te)))
            acc = float(np.where(s > ts, rag, closed).mean())
            print(
                f"| {gate} | {form} | {a:.3f} | {delta} | {rho} | {agree_default:.3f} | {agree_budget:.3f} | {acc:.3f} |"
            )
            if form in ("exact", "top-20", "top-20/capped", "none"):
                plots.setdefault(dataset, {})[key] = frontier(s, closed, rag)
    if args.plot:
        from ragate.report.plots import figure_data

        draw(plots, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
        print("\n" + figure_data({f"{d}|{k}": np.concatenate(c) for d, curves in plots.items() for k, c in curves.items()}))
    return 0


def _form_order(form: str) -> tuple[int, str]:
    if form == "exact":
        return (0, "")
    if form == "none":
        return (999, "")
    k, _, tail = form[4:].partition("/")
    return (100 - int(k), tail)


def frontier(score: np.ndarray, closed: np.ndarray, rag: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Retrieval rate and accuracy as the threshold sweeps from retrieving nothing to retrieving everything."""
    order = np.argsort(-score, kind="stable")
    gain = (rag - closed)[order]
    rates = np.arange(len(score) + 1) / len(score)
    acc = closed.mean() + np.concatenate([[0.0], np.cumsum(gain)]) / len(score)
    return rates, acc


def draw(plots: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(plots), figsize=(6 * len(plots), 4.5), squeeze=False)
    for ax, (dataset, curves) in zip(axes[0], plots.items(), strict=True):
        for key, (rates, acc) in sorted(curves.items()):
            style = "-" if key.endswith("exact") else ("--" if "top" in key else ":")
            ax.plot(rates, acc, style, label=key.replace("|", " "))
        ax.set_title(f"{dataset}: accuracy vs retrieval rate")
        ax.set_xlabel("retrieval rate")
        ax.set_ylabel("accuracy (contains)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--dataset", default="nq-open-oracle")
    r.add_argument("--questions", type=int, default=200)
    r.add_argument("--model", default="qwen2.5-coder-1.5b")
    r.add_argument("--index", type=Path, default=Path.home() / ".cache/ragate/indexes/pooled-dense")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--workers", type=int, default=1)
    r.add_argument("--shard", type=lambda s: tuple(int(x) for x in s.split("/")), default=None)
    r.set_defaults(func=run)
    t = sub.add_parser("table")
    t.add_argument("dirs", type=Path, nargs="+")
    t.add_argument("--budget", type=float, default=0.3)
    t.add_argument("--plot", type=Path, default=None)
    t.add_argument("--seed", type=int, default=0, help="the paired AUROC intervals' numpy seed")
    t.add_argument("--resamples", type=int, default=1000, help="the paired AUROC intervals' resamples")
    t.set_defaults(func=table)
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
