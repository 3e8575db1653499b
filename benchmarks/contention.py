"""`ragate ask --method dtr` and a Pipeline draft on an idle CPU and beside busy processes, by thread setting.

    taskset -c 0 .venv/bin/python benchmarks/contention.py [--cpus 0] [--busy 2] [--rounds 2]

Everything (the measured commands and the busy loops) runs on ``--cpus`` (default: the CPUs this process may use),
so on a shared machine the benchmark keeps to the cores it was given. Two measurements, each idle and beside
``--busy`` processes that spin on those CPUs:

- ``ask``: the wall time of `ragate ask "Who wrote Hamlet?" --method dtr --quiet` (the issue's command: start-up,
  model and index load, draft, pseudo-context, retrieval and answer), with the thread counts ragate chose before
  issue 51 (``--threads U --batch-threads C``: U = the CPUs in the affinity, C = ``os.cpu_count()``, since
  llama-cpp-python's own default for prompt threads ignores the affinity) and with today's default (``auto``);
- ``draft``: in one process per setting, a Pipeline's TARG draft (``Pipeline.decide``, 20 tokens) timed over
  ``--drafts`` questions, with 1 thread, 2 threads and ``auto``.

Prints the medians and, per setting, the ratio loaded / idle (the issue's goal: at most 3x). On a machine where
the affinity holds one core, libgomp sees more threads than CPUs and spins only briefly at its barriers, so the
2-core collapse the issue measured (two threads spinning while a busy process holds the other core) cannot show;
run with ``--cpus 0,1`` on a machine whose two cores may both be used to see it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

QUESTION = "Who wrote Hamlet?"
DRAFTS = (
    "who got the first nobel prize in physics",
    "where do the greasers live in the outsiders",
    "how many episodes are there in dragon ball z",
    "who is the owner of reading football club",
)

CHILD = r"""
import json, sys, time
from ragate.pipeline import Pipeline
threads = None if sys.argv[1] == "auto" else int(sys.argv[1])
with Pipeline("targ-margin", threads=threads, batch_threads=threads) as rag:
    rag.decide("warm up")
    seconds = []
    for q in sys.argv[2:]:
        start = time.perf_counter()
        rag.decide(q)
        seconds.append(time.perf_counter() - start)
    print(json.dumps({"seconds": seconds, "threads": rag.lm.inner.thread_counts}))
"""


def pinned(cpus: str) -> list[str]:
    return ["taskset", "-c", cpus]


@contextmanager
def busy(n: int, cpus: str) -> Iterator[None]:
    """``n`` processes spinning on ``cpus``, stopped (by their ids) on the way out."""
    procs = [subprocess.Popen([*pinned(cpus), sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        time.sleep(1.0)  # let the scheduler and the load figures see them
        yield
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


def ask(cpus: str, threads: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(
        [*pinned(cpus), sys.executable, "-m", "ragate.cli.main", "ask", QUESTION, "--method", "dtr", "--quiet",
         *threads],
        capture_output=True, text=True, check=True, timeout=3600,
    )  # fmt: skip
    return time.perf_counter() - start


def drafts(cpus: str, threads: str, n: int) -> tuple[float, dict[str, object]]:
    out = subprocess.run(
        [*pinned(cpus), sys.executable, "-c", CHILD, threads, *DRAFTS[:n]],
        capture_output=True, text=True, check=True, timeout=3600,
    )  # fmt: skip
    data = json.loads(out.stdout.strip().splitlines()[-1])
    return statistics.median(data["seconds"]), data["threads"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpus", default=",".join(map(str, sorted(os.sched_getaffinity(0)))))
    p.add_argument("--busy", type=int, default=2, help="busy processes beside the measured one (default 2)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--drafts", type=int, default=4, help="draft questions per draft measurement (at most 4)")
    p.add_argument("--skip-ask", action="store_true", help="only the draft measurement")
    args = p.parse_args()
    usable = len(args.cpus.split(","))
    before = ["--threads", str(usable), "--batch-threads", str(os.cpu_count() or 1)]
    arms = {f"before (threads {usable}, batch {os.cpu_count()})": before, "after (auto)": []}
    settings = ("1", "2", "auto")
    ask_s: dict[tuple[str, bool], list[float]] = {}
    draft_s: dict[tuple[str, bool], list[float]] = {}
    chosen: dict[tuple[str, bool], object] = {}
    for _ in range(args.rounds):
        for loaded in (False, True):
            with busy(args.busy if loaded else 0, args.cpus):
                if not args.skip_ask:
                    for name, flags in arms.items():
                        ask_s.setdefault((name, loaded), []).append(ask(args.cpus, flags))
                for setting in settings:
                    seconds, counts = drafts(args.cpus, setting, args.drafts)
                    draft_s.setdefault((setting, loaded), []).append(seconds)
                    chosen[(setting, loaded)] = counts
    where = f"CPUs {args.cpus} (os.cpu_count() = {os.cpu_count()}); loaded = {args.busy} busy processes on them"
    print(f"{where}; median of {args.rounds} rounds")
    if not args.skip_ask:
        print(f"\n`ragate ask {QUESTION!r} --method dtr`, wall seconds")
        print("| thread setting | idle | loaded | loaded / idle |")
        print("|---|---|---|---|")
        for name in arms:
            idle, load = statistics.median(ask_s[(name, False)]), statistics.median(ask_s[(name, True)])
            print(f"| {name} | {idle:.1f} | {load:.1f} | {load / idle:.2f}x |")
    print(f"\nPipeline TARG draft (20 tokens), median seconds per draft over {args.drafts} questions")
    print("| threads | idle | loaded | loaded / idle | counts auto chose (idle; loaded) |")
    print("|---|---|---|---|---|")
    for setting in settings:
        idle, load = statistics.median(draft_s[(setting, False)]), statistics.median(draft_s[(setting, True)])
        note = f"{chosen[(setting, False)]}; {chosen[(setting, True)]}" if setting == "auto" else ""
        print(f"| {setting} | {idle:.3f} | {load:.3f} | {load / idle:.2f}x | {note} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
