"""What the framework adapters share: the ragate Pipeline an adapter answers with (given, or built from the
Pipeline keywords), a framework's retriever as a ragate search function, and the map from the ids ragate chose
back to the framework's own document objects, kept per call."""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import inspect
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, Literal, Self, TypeVar

from ragate.answers.savings import Cost
from ragate.errors import RagateError

if TYPE_CHECKING:
    from ragate.answers.answer import Answer, Retrieval
    from ragate.gates.base import GateDecision
    from ragate.pipeline import Pipeline

T = TypeVar("T")
Route = Literal["retrieve", "answer"]
SEARCH_KEYWORDS = ("index", "search", "retriever")

# The framework objects the searches of one call returned, by id: a dict per call (per context, so per thread and
# per asyncio task), opened by ``collecting()``; outside one, searches keep nothing.
_SEEN: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "ragate_integration_seen", default=None
)


class MissingFrameworkError(RagateError, ImportError):
    """An adapter imported without its framework installed; the message names the extra to install."""


def missing(framework: str, extra: str, err: ImportError) -> MissingFrameworkError:
    """The error for an adapter whose framework package is not installed."""
    return MissingFrameworkError(
        f"ragate.integrations.{extra} needs {framework} ({err.name or 'a package'} is not installed): "
        f"pip install 'ragate[{extra}]'"
    )


class OwnsPipeline:
    """What every adapter adds to its framework's class: ``close()`` frees the pipeline it built (a ``pipeline=``
    given stays the caller's), and ``with adapter: ...`` closes it at the end."""

    pipeline: Any
    _owned: bool

    def close(self) -> None:
        """Free the model and search of this adapter's pipeline, if the adapter built it."""
        if self._owned:
            self.pipeline.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FrameworkSearch(Generic[T]):
    """A framework's retriever as a ragate search function ``(query, k) -> list[dict]``.

    ``fetch(query, k)`` asks the framework's retriever for its documents (at most ``k`` are kept); ``convert``
    turns one into ragate's dict (:func:`record`). Inside :func:`collecting`, each document returned is kept by
    its id, so the documents ragate chooses map back to the framework's own objects."""

    def __init__(
        self, fetch: Callable[[str, int], Sequence[T]], convert: Callable[[T], dict[str, Any]], name: str
    ):
        self._fetch, self._convert, self.__name__ = fetch, convert, name

    def __call__(self, query: str, k: int) -> list[dict[str, Any]]:
        found = list(self._fetch(query, k))[:k]
        seen = _SEEN.get()
        records = []
        for item in found:
            entry = self._convert(item)
            if seen is not None:
                seen.setdefault(entry["id"], item)
            records.append(entry)
        return records

    def __repr__(self) -> str:
        return f"FrameworkSearch({self.__name__})"


def record(doc_id: Any, text: Any, title: Any = None, score: Any = None) -> dict[str, Any]:
    """ragate's search result for one framework document: its own id, its text, a title if it has a string one
    and its score if it is a finite number (else ragate ranks it by position)."""
    if doc_id is None or doc_id == "":
        raise RagateError(f"a document the retriever returned has no id (text {str(text)[:60]!r})")
    out: dict[str, Any] = {"id": str(doc_id), "text": text if isinstance(text, str) else ""}
    if isinstance(title, str) and title:
        out["title"] = title
    if isinstance(score, int | float) and not isinstance(score, bool) and math.isfinite(score):
        out["score"] = float(score)
    return out


@contextlib.contextmanager
def collecting() -> Iterator[dict[str, Any]]:
    """The framework objects the searches run inside this block return, by id (this call's only)."""
    seen: dict[str, Any] = {}
    token = _SEEN.set(seen)
    try:
        yield seen
    finally:
        _SEEN.reset(token)


def no_documents(query: str, k: int) -> list[dict[str, Any]]:
    """The search of a router given no retriever: it finds nothing (the router only decides)."""
    return []


def open_pipeline(
    adapter: str, pipeline: Pipeline | None, options: Mapping[str, Any], search: Any = None
) -> tuple[Pipeline, bool]:
    """The ragate pipeline ``adapter`` answers with, and whether the adapter built it (and so closes it).

    ``pipeline``: a ready one, used as it is (it searches with its own ``search=`` or index); else ``options``
    are :class:`ragate.Pipeline`'s keywords and ``search`` (the user's retriever as a search function) its search.
    """
    from ragate.pipeline import Pipeline

    if pipeline is not None:
        if options:
            raise RagateError(
                f"{adapter}: give pipeline= or the Pipeline keywords ({', '.join(sorted(options))}), not both: a "
                "ready pipeline already has its method, model and threshold"
            )
        if search is not None:
            raise RagateError(
                f"{adapter}: give pipeline= or retriever=, not both: a ready pipeline searches with its own "
                "search=; build it with search=as_search(retriever) to read your retriever's documents"
            )
        if not isinstance(pipeline, Pipeline):
            raise RagateError(f"{adapter}: pipeline= takes a ragate.Pipeline, not {type(pipeline).__name__}")
        return pipeline, False
    check_keywords(adapter, options)
    given = sorted(set(SEARCH_KEYWORDS) & set(options))
    if search is not None and given:
        raise RagateError(
            f"{adapter}: the retriever you pass is the pipeline's search; drop {', '.join(k + '=' for k in given)}"
        )
    if search is not None:
        return Pipeline(search=search, **options), True
    return Pipeline(**options), True


