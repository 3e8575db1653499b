"""What a trigger reads off a block of generated tokens: entropies, sentences, words and their attention."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ragate.methods.triggers import Fire, Trigger  # noqa: F401 (the trigger interface, beside its registry)
from ragate.types import Generation
from ragate.uncertainty import topk_entropy

SENTENCE_END = (".", "!", "?")


def step_entropies(gen: Generation) -> list[float]:
    """Each step's entropy: exact where the engine gives the full distribution, else the top-k approximation
    (:func:`ragate.uncertainty.topk_entropy`) for every step, consistently."""
    if gen.entropies is not None:
        return list(gen.entropies)
    return [topk_entropy([t.logprob for t in top]) for top in gen.top_logprobs]


def _ends_sentence(tokens: Sequence[str], i: int) -> bool:
    return "\n" in tokens[i] or tokens[i].rstrip().endswith(SENTENCE_END)


def sentence_spans(tokens: Sequence[str], done: bool) -> list[tuple[int, int]]:
    """Token spans of the finished sentences. A sentence ends at a token that ends with . ! or ? (or holds a
    newline) when the next token starts with white space; "3.5" or "U.S." do not end one. The last sentence is
    finished only when generation is (``done``). Spans cover the tokens without gaps."""
    spans, start = [], 0
    for i in range(len(tokens) - 1):
        if _ends_sentence(tokens, i) and (tokens[i + 1][:1].isspace() or "\n" in tokens[i]):
            spans.append((start, i + 1))
            start = i + 1
    if done and start < len(tokens):
        spans.append((start, len(tokens)))
    return spans


def new_sentence(block: Generation, done: bool) -> tuple[int, int] | None:
    """The sentence that the newest token finished (the token after it starts the next one), or the trailing
    sentence once generation is ``done``; None otherwise. Each sentence is returned at exactly one step."""
    spans = sentence_spans(block.tokens, done)
    if not spans:
        return None
    last = spans[-1]
    n = len(block.tokens)
    if (done and last[1] == n) or (not done and last[1] == n - 1):
        return last
    return None


def sentence_around(tokens: Sequence[str], i: int) -> tuple[int, int]:
    """The span of the (possibly unfinished) sentence that holds token ``i``."""
    start = 0
    for s, e in sentence_spans(tokens, done=True):
        if s <= i < e:
            return s, e
        start = e
    return start, len(tokens)


def received_attention(heads: np.ndarray) -> np.ndarray:
    """DRAGIN's a_max: for each position j, the most attention any position pays it (max over rows, per head),
    averaged over heads. ``heads`` is ``(heads, L, L)``; the result has length L."""
    return np.asarray(heads.max(axis=1).mean(axis=0), dtype=np.float64)
