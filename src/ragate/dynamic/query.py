"""How a dynamic method turns a hit into a search query.

- ``attention`` (DRAGIN section 3.3, ETC section 3.3): run the question and the text so far through the model,
  take the attention that the tokens which fired pay to everything before them (last layer, averaged over
  heads, each row normalised to 1, averaged over the hit tokens), sum it per word, and keep the ``top_n``
  content words in their original order. Needs a backend with attentions (transformers).
- ``question-masked`` (ETC and DRAGIN without attention): the question, then the masked sentence below. Both
  papers form the query over the question *and* the text so far (DRAGIN section 3.3, ETC section 3.3); without
  attention weights to rank their words, the question is always kept and the new text is FLARE's masked
  sentence, so the two methods ask by one rule whatever the moment their trigger fires.
- ``masked`` (FLARE, Jiang et al. 2023, "masked query"): the sentence the hit is in, up to the end of the hit,
  without its tokens of probability below ``mask_below``; when fewer than three words remain, the question is
  put in front.
- ``sentence`` (IRCoT): the sentence just written. ``chunk`` (In-Context RALM): the tokens written since the
  last retrieval. ``question``: the question (Single RAG, TARG's re-check).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ragate.dynamic.etc import content_mask
from ragate.methods.triggers import Fire
from ragate.types import Generation

_WORD = re.compile(r"\S+")
_STRIP = "\"'“”‘’.,;:!?()[]{}"


def _masked_sentence(block: Generation, fire: Fire, mask_below: float) -> str:
    start, end = fire.sentence[0], max(fire.hit[1], fire.sentence[0])
    kept = [  # a masked token leaves a gap, so that its neighbours do not fuse into one word
        block.tokens[i] if np.exp(block.logprobs[i]) >= mask_below else " "
        for i in range(start, min(end, len(block.tokens)))
    ]
    return " ".join("".join(kept).split())


def masked_query(block: Generation, fire: Fire, question: str, mask_below: float) -> str:
    """FLARE's query: the masked sentence; the question in front only when fewer than three words remain."""
    text = _masked_sentence(block, fire, mask_below)
    if len(text.split()) < 3:
        text = f"{question} {text}".strip()
    return text


def question_masked_query(block: Generation, fire: Fire, question: str, mask_below: float) -> str:
    """The question, then the masked sentence: ETC's and DRAGIN's query on a backend without attentions."""
    return f"{question} {_masked_sentence(block, fire, mask_below)}".strip()


def span_text(block: Generation, span: tuple[int, int]) -> str:
    if span[1] <= span[0]:
        return ""
    return block.text[block.offsets[span[0]][0] : block.offsets[span[1] - 1][1]].strip()


def attention_query(lm: Any, text: str, hit: tuple[int, int], top_n: int, stop_words: frozenset[str]) -> str:
    """The ``top_n`` content words of ``text[:hit[0]]`` that the characters ``text[hit[0]:hit[1]]`` attend to
    most (see the module docstring); ``lm`` must have ``token_spans`` and ``head_attentions``."""
    ids, spans = lm.token_spans(text)
    hit_tokens = [i for i, (a, b) in enumerate(spans) if a < hit[1] and b > hit[0]]
    words = [(m.start(), m.end(), m.group()) for m in _WORD.finditer(text[: hit[0]])]
    if not hit_tokens or not words:
        return text[: hit[0]].strip() or text.strip()
    first = hit_tokens[0]
    attention = lm.head_attentions(ids[: hit_tokens[-1] + 1]).mean(axis=0)
    weights = np.zeros(first, dtype=np.float64)
    for i in hit_tokens:
        if i == 0:
            continue
        row = np.asarray(attention[i - 1][:first], dtype=np.float64)  # the step that chose token i
        total = row.sum()
        if total > 0:
            weights += row / total
    per_word = []
    for start, end, word in words:
        w = sum(weights[t] for t, (a, b) in enumerate(spans[:first]) if a < end and b > start)
        per_word.append((float(w), start, word.strip(_STRIP)))
    content = content_mask([w for _, _, w in per_word], stop_words)
    ranked = sorted((p for p, c in zip(per_word, content, strict=True) if c and p[2]), key=lambda p: -p[0])
    kept = sorted(ranked[:top_n], key=lambda p: p[1])
    return " ".join(word for _, _, word in kept)
