"""What deciding costs: seconds per question of each gate against the floor it cannot beat.

    .venv/bin/python benchmarks/gate_overhead.py [--questions 100] [--index DIR] [--model smollm2-135m]

On the first ``--questions`` NQ-open dev questions, every gate runs with the same reader, prompts (DTR's) and
selector (the question's top 3), so that only the gate differs. For a gate that retrieves for a share pi of the
questions, the floor is what an oracle gate with no cost of its own would spend at that rate:

    floor = t(never) + pi * (t(retrieval) + t(context decode))

with t(never) the seconds of the no-retrieval answer and t(retrieval) + t(context decode) the extra seconds of
the always-retrieve answer, both measured on the same questions in the same run (each question runs every
method back to back, in rotated order, so machine drift hits all alike; the backend's prompt cache is cleared
before each method, or a method would reuse the previous one's identical prompt for free).
Overhead = seconds / floor - 1.
Thresholds are each gate's default; pass ``--threshold GATE=VALUE`` to change one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from tqdm.auto import tqdm

from ragate.backends import load_backend
from ragate.methods import GateSpec, MethodSpec, SelectorSpec, run_method
from ragate.retrieval.demo import demo_index
from ragate.retrieval.index import open_index

GATES = (
    "never", "always", "ugt", "targ-entropy", "targ-margin", "targ-variance", "llm-judge", "pairs",
    "pairs-exclude-num", "random",
)  # fmt: skip
NQ = Path("../shared/data/nq_open/NQ-open.dev.jsonl")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--data", type=Path, default=NQ, help="NQ-open JSONL ({'question', 'answer'})")
    parser.add_argument("--index", default=None, help="index directory (default: the demo index)")
    parser.add_argument("--model", default=None)
    parser.add_argument("--threshold", action="append", default=[], help="GATE=VALUE, repeatable")
    args = parser.parse_args()
    if not args.data.exists():
        sys.exit(
            f"{args.data} not found: pass --data with NQ-open's NQ-open.dev.jsonl (see ../shared/data/README.md)"
        )
    with args.data.open() as f:
        questions = [json.loads(line)["question"] for _, line in zip(range(args.questions), f, strict=False)]
    thresholds = {k: float(v) for k, v in (t.split("=", 1) for t in args.threshold)}
    specs = {
        g: MethodSpec(g, g, GateSpec(g, threshold=thresholds.get(g)), SelectorSpec("question"))
        for g in GATES  # type: ignore[arg-type]
    }
    seconds: dict[str, list[float]] = {g: [] for g in GATES}
    retrieved: dict[str, list[bool]] = {g: [] for g in GATES}
    with open_index(args.index or demo_index()) as index, load_backend(args.model, "llama.cpp") as lm:
        run_method(specs["always"], questions[0], lm, index)  # warm-up: encoder, caches
        for i, question in enumerate(tqdm(questions, desc="questions")):
            order = GATES[i % len(GATES) :] + GATES[: i % len(GATES)]
            for gate in order:
                lm.clear_cache()  # the previous method's prompt must not make this one's look free
                trace = run_method(specs[gate], question, lm, index, seed=i)
                seconds[gate].append(trace.seconds)
                retrieved[gate].append(trace.retrieved)
    never = statistics.mean(seconds["never"])
    extra = statistics.mean(seconds["always"]) - never
    print(f"{len(questions)} NQ-open questions; model {lm.model}; index {args.index or 'demo'}")
    print(f"t(never) = {never:.3f} s/question; t(retrieval + context decode) = {extra:.3f} s\n")
    print("| gate | retrieval rate | s / question | floor s | overhead over floor |")
    print("|---|---|---|---|---|")
    for gate in GATES:
        rate = sum(retrieved[gate]) / len(questions)
        mean = statistics.mean(seconds[gate])
        floor = never + rate * extra
        print(f"| {gate} | {rate:.2f} | {mean:.3f} | {floor:.3f} | {100 * (mean / floor - 1):+.1f}% |")


if __name__ == "__main__":
    main()
