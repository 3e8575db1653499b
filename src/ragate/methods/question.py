"""One question's bookkeeping (:class:`QuestionRun`): its stages and queries, the draft a gate reads and reuses, and
the generations, searches and identities gates ask for through it (the :class:`~ragate.gates.base.GateContext`)."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ragate.backends.base import Backend
from ragate.backends.decoding import Watch
from ragate.errors import RagateError
from ragate.methods import prompts as P
from ragate.methods.spec import MethodSpec
from ragate.methods.trace import Stage
from ragate.models import model_identity
from ragate.retrieval.types import Hit, Retriever, ScoredHits
from ragate.types import Generation, GenerationRequest, Message


class QuestionRun:
    """The mutable bookkeeping of one question (stages, queries, what the gate generated); not shared, not kept.

    It is the :class:`~ragate.gates.base.GateContext` gates ask their generations through."""

    def __init__(
        self,
        spec: MethodSpec,
        question: str,
        lm: Backend,
        retriever: Retriever | None,
        *,
        seed: int = 0,
        progress: Callable[[str], None] | None = None,
        early_exit: bool = True,
    ) -> None:
        self.spec, self.question, self.lm, self.retriever = spec, question, lm, retriever
        self.seed, self.params = seed, spec.gate
        self.early_exit = early_exit  # a gate's draft may stop once its decision is settled (TARG Eqs. 1-2)
        self._cut_early = False  # the draft stopped there: it is not an answer until continued
        self.stages: list[Stage] = []
        self.queries: list[str] = []
        self.progress = progress
        self._draft: Generation | None = None
        self._answer: str | None = None  # set by a gate whose own reply holds the answer (verbal confidence)
        self.pseudo: str | None = None  # a pseudo-context the gate wrote, reused by the selector
        self.gate_stages: int | None = None  # how many of the stages the gate made (set once it has decided)
        self._scored: tuple[int, ScoredHits, int] | None = None  # a gate's search: (k, hits, its stage's place)
        self._hidden: np.ndarray | None = None  # the direct prompt's last hidden state (empty: not available)

    @property
    def prompts(self) -> P.PromptSet:
        return self.spec.prompts

    def messages(self, template: str, **fields: str) -> tuple[Message, ...]:
        user = Message("user", template.format(question=self.question, **fields))
        system = self.spec.prompts.system
        return (Message("system", system), user) if system else (user,)

    def generate(
        self, name: str, requests: Sequence[GenerationRequest], *, overhead: bool = False
    ) -> list[Generation]:
        if self.progress is not None:
            self.progress(name)
        gens = self.lm.generate(requests)
        self.stages.extend(Stage.of(name, g, overhead=overhead) for g in gens)
        return gens

    def one(
        self,
        name: str,
        template: str,
        *,
        max_tokens: int | None = None,
        overhead: bool = False,
        top_logprobs: int = 5,
        **fields: str,
    ) -> Generation:
        request = self._request(template, max_tokens, top_logprobs, **fields)
        return self.generate(name, [request], overhead=overhead)[0]

    def _request(
        self, template: str, max_tokens: int | None, top_logprobs: int = 5, **fields: str
    ) -> GenerationRequest:
        return GenerationRequest(
            self.messages(template, **fields),
            max_tokens=max_tokens or self.spec.max_tokens,
            top_logprobs=min(
                top_logprobs, self.lm.capabilities.top_k
            ),  # what the gate needs is checked first
        )

    def draft(self, max_tokens: int | None = None, *, settled: Watch | None = None) -> Generation:
        """The greedy direct answer, generated once (``max_tokens`` None: the method's answer length).

        ``settled`` (a gate's exact early exit, e.g. :class:`ragate.gates.targ.Settled`) sees the draft after each
        token; where this run allows early exit, the draft stops at the first token where it returns True
        (:meth:`Backend.generate_settled <ragate.backends.base.Backend.generate_settled>`: local engines decode no
        further). A draft that never settles is the one generated without it."""
        if self._draft is None:
            generate_settled = getattr(self.lm, "generate_settled", None)
            if settled is None or not self.early_exit or generate_settled is None:
                self._draft = self.one("draft", self.spec.prompts.direct, max_tokens=max_tokens)
                return self._draft
            request = self._request(self.spec.prompts.direct, max_tokens)
            if self.progress is not None:
                self.progress("draft")
            fired: list[bool] = []

            def watch(gen: Generation) -> bool:
                fired.append(settled(gen))
                return fired[-1]

            self._draft = generate_settled(request, watch)
            self._cut_early = bool(fired) and fired[-1] and len(self._draft) < request.max_tokens
            self.stages.append(Stage.of("draft", self._draft))
        return self._draft

    def hidden_state(self) -> np.ndarray | None:
        """The model's last-layer hidden state at the last token of the direct prompt (the draft's and the
        closed-book answer's), computed once by the prefill that answer needs anyway: the draft or answer after it
        starts from the kept prompt (``Capabilities.hidden_states``). None where the backend cannot give it (a
        server); recorded as a "prefill" stage of no tokens."""
        if self._hidden is None:
            if not self.lm.capabilities.hidden_states or not hasattr(self.lm, "hidden_state"):
                self._hidden = np.zeros(0, dtype=np.float32)
            else:
                if self.progress is not None:
                    self.progress("prefill")
                start = time.perf_counter()
                self._hidden = np.asarray(self.lm.hidden_state(self.messages(self.spec.prompts.direct)))
                self.stages.append(Stage("prefill", 0, 0, time.perf_counter() - start))
        return self._hidden if self._hidden.size else None

    def proxy_draft(self, max_tokens: int, *, top_logprobs: int = 2) -> Generation:
        """The proxy model's greedy draft of the direct prompt (:mod:`ragate.gates.proxy`): the backend carries the
        proxy (:class:`ragate.backends.proxy.WithProxy`, opened by Pipeline and eval for a gate that drafts with
        one). Recorded as an overhead stage named "proxy-draft"; never the answer."""
        proxy = getattr(self.lm, "proxy", None)
        if proxy is None:
            raise RagateError(
                f"the gate {self.spec.gate.kind!r} drafts with a small proxy model, and none is open beside "
                f"{self.lm.model!r}: run it through ragate.Pipeline or ragate ask/eval/sweep/calibrate/serve "
                "(which open the proxy, SmolLM2-135M by default), or wrap the backend in ragate.backends.proxy.WithProxy"
            )
        request = GenerationRequest(
            self.messages(self.spec.prompts.direct),
            max_tokens=max_tokens,
            top_logprobs=min(top_logprobs, proxy.capabilities.top_k),
        )
        if self.progress is not None:
            self.progress("proxy-draft")
        draft = proxy.generate([request])[0]
        self.stages.append(Stage.of("proxy-draft", draft, overhead=True))
        return draft

    @property
    def drafted(self) -> Generation | None:
        """The draft, if the gate asked for one."""
        return self._draft

    def pseudo_context(self) -> str:
        """A pseudo-context (the method's prompt), generated once and kept for DPR-AIS."""
        if self.pseudo is None:
            self.pseudo = self.one(
                "pseudo-context", self.spec.prompts.pseudo_context, max_tokens=self.spec.pseudo_max_tokens
            ).text
        return self.pseudo

    def set_answer(self, text: str) -> None:
        self._answer = text

    def closed_book_answer(self) -> str:
        """The answer when the gate says "no": what the gate set, else its draft (continued where it was cut at a
        shorter length than the answer's; generated whole on a backend that cannot continue a prefix, which the
        greedy draft of the same prompt begins), else the direct answer generated now."""
        if self._answer is not None:
            return self._answer
        draft = self._draft
        if draft is None:
            return self.one("answer", self.spec.prompts.direct).text
        text = draft.text
        if len(draft) > self.spec.max_tokens and len(draft.offsets) == len(draft):  # a gate's draft is longer
            return text[: draft.offsets[self.spec.max_tokens - 1][1]]  # than the answer may be: cut it there
        cut = draft.finish_reason == "length" or self._cut_early  # stopped before its end: continue it
        if cut and self.spec.max_tokens > len(draft):
            if not self.lm.capabilities.continues:  # a chat endpoint: the whole greedy answer, which the draft
                return self.one("answer", self.spec.prompts.direct).text  # (greedy, same prompt) begins
            rest = GenerationRequest(
                self.messages(self.spec.prompts.direct),
                max_tokens=self.spec.max_tokens - len(draft),
                assistant_prefix=draft.text,
                top_logprobs=0,
            )
            text += self.generate("continue", [rest])[0].text
        return text

    @contextlib.contextmanager
    def timed(self, name: str, *, overhead: bool = False) -> Iterator[None]:
        """Record the time of a step that makes no LM call (a kNN vote) as a stage."""
        start = time.perf_counter()
        yield
        self.stages.append(Stage(name, 0, 0, time.perf_counter() - start, overhead=overhead))

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Texts embedded as queries by the index's encoder (L2-normalised)."""
        return self.need_retriever().embed_queries(list(texts))

    def encoder_identity(self) -> dict[str, Any] | None:
        return encoder_identity(self.need_retriever())

    def model_identity(self) -> dict[str, Any]:
        return _model_identity(self.lm.model, self.lm.engine)

    def scored_search(self, k: int) -> ScoredHits:
        """The question's top ``k`` and the similarity scores they rest on, searched once and recorded as a
        "retrieve" stage marked overhead: a gate that reads no model decides from it. When the selector then asks
        the same search (the question, ``k``), it reads these hits and the stage is no longer overhead."""
        if self._scored is None or self._scored[0] != k:
            retriever = self.need_retriever()
            if self.progress is not None:
                self.progress("retrieve")
            start = time.perf_counter()
            found = retriever.scored_search([self.question], k)[0]
            self.stages.append(Stage("retrieve", 0, 0, time.perf_counter() - start, overhead=True))
            self.queries.append(self.question)
            self._scored = (k, found, len(self.stages) - 1)
        return self._scored[1]

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if self._scored is not None and queries == [self.question] and k == self._scored[0]:
            _, found, at = self._scored  # the gate's own search: read, not repeated
            self.stages[at] = replace(self.stages[at], overhead=False)
            return [list(found.hits)]
        retriever = self.need_retriever()
        if self.progress is not None:
            self.progress("retrieve")
        start = time.perf_counter()
        hits = retriever.search(queries, k)
        self.stages.append(Stage("retrieve", 0, 0, time.perf_counter() - start))
        self.queries.extend(queries)
        return hits

    def need_retriever(self) -> Retriever:
        if self.retriever is None:
            raise self.spec.no_index()
        return self.retriever


def encoder_identity(retriever: Retriever) -> dict[str, Any] | None:
    """The identity of the encoder a retriever embeds queries with (dense, or hybrid's dense half), else None."""
    encoder = getattr(retriever, "encoder", None) or getattr(
        getattr(retriever, "dense", None), "encoder", None
    )
    return encoder.identity() if encoder is not None else None


@functools.lru_cache(maxsize=4)
def _model_identity(model: str, engine: str) -> dict[str, Any]:
    return model_identity(model, engine)
