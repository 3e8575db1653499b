"""FLARE (Jiang et al., EMNLP 2023), the direct form: write the next sentence ahead; if any of its tokens has
probability below ``threshold``, drop the sentence, retrieve with it masked (tokens below ``mask_below``
removed, :func:`ragate.dynamic.query.masked_query`) and write it again with the passages."""

from __future__ import annotations

import math

from ragate.dynamic.steps import Fire, new_sentence
from ragate.types import Generation

DEFAULT_THRESHOLD = 0.4


class FlareTrigger:
    name = "flare"

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold

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
