"""What the hidden state a feedback store records costs an answer: each question answered as ``ragate.Pipeline``
answers it with a feedback store (the hidden state read first, from the prompt the draft then starts from) and
without one, each from a cleared cache with no prompt states kept from before it (within the answer, as in a
Pipeline, a prompt's state is kept and reused), in alternating order.

    taskset -c 1 .venv/bin/python benchmarks/hidden_cost.py [--model smollm2-135m] [--method targ-entropy]
                                                            [--questions 20] [--threads 1]

It prints, per arm, the prompt and generated tokens the engine evaluated and the seconds per answer (median), and
the paired difference with its bootstrap interval: what the hidden state adds to the answer's own prefill. The
tokens are exact; the seconds are this machine's (run it pinned to a quiet core). A server gives no hidden state:
this is the local engine's cost.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from ragate.backends import load_backend
from ragate.eval.calls import CallCache
from ragate.methods import get_method, run_method

QUESTIONS = Path(__file__).resolve().parents[1] / "src" / "ragate" / "data" / "demo" / "questions.jsonl"


def _interval(diffs: list[float], seed: int = 0, resamples: int = 2000) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    arr = np.asarray(diffs)
    means = arr[rng.integers(0, len(arr), size=(resamples, len(arr)))].mean(axis=1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="a model name or GGUF file (default SmolLM2-135M)")
    ap.add_argument("--method", default="targ-entropy")
    ap.add_argument("--questions", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    questions = [json.loads(line)["question"] for line in QUESTIONS.read_text().splitlines() if line.strip()]
    questions = questions[: args.questions]
    raw = load_backend(args.model, "llama.cpp", n_threads=args.threads)
    lm = CallCache(raw, None, f"{raw.engine}:{raw.model}", exact_prefixes=True)
    spec = get_method(args.method).with_threshold(float("inf"))  # closed-book: the path a hidden state rides on
    seen: dict[bool, list[tuple[int, float]]] = {True: [], False: []}
    run_method(spec, "Who wrote Hamlet?", lm, None, hidden=True)  # warm-up
    for i, question in enumerate(questions):
        for hidden in (True, False) if i % 2 == 0 else (False, True):
            raw.clear_cache()
            raw.drop_prompt_states()  # neither arm starts from the other's kept prompt
            before, start = raw.evaluated_tokens, time.perf_counter()
            run_method(spec, question, lm, None, hidden=hidden)
            seen[hidden].append((raw.evaluated_tokens - before, time.perf_counter() - start))
    raw.close()
    print(f"{len(questions)} demo questions, {args.method} answered closed-book, {raw.model}, {args.threads} thread(s)")
    for hidden in (False, True):
        tokens = [t for t, _ in seen[hidden]]
        secs = [s for _, s in seen[hidden]]
        name = "with the hidden state" if hidden else "without          "
        print(f"{name}: {statistics.mean(tokens):.1f} tokens evaluated per answer, median {statistics.median(secs):.3f} s")
    dt = [a[0] - b[0] for a, b in zip(seen[True], seen[False], strict=True)]
    ds = [a[1] - b[1] for a, b in zip(seen[True], seen[False], strict=True)]
    lo, hi = _interval(ds)
    base = statistics.mean(s for _, s in seen[False])
    print(
        f"the hidden state adds {statistics.mean(dt):.1f} evaluated tokens per answer and "
        f"{statistics.mean(ds):+.3f} s [{lo:+.3f}, {hi:+.3f}] (paired, 95% bootstrap), "
        f"{100 * statistics.mean(ds) / base:+.1f}% of the answer's {base:.3f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
