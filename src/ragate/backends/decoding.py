"""One token-by-token decoding loop for the local engines (llama.cpp, transformers).

Both engines give the full next-token logits, so both share this loop: pick a token (greedy or sampled), record
its log-probability, the top-k alternatives and the exact entropy of the step, track each token's character span
and stop at end-of-sequence, a stop string or ``max_tokens``. An engine only provides a :class:`LogitSource`:
next-token logits for a token sequence (reusing its cache for a shared prefix) and detokenisation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ragate.errors import RagateError
from ragate.types import FinishReason, Generation, GenerationRequest, TopLogprob
from ragate.uncertainty import log_softmax


class LogitSource(Protocol):
    """What an engine must provide to :func:`decode`."""

    def is_end(self, token_id: int) -> bool:
        """Whether ``token_id`` ends generation (end-of-sequence, end-of-turn)."""
        ...

    def next_logits(self, token_ids: Sequence[int]) -> np.ndarray:
        """Logits (vocabulary-sized, 1-D) for the token after ``token_ids``; may reuse a cached shared prefix."""
        ...

    def decode_completion(self, completion_ids: Sequence[int], prompt_ids: Sequence[int]) -> str:
        """Text of ``completion_ids`` when they follow ``prompt_ids`` (a partial trailing character as U+FFFD)."""
        ...

    def piece(self, token_id: int) -> str:
        """The text of one token on its own, for display (``Generation.tokens`` and top-k lists)."""
        ...


class Recompute:
    """A :class:`LogitSource` that forgets the engine's cache before every step, so that every step re-runs the
    whole sequence: the naive loop that the dynamic-RAG speed benchmark compares against. Not for real use."""

    def __init__(self, source: LogitSource) -> None:
        self._source = source

    def next_logits(self, token_ids: Sequence[int]) -> np.ndarray:
        self._source.clear_cache()  # type: ignore[attr-defined]
        return self._source.next_logits(token_ids)

    def is_end(self, token_id: int) -> bool:
        return self._source.is_end(token_id)

    def decode_completion(self, completion_ids: Sequence[int], prompt_ids: Sequence[int]) -> str:
        return self._source.decode_completion(completion_ids, prompt_ids)

    def piece(self, token_id: int) -> str:
        return self._source.piece(token_id)


@dataclass(frozen=True)
class StepStats:
    """Per-step numbers computed from one row of logits."""

    logprobs: np.ndarray  # float64, natural log, full vocabulary
    entropy: float
    top_ids: np.ndarray  # best first; ties broken by lower token id, as np.argmax does


def step_stats(logits: np.ndarray, k: int) -> StepStats:
    """Log-probabilities, exact entropy (TARG Eq. 1 / ETC Eq. 3) and the k best token ids of one step."""
    lp = log_softmax(logits)
    p = np.exp(lp)
    # elementwise, not np.dot: a BLAS call here leaves BLAS threads spinning, which slows the engine's next
    # forward pass by ~4x on a 2-core machine (measured with benchmarks/backends.py)
    ent = float(-(p * np.where(p > 0, lp, 0.0)).sum())
    k = max(1, min(k, lp.shape[-1]))
    if k < lp.shape[-1]:
        cand = np.argpartition(-lp, k - 1)[:k]
    else:
        cand = np.arange(lp.shape[-1])
    order = np.lexsort((cand, -lp[cand]))  # by logprob descending, then id ascending
    return StepStats(lp, ent, cand[order])


def apply_repetition_penalty(logits: np.ndarray, seen: Sequence[int], penalty: float) -> np.ndarray:
    """CTRL-style penalty as in transformers: seen tokens' positive logits are divided, negative multiplied."""
    if penalty == 1.0 or not seen:
        return logits
    out = np.array(logits, dtype=np.float64, copy=True)
    idx = np.unique(np.asarray(seen, dtype=np.int64))
    vals = out[idx]
    out[idx] = np.where(vals > 0, vals / penalty, vals * penalty)
    return out


def sample_token(logits: np.ndarray, temperature: float, top_p: float, rng: np.random.Generator) -> int:
    """Draw one token from softmax(logits / temperature), restricted to the smallest nucleus of mass ``top_p``."""
    probs = np.exp(log_softmax(np.asarray(logits, dtype=np.float64) / temperature))
    if top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order])
        keep = order[: int(np.searchsorted(cumulative, top_p) + 1)]
        nucleus = np.zeros_like(probs)
        nucleus[keep] = probs[keep]
        probs = nucleus / nucleus.sum()
    return int(rng.choice(probs.shape[0], p=probs))


def find_stop(text: str, stops: Sequence[str], search_from: int) -> int | None:
    """Index of the earliest stop string in ``text`` that ends at or after ``search_from``, or None."""
    hits = []
    for stop in stops:
        at = text.find(stop, max(0, search_from - len(stop) + 1))
        if at >= 0:
            hits.append(at)
    return min(hits) if hits else None


def check_prompt_fits(n_prompt: int, max_context: int, fix: str) -> None:
    """Raise a :class:`RagateError` naming the sizes and ``fix`` when a prompt leaves no room to generate."""
    if n_prompt >= max_context:
        raise RagateError(
            f"the prompt has {n_prompt} tokens but the context window holds {max_context}: {fix}"
        )


Watch = Callable[[Generation], bool]


