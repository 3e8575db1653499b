"""Throughput of ``ragate eval --engine ray`` against 1, 2 and 4 workers over a stand-in GPU server, and the
driver's overhead per question.

    .venv/bin/python benchmarks/ray_throughput.py [--questions 48] [--latency 0.2] [--workers 1,2,4]

It starts ``benchmarks/latency_server.py`` on 127.0.0.1 (every call answered after ``--latency`` seconds, many in
parallel, as a batching GPU server) and a local Ray cluster with as many logical CPUs as the largest worker count
(the workers wait on the server, not on the cores). Each run answers ``--questions`` demo questions with
no-retrieval (one LM call each) through ``run_eval(engine="ray")`` into a fresh run directory, with the call
cache off. A worker answers its batch one question after another, so the ideal throughput of N workers is
N / latency questions per second; the table gives the measured rate and its ratio to that ideal, after a warm-up
run that starts the actors' imports. The driver's overhead per question is the wall time of a run at latency 0
with one worker, minus what the worker itself spent answering (the records' seconds), per question: starting the
actors, shipping batches and records, and writing them.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ray

from ragate.eval.config import EvalConfig
from ragate.eval.records import read_records
from ragate.eval.run import run_eval

SERVER = Path(__file__).resolve().parent / "latency_server.py"


def server(latency: float) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "--latency", str(latency), "--port", "0"], stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stdout is not None
    return proc, proc.stdout.readline().decode().strip()


def timed(url: str, questions: int, workers: int, out: Path) -> tuple[float, float]:
    """Wall seconds of one Ray run, and the seconds its workers spent answering (sum over the records)."""
    config = EvalConfig(dataset="demo", methods=("no-retrieval",), engine="openai", model="latency-stub",
                        base_url=url, limit=questions)  # fmt: skip
    start = time.perf_counter()
    run_eval(config, out, progress=False, cache=False, engine="ray", ray_workers=workers)
    wall = time.perf_counter() - start
    return wall, sum(r["seconds"] for r in read_records(out / "questions.jsonl"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--questions", type=int, default=48)
    p.add_argument("--latency", type=float, default=0.2)
    p.add_argument("--workers", default="1,2,4")
    args = p.parse_args(argv)
    counts = [int(w) for w in args.workers.split(",")]
    ray.init(num_cpus=max(counts), include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    slow, slow_url = server(args.latency)
    fast, fast_url = server(0.0)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            timed(slow_url, 4, 1, Path(tmp) / "warm")
            print(f"{args.questions} demo questions, no-retrieval (1 call each), server latency {args.latency:g} s; "
                  "a local Ray cluster")  # fmt: skip
            print("| workers | seconds | questions/s | ideal (workers / latency) | ratio to ideal |")
            print("|---|---|---|---|---|")
            for n in counts:
                wall, _ = timed(slow_url, args.questions, n, Path(tmp) / f"w{n}")
                rate, ideal = args.questions / wall, n / args.latency
                print(f"| {n} | {wall:.1f} | {rate:.2f} | {ideal:.2f} | {rate / ideal:.2f} |")
            wall, answering = timed(fast_url, args.questions, 1, Path(tmp) / "overhead")
            print(f"driver overhead at latency 0, 1 worker: {(wall - answering) / args.questions * 1e3:.0f} ms per "
                  f"question ({wall:.1f} s wall, {answering:.1f} s answering, actor start included)")  # fmt: skip
    finally:
        for proc in (slow, fast):
            proc.terminate()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
