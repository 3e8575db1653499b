"""FLARE (Jiang et al., EMNLP 2023), the direct form: write the next sentence ahead; if any of its tokens has
probability below ``threshold``, drop the sentence, retrieve with it masked (tokens below ``mask_below``
removed, :func:`ragate.dynamic.query.masked_query`) and write it again with the passages."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ragate.dynamic.steps import new_sentence
from ragate.methods.triggers import Fire, Trigger
from ragate.types import Generation

if TYPE_CHECKING:
    from ragate.backends.base import Backend
    from ragate.methods.spec import DynamicSpec

DEFAULT_THRESHOLD = 0.4


class FlareTrigger(Trigger):
    name = "flare"
    default_threshold = DEFAULT_THRESHOLD

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold

    @classmethod
    def build(cls, spec: DynamicSpec, lm: Backend, stop_words: frozenset[str]) -> FlareTrigger:
        threshold = cls.threshold_for(spec)
        assert threshold is not None
        return cls(threshold)

    def check(self, block: Generation, done: bool) -> Fire | None:
        sentence = new_sentence(block, done)
        if sentence is None:
            return None
        start, end = sentence
        probs = [math.exp(lp) for lp in block.logprobs[start:end]]
        lowest = min(probs, default=1.0)
        if lowest >= self.threshold:
            return None
        at = start + probs.index(lowest)
        reason = f"flare: token {block.tokens[at]!r} has probability {lowest:.3f} < {self.threshold}"
        return Fire(start, lowest, self.threshold, reason, sentence, sentence)
