"""Core data types shared by every layer: requests to a language model and what it returns.

All types are frozen dataclasses. A :class:`Generation` is token-aligned: step ``i`` has the chosen token's id,
its log-probability, the top-k alternatives, the character span of the token in ``text`` and (when the engine
exposes the full distribution) the exact entropy of that step. Nothing downstream needs to re-tokenise text to
line scores up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal, Self

import numpy as np

from ragate.uncertainty import margin, topk_entropy

Role = Literal["system", "user", "assistant"]
FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class Message:
    """One chat message; a request with messages is rendered through the model's chat template."""

    role: Role
    content: str


@dataclass(frozen=True)
class GenerationRequest:
    """What to generate.

    ``prompt`` is raw text (sent as is) or a tuple of :class:`Message` (rendered with the model's chat template).
    ``temperature == 0`` means greedy decoding; otherwise tokens are sampled at that temperature with nucleus
    ``top_p``, reproducibly when ``seed`` is set. Generation ends at the model's end-of-sequence token, at the
    first stop string (which is not part of the returned text), or after ``max_tokens``.
    ``top_logprobs`` is how many alternatives to return per step (0 for none). ``attentions`` asks for the
    attention of each generated token over the whole sequence (only backends with that capability).
    ``repetition_penalty`` (1 = none) penalises tokens already in the prompt or output when choosing, as
    transformers does; reported log-probabilities stay those of the unpenalised distribution.
    ``assistant_prefix`` is text the answer already starts with (a draft being continued): it is placed after
    the rendered prompt and generation goes on from its end; it is not part of the returned text.
    """

    prompt: str | tuple[Message, ...]
    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    top_logprobs: int = 5
    seed: int | None = None
    attentions: bool = False
    repetition_penalty: float = 1.0
    assistant_prefix: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.prompt, str):
            if not self.prompt:
                raise ValueError("GenerationRequest.prompt is empty: give the text (or messages) to continue")
        elif not self.prompt or not all(isinstance(m, Message) for m in self.prompt):
            raise ValueError("GenerationRequest.prompt must be a non-empty str or a tuple of Message")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_logprobs < 0:
            raise ValueError(f"top_logprobs must be >= 0, got {self.top_logprobs}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0 (1 = none), got {self.repetition_penalty}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class TopLogprob:
    """One alternative at a step: token id (``None`` when a server does not say), its text, its log-probability."""

    token_id: int | None
    token: str
    logprob: float


@dataclass(frozen=True)
class Generation:
    """The result of one request, aligned per generated token.

    Log-probabilities are those of the model's own next-token distribution (temperature 1, no truncation), also
    when the token was sampled at another temperature, so that uncertainty scores do not depend on how the token
    was picked. OpenAI-compatible servers report what the server computes; see the backend's docs.

    ``token_ids`` is empty when the engine does not expose ids (most OpenAI-compatible servers).
    ``offsets[i]`` is the ``(start, end)`` character span of token ``i`` in ``text``; a token that ends inside a
    multi-byte character has an empty span and the next token's span covers the character.
    ``entropies[i]`` is the exact entropy of step ``i`` over the full vocabulary, or ``None`` when the engine
    only returns top-k logprobs (use :func:`ragate.uncertainty.topk_entropy`, an approximation, instead).
    The end-of-sequence token is never part of the steps.
    ``attentions``, when requested, is an array of shape ``(len(tokens), prompt_tokens + len(tokens))``: the
    last layer's attention, averaged over heads, of each generated token over every position before it.
    """

    text: str
    tokens: tuple[str, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top_logprobs: tuple[tuple[TopLogprob, ...], ...]
    offsets: tuple[tuple[int, int], ...]
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    seconds: float
    entropies: tuple[float, ...] | None = None
    attentions: np.ndarray | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        n = len(self.tokens)
        lengths = {
            "logprobs": len(self.logprobs),
            "top_logprobs": len(self.top_logprobs),
            "offsets": len(self.offsets),
        }
        if self.token_ids:
            lengths["token_ids"] = len(self.token_ids)
        if self.entropies is not None:
            lengths["entropies"] = len(self.entropies)
        bad = {k: v for k, v in lengths.items() if v != n}
        if bad:
            raise ValueError(f"Generation has {n} tokens but per-step fields of other lengths: {bad}")

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def top1_top2_gaps(self) -> tuple[float, ...]:
        """Per-step gap between the best and second-best log-probability (needs ``top_logprobs >= 2``)."""
        return tuple(margin([t.logprob for t in step]) for step in self.top_logprobs)

    def step_entropies(self) -> tuple[tuple[float, ...], bool]:
        """Per-step entropies and whether they are exact.

        Exact (full vocabulary) when the engine returned them; otherwise the top-k approximation
        :func:`ragate.uncertainty.topk_entropy` (a lower bound), computed from ``top_logprobs``.
        """
        if self.entropies is not None:
            return self.entropies, True
        return tuple(topk_entropy([t.logprob for t in step]) for step in self.top_logprobs), False


class Closeable:
    """A resource used as a context manager: ``with load_backend(...) as lm:`` closes it on the way out."""

    def close(self) -> None:
        """Release files, models or connections. Safe to call twice."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
