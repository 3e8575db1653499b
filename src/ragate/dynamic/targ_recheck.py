"""TARG's re-check option (TARG section 3, "optional re-check every m tokens"): every ``every`` tokens, score
the last ``window`` tokens of the running output with TARG's mean entropy (Eq. 1); the first time it passes
``threshold``, retrieve once with the question and go on (nothing is cut)."""

from __future__ import annotations

import statistics

from ragate.dynamic.steps import Fire, step_entropies
from ragate.gates.targ import DEFAULT_PREFIX
from ragate.types import Generation

DEFAULT_THRESHOLD = 0.8  # = DEFAULT_TARG_TAU["targ-entropy"]; calibrate it to a budget like the gate's


class TargRecheckTrigger:
    name = "targ-recheck"

    def __init__(self, threshold: float, every: int, window: int = DEFAULT_PREFIX) -> None:
        self.threshold, self.every, self.window = threshold, every, window

    def check(self, block: Generation, done: bool) -> Fire | None:
        n = len(block.tokens)
        if done or n == 0 or n % self.every:
            return None
        score = statistics.fmean(step_entropies(block)[-self.window :])
        if score <= self.threshold:
            return None
        reason = f"targ-recheck: mean entropy of the last {min(n, self.window)} tokens {score:.3f} > {self.threshold}"
        return Fire(n, score, self.threshold, reason, (max(0, n - self.window), n), (0, n))
