"""The query encoder called from many threads at once, as ``ragate eval --concurrency N`` calls it.

    .venv/bin/python benchmarks/encoder_concurrency.py [--threads 1,16] [--calls 320] [--texts 1]

all-MiniLM-L6-v2 (the demo index's encoder) embeds ``--calls`` short questions, ``--texts`` per call, from
``--threads`` threads, in four settings: torch's intra-op threads at their default (one per core) or 1, and the
calls free or one at a time under a lock. Each setting runs in a fresh process (torch's thread pool is set once).
Prints, per setting and thread count, the wall seconds, the process's CPU seconds, and CPU milliseconds per call.

Why it exists: with a latency server standing in for a GPU server, ``ragate eval --concurrency 16`` spends most
of its CPU around the calls (issue O, docs/evaluation.md "Concurrency"), and the encoder is the largest part of it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
import torch
from ragate.retrieval.encoders import load_encoder

torch_threads, locked, threads, calls, texts = json.loads(sys.argv[1])
if torch_threads:
    torch.set_num_threads(torch_threads)
encoder = load_encoder(None)
lock = threading.Lock()
questions = [f"who wrote the book number {i} of the series about the river?" for i in range(calls * texts)]
batches = [questions[i * texts:(i + 1) * texts] for i in range(calls)]
encoder.encode_queries(batches[0])  # warm

def one(batch):
    if locked:
        with lock:
            return encoder.encode_queries(batch)
    return encoder.encode_queries(batch)

start, cpu = time.perf_counter(), time.process_time()
with ThreadPoolExecutor(max_workers=threads) as pool:
    list(pool.map(one, batches))
print(json.dumps({"wall": time.perf_counter() - start, "cpu": time.process_time() - cpu,
                  "torch_threads": torch.get_num_threads()}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1,16", help="comma-separated thread counts (default 1,16)")
    ap.add_argument("--calls", type=int, default=320, help="encode calls per setting (default 320)")
    ap.add_argument("--texts", type=int, default=1, help="questions per call (default 1)")
    args = ap.parse_args()
    levels = [int(x) for x in args.threads.split(",")]
    print(f"{args.calls} calls x {args.texts} question(s), all-MiniLM-L6-v2 on the CPU\n")
    print("| torch threads | calls | threads | wall s | CPU s | CPU ms / call | wall ms / call |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for torch_threads in (0, 1):
        for locked in (False, True):
            for n in levels:
                if locked and n == 1:
                    continue  # the same as free
                setting = json.dumps([torch_threads, locked, n, args.calls, args.texts])
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, setting], check=False, capture_output=True, text=True
                )
                if out.returncode != 0:
                    print(out.stderr[-2000:], file=sys.stderr)
                    return 1
                r = json.loads(out.stdout.strip().splitlines()[-1])
                label = f"{r['torch_threads']}{' (default)' if not torch_threads else ''}"
                print(
                    f"| {label} | {'one at a time' if locked else 'free'} | {n} | {r['wall']:.2f} | "
                    f"{r['cpu']:.2f} | {1000 * r['cpu'] / args.calls:.1f} | {1000 * r['wall'] / args.calls:.1f} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
