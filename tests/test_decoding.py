"""The shared decoding loop, driven by a tiny scripted logit source whose every number is known."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from ragate.backends.decoding import apply_repetition_penalty, decode, find_stop, sample_token, step_stats
from ragate.types import GenerationRequest
from ragate.uncertainty import entropy, log_softmax

# token id -> bytes; id 0 ends the sequence. 'é' is split over two tokens (0xC3 0xA9) to test partial characters.
VOCAB = {0: b"", 1: b"Hello", 2: b" world", 3: b"\xc3", 4: b"\xa9", 5: b".", 6: b"\n"}


class ScriptedLogits:
    """Emits ``plan`` in order (logit 5 for the planned token, 0 for others), then end-of-sequence."""

    def __init__(self, plan: Sequence[int]) -> None:
        self.plan = list(plan)
        self.calls = 0

    def is_end(self, token_id: int) -> bool:
        return token_id == 0

    def next_logits(self, token_ids: Sequence[int]) -> np.ndarray:
        self.calls += 1
        step = len(token_ids) - 1  # the prompt is one token
        logits = np.zeros(len(VOCAB))
        logits[self.plan[step] if step < len(self.plan) else 0] = 5.0
        return logits

    def decode_completion(self, completion_ids: Sequence[int], prompt_ids: Sequence[int]) -> str:
        return b"".join(VOCAB[i] for i in completion_ids).decode("utf-8", "replace")

    def piece(self, token_id: int) -> str:
        return VOCAB[token_id].decode("utf-8", "replace")


def run(plan: Sequence[int], **kw: object) -> tuple[object, ScriptedLogits]:
    source = ScriptedLogits(plan)
    request = GenerationRequest(prompt="x", **kw)  # type: ignore[arg-type]
    return decode(source, request, [99], max_context=100), source


def test_greedy_steps_logprobs_and_offsets() -> None:
    gen, _ = run([1, 2, 5], top_logprobs=3)
    assert gen.text == "Hello world."
    assert gen.token_ids == (1, 2, 5)
    assert gen.finish_reason == "stop"  # end-of-sequence, not recorded as a step
    expected = float(log_softmax(np.array([0, 5.0, 0, 0, 0, 0, 0]))[1])
    assert gen.logprobs == pytest.approx((expected,) * 3)
    assert all(top[0].token_id == tid for top, tid in zip(gen.top_logprobs, gen.token_ids, strict=True))
    assert [len(t) for t in gen.top_logprobs] == [3, 3, 3]
    assert "".join(gen.text[s:e] for s, e in gen.offsets) == gen.text
    assert gen.offsets == ((0, 5), (5, 11), (11, 12))
    assert gen.entropies == pytest.approx([entropy(np.array([0, 5.0, 0, 0, 0, 0, 0]))] * 3)


def test_partial_utf8_character_gets_empty_span_then_full() -> None:
    gen, _ = run([1, 3, 4])
    assert gen.text == "Helloé"
    assert gen.offsets == ((0, 5), (5, 5), (5, 6))


def test_stop_string_is_cut_and_not_returned() -> None:
    gen, source = run([1, 2, 6, 1, 2], stop=("\n",))
    assert gen.text == "Hello world"
    assert gen.finish_reason == "stop"
    assert gen.token_ids == (1, 2)  # the token holding the stop string is dropped
    assert source.calls == 3  # no decoding after the stop


def test_stop_string_spanning_tokens() -> None:
    gen, _ = run([1, 2, 5], stop=("d.",))
    assert gen.text == "Hello worl"
    assert gen.token_ids == (1, 2)
    assert gen.offsets[-1] == (5, 10)  # the straddling token is kept, its span clipped


def test_max_tokens_and_context_limit() -> None:
    gen, _ = run([1, 2, 5], max_tokens=2)
    assert (gen.text, gen.finish_reason, gen.completion_tokens) == ("Hello world", "length", 2)
    source = ScriptedLogits([1, 2, 5])
    gen = decode(source, GenerationRequest(prompt="x"), [99], max_context=2)
    assert gen.completion_tokens == 1 and gen.finish_reason == "length"


def test_step_stats_ties_break_like_argmax() -> None:
    stats = step_stats(np.array([1.0, 3.0, 3.0, 0.0]), 3)
    assert list(stats.top_ids) == [1, 2, 0]
    assert int(np.argmax([1.0, 3.0, 3.0, 0.0])) == stats.top_ids[0]


def test_sampling_is_seeded_and_respects_top_p() -> None:
    logits = np.log(np.array([0.6, 0.3, 0.1]))
    draws = [sample_token(logits, 1.0, 1.0, np.random.default_rng(7)) for _ in range(3)]
    assert len(set(draws)) == 1  # same seed, same draw
    rng = np.random.default_rng(0)
    assert {sample_token(logits, 1.0, 0.5, rng) for _ in range(200)} == {0}  # nucleus of mass 0.5 = token 0
    rng = np.random.default_rng(0)
    assert {sample_token(logits, 1.0, 0.85, rng) for _ in range(300)} == {0, 1}


def test_repetition_penalty_matches_transformers_rule() -> None:
    out = apply_repetition_penalty(np.array([2.0, -2.0, 1.0]), [0, 1, 1], 2.0)
    assert list(out) == [1.0, -4.0, 1.0]


def test_find_stop() -> None:
    assert find_stop("abc\ndef", ["\n"], 0) == 3
    assert find_stop("abc", ["x", "bc"], 2) == 1
    assert find_stop("abc", ["zz"], 0) is None
