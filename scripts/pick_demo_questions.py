"""Pick `make demo`'s two gate questions from a sweep of the demo questions, by a rule stated in advance.

    .venv/bin/ragate sweep --dataset demo --methods dtr,targ-margin,targ-entropy --out SWEEP   # SmolLM2, ~35 min
    .venv/bin/python scripts/pick_demo_questions.py SWEEP [--gate targ-margin] [--budget 0.5] [--out FILE]

tau is the gate's threshold for the budget over the demo questions' scores (`ragate calibrate --from-sweep`, saved
to ``--out``: the file `make demo` passes as ``--calibration``). In file order, the rule takes the first question
that (a) the gate answers without retrieval and whose closed-book answer is right, and the first that (b) the gate
sends to retrieval, whose closed-book answer is wrong and whose answer with the documents is right ("right": the
gold answer is in the reply, SmolLM2 answers in sentences). It prints how many questions fall in each case, so
that the two shown are not mistaken for what the gate usually achieves.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ragate.eval.calibrate import calibrate_from_sweep
from ragate.eval.datasets import load_dataset
from ragate.eval.sweep import compact, method_records
from ragate.fileio import atomic_writer


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep", type=Path)
    p.add_argument("--gate", default="targ-margin")
    p.add_argument("--budget", type=float, default=0.5)
    p.add_argument("--out", type=Path, default=None, help="write the calibration file here")
    args = p.parse_args()
    cal = calibrate_from_sweep(args.sweep, args.gate, args.budget)
    tau = float(cal["tau"])
    order = {ex.id: i for i, ex in enumerate(load_dataset("demo"))}
    questions = {ex.id: ex.question for ex in load_dataset("demo")}
    rows = sorted(method_records(compact(args.sweep / "sweep.jsonl"), args.gate), key=lambda r: order[r["id"]])
    skipped = [r for r in rows if r["gates"][args.gate]["score"] <= tau]
    retrieved = [r for r in rows if r["gates"][args.gate]["score"] > tau]
    right = [r for r in skipped if r["closed"]["scores"]["acc"]]
    fixed = [r for r in retrieved if not r["closed"]["scores"]["acc"] and r["open"]["scores"]["acc"]]
    harmed = [r for r in retrieved if r["closed"]["scores"]["acc"] and not r["open"]["scores"]["acc"]]
    missed = [r for r in skipped if not r["closed"]["scores"]["acc"] and r["open"]["scores"]["acc"]]
    print(f"{args.gate} at budget {args.budget:g}: tau = {tau:.4g} over {len(rows)} demo questions")
    print(f"  answered without retrieval: {len(skipped)}; closed-book right among them: {len(right)}; "
          f"retrieval would have fixed: {len(missed)}")  # fmt: skip
    print(f"  retrieved: {len(retrieved)}; documents fixed a wrong closed-book answer: {len(fixed)}; "
          f"broke a right one: {len(harmed)}")  # fmt: skip
    for label, chosen in (("(a) skip, right closed-book", right), ("(b) retrieve, fixed by documents", fixed)):
        if not chosen:
            print(f"{label}: none")
            continue
        r = chosen[0]
        print(f"{label}: #{order[r['id']]} {questions[r['id']]!r} (score {r['gates'][args.gate]['score']:.4g})")
        print(f"    closed-book: {r['closed']['prediction'][:90]!r}")
        print(f"    with documents: {r['open']['prediction'][:90]!r}")
    if args.out is not None:
        with atomic_writer(args.out) as f:
            f.write((json.dumps(cal, indent=2) + "\n").encode())
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
