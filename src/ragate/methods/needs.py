"""What each gate and dynamic trigger needs from a backend, and the check every entry point runs first.

A backend states what it returns (:class:`~ragate.backends.base.Capabilities`): the full next-token
distribution (llama.cpp, transformers), the top-k log-probabilities of each step (OpenAI-style APIs, k <= 20),
or text only (many hosted and reasoning models). A method states what its gate or trigger reads (the registered
gate's or trigger's ``need``). :func:`support` compares the two and says how the method runs:

- ``exact``: the score is the paper's;
- ``approximate``: an entropy estimated from the top-k log-probabilities instead of the full distribution
  (:func:`ragate.uncertainty.topk_entropy`); the decision's reason says so;
- ``text``: the decision is read from the reply text and the score is coarse (the LLM judge's P(yes) becomes
  1/0.5/0 from the words "yes"/"no");
- ``unavailable``: the method cannot run; :func:`require` raises a :class:`CapabilityError` naming what is
  missing and the methods that would run, or swaps in the ``fallback`` gate and names it in the method.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from ragate.backends.base import Backend, Capabilities
from ragate.errors import CapabilityError, IndexNeedError, RagateError
from ragate.gates.base import Need, Support, support
from ragate.gates.registry import gate_names, get_gate
from ragate.methods.spec import RERANK_SELECTORS, GateSpec, MethodSpec
from ragate.methods.triggers import trigger_need
from ragate.retrieval.types import Retriever

# the gate `ragate serve` falls back to when no method was named and the backend cannot serve the default's:
# PAIRS's agreement needs only answer text (verbalised confidence is cheaper, but Qwen2.5-Coder-1.5B states
# 0.9 for nearly every answer: benchmarks/topk_fidelity.py)
DEFAULT_TEXT_GATE = "pairs"


def gate_need(kind: str) -> Need:
    """What the gate named ``kind`` reads (its registered :class:`~ragate.gates.base.Gate`'s ``need``)."""
    return get_gate(kind).need


_CRAG = Need(
    token_logprobs=True, top_k=2, text_fallback=True
)  # each passage's grade is P(yes), else its word


def method_need(spec: MethodSpec) -> Need:
    if spec.dynamic is not None:
        return trigger_need(spec.dynamic.trigger)
    if spec.crag is not None:
        return _CRAG
    if spec.gate.kind == "learned" and spec.gate.weights is not None:  # what its file reads, not every file
        from ragate.gates.learned import learned_in_force

        return learned_in_force(spec.gate.weights).need  # the gate in force while its file is being replaced
    return gate_need(spec.gate.kind)


_SUPPORT_ORDER: tuple[Support, ...] = ("unavailable", "text", "approximate", "exact")


def method_support(spec: MethodSpec, caps: Capabilities) -> tuple[Support, str]:
    if spec.route is not None:  # a route method runs as its least served route does
        from ragate.methods.route import route_specs

        found = [(method_support(s, caps), s.name) for s in route_specs(spec.route)]
        (status, why), name = min(found, key=lambda f: _SUPPORT_ORDER.index(f[0][0]))
        return status, why if status == "exact" else f"route {name!r}: {why}"
    if spec.dynamic is not None and not caps.continues:
        return "unavailable", (
            "the backend cannot continue the model's own text (an OpenAI-style chat endpoint), which a dynamic "
            "method does after every retrieval; run it with a local engine (--backend llama.cpp or transformers)"
        )
    return support(method_need(spec), caps)


def runnable(specs: Iterable[MethodSpec], caps: Capabilities) -> list[str]:
    """Names of the methods among ``specs`` that run on ``caps``."""
    return [s.name for s in specs if method_support(s, caps)[0] != "unavailable"]


def require(
    spec: MethodSpec,
    caps: Capabilities,
    *,
    engine: str,
    fallback: str | None = None,
    rename: bool = True,
    swappable: bool = True,
) -> MethodSpec:
    """``spec`` itself when it runs on ``caps``; else ``spec`` with the ``fallback`` gate, renamed
    ``NAME:fallback=GATE`` (``rename``; an eval run records the fallback in its config instead) so that answers
    say which gate decided; else a :class:`CapabilityError` naming what is missing and the methods that would
    run. ``swappable=False``: the method is a route of a route method, which has no gate to swap either, so the
    error offers no ``--fallback``."""
    from ragate.methods.registry import all_methods  # the registry imports this module's users

    if spec.route is not None:  # a route method runs where every route runs (no fallback: a route is a method)
        from ragate.methods.route import route_specs

        for route in route_specs(spec.route):
            try:
                require(route, caps, engine=engine, swappable=False)
            except CapabilityError as err:
                raise CapabilityError(f"the route method cannot run its route {route.name!r}: {err}") from None
        return spec
    status, why = method_support(spec, caps)
    if status != "unavailable":
        return spec
    need = method_need(spec)
    if fallback is not None:
        if fallback not in gate_names():
            raise CapabilityError(
                f"unknown fallback gate {fallback!r}; choose one of: {', '.join(gate_names())}"
            )
        if spec.dynamic is not None:
            raise CapabilityError(
                f"{spec.name!r} is a dynamic method ({why}); --fallback replaces a single-shot gate, so run a "
                f"single-shot method instead (e.g. --method pairs)"
            )
        gate = GateSpec(fallback)
        fell, fell_why = support(gate_need(gate.kind), caps)
        if fell == "unavailable":
            raise CapabilityError(f"the fallback gate {fallback!r} cannot run either: {fell_why}")
        return replace(spec, name=f"{spec.name}:fallback={fallback}" if rename else spec.name, gate=gate)
    would = runnable(all_methods().values(), caps)
    if spec.dynamic is not None or not swappable:  # --fallback swaps a single-shot method's gate
        raise CapabilityError(
            f"method {spec.name!r} cannot run on the {engine} backend: {why}. Methods that run on it: "
            f"{', '.join(would)}"
        )
    gates = [g for g in gate_names() if support(gate_need(g), caps)[0] != "unavailable"]
    raise CapabilityError(
        f"method {spec.name!r} needs {need.describe()}, but {why} (the {engine} backend). Methods that run on "
        f"it: {', '.join(would)}. Or keep this method's selector with another gate: --fallback GATE, one of "
        f"{', '.join(gates)}"
    )


def capability_report(caps: Capabilities) -> dict[str, object]:
    """A backend's capabilities and, per gate, how it runs there (``ragate ask --json``, /healthz)."""
    logprobs = "full distribution" if caps.full_distribution else (
        f"top-{caps.top_k}" if caps.logprobs and caps.top_k else ("token only" if caps.logprobs else "none")
    )  # fmt: skip
    return {
        "logprobs": logprobs,
        "top_k": caps.top_k,
        "attentions": caps.attentions,
        "sampling": caps.sampling,
        "gates": {g: support(gate_need(g), caps)[0] for g in gate_names()},
    }


def capability_summary(backend: Backend) -> dict[str, object]:
    """:func:`capability_report` of a backend plus how its capabilities were found (``capability_note``)."""
    report = capability_report(backend.capabilities)
    note = getattr(backend, "capability_note", "")
    return {**report, "note": note} if note else report


# selectors that compare vectors of one encoder (DPR-AIS, PAIRS Eqs. 4-8) and the one that searches by a vector
_EMBEDDING_SELECTORS = ("dpr-ais", "dpr-ais-question", "dpr-ais-pseudo")
_VECTOR_SELECTORS = ("hyde",)


def index_needs(spec: MethodSpec) -> list[str]:
    """What ``spec`` needs from its index beyond search: ``"embeddings"`` (its selector or gate compares the
    encoder's vectors) and ``"vector search"`` (HyDE searches with an averaged vector)."""
    return [need for need, _ in _index_needs(spec)]


def _index_needs(spec: MethodSpec) -> list[tuple[str, str]]:
    """(need, what in the method has it) pairs."""
    if spec.dynamic is not None or not spec.retrieves:
        return []
    sel = spec.selector
    needs = []
    if sel.kind in _EMBEDDING_SELECTORS:
        needs.append(("embeddings", f"its selector {sel.kind!r} compares embeddings"))
    if spec.crag is None and get_gate(spec.gate.kind).needs_embeddings:
        needs.append(("embeddings", f"its gate {spec.gate.kind!r} embeds with the index's encoder"))
    if sel.kind in _VECTOR_SELECTORS:
        needs.append(("vector search", f"its selector {sel.kind!r} searches with an averaged embedding"))
    return needs


def require_reranker(spec: MethodSpec) -> None:
    """A :class:`RagateError` before any LM call when a rerank selector has no cross-encoder to read K from."""
    sel = spec.selector
    if spec.dynamic is None and sel.kind in RERANK_SELECTORS and not sel.cross_encoder:
        raise RagateError(
            f"method {spec.name!r} reranks with a cross-encoder and none was given: pass --cross-encoder DIR to "
            "ragate ask or eval, or cross_encoder=DIR to ragate.Pipeline (a sentence-transformers CrossEncoder "
            "folder; none ships in a package registry reachable here); dpr-ais-sum ranks the same pool by the "
            "bi-encoder's cosines instead"
        )


def require_index(spec: MethodSpec, retriever: Retriever, *, where: str = "") -> None:
    """An :class:`IndexNeedError` before any LM call when ``retriever`` cannot serve what ``spec`` reads from it
    (DTR's and PAIRS's selection over a BM25 index, HyDE over a search that cannot take a vector)."""
    where = where or f"the {retriever.kind} index"
    if spec.route is not None:
        from ragate.methods.route import route_specs

        for route in route_specs(spec.route):
            require_index(route, retriever, where=where)
        return
    require_reranker(spec)
    if spec.dynamic is None and spec.crag is None and get_gate(spec.gate.kind).counts_terms:
        from ragate.gates.signals import has_term_counts

        if not has_term_counts(retriever):
            raise IndexNeedError(
                f"method {spec.name!r}: its gate {spec.gate.kind!r} counts terms in your corpus, and {where} has no "
                "passages to count: give the search function your documents' texts once (ragate.Pipeline(search="
                "..., corpus=texts); a framework adapter takes corpus= too), or build an index (`ragate index "
                "build`)"
            )
    for need, why in _index_needs(spec):
        if need == "embeddings" and not retriever.has_embeddings:
            raise IndexNeedError(
                f"method {spec.name!r} needs passage embeddings ({why}), but {where} is a {retriever.kind} index "
                "and holds none: build a dense or hybrid index (`ragate index build ... --kind hybrid`), or "
                "choose a method that only searches (standard-rag, targ-margin, ... or --selector question)"
            )
        if need == "vector search" and not retriever.searches_by_vector:
            raise IndexNeedError(
                f"method {spec.name!r} cannot run on {where} ({why}), which cannot search by vector: use a dense "
                "or hybrid index, or q2d (which searches with text)"
            )
