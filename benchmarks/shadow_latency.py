"""What shadow answers cost the requests: ``ragate serve`` with ``--shadow 0`` and with ``--shadow SHARE``, the
same requests at the same seeded arrival times, latency as the client sees it.

    .venv/bin/python benchmarks/shadow_latency.py [--requests 40] [--gap 2.0 | --in-flight 2] [--shadow 1.0]
                                                  [--share 0.1] [--method targ-entropy] [--model NAME]
                                                  [--out benchmarks/results/shadow_latency.txt]

Each server (SmolLM2 on llama.cpp, the demo index, 127.0.0.1 only) gets one warm-up request, then ``--requests``
demo questions from one client, sent at seeded exponential gaps of mean ``--gap`` seconds (a request whose
predecessor is still running waits for it). With ``--in-flight N`` the traffic is steady instead: N
closed-loop clients, each sending its next question as soon as its last one returns, so a request always waits. It
prints p50 and p95 for both and their ratio, the shadow worker's counts from ``/healthz`` (done, queued, the queue's
age), the turns at the model (the share of its time shadow work took while requests were in flight, and the longest
wait of a request on a shadow step: :mod:`ragate.backends.turns`), shadow jobs done per hour of that traffic, and
the answers' HTTP statuses (no 504). ``--table FILE...`` prints earlier runs' files
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
import threading
import time
from pathlib import Path
from typing import Any

import httpx

QUESTIONS = Path(__file__).resolve().parents[1] / "src" / "ragate" / "data" / "demo" / "questions.jsonl"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_server(
    args: list[str], schedule: list[tuple[float, str]], log: Path, in_flight: int = 0
) -> dict[str, Any]:
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
        with httpx.Client(base_url=url, timeout=600) as http:
            http.post("/v1/answer", json={"question": "Who wrote Hamlet?"}).raise_for_status()
            time.sleep(5)  # the warm-up's shadow job, if any, is done
            latencies: list[float] = []
            statuses: list[int] = []
            lock = threading.Lock()
            start = time.perf_counter()

            def ask(question: str) -> None:
                t = time.perf_counter()
                r = http.post("/v1/answer", json={"question": question})
                with lock:
                    statuses.append(r.status_code)
                    if r.status_code == 200:
                        latencies.append(time.perf_counter() - t)

            if in_flight:  # closed loop: each client sends its next question when its last one returns
                todo = [q for _, q in schedule]

                def client() -> None:
                    while True:
                        with lock:
                            if not todo:
                                return
                            question = todo.pop(0)
                        ask(question)

                clients = [threading.Thread(target=client) for _ in range(in_flight)]
                for c in clients:
                    c.start()
                for c in clients:
                    c.join()
            else:
                for at, question in schedule:
                    wait = start + at - time.perf_counter()
                    if wait > 0:
                        time.sleep(wait)
                    ask(question)
            elapsed = time.perf_counter() - start
            learning = http.get("/healthz").json().get("learning", {})
    finally:
        proc.terminate()
        proc.wait(30)
    return {"latencies": latencies, "statuses": statuses, "elapsed": elapsed, "shadow": learning.get("shadow")}


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
    ap.add_argument("--share", type=float, default=0.1, help="serve --shadow-share (its default 0.1)")
    ap.add_argument(
        "--in-flight", type=int, default=0,
        help="steady traffic: this many closed-loop clients, each sending its next question when its last returns "
        "(0: one client at --gap arrivals)",
    )  # fmt: skip
    ap.add_argument("--method", default="targ-entropy")
    ap.add_argument("--model", default=None, help="serve --model (default SmolLM2-135M)")
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
    base = ["--method", args.method] + (["--model", args.model] if args.model else [])
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in (
            ("off", []),
            ("on", ["--shadow", str(args.shadow), "--shadow-share", str(args.share),
                    "--feedback-store", str(Path(tmp) / "fb.db")]),
        ):  # fmt: skip
            results[name] = run_server([*base, *extra], schedule, Path(tmp) / f"{name}.log", args.in_flight)
    off, on = results["off"]["latencies"], results["on"]["latencies"]
    traffic = (
        f"{args.in_flight} closed-loop clients (steady)" if args.in_flight
        else f"seeded exponential arrivals (mean gap {args.gap:g} s), one client"
    )  # fmt: skip
    worker = dict(results["on"]["shadow"] or {})
    turns = worker.pop("turns", None)
    elapsed = results["on"]["elapsed"]
    lines = [
        f"{args.requests} requests of {args.method}, {traffic}",
        f"shadow off: p50 {_pct(off, 50):.3f} s, p95 {_pct(off, 95):.3f} s",
        f"shadow {args.shadow:g} at share {args.share:g}: p50 {_pct(on, 50):.3f} s, p95 {_pct(on, 95):.3f} s",
        f"p50 on / off: {_pct(on, 50) / _pct(off, 50):.3f}; p95 on / off: {_pct(on, 95) / _pct(off, 95):.3f}",
        f"shadow worker: {json.dumps(worker)}",
        f"turns at the model: {json.dumps(turns)}",
        (f"shadow jobs done per hour of this traffic: {3600 * worker.get('done', 0) / elapsed:.0f} "
        f"({worker.get('done', 0)} in {elapsed:.0f} s)"),
        "statuses: off " + json.dumps(_count(results["off"]["statuses"]))
        + ", on " + json.dumps(_count(results["on"]["statuses"])),
    ]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out is not None:
        args.out.write_text(text)
    return 0


def _count(statuses: list[int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in statuses:
        out[str(s)] = out.get(str(s), 0) + 1
    return out


if __name__ == "__main__":
    raise SystemExit(main())