def check_keywords(adapter: str, options: Mapping[str, Any]) -> None:
    """Every keyword in ``options`` is one of :class:`ragate.Pipeline`'s; a typo gets "did you mean"."""
    from ragate.pipeline import Pipeline

    known = [name for name in inspect.signature(Pipeline.__init__).parameters if name != "self"]
    for name in options:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise RagateError(
                f"{adapter}: {name!r} is not a ragate.Pipeline keyword.{hint} The keywords: {', '.join(known)}"
            )


def open_model_pipeline(
    adapter: str, pipeline: Pipeline | None, options: dict[str, Any]
) -> tuple[Pipeline, bool]:
    """The pipeline a framework LLM type (``RagateLLM``, ``RagateChatModel``, ``RagateLLMGenerator``) answers
    with: ``pipeline`` as it is, else one built from ``options`` with method ``no-retrieval`` unless told (it only
    generates: no gate to check or load) and, without ``index=``, a search that finds nothing."""
    if pipeline is not None:
        return open_pipeline(adapter, pipeline, options)
    options = {"method": "no-retrieval", **options}
    return open_pipeline(adapter, None, options, None if "index" in options else no_documents)


@contextlib.contextmanager
def closed_on_error(pipeline: Pipeline, owned: bool) -> Iterator[None]:
    """Close the pipeline an adapter built (``owned``) when the framework's own constructor fails after it."""
    try:
        yield
    except BaseException:
        if owned:
            pipeline.close()
        raise


def router_search(options: Mapping[str, Any], search: Any) -> Any:
    """The search a router's pipeline is built with: the user's retriever, or, when neither it nor an index or
    search keyword is given, one that finds nothing (so deciding never builds the demo index)."""
    if search is None and not set(SEARCH_KEYWORDS) & set(options):
        return no_documents
    return search


def decide(pipeline: Pipeline, question: str) -> GateDecision:
    """The gate's decision on ``question`` (:meth:`ragate.Pipeline.decide`: only the gate runs; under a retrieval
    budget at the controller's threshold, and counted)."""
    return pipeline.decide(question)


def route(decision: GateDecision) -> Route:
    """A router's answer for a decision."""
    return "retrieve" if decision.retrieve else "answer"


def decision_record(method: str, decision: GateDecision) -> dict[str, Any]:
    """The gate's decision as plain data, for a framework's metadata."""
    return {
        "method": method,
        "retrieved": decision.retrieve,
        "score": decision.score,
        "threshold": decision.threshold,
        "reason": decision.reason,
    }


def question_of(value: Any, key: str) -> str:
    """The question in a router's input: a string, or the ``key`` item or attribute of a state."""
    if isinstance(value, Mapping):
        if key not in value:
            keys = ", ".join(map(repr, value))
            raise RagateError(
                f"the state has no {key!r} key (its keys: {keys}); name the question's with question_key="
            )
        value = value[key]
    elif not isinstance(value, str) and hasattr(value, key):
        value = getattr(value, key)
    if not isinstance(value, str):
        raise RagateError(
            f"the question is a {type(value).__name__}: pass a str, or a state with a {key!r} str"
        )
    return value


def result_record(
    pipeline: Pipeline, result: Answer | Retrieval, *, read_elsewhere: bool = False, read: Cost | None = None
) -> dict[str, Any]:
    """The decision and the savings of one answer, for a framework's result object: :func:`decision_record` and
    ``savings`` (:meth:`ragate.Pipeline.savings`, what ``ragate serve`` reports per request). ``read_elsewhere``:
    the framework's own LLM read the documents, outside ragate's trace; ``read`` is what that read cost, from the
    LLM's own usage (:func:`usage_cost`): it is added to the answer's cost and feeds the estimate that a skip's
    savings come from. Without it a retrieved answer's savings are None (unknown) and feed nothing."""
    out = decision_record(result.method, result.decision)
    if read_elsewhere and result.retrieved and read is None:
        out["savings"] = None
    else:
        out["savings"] = pipeline.savings(result.trace, read=read if result.retrieved else None).to_json()
    return out


def usage_cost(prompt_tokens: object, completion_tokens: object, seconds: float) -> Cost | None:
    """What one read by a framework's LLM cost, from the usage the LLM reported; None where it reported no
    whole-number token counts (the savings then stay unknown rather than guessed)."""
    counts = [prompt_tokens, completion_tokens]
    if any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in counts):
        return None
    return Cost(int(prompt_tokens) + int(completion_tokens), max(0.0, float(seconds)))  # type: ignore[call-overload]


class DirectAnswers:
    """The model's own answers a router kept for the questions it routed away from retrieval, until the branch
    that answers without retrieval takes them (by question; bounded: the oldest go first)."""

    def __init__(self, limit: int = 256) -> None:
        self._kept: OrderedDict[str, tuple[Any, dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()
        self._limit = limit

    def keep(self, question: str, result: Any, record: dict[str, Any]) -> None:
        with self._lock:
            self._kept[question] = (result, record)
            self._kept.move_to_end(question)
            while len(self._kept) > self._limit:
                self._kept.popitem(last=False)

    def take(self, question: str) -> tuple[Any, dict[str, Any]] | None:
        with self._lock:
            return self._kept.pop(question, None)
