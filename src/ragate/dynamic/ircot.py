"""IRCoT (Trivedi et al., ACL 2023): retrieve with the question first, then after every chain-of-thought
sentence with that sentence as the query, keeping every passage read (up to a cap); nothing is cut. The
sentence that gives the answer ("... the answer is ...") ends the chain and does not retrieve."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ragate.dynamic.steps import new_sentence
from ragate.methods.triggers import Fire, Trigger
from ragate.types import Generation

if TYPE_CHECKING:
    from ragate.backends.base import Backend
    from ragate.methods.spec import DynamicSpec


class IrcotTrigger(Trigger):
    name = "ircot"
    like = "ircot"

    @classmethod
    def build(cls, spec: DynamicSpec, lm: Backend, stop_words: frozenset[str]) -> IrcotTrigger:
        return cls()

    def check(self, block: Generation, done: bool) -> Fire | None:
        sentence = None if done else new_sentence(block, done)
        if sentence is None:
            return None
        start, end = sentence
        written = block.text[block.offsets[start][0] : block.offsets[end - 1][1]]
        if "answer is" in written.lower() or not written.strip():
            return None
        return Fire(end, 1.0, 1.0, "ircot: a chain-of-thought sentence is finished", sentence, sentence)
