"""llama.cpp right after the torch encoder, with OpenMP's wait policy passive (sleeping) or active (spinning).

    .venv/bin/python benchmarks/threads.py [--tokens 30] [--rounds 3] [--busy]

Each policy runs in a fresh process (OpenMP reads the policy once, when it loads): load all-MiniLM-L6-v2 and
SmolLM2 on llama.cpp (which runs its layers on the system's libgomp), then ``--rounds`` times: embed 20 texts,
generate ``--tokens`` tokens, and time the generation. ``--busy`` keeps one core busy with another process
meanwhile. Prints seconds per round for each policy and their ratio.

Why it exists: on this 2-core machine, with another process running llama.cpp and the encoder at the same time,
a process that also runs both sometimes slowed down about 100x (30 SmolLM2 tokens in 87-110 s instead of
0.3-1 s), and ``OMP_WAIT_POLICY=PASSIVE`` avoided it in every run tried. But PASSIVE makes llama.cpp's own
threads sleep at every barrier: on an idle machine generation falls from ~135 to ~36 tokens/s (this script: 0.22
against 0.87 s). ragate therefore leaves the policy to the operator; results in benchmarks/results/threads.txt.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time

CHILD = r"""
import json, os, sys, time
from ragate.backends import load_backend
from ragate.retrieval.encoders import load_encoder
from ragate.types import GenerationRequest, Message
tokens, rounds = int(sys.argv[1]), int(sys.argv[2])
request = [GenerationRequest((Message("user", "Write a passage about kettles."),), max_tokens=tokens)]
encoder, lm = load_encoder(), load_backend(None, "llama.cpp")
times = []
for _ in range(rounds):
    encoder.encode_documents(["a text to embed, as a query or a retrieved passage"] * 20)
    start = time.perf_counter()
    lm.generate(request)
    times.append(time.perf_counter() - start)
print(json.dumps({"policy": os.environ.get("OMP_WAIT_POLICY"), "seconds": times}))
"""


def _spin(stop: float) -> None:
    while time.time() < stop:
        pass


def run(policy: str, tokens: int, rounds: int) -> list[float]:
    env = dict(os.environ, OMP_WAIT_POLICY=policy)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(tokens), str(rounds)],
        env=env, capture_output=True, text=True, check=True, timeout=3600,
    )  # fmt: skip
    return list(json.loads(proc.stdout.strip().splitlines()[-1])["seconds"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--busy", action="store_true", help="keep one core busy with another process")
    args = p.parse_args()
    spinner = None
    if args.busy:
        spinner = multiprocessing.Process(target=_spin, args=(time.time() + 7200,), daemon=True)
        spinner.start()
    try:
        results = {policy: run(policy, args.tokens, args.rounds) for policy in ("PASSIVE", "ACTIVE")}
    finally:
        if spinner is not None:
            spinner.terminate()
    print(f"{args.tokens} tokens after each embedding of 20 texts; {'one core busy' if args.busy else 'idle machine'}")
    print("| OMP_WAIT_POLICY | seconds per round | median |")
    print("|---|---|---|")
    for policy, seconds in results.items():
        median = sorted(seconds)[len(seconds) // 2]
        print(f"| {policy} | {', '.join(f'{s:.2f}' for s in seconds)} | {median:.2f} |")
    passive, active = (sorted(results[p])[len(results[p]) // 2] for p in ("PASSIVE", "ACTIVE"))
    print(f"ACTIVE / PASSIVE: {active / passive:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
