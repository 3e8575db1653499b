"""What deciding costs: each gate's cost per question against the floor it cannot beat, before and after the
reading prompt reuses the gate's prompt state.

    .venv/bin/python benchmarks/gate_overhead.py [--model qwen2.5-coder-1.5b] [--index DIR] [--questions 100] \
        [--budget 0.5] [--arms before,after] [--out FILE.jsonl]

On the first ``--questions`` NQ-open dev questions (``--data``: another JSONL file, or a dataset name such as
``hotpotqa``), every gate runs with the same reader and selector (the question's top 3), so that only the gate
differs. Two arms (issue P):

- ``before``: the reader puts the documents before the question (TARG's reader as ragate had it, ``targ``
  prompts), and the backend is used as it was: its key/value cache cleared before each method, a call reusing
  what the previous call of the same method left in it. Nothing but the system message is shared between the
  gate's prompt and the reading prompt.
- ``after``: the question first, then the documents (TARG's x = B(q) ⊕ C, ``targ-question-first``), and every call
  computed as :class:`ragate.Pipeline` computes it: from a cleared cache, its prompt started from the kept state of
  the earlier prompt with the longest aligned common prefix (:mod:`ragate.backends.prompt_states`). The states are
  dropped before each method, so a method reuses only its own prompts (never another method's identical reading
  prompt).

The gate's draft prompt is the same in both arms (system + question), so the thresholded gates decide the same.
For a gate that retrieves for the questions R, the paired floor is what an oracle gate with no cost of its own would
spend on the same questions, in the same arm:

    paired floor = mean over questions q of t(never, q) + [q in R] * (t(always, q) - t(never, q))

and overhead = cost / paired floor - 1, with cost measured three ways around the whole method call: CPU seconds of
the process (all threads; the main figure: other load on this shared machine inflates wall time without changing
the work done), wall seconds, and tokens the engine evaluated (prompt tokens not taken from a cache, plus generated
ones; deterministic). ``reused`` is the mean prompt tokens a question's calls took from kept states (after arm).

Each question runs every (arm, gate) back to back in rotated order, so machine drift hits all alike. Thresholds:
with ``--budget RHO`` (default 0.5) UGT and TARG's three gates are calibrated to retrieve for a share RHO of
questions, tau = F^-1(1 - RHO) over their scores on ``--calibration`` other NQ-open questions (from the end of the
file), and the random gate's rate is RHO; ``--budget paper`` keeps every paper default. PAIRS and the LLM judge
have no threshold. PAIRS's pseudo-context is capped at ``--pseudo-max-tokens`` (default 128, not the paper's 1024:
the pseudo-context is all overhead either way, and 1024 tokens would take most of the run's time).

``--out`` keeps one JSON line per (question, arm, gate) as it finishes; rerunning with the same file resumes, and
``--shard i/n`` runs every n-th question from the i-th (0-based), so two processes pinned to two cores
(``taskset -c 0``, ``taskset -c 1``) fill two files that ``--report FILE FILE`` reads together.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ragate.backends import load_backend
from ragate.eval.calls import CallCache
from ragate.eval.datasets import DATASETS
from ragate.eval.datasets import read_questions as dataset_questions
from ragate.eval.records import RecordWriter, read_records
from ragate.gates.registry import get_gate
from ragate.methods import GateSpec, MethodSpec, SelectorSpec, decide, run_method
from ragate.methods.prompts import TARG, TARG_CONTEXT_FIRST, PromptSet
from ragate.methods.proxy import attach_proxy
from ragate.retrieval.demo import demo_index
from ragate.retrieval.index import open_index
from ragate.tuning.calibrate import threshold_for_budget

GATES = (
    "never", "always", "ugt", "targ-entropy", "targ-margin", "targ-variance", "llm-judge", "pairs", "random",
    # issue 51: anytime drafts, a small proxy model's draft, and gates that read no model or the corpus
    "targ-entropy@k=5", "targ-entropy@k=10", "targ-margin@k=5", "targ-margin@k=10", "proxy-margin", "proxy-entropy",
    "retrieval-top1", "retrieval-gap", "retrieval-dispersion", "question-length", "question-numeric",
    "question-rarity", "corpus-coverage", "corpus-or-margin", "no-model-lr",
    # issue 63: the learned gate (a cascade file drafts only inside its band)
    "learned",
)  # fmt: skip
CALIBRATED = tuple(g for g in GATES if g not in ("never", "always", "llm-judge", "pairs", "random"))
NQ = Path("../shared/data/nq_open/NQ-open.dev.jsonl")


@dataclass(frozen=True)
class Arm:
    prompts: PromptSet
    exact: bool  # calls computed from a cleared cache with kept prompt states (as ragate.Pipeline does)
    what: str


ARMS = {
    "before": Arm(
        TARG_CONTEXT_FIRST, False, "documents before the question; the engine's cache, cleared per method"
    ),
    "after": Arm(TARG, True, "question first (x = B(q) + C); kept prompt states, dropped per method"),
}


def read_questions(source: str, first: int, last: int) -> tuple[list[str], list[str]]:
    """The first ``first`` questions of a JSONL file with "question" fields or of a dataset name, and the last
    ``last`` (to calibrate on)."""
    questions = dataset_questions(source)
    return questions[:first], questions[len(questions) - last :] if last else []


def spec_for(
    gate: str, arm: Arm, thresholds: dict[str, float], budget: float, pseudo: int, weights: str | None = None
) -> MethodSpec:
    kind = GateSpec(gate, threshold=thresholds.get(gate), rate=budget)  # type: ignore[arg-type]
    if weights is not None and get_gate(gate).reads_weights:
        kind = replace(kind, weights=weights)
    return MethodSpec(
        gate, gate, kind, SelectorSpec("question"), prompts=arm.prompts, pseudo_max_tokens=pseudo
    )


def calibrate(
    budget: float,
    questions: list[str],
    lm: Any,
    index: Any,
    pseudo: int,
    gates: list[str],
    weights: str | None,
) -> dict[str, float]:
    thresholds = {}
    for gate in gates:
        spec = spec_for(gate, ARMS["after"], {}, budget, pseudo, weights)
        scores = [
            decide(spec, q, lm, index, seed=10_000 + i).score
            for i, q in enumerate(tqdm(questions, desc=f"calibrate {gate}", leave=False))
        ]
        thresholds[gate] = threshold_for_budget(scores, budget)
    return thresholds


def measure(
    gate: str, arm_name: str, i: int, question: str, raw: Any, exact: CallCache, index: Any, specs: dict
) -> dict:  # type: ignore[type-arg]
    arm = ARMS[arm_name]
    raw.clear_cache()  # the previous method's prompt must not make this one's look free
    raw.drop_prompt_states()
    lm = exact if arm.exact else exact.inner  # the model, with the proxy model beside it where one is open
    proxy = getattr(exact.inner, "proxy", None)
    proxy_evaluated = proxy.evaluated_tokens if proxy is not None else 0
    evaluated = raw.evaluated_tokens
    with exact.tally() as tally:
        start, cpu = time.perf_counter(), time.process_time()
        trace = run_method(specs[arm_name, gate], question, lm, index, seed=i)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {
        "q": i, "arm": arm_name, "gate": gate, "seconds": seconds, "cpu": cpu,
        "tokens": raw.evaluated_tokens - evaluated, "charged_tokens": trace.tokens, "reused": tally.reused_tokens,
        "proxy_tokens": (proxy.evaluated_tokens - proxy_evaluated) if proxy is not None else 0,
        "retrieved": trace.retrieved, "score": trace.gate.score, "answer": trace.answer,
        "drafted": any(st.name == "draft" for st in trace.stages[: trace.gate_stages or 0]),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--calibration", type=int, default=20, help="questions to calibrate thresholds on")
    parser.add_argument("--budget", default="0.5", help="retrieval budget rho in [0, 1], or 'paper'")
    parser.add_argument(
        "--data", default=str(NQ), help="JSONL with 'question' fields, or a dataset name (e.g. hotpotqa)"
    )
    parser.add_argument("--index", default=None, help="index directory (default: the demo index)")
    parser.add_argument("--model", default=None)
    parser.add_argument("--arms", default="before,after", help="comma-separated: before, after")
    parser.add_argument(
        "--gates", default=",".join(g for g in GATES if g != "learned"),
        help="comma-separated; never and always are the floor (learned: a run of its own, its gate file apart)",
    )  # fmt: skip
    parser.add_argument("--pseudo-max-tokens", type=int, default=128, help="PAIRS's pseudo-context cap")
    parser.add_argument("--threshold", action="append", default=[], help="GATE=VALUE, repeatable")
    parser.add_argument(
        "--gate-weights", default=None,
        help="no-model-lr's weights file (`ragate gate fit`) or learned's gate file (`ragate gate learn`)",
    )  # fmt: skip
    parser.add_argument("--shard", default="0/1", help="i/n: every n-th question from the i-th (0-based)")
    parser.add_argument("--out", type=Path, default=None, help="JSONL of measurements; resumes if it exists")
    parser.add_argument("--report", type=Path, nargs="+", default=None, help="only print the tables of FILEs")
    parser.add_argument("--costs", default="cpu,seconds,tokens", help="with --report: the cost tables to print")
    args = parser.parse_args()
    arms = args.arms.split(",")
    gates = args.gates.split(",")
    if unknown := [a for a in arms if a not in ARMS] + [g for g in gates if g not in GATES]:
        sys.exit(f"unknown arm or gate: {', '.join(unknown)}")
    if not args.report and "no-model-lr" in gates and "learned" in gates:
        sys.exit("no-model-lr and learned read different --gate-weights files: measure them in two runs")
    if not args.report and {"no-model-lr", "learned"} & set(gates) and args.gate_weights is None:
        sys.exit(
            "no-model-lr needs --gate-weights FILE (`ragate gate fit` on a training sweep of this model), learned "
            "a gate file (`ragate gate learn`, or benchmarks/learned_gate.py --write-gates)"
        )
    if args.report:
        rows = [r for path in args.report for r in read_records(path, fault=_row_fault)]
        report(rows, args.questions, gates, tuple(args.costs.split(",")))
        return
    if not Path(args.data).exists() and args.data not in DATASETS:
        sys.exit(
            f"{args.data} not found: pass --data with NQ-open's NQ-open.dev.jsonl or a dataset name (see "
            "../shared/data/README.md)"
        )
    shard, shards = (int(x) for x in args.shard.split("/"))
    paper = args.budget == "paper"
    budget = 0.5 if paper else float(args.budget)
    questions, held_out = read_questions(args.data, args.questions, 0 if paper else args.calibration)
    overrides = {k: float(v) for k, v in (t.split("=", 1) for t in args.threshold)}
    rows = read_records(args.out, fault=_row_fault) if args.out else []
    with open_index(args.index or demo_index()) as index, load_backend(args.model, "llama.cpp") as raw:
        # a proxy gate's small model (SmolLM2-135M) beside the measured one; its tokens are counted apart
        # (proxy_tokens), its CPU time with the method's
        lm = attach_proxy(raw, [GateSpec(g) for g in gates], close_main=False)
        exact = CallCache(lm, None, f"{raw.engine}:{raw.model}", exact_prefixes=True)
        # every thresholds line of the file, merged: a resume with more --gates calibrates only the new ones
        thresholds = {g: t for r in rows if "thresholds" in r for g, t in r["thresholds"].items()}
        first = not any("thresholds" in r for r in rows)
        todo = [] if paper else [g for g in gates if g in CALIBRATED and g not in thresholds]
        if first or todo:
            found = calibrate(budget, held_out, exact, index, args.pseudo_max_tokens, todo, args.gate_weights)
            found.update({g: t for g, t in overrides.items() if first or g in todo})
            saved = {
                "thresholds": found,
                "model": raw.model,
                "budget": args.budget,
                "gate_weights": args.gate_weights,
            }
            rows.append(saved)
            _append(args.out, saved)
            thresholds.update(found)
        specs = {
            (a, g): spec_for(g, ARMS[a], thresholds, budget, args.pseudo_max_tokens, args.gate_weights)
            for a in ARMS
            for g in GATES
        }
        done = {(r["q"], r["arm"], r["gate"]) for r in rows if "gate" in r}
        run_method(specs["after", "always"], questions[0], exact, index)  # warm-up: encoder, caches
        pairs = [(a, g) for a in arms for g in gates]
        mine = [i for i in range(len(questions)) if i % shards == shard]
        for i in tqdm(mine, desc="questions"):
            order = pairs[i % len(pairs) :] + pairs[: i % len(pairs)]
            for arm, gate in order:
                if (i, arm, gate) not in done:
                    row = measure(gate, arm, i, questions[i], raw, exact, index, specs)
                    rows.append(row)
                    _append(args.out, row)
    if lm is not raw:
        lm.close()  # the proxy (the model is closed by its own `with`)
    report(rows, len(questions), gates)


def _row_fault(row: dict) -> str | None:  # type: ignore[type-arg]
    """What is wrong with one line of ``--out`` (the thresholds, or one measurement), else None."""
    keys = (
        ("thresholds",)
        if "thresholds" in row
        else ("q", "arm", "gate", "cpu", "seconds", "tokens", "retrieved")
    )
    missing = [k for k in keys if k not in row]
    return f"no {', '.join(missing)} in this line (not a gate_overhead.py file?)" if missing else None


def _append(path: Path | None, row: dict) -> None:  # type: ignore[type-arg]
    if path is not None:
        with RecordWriter(path) as writer:
            writer.append(row)


COSTS = (
    ("cpu", "CPU seconds of the process (all threads): what the method costs, little moved by other load"),
    ("seconds", "wall seconds: what a user waits, on a shared 2-core machine (noisy)"),
    (
        "tokens",
        "tokens the engine evaluated (prompt tokens not taken from a cache, plus generated): deterministic",
    ),
)


def report(rows: list[dict], n: int, gates: list[str], costs: tuple[str, ...] = ("cpu", "seconds", "tokens")) -> None:  # type: ignore[type-arg]
    head = next((r for r in rows if "thresholds" in r), {})
    taus = {g: t for r in rows if "thresholds" in r for g, t in r["thresholds"].items()}
    print(f"model {head.get('model')}; budget {head.get('budget')}; thresholds:")
    print("  " + ", ".join(f"{g} {t:.4g}" for g, t in taus.items()))
    done = {(r["q"], r["arm"], r["gate"]): r for r in rows if "gate" in r and r["q"] < n}
    for arm, setting in ARMS.items():
        qs = sorted({q for q, a, _ in done if a == arm})
        qs = [q for q in qs if all((q, arm, g) in done for g in gates)]
        if not qs:
            continue
        print(f"\n**arm {arm}**: {setting.what}; {len(qs)} questions")
        for cost, what in COSTS:
            if cost not in costs:
                continue
            table(done, qs, arm, gates, cost, what)
    both = [q for q in range(n) if all((q, a, g) in done for a in ARMS for g in gates)]
    if both:
        print(f"\n## before -> after, on the {len(both)} questions both arms answered\n")
        print("| gate | retrieval rate (before / after) | overhead CPU before | after | overhead tokens before | after "
              "| tokens reused / question (after) |")  # fmt: skip
        print("|---|---|---|---|---|---|---|")
        for gate in gates:
            cells = [_rate(done, both, a, gate) for a in ARMS]
            cpu = [_overhead(done, both, a, gate, "cpu") for a in ARMS]
            tok = [_overhead(done, both, a, gate, "tokens") for a in ARMS]
            reused = statistics.mean(done[q, "after", gate]["reused"] for q in both)
            print(
                f"| {gate} | {cells[0]:.2f} / {cells[1]:.2f} | {cpu[0]:+.1f}% | {cpu[1]:+.1f}% | {tok[0]:+.1f}% "
                f"| {tok[1]:+.1f}% | {reused:.1f} |"
            )


def _rate(done: dict, qs: list[int], arm: str, gate: str) -> float:  # type: ignore[type-arg]
    return sum(done[q, arm, gate]["retrieved"] for q in qs) / len(qs)


def _paired_floor(done: dict, qs: list[int], arm: str, gate: str, cost: str) -> float:  # type: ignore[type-arg]
    return statistics.mean(
        done[q, arm, "never"][cost]
        + done[q, arm, gate]["retrieved"] * (done[q, arm, "always"][cost] - done[q, arm, "never"][cost])
        for q in qs
    )


def _overhead(done: dict, qs: list[int], arm: str, gate: str, cost: str) -> float:  # type: ignore[type-arg]
    mean = statistics.mean(done[q, arm, gate][cost] for q in qs)
    return 100 * (mean / _paired_floor(done, qs, arm, gate, cost) - 1)


def table(done: dict, qs: list[int], arm: str, gates: list[str], cost: str, what: str) -> None:  # type: ignore[type-arg]
    never = statistics.mean(done[q, arm, "never"][cost] for q in qs)
    extra = statistics.mean(done[q, arm, "always"][cost] - done[q, arm, "never"][cost] for q in qs)
    print(f"\n{what}: never {never:.3f} / question; retrieval + context decode {extra:.3f}\n")
    print("| gate | retrieval rate | share drafted | per question | paired floor | paired overhead |")
    print("|---|---|---|---|---|---|")
    for gate in gates:
        rate = _rate(done, qs, arm, gate)
        mean = statistics.mean(done[q, arm, gate][cost] for q in qs)
        paired = _paired_floor(done, qs, arm, gate, cost)
        flags = [done[q, arm, gate].get("drafted") for q in qs]  # older files did not record it
        drafted = "–" if None in flags else f"{statistics.mean(flags):.2f}"
        print(
            f"| {gate} | {rate:.2f} | {drafted} | {mean:.3f} | {paired:.3f} | {100 * (mean / paired - 1):+.1f}% |"
        )


if __name__ == "__main__":
    main()
