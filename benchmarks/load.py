"""Load test of ``ragate serve`` on this machine: N concurrent clients, each sending M requests one after another.

    .venv/bin/python benchmarks/load.py [--clients 16] [--requests 20] [--method no-retrieval] [--max-tokens 16]
                                        [--endpoint answer|chat] [--workers 1] [--out FILE.json]
    .venv/bin/python benchmarks/load.py --url http://127.0.0.1:8000 [--pid PID] ...   # a server already running

Without ``--url`` it starts ``ragate serve`` on a free 127.0.0.1 port (the default model and the demo index unless
``--serve-args`` says otherwise, ``--max-concurrency`` = clients so that no request is turned away), sends one
warm-up request, runs the load, reads the server's peak resident memory (``VmHWM`` of the server and its worker
processes) and stops it. Only loopback addresses are accepted: this is a benchmark, not a load generator for
other people's machines. Questions are the demo set's, in turn.

With ``--overload 1,2,5`` it measures goodput under an *offered* load instead (open loop): it first times
``--probe`` answers, four at a time, to estimate the server's capacity (answers per second when it is kept busy; a
local model answers one request at a time), then, for each multiple m, sends requests arriving at m x capacity for
``--duration`` seconds, whether or not earlier ones have finished. A client whose request gets 429 waits its
``Retry-After`` and tries again while the request's deadline (the server's ``--timeout``, ``--deadline`` here)
allows. Per multiple it prints: arrivals, answers (200), admitted requests that ended in a 504 (the bar: none at
2x), requests refused until their deadline passed, goodput (answers per second, and as a share of capacity) and
p95 of the answered requests' latency from arrival. ``--ragate-src DIR`` runs the server from another checkout's
``src`` (e.g. a ``git worktree`` of an older commit, for a before/after comparison); ``--server-cpus 1`` pins it.

    .venv/bin/python benchmarks/load.py --overload 1,2,5 --deadline 5 --max-concurrency 32 --max-tokens 32 \
        --server-cpus 1 [--ragate-src /tmp/before/src]

It prints the count of each HTTP status (a 429 is retried after its ``Retry-After``, at most 20 times, and
counted), the 5xx count (the acceptance bar is 0), latency p50/p95/p99 as the client saw it (retries included),
requests per second over the run, the server-reported queueing time, and the peak memory. Exit status 1 if
any request got a 5xx or no answer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shlex
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

QUESTIONS = Path(__file__).resolve().parents[1] / "src" / "ragate" / "data" / "demo" / "questions.jsonl"
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
MAX_RETRIES = 20
PROBE_CLIENTS = 4  # --overload's capacity probe: answers in flight at once (within the server's default limit)


@dataclass
class Outcome:
    status: int  # final HTTP status; 0 = no answer (connection error, client timeout)
    seconds: float
    retries: int = 0
    queue_seconds: float | None = None
    error: str | None = None


@dataclass
class Report:
    clients: int
    requests_per_client: int
    endpoint: str
    method: str
    max_tokens: int
    statuses: dict[str, int] = field(default_factory=dict)
    server_errors: int = 0
    retried_429: int = 0
    latency_p50: float = 0.0
    latency_p95: float = 0.0
    latency_p99: float = 0.0
    latency_max: float = 0.0
    requests_per_second: float = 0.0
    wall_seconds: float = 0.0
    mean_queue_seconds: float | None = None
    server_peak_rss_mib: float | None = None
    first_errors: list[str] = field(default_factory=list)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def questions() -> list[str]:
    with QUESTIONS.open(encoding="utf-8") as f:
        return [json.loads(line)["question"] for line in f if line.strip()]


def body(endpoint: str, question: str, method: str, max_tokens: int) -> tuple[str, dict[str, Any]]:
    if endpoint == "chat":
        messages = [{"role": "user", "content": question}]
        return "/v1/chat/completions", {"model": method, "messages": messages, "max_tokens": max_tokens}
    return "/v1/answer", {"question": question, "method": method, "options": {"max_tokens": max_tokens}}


async def one(
    client: httpx.AsyncClient, path: str, payload: dict[str, Any], deadline: float | None = None
) -> Outcome:
    """One request; a 429 is retried after its Retry-After, at most MAX_RETRIES times, or with ``deadline``
    (seconds from the first try) while the deadline allows."""
    start, retries = time.perf_counter(), 0
    while True:
        try:
            r = await client.post(path, json=payload)
        except httpx.HTTPError as err:
            return Outcome(0, time.perf_counter() - start, retries, error=f"{type(err).__name__}: {err}")
        seconds = time.perf_counter() - start
        if r.status_code == 429:
            wait = float(r.headers.get("Retry-After", "1"))
            if retries < MAX_RETRIES if deadline is None else seconds + wait < deadline:
                retries += 1
                await asyncio.sleep(wait)
                continue
        if r.status_code >= 400:
            return Outcome(r.status_code, seconds, retries, error=r.text[:300])
        data = r.json()
        timings = data.get("timings") or (data.get("ragate") or {}).get("timings") or {}
        return Outcome(r.status_code, seconds, retries, timings.get("queue_seconds"))


async def load(url: str, args: argparse.Namespace, headers: dict[str, str]) -> tuple[list[Outcome], float]:
    qs = questions()
    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    timeout = httpx.Timeout(args.client_timeout)
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=timeout) as client:
        warm = await one(client, *body(args.endpoint, qs[0], args.method, args.max_tokens))
        if warm.status != 200:
            raise SystemExit(f"load.py: the warm-up request failed: HTTP {warm.status}: {warm.error}")

        async def client_loop(c: int) -> list[Outcome]:
            out = []
            for i in range(args.requests):
                question = qs[(c * args.requests + i) % len(qs)]
                out.append(await one(client, *body(args.endpoint, question, args.method, args.max_tokens)))
            return out

        start = time.perf_counter()
        results = await asyncio.gather(*(client_loop(c) for c in range(args.clients)))
        wall = time.perf_counter() - start
    return [o for r in results for o in r], wall


def peak_rss_mib(pid: int) -> float | None:
    """Peak resident memory (VmHWM) of ``pid`` plus its child processes (uvicorn workers), in MiB; Linux only."""
    pids = [pid]
    try:
        import psutil
    except ImportError:  # without psutil: the server process alone
        psutil = None
    if psutil is not None:
        with contextlib.suppress(psutil.Error):
            pids += [p.pid for p in psutil.Process(pid).children(recursive=True)]
    total_kib = 0
    for p in pids:
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                total_kib += int(line.split()[1])
    return total_kib / 1024 if total_kib else None


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # a closed-loop run admits every client; an overload run keeps the server's default limit unless told
    concurrency = args.max_concurrency or (None if args.overload else args.clients)
    cmd = [sys.executable, "-m", "ragate.cli.main", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--method", args.method, "--workers", str(args.workers), "--log-level", "warning",
           *shlex.split(args.serve_args)]  # fmt: skip
    if concurrency is not None:
        cmd += ["--max-concurrency", str(concurrency)]
    if args.deadline is not None:
        cmd += ["--timeout", f"{args.deadline:g}"]
    if args.server_cpus:
        cmd = ["taskset", "-c", args.server_cpus, *cmd]
    env = {**os.environ, "RAGATE_API_KEY": ""}
    if args.ragate_src is not None:
        env["PYTHONPATH"] = str(args.ragate_src.resolve())
    log = open(args.server_log, "wb")  # noqa: SIM115 - the server writes to it until it stops
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + args.start_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"load.py: ragate serve exited with {proc.returncode}; see {args.server_log}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.terminate()
    raise SystemExit(
        f"load.py: ragate serve did not become healthy in {args.start_timeout} s; see {args.server_log}"
    )


def summarise(outcomes: list[Outcome], wall: float, args: argparse.Namespace, rss: float | None) -> Report:
    ok = [o.seconds for o in outcomes if o.status == 200]
    statuses: dict[str, int] = {}
    for o in outcomes:
        statuses[str(o.status)] = statuses.get(str(o.status), 0) + 1
    queues = [o.queue_seconds for o in outcomes if o.queue_seconds is not None]
    return Report(
        clients=args.clients,
        requests_per_client=args.requests,
        endpoint=args.endpoint,
        method=args.method,
        max_tokens=args.max_tokens,
        statuses=dict(sorted(statuses.items())),
        server_errors=sum(1 for o in outcomes if o.status >= 500 or o.status == 0),
        retried_429=sum(o.retries for o in outcomes),
        latency_p50=percentile(ok, 50) if ok else 0.0,
        latency_p95=percentile(ok, 95) if ok else 0.0,
        latency_p99=percentile(ok, 99) if ok else 0.0,
        latency_max=max(ok, default=0.0),
        requests_per_second=len(outcomes) / wall if wall else 0.0,
        wall_seconds=wall,
        mean_queue_seconds=statistics.fmean(queues) if queues else None,
        server_peak_rss_mib=rss,
        first_errors=[f"HTTP {o.status}: {o.error}" for o in outcomes if o.error][:5],
    )


def render(rep: Report) -> str:
    rss = (
        f"{rep.server_peak_rss_mib:.0f} MiB"
        if rep.server_peak_rss_mib is not None
        else "unknown (give --pid)"
    )
    queue = f"{rep.mean_queue_seconds:.2f} s" if rep.mean_queue_seconds is not None else "-"
    lines = [
        (
            f"{rep.clients} clients x {rep.requests_per_client} requests, POST {rep.endpoint} "
            f"(method {rep.method}, max_tokens {rep.max_tokens})"
        ),
        (
            f"statuses: {', '.join(f'{k}: {v}' for k, v in rep.statuses.items())}; "
            f"5xx or no answer: {rep.server_errors}; 429s retried: {rep.retried_429}"
        ),
        (
            f"latency p50 {rep.latency_p50:.2f} s, p95 {rep.latency_p95:.2f} s, p99 {rep.latency_p99:.2f} s, "
            f"max {rep.latency_max:.2f} s (mean server queueing {queue})"
        ),
        f"throughput {rep.requests_per_second:.2f} requests/s over {rep.wall_seconds:.1f} s",
        f"server peak memory (VmHWM, all processes) {rss}",
    ]
    lines += [f"  error: {e}" for e in rep.first_errors]
    return "\n".join(lines)


@dataclass
class Offered:
    """One multiple of capacity under open-loop arrivals."""

    multiple: float
    rate: float  # arrivals per second
    arrivals: int
    answered: int  # 200
    timed_out: int  # admitted, then 504
    refused: int  # 429 until its deadline passed
    other: int  # any other status, or no answer
    goodput: float  # answers per second, from the first arrival to the last reply
    p95: float  # of the answered requests' latency from arrival
    first_errors: list[str] = field(default_factory=list)


async def overload(url: str, args: argparse.Namespace, headers: dict[str, str]) -> tuple[float, list[Offered]]:
    """Capacity from ``--probe`` sequential answers, then ``--duration`` seconds of arrivals at each multiple."""
    # each request its own question (a demo question and its number), so that none reuses an earlier prompt's
    # evaluated state and every multiple costs what the capacity probe measured
    qs = [f"{q} (request {i})" for i, q in enumerate(questions() * 50)]
    deadline = args.deadline if args.deadline is not None else 300.0
    timeout = httpx.Timeout(deadline + 30)
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=timeout) as client:
        async def probe(i: int) -> None:
            o = await one(client, *body(args.endpoint, qs[i % len(qs)], args.method, args.max_tokens), deadline)
            if o.status != 200:
                raise SystemExit(f"load.py: a capacity probe failed: HTTP {o.status}: {o.error}")

        await probe(0)  # warm-up
        start = time.perf_counter()
        for first in range(0, args.probe, PROBE_CLIENTS):  # a few at a time: the server's own overlap counts
            await asyncio.gather(*(probe(i) for i in range(first, min(args.probe, first + PROBE_CLIENTS))))
        capacity = args.probe / (time.perf_counter() - start)
        print(f"capacity: {capacity:.2f} answers/s ({args.probe} answers, {PROBE_CLIENTS} at a time)")
        rows, offset = [], 0
        for m in args.overload:
            rate = m * capacity
            n = max(1, round(rate * args.duration))
            start = time.perf_counter()

            async def arrive(
                i: int, start: float = start, rate: float = rate, offset: int = offset
            ) -> tuple[Outcome, float]:
                await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
                q = qs[(args.probe + 1 + offset + i) % len(qs)]
                o = await one(client, *body(args.endpoint, q, args.method, args.max_tokens), deadline)
                return o, time.perf_counter()

            done = await asyncio.gather(*(arrive(i) for i in range(n)))
            outcomes = [o for o, _ in done]
            ok = [o.seconds for o in outcomes if o.status == 200]
            span = max(t for _, t in done) - start
            counts = {s: sum(1 for o in outcomes if o.status == s) for s in (200, 504, 429)}
            rows.append(
                Offered(
                    multiple=m, rate=rate, arrivals=n, answered=counts[200], timed_out=counts[504],
                    refused=counts[429], other=n - sum(counts.values()), goodput=len(ok) / span,
                    p95=percentile(ok, 95) if ok else float("nan"),
                    first_errors=[f"HTTP {o.status}: {o.error}" for o in outcomes if o.error][:3],
                )
            )  # fmt: skip
            print(render_offered(rows[-1], capacity), flush=True)
            offset += n
            await asyncio.sleep(deadline)  # let the server drain before the next multiple
    return capacity, rows


def render_offered(row: Offered, capacity: float) -> str:
    return (
        f"{row.multiple:g}x capacity ({row.rate:.2f}/s): {row.arrivals} arrivals, {row.answered} answered, "
        f"{row.timed_out} admitted then timed out (504), {row.refused} refused until their deadline (429), "
        f"{row.other} other; goodput {row.goodput:.2f}/s ({row.goodput / capacity:.2f} of capacity), "
        f"p95 {row.p95:.2f} s"
    )


def multiples(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--overload takes multiples like 1,2,5; got {text!r}") from None
    if not values or any(not (0 < v <= 20) for v in values):
        raise argparse.ArgumentTypeError(f"--overload multiples must be in (0, 20]; got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clients", type=int, default=16, help="concurrent clients (default 16)")
    p.add_argument("--requests", type=int, default=20, help="requests per client (default 20)")
    p.add_argument("--method", default="no-retrieval", help="ragate method (default no-retrieval)")
    p.add_argument("--max-tokens", type=int, default=16, help="options.max_tokens per request (default 16)")
    p.add_argument("--endpoint", choices=("answer", "chat"), default="answer")
    p.add_argument("--url", default=None, help="a running server (loopback only); default: start one")
    p.add_argument("--pid", type=int, default=None, help="with --url: the server's pid, for its peak memory")
    p.add_argument("--api-key", default=os.environ.get("RAGATE_API_KEY") or None)
    p.add_argument("--workers", type=int, default=1, help="uvicorn workers of the started server (default 1)")
    p.add_argument("--serve-args", default="", help="more `ragate serve` arguments, e.g. '--index DIR'")
    p.add_argument("--server-log", default="/tmp/ragate-load-server.log")
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.add_argument(
        "--client-timeout", type=float, default=600.0, help="seconds a client waits for one answer"
    )
    p.add_argument("--out", type=Path, default=None, help="also write the report as JSON here")
    p.add_argument("--max-concurrency", type=int, default=None, help="of the started server (default: clients)")
    p.add_argument("--overload", type=multiples, default=None, help="open-loop arrivals at these multiples of "
                   "the measured capacity, e.g. 1,2,5 (goodput and p95; see the module's docstring)")  # fmt: skip
    p.add_argument("--duration", type=float, default=30.0, help="with --overload: seconds of arrivals per multiple")
    p.add_argument("--probe", type=int, default=40, help="with --overload: answers timed for the capacity")
    p.add_argument("--deadline", type=float, default=None, help="the started server's --timeout (the requests' "
                   "deadline; with --url give the running server's)")  # fmt: skip
    p.add_argument("--ragate-src", type=Path, default=None, help="run the started server from this checkout's src")
    p.add_argument("--server-cpus", default=None, help="pin the started server to these CPUs (taskset -c)")
    args = p.parse_args(argv)
    if args.clients < 1 or args.requests < 1 or args.clients * args.requests > 10_000:
        p.error("need 1 <= clients, 1 <= requests and clients x requests <= 10000")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    proc = None
    if args.url:
        if urlparse(args.url).hostname not in LOOPBACK:
            p.error(f"--url must be a loopback address ({', '.join(LOOPBACK)}), got {args.url}")
        url, pid = args.url.rstrip("/"), args.pid
    else:
        proc, url = start_server(args)
        pid = proc.pid
    try:
        if args.overload:
            capacity, rows = asyncio.run(overload(url, args, headers))
            if args.out:
                args.out.write_text(json.dumps({"capacity": capacity, "rows": [asdict(r) for r in rows]}) + "\n")
            return 1 if any(r.other for r in rows) else 0
        outcomes, wall = asyncio.run(load(url, args, headers))
        rss = peak_rss_mib(pid) if pid is not None else None
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    report = summarise(outcomes, wall, args, rss)
    print(render(report))
    if args.out:
        args.out.write_text(json.dumps(asdict(report), indent=2) + "\n")
    return 1 if report.server_errors else 0


if __name__ == "__main__":
    sys.exit(main())
