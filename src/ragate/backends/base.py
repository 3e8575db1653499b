"""The one interface every language-model engine implements: a batch of requests in, a list of generations out."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

from ragate.backends.decoding import Watch, replay
from ragate.errors import CapabilityError, RagateError
from ragate.types import Closeable, Generation, GenerationRequest, Message


def check_text(prompt: str | Sequence[Message], assistant_prefix: str = "") -> None:
    """Refuse a prompt a tokenizer cannot encode: a lone UTF-16 surrogate (JSON's "\\ud800", or bytes that were
    not UTF-8 read with ``surrogateescape``) from a question, a passage or a pseudo-context. Every text reader
    checks its own input first; this is the last line before an engine, so a reader that missed one gives an
    error that names the text rather than a UnicodeEncodeError traceback."""
    texts = [prompt] if isinstance(prompt, str) else [m.content for m in prompt]
    for text in (*texts, assistant_prefix):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:
            near = text[max(0, err.start - 30) : err.start]
            raise RagateError(
                f"a prompt holds a lone surrogate ({text[err.start]!r} after {near!r}) that no tokenizer can "
                "encode: it came from a question, a document or a file that is not valid UTF-8; fix that text"
            ) from None


@dataclass(frozen=True)
class Capabilities:
    """What an engine can return. Gates and triggers check these instead of sniffing the backend's type.

    ``top_k`` is the largest ``top_logprobs`` the engine returns per step (0: none). ``full_distribution`` means
    every step's exact entropy over the vocabulary is available (``Generation.entropies``); without it, callers
    fall back to :func:`ragate.uncertainty.topk_entropy`, an approximation. ``token_ids`` means generations carry
    token ids. ``prefix_cache`` means a request whose prompt extends an earlier one reuses the earlier work.
    ``continues`` means a message prompt may end in an ``assistant_prefix`` that the model continues (an
    OpenAI-style chat endpoint cannot: callers generate the whole answer instead). ``hidden_states`` means the
    backend has ``hidden_state(prompt)``: the last-layer hidden state at the prompt's last token (local engines;
    a server does not return it).
    """

    logprobs: bool
    top_k: int
    attentions: bool
    sampling: bool
    chat_template: bool
    full_distribution: bool
    token_ids: bool
    prefix_cache: bool
    continues: bool = True
    hidden_states: bool = False


class Backend(Closeable, ABC):
    """A language model behind one engine (llama.cpp, transformers, an OpenAI-compatible server, a script).

    ``generate`` takes a list of requests and returns one :class:`Generation` per request, in order; each engine
    batches in its own way. Backends are context managers; ``close`` releases the model or connection.
    """

    engine: str
    model: str
    capabilities: Capabilities
    # a local engine takes each model step under this context, where a pipeline sets one (turns at the model between
    # requests and background work, and a request's time limit: :mod:`ragate.backends.turns`)
    step: Callable[[], AbstractContextManager[None]] | None = None

    @abstractmethod
    def _generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]: ...

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        if isinstance(requests, GenerationRequest):
            raise TypeError("Backend.generate takes a list of GenerationRequest; wrap a single one in [ ]")
        for request in requests:
            self.check(request)
        return self._generate(list(requests))

    def check(self, request: GenerationRequest) -> None:
        """Raise :class:`CapabilityError` when ``request`` asks for something this backend cannot return."""
        check_text(request.prompt, request.assistant_prefix)
        caps = self.capabilities
        if request.attentions and not caps.attentions:
            raise CapabilityError(
                f"the {self.engine} backend cannot return attentions; use the transformers backend "
                "(--backend transformers) for attention-based methods"
            )
        if request.top_logprobs > caps.top_k:
            raise CapabilityError(
                f"the {self.engine} backend returns at most {caps.top_k} top logprobs per step, "
                f"{request.top_logprobs} were requested"
            )
        if not request.greedy and not caps.sampling:
            raise CapabilityError(f"the {self.engine} backend cannot sample; use temperature=0")
        if not isinstance(request.prompt, str) and not caps.chat_template:
            raise CapabilityError(
                f"the {self.engine} backend has no chat template for model {self.model!r}; send a text prompt"
            )

    def generate_watched(
        self, request: GenerationRequest, watch: Watch, *, recompute: bool = False
    ) -> Generation:
        """One generation that ``watch`` sees after every token and may stop (a dynamic-RAG trigger).

        Engines that decode token by token (llama.cpp, transformers) stop as soon as ``watch`` returns True;
        others generate the whole reply and cut it where ``watch`` would have stopped (same result, more tokens
        paid). ``recompute=True`` re-runs the whole sequence at every step instead of reusing the key/value cache:
        the naive loop, only for the speed benchmark (local engines only).
        """
        if recompute:
            raise CapabilityError(
                f"the {self.engine} backend has no step-by-step loop to run without a cache"
            )
        self.check(request)
        return replay(self._generate([request])[0], watch)

    def generate_settled(self, request: GenerationRequest, settled: Watch) -> Generation:
        """``request``'s generation up to the first token where ``settled`` (seeing the generation so far) returns
        True, or whole: a gate's exact early exit (TARG Eqs. 1-2), whose decision is settled before its draft ends.
        The tokens are those of ``generate([request])``, cut there. Engines that decode token by token (llama.cpp,
        transformers) decode no further; others generate the whole reply and cut it (the same tokens, all paid:
        the OpenAI-compatible backend does not stream). A call that must not depend on the calls before it
        (:class:`ragate.eval.calls.CallCache`) computes it from a cleared cache, as it does every call."""
        return self.generate_watched(request, settled)

    def clear_cache(self) -> None:
        """Forget cached prompt state (the key/value cache kept for prefix reuse), so that the next request is
        timed cold. Benchmarks comparing methods on the same question need this; serving does not."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model!r})"
