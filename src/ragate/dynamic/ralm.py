"""In-Context RALM (Ram et al., TACL 2023): retrieve with the question first, then every ``every`` generated
tokens with the tokens just written as the query (the retrieval stride s; DRAGIN's FL-RAG baseline). Nothing
is cut."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ragate.methods.triggers import Fire, Trigger
from ragate.types import Generation

if TYPE_CHECKING:
    from ragate.backends.base import Backend
    from ragate.methods.spec import DynamicSpec

DEFAULT_EVERY = 16


class RalmTrigger(Trigger):
    name = "ralm"
    like = "ralm"

    def __init__(self, every: int) -> None:
        if every < 1:
            raise ValueError(f"RALM's stride must be >= 1 token, got {every}")
        self.every = every

    @classmethod
    def build(cls, spec: DynamicSpec, lm: Backend, stop_words: frozenset[str]) -> RalmTrigger:
        return cls(spec.every)

    def check(self, block: Generation, done: bool) -> Fire | None:
        n = len(block.tokens)
        if done or n < self.every:
            return None
        return Fire(
            n, float(n), float(self.every), f"ralm: {n} tokens since the last retrieval", (0, n), (0, n)
        )
