"""CPU thread pools that share two cores without starving each other.

ragate runs two numeric runtimes in one process: llama.cpp (the LM) and torch (the encoder, the transformers
backend). torch's OpenMP threads spin after each parallel region waiting for more work (OpenMP's default "active"
wait policy); llama.cpp's threads then wait behind them at every layer. Measured on this 2-core machine with
another process busy on one core: 30 SmolLM2 tokens took 106-110 s right after the encoder had embedded 20
texts, against 0.35-0.5 s with ``OMP_WAIT_POLICY=PASSIVE`` (``benchmarks/threads.py``). So before either
runtime loads, ragate sets that policy, unless the environment already chooses one.
"""

from __future__ import annotations

import os

WAIT_POLICY = "OMP_WAIT_POLICY"


def passive_openmp() -> None:
    """Make OpenMP threads sleep, not spin, when idle (read once, when a runtime loads: call this before)."""
    os.environ.setdefault(WAIT_POLICY, "PASSIVE")
