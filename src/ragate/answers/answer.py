"""What a :class:`ragate.Pipeline` returns (:class:`Answer`, :class:`Retrieval`, their :class:`Document`, a
:class:`Calibration`) and how it checks a question before any work."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragate.errors import RagateError
from ragate.gates.base import GateDecision
from ragate.methods.trace import Stage, Trace
from ragate.retrieval.types import Hit

MAX_QUESTION_CHARS = 4000


@dataclass(frozen=True)
class Document:
    """A document the answer read: its id, title, text, score and rank, and where it came from (``source``: the
    file a passage of your documents was cut from, ``span``: its character range there)."""

    id: str
    title: str
    text: str
    score: float
    rank: int
    source: str | None = None
    span: tuple[int, int] | None = None

    @classmethod
    def of(cls, hit: Hit) -> Document:
        p = hit.passage
        return cls(p.id, p.title, p.text, hit.score, hit.rank, p.source, getattr(p, "span", None))


@dataclass(frozen=True)
class Answer:
    """One answered question: the answer, the gate's decision (score, threshold, reason), the documents read and
    the cost of every stage. ``trace`` is the full record (what ``ragate eval`` stores)."""

    question: str
    text: str
    method: str
    retrieved: bool
    decision: GateDecision
    documents: tuple[Document, ...]
    stages: tuple[Stage, ...]
    trace: Trace
    id: str = ""  # the feedback store's id for it (empty where the pipeline keeps no feedback)

    @classmethod
    def of(cls, trace: Trace) -> Answer:
        docs = tuple(Document.of(h) for h in trace.documents)
        return cls(trace.question, trace.answer, trace.method, trace.retrieved, trace.gate, docs, trace.stages, trace)

    @property
    def seconds(self) -> float:
        return self.trace.seconds

    @property
    def tokens(self) -> int:
        return self.trace.tokens

    def __str__(self) -> str:
        return self.text

    def to_json(self) -> dict[str, Any]:
        out = self.trace.to_json()
        if self.id:
            out["id"] = self.id
        for doc, record in zip(self.documents, out["documents"], strict=True):
            record |= {"text": doc.text, "source": doc.source, "span": list(doc.span) if doc.span else None}
        return out


@dataclass(frozen=True)
class Retrieval:
    """The gate's decision for one question and, when it retrieves, the documents the method chose, with no
    answer written (:meth:`Pipeline.retrieve`: for a framework that reads them with its own model). ``answer``
    is the model's own answer where the gate skipped and it was asked for (``answer_skipped=True``: the draft,
    continued), else None."""

    question: str
    method: str
    retrieved: bool
    decision: GateDecision
    documents: tuple[Document, ...]
    stages: tuple[Stage, ...]
    trace: Trace
    answer: str | None = None

    @classmethod
    def of(cls, trace: Trace) -> Retrieval:
        docs = tuple(Document.of(h) for h in trace.documents)
        answer = None if trace.retrieved or not trace.answer else trace.answer
        return cls(trace.question, trace.method, trace.retrieved, trace.gate, docs, trace.stages, trace, answer)


@dataclass(frozen=True)
class Calibration:
    """A threshold set from the gate scores of questions without answers (``Pipeline.calibrate``, ``ragate
    calibrate --questions``): ``tau`` keeps the share that retrieves at ``budget`` (at most, with ``confidence``).
    ``to_json()`` is the file ``ragate ask/eval/serve --calibration`` and ``Pipeline(calibration=)`` read."""

    method: str
    gate: str
    tau: float
    budget: float
    n: int
    retrieval_rate: float  # on the questions it was set on
    model: str | None
    engine: str
    confidence: float | None = None
    batch: int | None = None
    bound: str = "plain quantile F^-1(1 - budget) (TARG 3.3)"
    k: int | None = None  # with confidence: tau is the k-th smallest score
    expected_rate: float | None = None
    rate_interval: tuple[float, float] | None = None
    source: str = "questions"
    warning: str | None = None  # why the rate on these questions is far from the budget (ties, too few)

    @classmethod
    def from_scores(
        cls, scores: list[float], budget: float, *, confidence: float | None = None, batch: int | None = None,
        method: str, gate: str, model: str | None, engine: str, source: str = "questions",
    ) -> Calibration:
        """The threshold for ``budget`` over these gate scores (:func:`ragate.eval.thresholds.threshold_from_scores`:
        F^-1(1 - budget), TARG 3.3, or with ``confidence`` the order statistic that bounds the rate on new
        questions). Check the budget before scoring (``check_budget_value``)."""
        from ragate.eval.thresholds import threshold_from_scores

        found = threshold_from_scores(scores, budget, confidence=confidence, batch=batch)
        return cls(method=method, gate=gate, model=model, engine=engine, source=source, **found)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "method": self.method, "gate": self.gate, "objective": "budget", "budget": self.budget,
            "dev": self.source, "n": self.n, "model": self.model, "engine": self.engine, "tau": self.tau,
            "dev_retrieval_rate": self.retrieval_rate, "dev_em": None, "bound": self.bound,
        }  # fmt: skip
        if self.confidence is not None:
            out |= {
                "confidence": self.confidence, "batch": self.batch, "k": self.k, "expected_rate": self.expected_rate,
                "rate_interval": list(self.rate_interval) if self.rate_interval else None,
            }  # fmt: skip
        if self.warning:
            out["warning"] = self.warning
        return out

    def save(self, path: str | Path) -> Path:
        import json

        from ragate.fileio import atomic_writer

        with atomic_writer(path) as f:
            f.write(json.dumps(self.to_json(), indent=2).encode())
        return Path(path)


def check_question(question: str, max_chars: int = MAX_QUESTION_CHARS) -> str:
    """The question stripped; empty, over-long or not valid Unicode is a :class:`RagateError`."""
    if not isinstance(question, str):
        raise RagateError(f"a question is a string, not {type(question).__name__}")
    question = question.strip()
    if not question:
        raise RagateError('the question is empty: pass it in quotes, e.g. ragate ask "Who wrote Hamlet?"')
    if len(question) > max_chars:
        raise RagateError(
            f"the question is {len(question)} characters; ragate takes at most {max_chars} "
            "(put documents in an index, not in the question)"
        )
    try:
        question.encode("utf-8")
    except UnicodeEncodeError as err:
        raise RagateError(
            f"the question holds a lone surrogate ({question[err.start]!r} at character {err.start}) or bytes "
            "that are not UTF-8: pass valid text"
        ) from None
    return question
