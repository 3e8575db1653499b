"""What shadow answers cost the requests: ``ragate serve`` with ``--shadow 0`` and with ``--shadow SHARE``, the
same requests at the same seeded arrival times, latency as the client sees it.

    .venv/bin/python benchmarks/shadow_latency.py [--requests 40] [--gap 2.0] [--shadow 1.0] [--method targ-entropy]
                                                  [--out benchmarks/results/shadow_latency.txt]

Each server (SmolLM2 on llama.cpp, the demo index, 127.0.0.1 only) gets one warm-up request, then ``--requests``
demo questions from one client, sent at seeded exponential gaps of mean ``--gap`` seconds (a request whose
predecessor is still running waits for it). It prints p50 and p95 for both and their ratio (the acceptance bar:
p50 with shadow on within 10% of off), and the shadow worker's counts from ``/healthz`` (done, preempted: how often
a request took the model back from a shadow job at a stage boundary). ``--table FILE...`` prints earlier runs' files
as one markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

QUESTIONS = Path(__file__).resolve().parents[1] / "src" / "ragate" / "data" / "demo" / "questions.jsonl"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_server(args: list[str], schedule: list[tuple[float, str]], log: Path) -> dict[str, Any]:
    port = _port()
    cmd = [
        sys.executable,
        "-m",
        "ragate.cli.main",
        "serve",
        "--port",
        str(port),
        "--log-level",
        "warning",
        *args,
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "RAGATE_API_KEY": ""}
        )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(1200):
            try:
                httpx.get(f"{url}/healthz", timeout=3)
                break
            except httpx.TransportError:
                if proc.poll() is not None:
                    raise SystemExit(log.read_text()[-2000:]) from None
                time.sleep(0.25)
        with httpx.Client(base_url=url, timeout=300) as http:
            http.post("/v1/answer", json={"question": "Who wrote Hamlet?"}).raise_for_status()
            time.sleep(5)  # the warm-up's shadow job, if any, is done
            latencies = []
            start = time.perf_counter()
            for at, question in schedule:
                wait = start + at - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                t = time.perf_counter()
                http.post("/v1/answer", json={"question": question}).raise_for_status()
                latencies.append(time.perf_counter() - t)
            learning = http.get("/healthz").json().get("learning", {})
    finally:
        proc.terminate()
        proc.wait(30)
    return {"latencies": latencies, "shadow": learning.get("shadow")}


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def table(paths: list[Path]) -> str:
    """A markdown table of earlier runs' output files (docs/service.md's table is this command's output)."""
    rows = [
        "| mean gap between requests | p50 on / off | p95 on / off | shadow jobs done / sampled | preempted |",
        "|---|---|---|---|---|",
    ]
    for path in paths:
        lines = path.read_text().splitlines()
        gap = re.search(r"mean gap ([0-9.]+) s", lines[0])
        ratios = re.search(r"p50 on / off: ([0-9.]+); p95 on / off: ([0-9.]+)", lines[3])
        worker = json.loads(lines[4].split(":", 1)[1])
        if gap is None or ratios is None:
            raise SystemExit(f"{path} is not benchmarks/shadow_latency.py output")
        rows.append(
            f"| {gap[1]} s | {ratios[1]} | {ratios[2]} | {worker['done']} / {worker['sampled']} | "
            f"{worker['preempted']} |"
        )
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", type=Path, nargs="+", help="only print a table of these earlier --out files")
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument(
        "--gap", type=float, default=2.0, help="mean seconds between arrivals (seeded exponential)"
    )
    ap.add_argument("--shadow", type=float, default=1.0)
    ap.add_argument("--method", default="targ-entropy")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if args.table:
        print(table(args.table), end="")
        return 0
    questions = [json.loads(line)["question"] for line in QUESTIONS.read_text().splitlines() if line.strip()]
    rng = random.Random(args.seed)
    at, schedule = 0.0, []
    for i in range(args.requests):
        schedule.append((at, questions[i % len(questions)]))
        at += rng.expovariate(1 / args.gap)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in (
            ("off", []),
            ("on", ["--shadow", str(args.shadow), "--feedback-store", str(Path(tmp) / "fb.db")]),
        ):
            results[name] = run_server(["--method", args.method, *extra], schedule, Path(tmp) / f"{name}.log")
    off, on = results["off"]["latencies"], results["on"]["latencies"]
    lines = [
        f"{args.requests} requests of {args.method}, seeded exponential arrivals (mean gap {args.gap:g} s), one client",
        f"shadow off: p50 {_pct(off, 50):.3f} s, p95 {_pct(off, 95):.3f} s",
        f"shadow {args.shadow:g}: p50 {_pct(on, 50):.3f} s, p95 {_pct(on, 95):.3f} s",
        f"p50 on / off: {_pct(on, 50) / _pct(off, 50):.3f}; p95 on / off: {_pct(on, 95) / _pct(off, 95):.3f}",
        f"shadow worker: {json.dumps(results['on']['shadow'])}",
    ]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
