"""Pick `make demo`'s two gate questions from a sweep of the demo questions, by a rule stated in advance.

    .venv/bin/ragate sweep --dataset demo --methods dtr,targ-margin,targ-entropy --out SWEEP   # SmolLM2, ~35 min
    .venv/bin/python scripts/pick_demo_questions.py SWEEP [--gate targ-margin] [--budget 0.5] [--margin 0.05]
                                                   [--out FILE]

tau is the gate's threshold for the budget over the demo questions' scores (`ragate calibrate --from-sweep`, saved
to ``--out``: the file `make demo` passes as ``--calibration``). In file order, the rule takes the first question
that (a) the gate answers without retrieval and whose closed-book answer is right, and the first that (b) the gate
sends to retrieval, whose closed-book answer is wrong and whose answer with the documents is right ("right": the
gold answer is in the reply, SmolLM2 answers in sentences). Each must score at least ``--margin`` from tau, so
that a small numeric drift (another CPU, another llama.cpp build) does not flip the demo's decision. It prints how
many questions fall in each case, so that the two shown are not mistaken for what the gate usually achieves; its
output is a generated block of the README.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ragate.eval.datasets import load_dataset
from ragate.eval.sweep import compact, method_records
from ragate.fileio import atomic_writer
from ragate.tuning.calibrate import calibrate_from_sweep


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep", type=Path)
    p.add_argument("--gate", default="targ-margin")
    p.add_argument("--budget", type=float, default=0.5)
    p.add_argument("--margin", type=float, default=0.05, help="least distance of a picked score from tau")
    p.add_argument("--out", type=Path, default=None, help="write the calibration file here")
    args = p.parse_args()
    cal = calibrate_from_sweep(args.sweep, args.gate, args.budget)
    tau = float(cal["tau"])
    order = {ex.id: i for i, ex in enumerate(load_dataset("demo"))}
    questions = {ex.id: ex.question for ex in load_dataset("demo")}
    rows = sorted(method_records(compact(args.sweep / "sweep.jsonl"), args.gate), key=lambda r: order[r["id"]])
    score = {r["id"]: r["gates"][args.gate]["score"] for r in rows}
    skipped = [r for r in rows if score[r["id"]] <= tau]
    retrieved = [r for r in rows if score[r["id"]] > tau]
    right = [r for r in skipped if r["closed"]["scores"]["acc"]]
    fixed = [r for r in retrieved if not r["closed"]["scores"]["acc"] and r["open"]["scores"]["acc"]]
    harmed = [r for r in retrieved if r["closed"]["scores"]["acc"] and not r["open"]["scores"]["acc"]]
    missed = [r for r in skipped if not r["closed"]["scores"]["acc"] and r["open"]["scores"]["acc"]]
    print(f"{args.gate} at budget {args.budget:g} over the {len(rows)} demo questions (`{args.sweep}`): "
          f"tau = {tau:.4g}")  # fmt: skip
    print(f"- answered without retrieval: {len(skipped)}; closed-book right among them: {len(right)}; "
          f"retrieval would have fixed: {len(missed)}")  # fmt: skip
    print(f"- retrieved: {len(retrieved)}; documents fixed a wrong closed-book answer: {len(fixed)}; "
          f"broke a right one: {len(harmed)}")  # fmt: skip
    cases = (
        (f"(a) skip, right closed-book, score <= tau - {args.margin:g}", right, lambda v: v <= tau - args.margin),
        (f"(b) retrieve, fixed by documents, score >= tau + {args.margin:g}", fixed, lambda v: v >= tau + args.margin),
    )
    for label, candidates, clear in cases:
        chosen = [r for r in candidates if clear(score[r["id"]])]
        if not chosen:
            print(f"- {label}: none")
            continue
        r = chosen[0]
        print(f"- {label}: #{order[r['id']]} {questions[r['id']]!r} (score {score[r['id']]:.4g})")
        print(f"  - closed-book: {r['closed']['prediction'][:90]!r}")
        print(f"  - with documents: {r['open']['prediction'][:90]!r}")
    if args.out is not None:
        with atomic_writer(args.out) as f:
            f.write((json.dumps(cal, indent=2) + "\n").encode())
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
