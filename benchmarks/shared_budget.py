"""Replicas that share one budget window in Valkey/Redis (``ragate serve --state``), measured by replaying a
sweep's recorded gate scores through N controllers: no LM calls.

    .venv/bin/python benchmarks/shared_budget.py [SWEEP_DIR] [--gate targ-margin] [--budget 0.3] [--window 200]
        [--replicas 2,4] [--passes 6] [--seed 0]

It starts a redis-server (or valkey-server) on a free 127.0.0.1 port. Each pass plays the sweep's questions in a
new random order; each request goes to one of N replicas' controllers (:class:`ragate.state.budget.BudgetController`):
at random ("random"), or with the hardest half of the questions (score above the median) sent to replica 1 and
the rest spread over the others ("skewed": another client population behind one replica). Each replica decides
with its controller's tau and reports the decision back, with its window in the store (shared) or its own
(local). It prints, after the first ``--window`` requests: the realised rate's error |r - rho| over all replicas,
the largest error of a window of W consecutive requests, the share of requests decided as the fleet's own
(1 - rho)-quantile over the replayed scores would decide them (one threshold for the fleet: 1.0), and the store's
cost per request (one push, one read of tau) next to the local controller's. Exit 1 if the server cannot start.
"""

from __future__ import annotations

import argparse
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ragate.eval.sweep import compact, method_records
from ragate.methods import get_method
from ragate.state.budget import BudgetController
from ragate.state.shared import SharedWindow, parse_state_url

DEFAULT_SWEEP = (
    Path(__file__).resolve().parents[1] / "docs/results/runs/sweep-gates-nq-open-oracle-qwen2.5-coder-1.5b-300"
)


def start_store(workdir: str) -> tuple[subprocess.Popen[bytes], int]:
    server = shutil.which("valkey-server") or shutil.which("redis-server")
    if server is None:
        raise SystemExit("shared_budget.py: no valkey-server or redis-server (apt-get install redis-server)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", workdir],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"shared_budget.py: {server} did not start")


def play(
    scores: list[float], replicas: list[BudgetController], routing: str, passes: int, seed: int, window: int
) -> tuple[list[float], list[bool], float]:
    """The stream's scores and decisions, and the mean seconds per request (tau read, decision, observe)."""
    rng = random.Random(seed)
    median = sorted(scores)[len(scores) // 2]
    seen, decided, spent = [], [], 0.0
    for _ in range(passes):
        order = scores[:]
        rng.shuffle(order)
        for s in order:
            if routing == "skewed" and len(replicas) > 1:
                r = replicas[0] if s > median else replicas[1 + rng.randrange(len(replicas) - 1)]
            else:
                r = replicas[rng.randrange(len(replicas))]
            start = time.perf_counter()
            d = s > r.tau
            r.observe(s, d)
            spent += time.perf_counter() - start
            seen.append(s)
            decided.append(d)
    return seen, decided, spent / len(seen)


def summary(seen: list[float], decided: list[bool], budget: float, window: int) -> tuple[float, float, float]:
    after_s, after_d = seen[window:], decided[window:]
    rate = sum(after_d) / len(after_d)
    worst = max(abs(sum(after_d[i : i + window]) / window - budget) for i in range(len(after_d) - window + 1))
    cut = sorted(seen)[int((1 - budget) * len(seen))]
    agree = sum(d == (s > cut) for s, d in zip(after_s, after_d, strict=True)) / len(after_d)
    return abs(rate - budget), worst, agree


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep", nargs="?", type=Path, default=DEFAULT_SWEEP)
    p.add_argument("--gate", default="targ-margin")
    p.add_argument("--budget", type=float, default=0.3)
    p.add_argument("--window", type=int, default=200)
    p.add_argument("--replicas", default="2,4")
    p.add_argument("--passes", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    scores = [float(r["gates"][args.gate]["score"]) for r in method_records(compact(args.sweep / "sweep.jsonl"),
                                                                             args.gate)]  # fmt: skip
    spec = get_method(args.gate)
    print(f"{args.gate} scores of {len(scores)} questions ({args.sweep.name}), {args.passes} passes, "
          f"budget {args.budget:g}, window {args.window}; after the first {args.window} requests:")  # fmt: skip
    print("| replicas | routing | window | rate error | largest windowed error | decided as the fleet's quantile "
          "| seconds per request |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as workdir:
        proc, port = start_store(workdir)
        try:
            for db, (n, routing) in enumerate(
                (int(n), routing) for n in args.replicas.split(",") for routing in ("random", "skewed")
            ):
                url = parse_state_url(f"redis://127.0.0.1:{port}/{db}")
                for where in ("local", "shared"):
                    replicas = [
                        BudgetController(args.budget, args.window, spec, None, model="m", shared=(
                            SharedWindow(url, method=spec.name, model="m", budget=args.budget, window=args.window)
                            if where == "shared" else None))
                        for _ in range(n)
                    ]  # fmt: skip
                    seen, decided, cost = play(scores, replicas, routing, args.passes, args.seed, args.window)
                    error, worst, agree = summary(seen, decided, args.budget, args.window)
                    print(f"| {n} | {routing} | {where} | {error:.3f} | {worst:.3f} | {agree:.3f} | "
                          f"{cost * 1e3:.2f} ms |")  # fmt: skip
                    for r in replicas:
                        r.close()
        finally:
            proc.kill()
            proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
