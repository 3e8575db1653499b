"""A scripted backend for unit tests that need exact control (call counts, chosen logprobs). Not for real use."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ragate.backends.base import Backend, Capabilities
from ragate.types import FinishReason, Generation, GenerationRequest, TopLogprob

Script = Callable[[GenerationRequest], Generation]

SCRIPTED_CAPABILITIES = Capabilities(
    logprobs=True,
    top_k=20,
    attentions=False,
    sampling=True,
    chat_template=True,
    full_distribution=False,
    token_ids=False,
    prefix_cache=False,
)


def make_generation(
    tokens: Sequence[str],
    logprobs: Sequence[float],
    top_logprobs: Sequence[Sequence[tuple[str, float]]] | None = None,
    *,
    finish_reason: FinishReason = "stop",
    prompt_tokens: int = 0,
    entropies: Sequence[float] | None = None,
) -> Generation:
    """A :class:`Generation` whose text is the concatenation of ``tokens``, with offsets filled in.

    Without ``top_logprobs`` each step's top-1 list holds the chosen token alone.
    """
    offsets, start = [], 0
    for tok in tokens:
        offsets.append((start, start + len(tok)))
        start += len(tok)
    tops = (
        tuple(tuple(TopLogprob(None, t, lp) for t, lp in step) for step in top_logprobs)
        if top_logprobs is not None
        else tuple((TopLogprob(None, t, lp),) for t, lp in zip(tokens, logprobs, strict=True))
    )
    return Generation(
        text="".join(tokens),
        tokens=tuple(tokens),
        token_ids=(),
        logprobs=tuple(logprobs),
        top_logprobs=tops,
        offsets=tuple(offsets),
        finish_reason=finish_reason,
        prompt_tokens=prompt_tokens,
        completion_tokens=len(tokens),
        seconds=0.0,
        entropies=None if entropies is None else tuple(entropies),
    )


def text_generation(text: str, *, finish_reason: FinishReason = "stop") -> Generation:
    """A :class:`Generation` as a text-only API returns it: the text, no per-token steps."""
    return Generation(
        text=text, tokens=(), token_ids=(), logprobs=(), top_logprobs=(), offsets=(),
        finish_reason=finish_reason, prompt_tokens=0, completion_tokens=0, seconds=0.0,
    )  # fmt: skip


TEXT_ONLY = Capabilities(
    logprobs=False, top_k=0, attentions=False, sampling=True, chat_template=True, full_distribution=False,
    token_ids=False, prefix_cache=False,
)  # fmt: skip


class ScriptedBackend(Backend):
    """Answers each request by calling ``script(request)``, or pops the next of a fixed list of generations.

    ``calls`` records every request in order, so tests can prove how many decodes a method made.
    """

    engine = "scripted"

    def __init__(
        self,
        script: Script | Sequence[Generation],
        *,
        model: str = "scripted",
        capabilities: Capabilities = SCRIPTED_CAPABILITIES,
    ) -> None:
        self.model = model
        self.capabilities = capabilities
        self.calls: list[GenerationRequest] = []
        if callable(script):
            self._script: Script = script
        else:
            queue = list(script)

            def pop(_: GenerationRequest) -> Generation:
                if not queue:
                    raise AssertionError("ScriptedBackend ran out of scripted generations")
                return queue.pop(0)

            self._script = pop

    def _generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        out = []
        for request in requests:
            self.calls.append(request)
            out.append(self._script(request))
        return out
