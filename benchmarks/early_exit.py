"""What TARG's exact early exit saves: decoded tokens of the entropy and margin gates with and without it.

    taskset -c 0 .venv/bin/python benchmarks/early_exit.py [--limit 80] [--budgets 0.2,0.5,0.8] [--model M]

On the demo questions (SmolLM2-135M on llama.cpp by default, the demo index), each gate's threshold is set to
retrieve for a share ``budget`` of them (tau = F^-1(1 - budget) over their full-draft scores, TARG section 3.3),
and every question is answered twice by ``run_method``: with ``early_exit=False`` (every 20-token draft decoded
whole) and with ``early_exit=True`` (the draft stops once (1/k) sum u_t > tau, TARG Eqs. 1-2). Every call is
computed as :class:`ragate.Pipeline` computes it (from a cleared cache and kept prompt states) through one call
store, so the reading answers and continuations are computed once and shared by both passes, while a draft that
stops early is always decoded afresh (``CallCache.generate_settled``). The script checks that both passes make
the same decisions and write the same answers from the same documents, and prints per gate and budget:

- the retrieval rate and how many decisions and answers agree;
- draft tokens decoded per retrieved question, without and with early exit, and their ratio;
- draft tokens decoded per question (all of them: a draft that says "no" runs to k either way);
- decoded (generated) tokens per question over the whole method (draft, continuation or reading answer).

Token counts, not seconds: the whole drafts come from the store at the cost measured when they were first computed,
so on a shared machine their seconds and the early drafts' are not measured under the same load.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ragate.backends import load_backend
from ragate.eval.calls import CallCache, CallStore
from ragate.eval.datasets import load_dataset
from ragate.methods import get_method, run_method
from ragate.methods.runner import decide
from ragate.retrieval.demo import demo_index
from ragate.retrieval.index import open_index
from ragate.tuning.calibrate import threshold_for_budget

GATES = ("targ-entropy", "targ-margin")


def decoded(trace: Any) -> int:
    return sum(s.completion_tokens for s in trace.stages)


def draft_stage(trace: Any) -> Any:
    return next(s for s in trace.stages if s.name == "draft")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--limit", type=int, default=80, help="the first N demo questions (default: all 80)")
    p.add_argument("--budgets", default="0.2,0.5,0.8")
    p.add_argument("--model", default=None)
    args = p.parse_args()
    budgets = [float(b) for b in args.budgets.split(",")]
    questions = [ex.question for ex in load_dataset("demo")][: args.limit]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, load_backend(args.model, "llama.cpp") as inner:
        store = CallStore(Path(tmp) / "calls.sqlite")
        lm = CallCache(inner, store, f"bench:{inner.model}", exact_prefixes=True)
        retriever = open_index(demo_index(progress=False))
        print(f"{len(questions)} demo questions, {inner.model} on llama.cpp ({inner.thread_counts}), k = 20")
        print("| gate | budget | tau | retrieval rate | decisions, answers agree | draft tokens / retrieved "
              "question: whole, early exit, ratio | draft tokens / question: whole, early exit, ratio | "
              "decoded tokens / question: whole, early exit, ratio |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|")  # 8 columns
        for gate in GATES:
            spec = get_method(gate)
            scores = [decide(spec, q, lm).score for q in questions]  # full drafts (decide never stops early)
            for budget in budgets:
                tau = threshold_for_budget(scores, budget)
                at = spec.with_threshold(tau)
                agree = 0
                rows: list[tuple[bool, int, int, int, int]] = []
                for q in questions:
                    whole = run_method(at, q, lm, retriever, early_exit=False)
                    early = run_method(at, q, lm, retriever, early_exit=True)
                    same = (whole.retrieved, whole.answer, [d.id for d in whole.documents]) == (
                        early.retrieved, early.answer, [d.id for d in early.documents]
                    )  # fmt: skip
                    agree += same
                    a, b = draft_stage(whole), draft_stage(early)
                    rows.append(
                        (whole.retrieved, a.completion_tokens, b.completion_tokens, decoded(whole), decoded(early))
                    )
                got = [r for r in rows if r[0]]
                n = len(rows)

                def mean(values: list[float]) -> float:
                    return statistics.fmean(values) if values else 0.0

                dw, de = mean([r[1] for r in got]), mean([r[2] for r in got])
                aw, ae = mean([r[1] for r in rows]), mean([r[2] for r in rows])
                tw, te = mean([r[3] for r in rows]), mean([r[4] for r in rows])
                print(
                    f"| {gate} | {budget:g} | {tau:.4g} | {len(got) / n:.2f} | {agree}/{n} | "
                    f"{dw:.1f}, {de:.1f}, {de / dw if dw else 1:.2f} | {aw:.1f}, {ae:.1f}, {ae / aw:.2f} | "
                    f"{tw:.1f}, {te:.1f}, {te / tw:.3f} |",
                    flush=True,
                )
        store.close()
    print(f"({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
