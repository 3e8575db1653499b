"""DRAGIN (Su et al., ACL 2024): retrieve when a content word is both uncertain and important.

RIND (section 3.1): a word's score is its entropy (the mean over its sub-tokens, as the authors' code) times the
attention it receives (a_max, the most any later position pays it; last layer, averaged over heads) rescaled to
mean 1 over its sentence, times 1 for content words and 0 for stop words. A sentence is checked once it is
finished; the first word whose score passes ``threshold`` fires. The output is cut before that word (the paper
truncates at the token; ``cut="sentence"`` is the authors' code, which drops the whole sentence). Attentions
come from the transformers backend, over the tokens of the block alone as in the code; on a backend without them
every word's attention is 1, so the score is entropy times the content indicator (the trace says so).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ragate.dynamic.etc import content_mask, words_from_tokens
from ragate.dynamic.steps import new_sentence, received_attention, step_entropies
from ragate.gates.base import Need
from ragate.methods.triggers import Fire, Trigger
from ragate.types import Generation

if TYPE_CHECKING:
    from ragate.backends.base import Backend
    from ragate.methods.spec import DynamicSpec

DEFAULT_THRESHOLD = 1.2  # the authors' HotpotQA config (hallucination_threshold)


class DraginTrigger(Trigger):
    name = "dragin"
    need = Need(token_logprobs=True, top_k=1, entropy=True)
    default_threshold = DEFAULT_THRESHOLD
    like = "dragin"

    def __init__(
        self, threshold: float, stop_words: frozenset[str], *, cut: str = "word", attention: Any = None
    ) -> None:
        self.threshold, self.stop_words, self.cut, self._attention = threshold, stop_words, cut, attention

    @classmethod
    def build(cls, spec: DynamicSpec, lm: Backend, stop_words: frozenset[str]) -> DraginTrigger:
        from ragate.dynamic.triggers import attention_source

        threshold = cls.threshold_for(spec)
        assert threshold is not None
        return cls(threshold, stop_words, cut=spec.cut, attention=attention_source(lm))

    def check(self, block: Generation, done: bool) -> Fire | None:
        sentence = new_sentence(block, done)
        if sentence is None:
            return None
        start, end = sentence
        entropies = step_entropies(block)
        words = [w for w in words_from_tokens(block.tokens[:end], entropies[:end]) if w.token_start >= start]
        if not words:
            return None
        if self._attention is not None and block.token_ids:
            per_token = received_attention(self._attention(block.token_ids[:end]))
        else:
            per_token = np.ones(end)
        attention = np.array([per_token[w.token_start : w.token_end].sum() for w in words])
        attention = attention * len(words) / (attention.sum() + 1e-10)
        content = content_mask([w.text for w in words], self.stop_words)
        for word, a, is_content in zip(words, attention, content, strict=True):
            h = float(np.mean(entropies[word.token_start : word.token_end]))
            score = float(a) * h * float(is_content)
            if score > self.threshold:
                keep = word.token_start if self.cut == "word" else start
                reason = f"dragin: attention {a:.2f} x entropy {h:.2f} at {word.text!r} > {self.threshold}"
                return Fire(keep, score, self.threshold, reason, (word.token_start, word.token_end), sentence)
        return None
