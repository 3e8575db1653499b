"""TARG's re-check option (TARG section 3, "optional re-check every m tokens"): every ``every`` tokens, score
the last ``window`` tokens of the running output with TARG's mean entropy (Eq. 1); the first time it passes
``threshold``, retrieve once with the question and go on (nothing is cut)."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from ragate.dynamic.steps import step_entropies
from ragate.gates.base import Need
from ragate.gates.targ import DEFAULT_PREFIX
from ragate.methods.triggers import Fire, Trigger
from ragate.types import Generation

if TYPE_CHECKING:
    from ragate.backends.base import Backend
    from ragate.methods.spec import DynamicSpec

DEFAULT_THRESHOLD = 0.8  # = the targ-entropy gate's default_tau; calibrate it to a budget like the gate's


class TargRecheckTrigger(Trigger):
    name = "targ-recheck"
    need = Need(token_logprobs=True, top_k=1, entropy=True)
    default_threshold = DEFAULT_THRESHOLD
    like = "targ-recheck"

    def __init__(self, threshold: float, every: int, window: int = DEFAULT_PREFIX) -> None:
        self.threshold, self.every, self.window = threshold, every, window

    @classmethod
    def build(cls, spec: DynamicSpec, lm: Backend, stop_words: frozenset[str]) -> TargRecheckTrigger:
        threshold = cls.threshold_for(spec)
        assert threshold is not None
        return cls(threshold, spec.every)

    def check(self, block: Generation, done: bool) -> Fire | None:
        n = len(block.tokens)
        if done or n == 0 or n % self.every:
            return None
        score = statistics.fmean(step_entropies(block)[-self.window :])
        if score <= self.threshold:
            return None
        reason = f"targ-recheck: mean entropy of the last {min(n, self.window)} tokens {score:.3f} > {self.threshold}"
        return Fire(n, score, self.threshold, reason, (max(0, n - self.window), n), (0, n))
