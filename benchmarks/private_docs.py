"""The private-documents benchmark: gates over documents the model never saw, next to general questions.

    .venv/bin/python benchmarks/private_docs.py [--model qwen2.5-coder-1.5b] [--sweep DIR] [--index DIR]

The documents and questions are in benchmarks/private_docs/ (its README: sources, licences, how the questions were
written): libffi's HTML manual and the AWS CLI's topic guides (25 files, 114 passages of a hybrid index), 29
questions answered only there and 14 general questions, each with gold answers and, for the document questions,
the gold file (its passages' ids: ``ragate eval`` reports recall@3 against them).

It builds the index (once, in RAGATE_HOME/indexes/private-docs, from inside the documents folder so that passage
ids name the files as the questions do), runs ``ragate sweep`` over the questions (resumable: every question's
closed-book answer, retrieval answer and each gate's score, every LM call stored once) and prints:

- every gate at matched retrieval rates (0.5, and 29/43 = the share of document questions, the rate a perfect
  router needs): each retrieves for exactly that many questions, those it scores highest (no answers are read),
  so the gates differ only in which questions they pick; then each at that budget with its tau cross-fitted (each
  half of the questions gets the tau of the other half's scores: calibration on questions it is not judged on;
  ties in the scores move the rate it reaches): accuracy with a bootstrap interval, on document and general questions, the retrieval rate
  on each kind, and seconds per question. Accuracy: a gold answer occurs in the answer as a whole word, case
  aside (the questions' gold answers are such regular expressions, ``kind: regex``: ``ffi_prep_cif_var`` is not
  found in ``ffi_prep_cif_variadic``, which SQuAD's normalisation and a substring test would accept);
- each gate at its default tau (what a user gets without calibrating);
- the paired differences against targ-margin at the same matched rate (accuracy, bootstrap over the same questions):
  an interval that crosses 0 is "not established".

Seconds per question are the sweep's charged seconds of the chosen answer plus the gate's: an upper bound where a
draft starts the closed-book answer, and for corpus-or-margin the sweep's full draft, which a live run skips when
the search alone settles "retrieve" (the early exit; so its live cost on retrieved questions is lower than shown).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ragate.eval.metrics import Resampling, bootstrap_ci, paired_bootstrap_diff
from ragate.eval.sweep import compact
from ragate.tuning.calibrate import cross_fitted_taus, halves

ROOT = Path(__file__).resolve().parent / "private_docs"
QUESTIONS = ROOT / "questions.jsonl"
GATES = ("targ-margin", "dtr", "retrieval-top1", "corpus-coverage", "corpus-or-margin")
BASELINE = "targ-margin"
TARG_FAMILY_GATE = "targ-margin"  # never/always rows: the closed-book and retrieval answers of TARG's family


def build_index(out: Path) -> Path:
    """The hybrid index of the documents, built from inside the documents folder (``--docs .``)."""
    if (out / "manifest.json").is_file():
        return out
    from ragate.retrieval.documents import index_documents

    here = Path.cwd()
    os.chdir(ROOT / "docs")
    try:
        index_documents(["."], out, "hybrid", overwrite=True)
    finally:
        os.chdir(here)
    return out


def run_sweep(sweep: Path, index: Path, model: str, threads: str | None) -> None:
    ragate = Path(sys.executable).parent / "ragate"
    cmd = [
        str(ragate), "sweep", "--dataset", str(QUESTIONS), "--index", str(index), "--model", model,
        "--methods", ",".join(GATES), "--out", str(sweep), "--resume", "--metric", "acc",
    ]  # fmt: skip
    if threads:
        cmd += ["--threads", threads]
    print("$ " + " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True)


def _rows(records: Sequence[dict[str, Any]], gate: str) -> list[dict[str, Any]]:
    rows = [r for r in records if gate in r["methods"] and gate in r["gates"]]
    return sorted(rows, key=lambda r: str(r["id"]))


def _choose(
    rows: Sequence[dict[str, Any]], retrieve: Sequence[bool], gate: str | None
) -> list[dict[str, Any]]:
    out = []
    for r, x in zip(rows, retrieve, strict=True):
        answer = r["open"] if x else r["closed"]
        seconds = answer["seconds"] + (r["gates"][gate]["seconds"] if gate else 0.0)
        out.append(
            {
                "id": str(r["id"]),
                "retrieve": x,
                "scores": answer["scores"],
                "seconds": seconds,
                "answer": answer,
            }
        )
    return out


def top_share(rows: Sequence[dict[str, Any]], gate: str, rate: float) -> list[bool]:
    """Retrieve for exactly round(rate * n) questions, those with the highest scores (ties: by the sha256 of the
    id, a fixed order unrelated to the answers): every gate then retrieves for the same number of questions."""
    m = round(rate * len(rows))
    order = sorted(
        range(len(rows)),
        key=lambda i: (
            -float(rows[i]["gates"][gate]["score"]),
            hashlib.sha256(str(rows[i]["id"]).encode()).hexdigest(),
        ),
    )
    picked = set(order[:m])
    return [i in picked for i in range(len(rows))]


def _line(
    name: str, how: str, chosen: Sequence[dict[str, Any]], category: dict[str, str], boot: Resampling
) -> str:
    acc = [c["scores"]["acc"] for c in chosen]
    lo, hi = bootstrap_ci(acc, samples=boot.samples, seed=boot.seed)

    def part(kind: str, key: str) -> str:
        values = [
            c[key] if key == "retrieve" else c["scores"]["acc"] for c in chosen if category[c["id"]] == kind
        ]
        return f"{100 * statistics.fmean(float(v) for v in values):.0f}" if values else "-"

    rate = statistics.fmean(float(c["retrieve"]) for c in chosen)
    seconds = statistics.fmean(c["seconds"] for c in chosen)
    return (
        f"| {name} | {how} | {rate:.2f} ({part('docs', 'retrieve')}% / {part('general', 'retrieve')}%) | "
        f"{100 * statistics.fmean(acc):.1f} [{100 * lo:.1f}, {100 * hi:.1f}] | {part('docs', 'acc')} | "
        f"{part('general', 'acc')} | {seconds:.1f} |"
    )


def main(argv: list[str] | None = None) -> int:
    from ragate.models import ragate_home

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--index", type=Path, default=None, help="default: RAGATE_HOME/indexes/private-docs")
    parser.add_argument(
        "--sweep", type=Path, default=None, help="the sweep directory (resumed if incomplete)"
    )
    parser.add_argument("--threads", default=None, help="passed to ragate sweep (e.g. 1 on a shared machine)")
    parser.add_argument("--no-run", action="store_true", help="only read the sweep directory as it is")
    parser.add_argument("--seed", type=int, default=0, help="the bootstrap intervals' numpy seed")
    parser.add_argument("--resamples", type=int, default=1000, help="the bootstrap intervals' resamples")
    args = parser.parse_args(argv)
    boot = Resampling(args.resamples, args.seed)

    def line(name: str, how: str, chosen: Sequence[dict[str, Any]], category: dict[str, str]) -> str:
        return _line(name, how, chosen, category, boot)


    examples = [
        json.loads(line) for line in QUESTIONS.read_text(encoding="utf-8").splitlines() if line.strip()
    ]
    category = {str(e["id"]): e["category"] for e in examples}
    sweep = args.sweep or Path("docs/results/runs") / f"sweep-private-docs-{args.model}-{len(examples)}"
    if not args.no_run:
        index = build_index(args.index or ragate_home() / "indexes" / "private-docs")
        run_sweep(sweep, index, args.model, args.threads)
    records = compact(sweep / "sweep.jsonl")
    n_docs = sum(1 for c in category.values() if c == "docs")

    print(f"# Private documents: {len(examples)} questions ({n_docs} on the documents), {args.model}\n")
    print(f"sweep: {sweep}\n")
    print("| gate | tau | retrieval rate (docs / general) | accuracy [95% CI] | docs | general | s/q |")
    print("|---|---|---|---|---|---|---|")
    base = _rows(records, TARG_FAMILY_GATE)
    print(line("never (TARG's prompt)", "-", _choose(base, [False] * len(base), None), category))
    print(line("always (TARG's reader, top 5)", "-", _choose(base, [True] * len(base), None), category))
    docs_recall = [r["open"]["recall@3"] for r in base if category[str(r["id"])] == "docs"]
    dtr_rows = _rows(records, "dtr")
    print(line("never (DTR's prompt)", "-", _choose(dtr_rows, [False] * len(dtr_rows), None), category))
    print(
        line("always (DTR's DPR-AIS reader)", "-", _choose(dtr_rows, [True] * len(dtr_rows), None), category)
    )
    chosen: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for gate in GATES:
        rows = _rows(records, gate)
        default = [bool(r["gates"][gate]["retrieve"]) for r in rows]
        print(
            line(
                gate,
                f"default {rows[0]['gates'][gate]['threshold']:.3g}",
                _choose(rows, default, gate),
                category,
            )
        )
    rates = (0.5, n_docs / len(examples))
    for rate in rates:
        for gate in GATES:
            rows = _rows(records, gate)
            chosen[(gate, rate)] = _choose(rows, top_share(rows, gate, rate), gate)
            print(line(gate, f"top {rate:.2f} by score (matched)", chosen[(gate, rate)], category))
    for rate in rates:
        for gate in GATES:
            rows = _rows(records, gate)
            scores = [float(r["gates"][gate]["score"]) for r in rows]
            taus = cross_fitted_taus(scores, rate, halves([str(r["id"]) for r in rows]))
            picked = _choose(rows, [s > t for s, t in zip(scores, taus, strict=True)], gate)
            print(line(gate, f"budget {rate:.2f}, tau cross-fitted", picked, category))
    print(
        f"\nrecall@3 of the gold file by the question's top-5 search, document questions: "
        f"{100 * statistics.fmean(docs_recall):.1f}% ({len(docs_recall)} questions)\n"
    )
    print("Paired differences in accuracy against targ-margin at the same rate (points, 95% bootstrap):\n")
    for rate in rates:
        base_acc = {c["id"]: c["scores"]["acc"] for c in chosen[(BASELINE, rate)]}
        for gate in GATES:
            if gate == BASELINE:
                continue
            mine = {c["id"]: c["scores"]["acc"] for c in chosen[(gate, rate)]}
            ids = sorted(set(mine) & set(base_acc))
            a, b = [mine[i] for i in ids], [base_acc[i] for i in ids]
            lo, hi = paired_bootstrap_diff(a, b, samples=boot.samples, seed=boot.seed)
            diff = statistics.fmean(a) - statistics.fmean(b)
            verdict = "not established" if lo <= 0 <= hi else ("higher" if lo > 0 else "lower")
            print(
                f"- rate {rate:.2f}: {gate} - targ-margin = {100 * diff:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}] "
                f"({verdict}; n = {len(ids)})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
