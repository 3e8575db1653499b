"""What a method did for one question: its answer, its gate's decision, what it searched and read, and the cost
of every stage."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ragate.gates.base import GateDecision
from ragate.retrieval.types import Hit
from ragate.text import evidence_applies, extract_answer, supported
from ragate.types import Generation


@dataclass(frozen=True)
class Stage:
    """One step: an LM call (tokens > 0) or a retrieval (tokens 0). ``overhead`` marks work the answer does not
    reuse (a draft thrown away because the gate said "retrieve", a judge's reply, the variance gate's samples)."""

    name: str
    prompt_tokens: int
    completion_tokens: int
    seconds: float
    overhead: bool = False
    finish_reason: str = ""  # an LM call's: "stop" (an end token or a stop string) or "length" (max_tokens)
    logprob: float | None = None  # an LM call's: the sum of its generated tokens' log-probabilities (None: none given)

    @classmethod
    def of(cls, name: str, gen: Generation, *, overhead: bool = False) -> Stage:
        total = math.fsum(gen.logprobs) if gen.logprobs and len(gen.logprobs) == len(gen.tokens) else None
        return cls(name, gen.prompt_tokens, gen.completion_tokens, gen.seconds, overhead, gen.finish_reason, total)


def _is_call(stage: Stage) -> bool:
    return bool(stage.prompt_tokens or stage.completion_tokens)


def answer_stages(stages: tuple[Stage, ...] | list[Stage], *, dynamic: bool) -> list[Stage]:
    """The LM calls that wrote the answer: a single-shot method's reading answer (or a draft's continuation), else
    its draft kept as the answer; a dynamic method's every generation (its chain of thought, tokens cut at a
    retrieval included)."""
    calls = [s for s in stages if _is_call(s)]
    if dynamic:
        return [s for s in calls if s.name in ("generate", "answer-is")]
    return [s for s in calls if s.name in ("answer", "continue")] or [s for s in calls if s.name == "draft"]


def answer_nll(stages: tuple[Stage, ...] | list[Stage], *, dynamic: bool) -> float | None:
    """The normalised NLL, -(1/T) sum_t log p(a_t) (DTR Eqs. 2-3), of the tokens of the calls that wrote the answer
    (:func:`answer_stages`), each whole. None where the backend gave no log-probabilities or nothing was
    generated."""
    wrote = answer_stages([s for s in stages if s.completion_tokens], dynamic=dynamic)  # a call that wrote none
    tokens = sum(s.completion_tokens for s in wrote)
    if not tokens or any(s.logprob is None for s in wrote):
        return None
    return -math.fsum(s.logprob or 0.0 for s in wrote) / tokens


@dataclass(frozen=True)
class RetrievalEvent:
    """One retrieval of a dynamic method: where in the output it happened and what it asked.

    ``at_token`` counts the answer's tokens written (and kept) before it, ``generated`` every token generated
    before it, including tokens cut away; both are 0 for a retrieval made before generating (Single RAG, IRCoT,
    RALM). ``query_form`` says how the query was made (attention, masked, sentence, chunk, question)."""

    at_token: int
    generated: int
    query: str
    query_form: str
    score: float
    reason: str
    doc_ids: tuple[str, ...]


@dataclass(frozen=True)
class DynamicInfo:
    """What a dynamic method did besides answering: the whole output, every retrieval, tokens thrown away."""

    trigger: str
    output: str
    retrievals: tuple[RetrievalEvent, ...]
    generated_tokens: int
    discarded_tokens: int
    bound_reached: bool = False  # a method without a retrieval cap stopped at the safety bound

    @property
    def first_retrieval(self) -> RetrievalEvent | None:
        """The first retrieval the trigger asked for (retrievals before generating do not count)."""
        return next((r for r in self.retrievals if r.query_form != "initial"), None)


@dataclass(frozen=True)
class RouteCheck:
    """One stop check of a route cascade on a route's answer: its ``kind`` ("nll": the answer's normalised NLL at
    most ``threshold``; "agree": the answer agrees with the route before it, score 1 or 0, threshold 1;
    "supported": the answer is found in the passages it read, score 1 or 0, without which it does not stop), its
    score, and whether it stopped the cascade there. A policy that chooses from features records one per route
    instead: "classifier" (Adaptive-RAG: the route's probability, threshold the chosen route's) or "learned"
    (the route's P(right), threshold its price lambda * cost: the route of the largest difference is taken);
    ``stop`` marks the route chosen."""

    route: str
    kind: str
    score: float | None  # None: the backend gave no log-probabilities (the check cannot stop the cascade)
    threshold: float
    stop: bool


@dataclass(frozen=True)
class RouteInfo:
    """What a route method did: the routes it could take (cheapest first), the one whose answer it gave, each
    check met on the way, how many of the trace's stages each route it ran made, the routes it ran, their answers,
    whether each read documents, and each one's answer NLL and tokens (in the order run: what the learned policy
    reads of the first answer, and a feedback store keeps)."""

    routes: tuple[str, ...]
    taken: str
    checks: tuple[RouteCheck, ...]
    stages: tuple[int, ...] = ()
    ran: tuple[str, ...] = ()
    answers: tuple[str, ...] = ()
    retrieved: tuple[bool, ...] = ()  # whether each route run read documents
    nll: tuple[float | None, ...] = ()  # each route run's answer NLL (None: no log-probabilities)
    tokens: tuple[int, ...] = ()  # each route run's prompt and completion tokens


@dataclass(frozen=True)
class Trace:
    """The record of one question through one method (one JSON line in an evaluation run)."""

    method: str
    question: str
    answer: str
    retrieved: bool
    gate: GateDecision
    queries: tuple[str, ...]
    documents: tuple[Hit, ...]
    stages: tuple[Stage, ...]
    dynamic: DynamicInfo | None = None
    gate_stages: int | None = None  # the first this many stages are the gate's (None: no gate ran apart)
    # the greedy draft the gate read, per token (None: no gate drafted); kept in memory for a caller that shows
    # it (``ragate serve``'s ``draft_tokens``), never written by ``to_json``
    draft: Generation | None = field(default=None, compare=False, repr=False)
    # the model's last-layer hidden state at the direct prompt's last token, where it was taken (a feedback store
    # records it with the answer's other features, :mod:`ragate.learning.store`); in memory only, like ``draft``
    hidden: Any = field(default=None, compare=False, repr=False)
    route: RouteInfo | None = None  # a route method's path (ragate.methods.route)

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.stages)

    @property
    def answering_stages(self) -> tuple[Stage, ...]:
        """The stages of the method that gave the answer: all of them, or a route method's last route's."""
        if self.route is not None and self.route.stages:
            return self.stages[sum(self.route.stages[:-1]) :]
        return self.stages

    @property
    def finish_reason(self) -> str:
        """Why the answer's text ended: "length" when the call that wrote it (the reading answer, a draft
        kept as the answer, or its continuation) stopped at ``max_tokens``, else "stop"."""
        stages = self.answering_stages
        answer = answer_stages(stages, dynamic=False) or [s for s in stages if _is_call(s)]
        return "length" if answer and answer[-1].finish_reason == "length" else "stop"

    @property
    def supported(self) -> bool | None:
        """Whether the answer's extracted words are found whole in a document it read (:func:`ragate.text.supported`;
        None: it read none, or the answer is yes or no, :func:`ragate.text.evidence_applies`): eval records it, and
        a route cascade's evidence check reads it."""
        answer = extract_answer(self.answer)
        if not self.documents or not evidence_applies(answer):
            return None
        return supported(answer, [f"{h.passage.title} {h.passage.text}" for h in self.documents])

    @property
    def answer_nll(self) -> float | None:
        """The normalised NLL of the calls that wrote the answer (:func:`answer_nll`)."""
        return answer_nll(self.answering_stages, dynamic=self.dynamic is not None)

    @property
    def lm_calls(self) -> int:
        return sum(1 for s in self.stages if s.prompt_tokens or s.completion_tokens)

    @property
    def tokens(self) -> int:
        return sum(s.prompt_tokens + s.completion_tokens for s in self.stages)

    @property
    def retrievals(self) -> int:
        """The searches the method made (its "retrieve" stages): what eval records and a route budget spends."""
        return sum(1 for s in self.stages if s.name == "retrieve")

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "question": self.question,
            "answer": self.answer,
            "retrieved": self.retrieved,
            "gate": asdict(self.gate),
            "queries": list(self.queries),
            "documents": [
                {"id": h.id, "title": h.passage.title, "score": h.score, "rank": h.rank}
                for h in self.documents
            ],
            "stages": [asdict(s) for s in self.stages],
            "seconds": self.seconds,
            "tokens": self.tokens,
            **({"dynamic": asdict(self.dynamic)} if self.dynamic is not None else {}),
            **({"route": asdict(self.route)} if self.route is not None else {}),
        }