def decode(
    source: LogitSource,
    request: GenerationRequest,
    prompt_ids: Sequence[int],
    *,
    max_context: int,
    watch: Watch | None = None,
) -> Generation:
    """Run ``request`` on ``source`` from the tokenised prompt ``prompt_ids``; see the module docstring.

    The chosen token's log-probability and the top-k list come from the model's own distribution (temperature 1),
    also when the token is sampled; the end-of-sequence token ends generation and is not recorded as a step.
    Generation also stops with ``finish_reason="length"`` when the context window (``max_context``) is full.
    ``watch``, when given, sees the generation so far after every new token (a dynamic-RAG trigger); when it
    returns True, decoding stops there (``finish_reason="stop"``) and nothing more is computed.
    """
    start = time.perf_counter()
    rng = np.random.default_rng(request.seed)
    k = request.top_logprobs
    ids = list(prompt_ids)
    out_ids: list[int] = []
    logprobs: list[float] = []
    tops: list[tuple[TopLogprob, ...]] = []
    entropies: list[float] = []
    offsets: list[tuple[int, int]] = []
    pieces: list[str] = []
    text = ""
    finish: FinishReason = "length"
    cut_at_stop = False
    for _ in range(request.max_tokens):
        if len(ids) >= max_context:
            break
        logits = source.next_logits(ids)
        stats = step_stats(logits, max(k, 1))
        chooser = apply_repetition_penalty(logits, ids, request.repetition_penalty)
        if request.greedy:
            token = int(stats.top_ids[0]) if chooser is logits else int(np.argmax(chooser))
        else:
            token = sample_token(chooser, request.temperature, request.top_p, rng)
        if source.is_end(token):
            finish = "stop"
            break
        ids.append(token)
        out_ids.append(token)
        pieces.append(source.piece(token))
        logprobs.append(float(stats.logprobs[token]))
        entropies.append(stats.entropy)
        tops.append(
            tuple(
                TopLogprob(int(t), source.piece(int(t)), float(stats.logprobs[t])) for t in stats.top_ids[:k]
            )
        )
        new_text = source.decode_completion(out_ids, prompt_ids)
        if new_text.endswith(
            "\ufffd"
        ):  # the token ends inside a multi-byte character: the next one completes it
            offsets.append((len(text), len(text)))
            continue
        common = len(text) if new_text.startswith(text) else common_prefix_len(text, new_text)
        offsets.append((common, len(new_text)))
        text = new_text
        if request.stop:
            at = find_stop(text, request.stop, common)
            if at is not None:
                text = text[:at]
                n_keep = sum(1 for s, _ in offsets if s < at)
                offsets = [(min(s, at), min(e, at)) for s, e in offsets[:n_keep]]
                del out_ids[n_keep:], logprobs[n_keep:], entropies[n_keep:], tops[n_keep:]
                del pieces[n_keep:]
                finish = "stop"
                cut_at_stop = True
                break
        if watch is not None and watch(
            _generation(
                text, pieces, out_ids, logprobs, tops, offsets, "length", prompt_ids, start, entropies
            )
        ):
            finish = "stop"
            break
    if out_ids and not cut_at_stop:
        final = source.decode_completion(out_ids, prompt_ids)
        if final != text and final.startswith(text):
            # a partial character held back at the end: give it to the last token, as U+FFFD
            offsets[-1] = (offsets[-1][0], len(final))
            text = final
    return _generation(text, pieces, out_ids, logprobs, tops, offsets, finish, prompt_ids, start, entropies)


def _generation(
    text: str,
    pieces: Sequence[str],
    out_ids: Sequence[int],
    logprobs: Sequence[float],
    tops: Sequence[tuple[TopLogprob, ...]],
    offsets: Sequence[tuple[int, int]],
    finish: FinishReason,
    prompt_ids: Sequence[int],
    start: float,
    entropies: Sequence[float],
) -> Generation:
    return Generation(
        text=text,
        tokens=tuple(pieces),
        token_ids=tuple(out_ids),
        logprobs=tuple(logprobs),
        top_logprobs=tuple(tops),
        offsets=tuple(offsets),
        finish_reason=finish,
        prompt_tokens=len(prompt_ids),
        completion_tokens=len(out_ids),
        seconds=time.perf_counter() - start,
        entropies=tuple(entropies),
    )


def prefix(gen: Generation, n: int) -> Generation:
    """The first ``n`` steps of ``gen`` as a generation of their own (text up to the end of step n-1)."""
    if n >= len(gen.tokens):
        return gen
    end = gen.offsets[n - 1][1] if n else 0
    return Generation(
        text=gen.text[:end],
        tokens=gen.tokens[:n],
        token_ids=gen.token_ids[:n],
        logprobs=gen.logprobs[:n],
        top_logprobs=gen.top_logprobs[:n],
        offsets=gen.offsets[:n],
        finish_reason="stop",
        prompt_tokens=gen.prompt_tokens,
        completion_tokens=n,
        seconds=gen.seconds,
        entropies=None if gen.entropies is None else gen.entropies[:n],
        attentions=None if gen.attentions is None else gen.attentions[:n],
    )


def replay(gen: Generation, watch: Watch) -> Generation:
    """``watch`` run over a finished generation step by step, as :func:`decode` runs it while decoding: the
    generation up to the first step where it returns True (or all of it). Engines that cannot stop mid-way
    (remote servers, scripts) use this; they pay for the tokens after the stop, the result is the same."""
    for n in range(1, len(gen.tokens) + 1):
        if watch(prefix(gen, n)):
            return prefix(gen, n)
    return gen


def common_prefix_len(a: Sequence[object], b: Sequence[object]) -> int:
    """Length of the longest common prefix of two sequences (token ids or strings)."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
