"""What deciding costs: seconds per question of each gate against the floor it cannot beat.

    .venv/bin/python benchmarks/gate_overhead.py [--questions 100] [--budget 0.5] [--out FILE.jsonl]

On the first ``--questions`` NQ-open dev questions, every gate runs with the same reader, prompts (DTR's) and
selector (the question's top 3), so that only the gate differs. For a gate that retrieves for a share pi of the
questions, the floor is what an oracle gate with no cost of its own would spend at that rate:

    floor = t(never) + pi * (t(retrieval) + t(context decode))

with t(never) the seconds of the no-retrieval answer and t(retrieval) + t(context decode) the extra seconds of
the always-retrieve answer, both measured on the same questions in the same run. The table gives that floor
(means over all questions) and the paired one, which sums t(never, q) + [gate retrieved q] * (t(always, q) -
t(never, q)) over the questions the gate actually retrieved for, so the cost of *which* questions it picks does
not count as overhead. Overhead = cost / floor - 1, with cost measured three ways around the whole method call:
CPU seconds of the process (all threads; the main figure, since this machine is shared and other load inflates
wall time without changing the work done), wall seconds, and tokens processed (deterministic).

Each question runs every method back to back, in rotated order, so machine drift hits all alike; the backend's
prompt cache is cleared before each method, or a method would reuse the previous one's identical prompt for free.

Thresholds: with ``--budget RHO`` (default 0.5) the thresholded gates (UGT, TARG's three) are calibrated to
retrieve for a share RHO of questions: tau = F^-1(1 - RHO) over their scores on ``--calibration`` other NQ-open
questions (from the end of the file, disjoint from the measured ones), and the random gate's rate is RHO. With
``--budget paper`` every gate keeps its paper default. ``--threshold GATE=VALUE`` overrides one gate.
PAIRS and the LLM judge have no threshold: their rate is what the model makes it.

``--out`` keeps one JSON line per (question, gate) as it finishes; rerunning with the same file resumes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from tqdm.auto import tqdm

from ragate.backends import load_backend
from ragate.eval.calibrate import threshold_for_budget
from ragate.eval.records import RecordWriter, read_records
from ragate.methods import GateSpec, MethodSpec, SelectorSpec, decide, run_method
from ragate.retrieval.demo import demo_index
from ragate.retrieval.index import open_index

GATES = (
    "never", "always", "ugt", "targ-entropy", "targ-margin", "targ-variance", "llm-judge", "pairs",
    "pairs-exclude-num", "random",
)  # fmt: skip
CALIBRATED = ("ugt", "targ-entropy", "targ-margin", "targ-variance")
NQ = Path("../shared/data/nq_open/NQ-open.dev.jsonl")


def read_questions(path: Path, first: int, last: int) -> tuple[list[str], list[str]]:
    lines = path.read_text().splitlines()
    questions = [json.loads(line)["question"] for line in lines]
    return questions[:first], questions[len(questions) - last :] if last else []


def calibrate(budget: float, questions: list[str], lm, index) -> dict[str, float]:  # type: ignore[no-untyped-def]
    thresholds = {}
    for gate in CALIBRATED:
        spec = MethodSpec(gate, gate, GateSpec(gate), SelectorSpec("question"))  # type: ignore[arg-type]
        scores = [
            decide(spec, q, lm, index, seed=10_000 + i).score
            for i, q in enumerate(tqdm(questions, desc=f"calibrate {gate}", leave=False))
        ]
        thresholds[gate] = threshold_for_budget(scores, budget)
    return thresholds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--calibration", type=int, default=20, help="questions to calibrate thresholds on")
    parser.add_argument("--budget", default="0.5", help="retrieval budget rho in [0, 1], or 'paper'")
    parser.add_argument("--data", type=Path, default=NQ, help="NQ-open JSONL ({'question', 'answer'})")
    parser.add_argument("--index", default=None, help="index directory (default: the demo index)")
    parser.add_argument("--model", default=None)
    parser.add_argument("--threshold", action="append", default=[], help="GATE=VALUE, repeatable")
    parser.add_argument("--out", type=Path, default=None, help="JSONL of measurements; resumes if it exists")
    args = parser.parse_args()
    if not args.data.exists():
        sys.exit(
            f"{args.data} not found: pass --data with NQ-open's NQ-open.dev.jsonl (see ../shared/data/README.md)"
        )
    paper = args.budget == "paper"
    budget = 0.5 if paper else float(args.budget)
    questions, held_out = read_questions(args.data, args.questions, 0 if paper else args.calibration)
    overrides = {k: float(v) for k, v in (t.split("=", 1) for t in args.threshold)}
    rows = read_records(args.out) if args.out else []
    with open_index(args.index or demo_index()) as index, load_backend(args.model, "llama.cpp") as lm:
        saved = next((r["thresholds"] for r in rows if "thresholds" in r), None)
        if saved is None:
            thresholds = {} if paper else calibrate(budget, held_out, lm, index)
            thresholds.update(overrides)
            rows.append({"thresholds": thresholds})
            _append(args.out, rows[-1])
        else:
            thresholds = saved
        specs = {
            g: MethodSpec(
                g, g, GateSpec(g, threshold=thresholds.get(g), rate=budget), SelectorSpec("question")
            )  # type: ignore[arg-type]
            for g in GATES
        }
        done = {(r["q"], r["gate"]) for r in rows if "gate" in r}
        run_method(specs["always"], questions[0], lm, index)  # warm-up: encoder, caches
        for i, question in enumerate(tqdm(questions, desc="questions")):
            order = GATES[i % len(GATES) :] + GATES[: i % len(GATES)]
            for gate in order:
                if (i, gate) in done:
                    continue
                lm.clear_cache()  # the previous method's prompt must not make this one's look free
                start, cpu = time.perf_counter(), time.process_time()
                trace = run_method(specs[gate], question, lm, index, seed=i)
                row = {
                    "q": i,
                    "gate": gate,
                    "seconds": time.perf_counter() - start,
                    "cpu": time.process_time() - cpu,
                    "tokens": trace.tokens,
                    "retrieved": trace.retrieved,
                }
                rows.append(row)
                _append(args.out, row)
        model = lm.model
    report(rows, len(questions), thresholds, budget, paper, model, args.index or "demo")


def _append(path: Path | None, row: dict) -> None:  # type: ignore[type-arg]
    if path is not None:
        with RecordWriter(path) as writer:
            writer.append(row)


def report(rows, n, thresholds, budget, paper, model, index) -> None:  # type: ignore[no-untyped-def]
    done = [r for r in rows if "gate" in r and r["q"] < n]
    how = "paper defaults" if paper else f"calibrated to budget {budget} on held-out questions"
    print(f"{n} NQ-open questions; model {model}; index {index}; thresholds: {how}")
    print("  " + ", ".join(f"{g} {t:.4g}" for g, t in thresholds.items()))
    for cost, what in COSTS:
        table(done, n, cost, what)


COSTS = (
    ("cpu", "CPU seconds of the process (all threads): what the method costs, little moved by other load"),
    ("seconds", "wall seconds: what a user waits, on a shared 2-core machine (noisy)"),
    ("tokens", "tokens processed (prompt + generated): deterministic"),
)


def table(rows, n, cost, what) -> None:  # type: ignore[no-untyped-def]
    value = {(r["q"], r["gate"]): r[cost] for r in rows}
    retrieved = {(r["q"], r["gate"]): r["retrieved"] for r in rows}
    qs = range(n)
    t_never = [value[q, "never"] for q in qs]
    t_extra = [value[q, "always"] - value[q, "never"] for q in qs]
    never, extra = statistics.mean(t_never), statistics.mean(t_extra)
    print(f"\n{what}: never {never:.3f} / question; retrieval + context decode {extra:.3f}\n")
    print("| gate | retrieval rate | per question | floor | overhead | paired floor | paired overhead |")
    print("|---|---|---|---|---|---|---|")
    for gate in GATES:
        rate = sum(retrieved[q, gate] for q in qs) / n
        mean = statistics.mean(value[q, gate] for q in qs)
        floor = never + rate * extra
        paired = statistics.mean(t_never[q] + retrieved[q, gate] * t_extra[q] for q in qs)
        print(
            f"| {gate} | {rate:.2f} | {mean:.3f} | {floor:.3f} | {100 * (mean / floor - 1):+.1f}% "
            f"| {paired:.3f} | {100 * (mean / paired - 1):+.1f}% |"
        )


if __name__ == "__main__":
    main()
