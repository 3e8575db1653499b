"""Concurrency: questions per hour of `ragate eval --backend openai --concurrency N` as N grows.

    .venv/bin/python benchmarks/concurrency.py [--server latency|llama] [--levels 1,4,16,64] [--questions 64] \
        [--latency 0.2] [--servers 1] [--dataset demo] [--methods no-retrieval,targ-margin,pairs,dtr] \
        [--model smollm2-135m] [--index DIR] [--out DIR]

Each level is one real ``ragate eval`` process (``--no-call-cache``: every LM call is paid; ``--quiet``; its own
fresh run directory) over the first ``--questions`` questions, against OpenAI-compatible servers this script
starts and stops:

- ``--server latency`` (the default): ``benchmarks/latency_server.py``, which answers every call after
  ``--latency`` seconds with unlimited slots, like a GPU server with many. What is measured is ragate's own
  scheduling: how many calls it really keeps in flight, and what its retrieval and gates cost around them.
  Target: at N=16 the speed-up over N=1 reaches at least 0.8 of the ideal one.
- ``--server llama``: llama-cpp-python's server with ``--model`` (a ragate model name, default smollm2-135m) on
  this machine's CPU. It answers one request at a time, so one server's ideal speed-up is 1 whatever N is.

``--servers K`` starts K servers and passes each as its own ``--base-url`` (a fleet); ragate spreads the calls over
them. The table gives, per level, the process's wall seconds and the seconds inside the run (``results.json``
``finished - started``: without the interpreter start-up and imports, which every level pays once), questions
per hour and the speed-up over the first level from the latter; the ideal speed-up N; and efficiency = speed-up /
min(N, limit), where the limit is the (question, method) jobs of the run and, for llama, one slot per server.
``answering s`` is the time from the first answer written to the last, scaled to all of them (the run's
start-up, the same at every level, left out: model and index loading, the capability probe, the warm-up), and its
speed-up and efficiency beside it. The last column compares each level's answers with the first level's per (question, method): prediction,
retrieval decision, documents read and gate score; differences are named below the table. Exit status 1 when
answers differ or the latency server misses the target. Use ``--out DIR`` to keep the runs and server logs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from ragate.eval.records import latest, read_records
from ragate.models import resolve_model

HERE = Path(__file__).resolve().parent
METHODS = "no-retrieval,targ-margin,pairs,dtr"
COMPARED = ("prediction", "retrieved", "doc_ids", "gate_score", "error")
TARGET = (16, 0.8)  # (level, least efficiency) the latency server must reach


def start_latency_server(latency: float, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``benchmarks/latency_server.py`` on a free loopback port; returns the process and its base URL."""
    cmd = [sys.executable, str(HERE / "latency_server.py"), "--latency", str(latency)]
    with log.open("wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err)
    assert proc.stdout is not None
    url = proc.stdout.readline().decode().strip()  # its first line, once it listens
    if not url.startswith("http://"):
        stop(proc)
        raise RuntimeError(
            f"the latency server did not start: {url!r} {log.read_text(errors='replace')[-2000:]}"
        )
    return proc, url


# token logprobs on, as tests/test_openai_backend.py starts it
LLAMA_FLAGS = ("--n_ctx", "2048", "--logits_all", "true")


def start_llama_server(
    gguf: Path, log: Path, flags: tuple[str, ...] = LLAMA_FLAGS, wait: float = 120
) -> tuple[subprocess.Popen[bytes], str]:
    """llama-cpp-python's server with ``gguf`` and ``flags`` on a free loopback port, once it answers ``/models``
    (within ``wait`` seconds); returns the process and its base URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
           "--port", str(port), *flags]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{url}/models", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    stop(proc)
    raise RuntimeError(
        f"llama_cpp.server did not answer {url}/models: {log.read_text(errors='replace')[-3000:]}"
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def run_level(n: int, urls: list[str], args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """One whole ``ragate eval --concurrency n`` run into ``out/c{n}``; its wall and in-run seconds."""
    run_dir = out / f"c{n}"
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [
        str(Path(sys.executable).with_name("ragate")), "eval", "--backend", "openai",
        *(a for url in urls for a in ("--base-url", url)), "--dataset", args.dataset, "--methods", args.methods,
        "--limit", str(args.questions), "--concurrency", str(n), "--no-call-cache", "--quiet", "--out", str(run_dir),
        *(["--index", str(args.index)] if args.index else []),
    ]  # fmt: skip
    print(f"[N={n}] {' '.join(cmd)}", file=sys.stderr, flush=True)
    log = out / f"c{n}.log"
    start = time.perf_counter()
    seen, first, last = 0, None, None  # answers written, when the first and the last appeared
    with log.open("wb") as f:
        done = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        while done.poll() is None:
            lines = _lines(run_dir / "questions.jsonl")
            if lines > seen:
                seen, last = lines, time.perf_counter()
                first = first or last
            time.sleep(0.01)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(
            f"ragate eval failed (exit {done.returncode}): {log.read_text(errors='replace')[-3000:]}"
        )
    results = json.loads((run_dir / "results.json").read_text())
    used = results["config"].get("base_url")
    if len(urls) > 1 and not isinstance(used, list):
        print(
            f"[N={n}] warning: ragate ran on {used!r} alone, not on all {len(urls)} servers", file=sys.stderr
        )
    answering = (last - first) * seen / max(1, seen - 1) if first is not None and last is not None else None
    return {
        "wall": wall,
        "seconds": results["finished"] - results["started"],
        "answering": answering,  # first to last answer, scaled to all answers: no start-up
        "run_dir": run_dir,
    }


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


def answers(run_dir: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (question, method), what must not depend on the concurrency."""
    return {
        (r["id"], r["method"]): {k: r.get(k) for k in COMPARED}
        for r in latest(read_records(run_dir / "questions.jsonl"))
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", choices=("latency", "llama"), default="latency")
    p.add_argument("--levels", default=None, help="concurrency levels (default 1,4,16,64; llama 1,2,4)")
    p.add_argument("--questions", type=int, default=64)
    p.add_argument("--latency", type=float, default=0.2, help="seconds per call of the latency server")
    p.add_argument("--servers", type=int, default=1, help="servers started, each passed as a --base-url")
    p.add_argument("--dataset", default="demo")
    p.add_argument("--methods", default=METHODS)
    p.add_argument("--model", default="smollm2-135m", help="with --server llama: a ragate model name or GGUF")
    p.add_argument("--index", type=Path, default=None, help="index directory (default: the demo index)")
    p.add_argument(
        "--out", type=Path, default=None, help="keep runs and logs here (default: a temporary folder)"
    )
    args = p.parse_args(argv)
    levels = sorted(
        {int(x) for x in (args.levels or ("1,2,4" if args.server == "llama" else "1,4,16,64")).split(",")}
    )
    if levels[0] < 1 or args.servers < 1 or args.questions < 1:
        p.error("levels, --servers and --questions must be >= 1")
    out = args.out or Path(tempfile.mkdtemp(prefix="ragate-concurrency-"))
    out.mkdir(parents=True, exist_ok=True)
    gguf = resolve_model(args.model) if args.server == "llama" else None
    procs: list[subprocess.Popen[bytes]] = []
    try:
        urls = []
        for k in range(args.servers):
            log = out / f"server{k}.log"
            proc, url = (
                start_llama_server(gguf, log) if gguf is not None else start_latency_server(args.latency, log)
            )
            procs.append(proc)
            urls.append(url)
        runs = {n: run_level(n, urls, args, out) for n in levels}
    finally:
        for proc in procs:
            stop(proc)

    reference = answers(runs[levels[0]]["run_dir"])
    methods = [m for m in args.methods.split(",") if m]
    questions = len({key[0] for key in reference})
    jobs = questions * len(methods)
    limit = min(jobs, args.servers) if args.server == "llama" else jobs
    where = (
        f"latency server, {args.latency:g} s a call"
        if args.server == "latency"
        else f"llama.cpp {args.model}"
    )
    print(f"\n{questions} {args.dataset} questions x {len(methods)} methods ({args.methods}), {args.servers} x "
          f"{where}; limit {limit} calls in flight ({out})\n")  # fmt: skip
    print(
        f"| N | wall s | run s | questions/hour | speed-up | ideal | efficiency | answering s | speed-up "
        f"| efficiency | answers as N={levels[0]} |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    base, efficiency, diffs = runs[levels[0]]["seconds"], {}, {}
    steady, steady_eff = runs[levels[0]]["answering"], {}
    for n, run in runs.items():
        speedup = base / run["seconds"]
        ideal = min(n, limit) / min(levels[0], limit)
        efficiency[n] = speedup / ideal
        answering = run["answering"]
        steady_up = steady / answering if steady and answering else float("nan")
        steady_eff[n] = steady_up / ideal
        mine = answers(run["run_dir"])
        diffs[n] = [(key, reference.get(key), mine.get(key)) for key in sorted(reference.keys() | mine.keys())
                    if reference.get(key) != mine.get(key)]  # fmt: skip
        same = "identical" if not diffs[n] else f"{len(diffs[n])} differ"
        qph = questions / (run["seconds"] / 3600)
        print(f"| {n} | {run['wall']:.1f} | {run['seconds']:.1f} | {qph:.0f} | {speedup:.2f}x | {n / levels[0]:g}x | "
              f"{efficiency[n]:.2f} | {answering or float('nan'):.1f} | {steady_up:.2f}x | {steady_eff[n]:.2f} "
              f"| {same} |")  # fmt: skip
    for n, rows in diffs.items():
        for key, was, now in rows:
            changed = {k: ((was or {}).get(k), (now or {}).get(k)) for k in COMPARED}
            print(f"  N={n} differs on {key}: " + ", ".join(
                f"{k} {a!r} -> {b!r}" for k, (a, b) in changed.items() if a != b))  # fmt: skip
    missed = False
    if args.server == "latency" and TARGET[0] in efficiency:
        missed = efficiency[TARGET[0]] < TARGET[1]
        print(f"\ntarget: N={TARGET[0]} efficiency {efficiency[TARGET[0]]:.2f} >= {TARGET[1]} (whole run): "
              f"{'missed' if missed else 'met'}; answering alone (the run's start-up left out, as a long run "
              f"amortises it): {steady_eff[TARGET[0]]:.2f}")  # fmt: skip
    errors = sum(1 for run in runs.values() for a in answers(run["run_dir"]).values() if a["error"])
    if errors:
        print(f"\n{errors} answers are errors: see the questions.jsonl files under {out}")
    return 1 if missed or any(diffs.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
