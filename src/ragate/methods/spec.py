"""Method recipes: a gate (when to retrieve) + a selector (how to choose what to read) + the paper's prompts.

Any gate combines with any selector: a named method is just a default pairing with its paper's settings.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal, get_args

from ragate.errors import RagateError
from ragate.gates.spec import GateSpec
from ragate.methods.prompts import DTR, PromptSet
from ragate.selection.ais import AISScore

if TYPE_CHECKING:
    from ragate.methods.route_policy import RoutePolicyModel

SelectorKind = Literal[
    "question", "hyde", "q2d", "cot", "dpr-ais", "dpr-ais-question", "dpr-ais-pseudo",
    "fixed-2q1p", "fixed-1q2p", "dpr-ais-rerank", "rerank",
]  # fmt: skip
RERANK_SELECTORS: tuple[SelectorKind, ...] = ("dpr-ais-rerank", "rerank")  # read K from a cross-encoder

SELECTORS: tuple[SelectorKind, ...] = get_args(SelectorKind)


@dataclass(frozen=True)
class SelectorSpec:
    """How documents are chosen once the gate says "retrieve"."""

    kind: SelectorKind
    k: int = 3  # documents the reader sees (DTR, PAIRS); TARG uses 5
    n: int = 5  # per path in DPR
    score: AISScore = "cos"
    hyde_samples: int = 1  # HyDE's N (the original uses 8 at T = 0.7; 1 greedy keeps CPU runs short)
    repeats: int = 5  # Q2D / CoT: the question repeated this many times before the generated text
    cross_encoder: str | None = None  # dpr-ais-rerank, rerank: a sentence-transformers CrossEncoder folder


QueryForm = Literal["auto", "attention", "question-masked", "masked", "sentence", "chunk", "question"]
Cut = Literal["word", "sentence", "none"]
Passages = Literal["rest", "sentence"]
Exemplars = Literal["authors", "ragate-3"]  # ragate.dynamic.prompts.exemplars_for
SAFETY_RETRIEVALS = 10  # the bound on a method with no retrieval cap (its record says when it was reached)


@dataclass(frozen=True)
class DynamicSpec:
    """A dynamic-RAG method (ragate.dynamic): what watches the generation, how it asks, where it cuts.

    ``trigger`` names a registered trigger (:mod:`ragate.methods.triggers`; "none": no trigger) and
    ``threshold`` None is its default. ``query`` "auto" is DRAGIN's attention query (over the question and the
    text so far, ETC section 3.3) when the backend returns attentions, else "question-masked": the question, then
    FLARE's masked sentence, so that ETC and DRAGIN ask by one rule that always includes the question
    (:mod:`ragate.dynamic.query`). ``cut`` is where the output is cut back when the trigger fires: at the word
    that fired ("word"), at the start of its sentence ("sentence"), or nowhere ("none": IRCoT, RALM and the
    re-check keep what they wrote). ``initial`` retrieves with the question before generating (Single RAG,
    IRCoT, RALM). ``every`` is RALM's n and the re-check's m. ``max_retrievals`` None is no cap (ETC and DRAGIN:
    neither paper has one), bounded for safety at :data:`SAFETY_RETRIEVALS`, which the record notes when
    reached. ``passages`` "rest": the passages stay in the prompt for everything written after the retrieval;
    "sentence": for one sentence, then the prompt is the question and the text so far again (the authors' code of
    DRAGIN and ETC, ``get_top_sentence``). ``signed`` compares ETC's trend signed (``trend >= alpha``, the
    authors' code) instead of its absolute value (the paper). ``settle``: after a triggered retrieval the first
    sentence over the new passages is written before the trigger watches again, as the authors' code of DRAGIN
    and ETC writes it (unchecked); it guarantees a sentence of progress per retrieval. Without it and without a
    cap, DRAGIN fired again at the first word after its cut: on 35 of the first 68 HotpotQA questions it reached
    the safety bound of 10 retrievals (a re-measure of 2026-11-26, discarded). ``exemplars`` picks the few-shot
    chain-of-thought exemplars: "authors" the authors' set and number per dataset family (DRAGIN's and ETC's code,
    ETC section 4.2; ``ragate/data/exemplars/``), "ragate-3" ragate's own three per family (the old default).
    """

    trigger: str
    threshold: float | None = None
    query: QueryForm = "auto"
    cut: Cut = "word"
    initial: bool = False
    k: int = 3  # passages per retrieval (ETC section 4.2, DRAGIN's retrieve_topk)
    max_retrievals: int | None = 3
    max_tokens: int = 100  # DRAGIN's generate_max_length
    every: int = 16
    top_n: int = 35  # DRAGIN's retrieve_keep_top_k (HotpotQA config)
    mask_below: float = 0.4  # FLARE's masked query: drop tokens with probability below this
    accumulate: bool = False  # IRCoT keeps every passage it has read (up to max_documents)
    max_documents: int = 6
    passages: Passages = "rest"
    signed: bool = False
    settle: bool = False
    entropy: Literal["token", "word"] = "token"  # ETC's entropy sequence: per token (Eqs. 3-4) or per word
    exemplars: Exemplars = "authors"

    @property
    def retrieval_bound(self) -> int:
        """The most retrievals the trigger may ask for: the cap, or the safety bound when there is none."""
        return SAFETY_RETRIEVALS if self.max_retrievals is None else self.max_retrievals


CragIncorrect = Literal["closed-book", "rewrite"]


@dataclass(frozen=True)
class CragSpec:
    """CRAG-lite (ragate.methods.crag_lite): grade the top-k passages, then act (CRAG section 4.2).

    A passage's grade is P(relevant) from a yes/no prompt. ``upper``/``lower`` are CRAG's two thresholds: some
    passage >= ``upper`` is *correct* (read the passages graded >= ``lower``), every passage < ``lower`` is
    *incorrect*, anything else *ambiguous* (read the passages graded >= ``lower``, or all when none is).
    ``incorrect``: "closed-book" answers without the passages, keeping TARG's bound of one retrieval call
    (section 5.1, the default); "rewrite" is CRAG's own action in one step: the model writes a search query and
    the answer reads its top-k (a second retrieval call).
    """

    upper: float = 0.7
    lower: float = 0.3
    incorrect: CragIncorrect = "closed-book"


RoutePolicy = Literal["cascade", "calibrated", "adaptive-rag", "learned"]
ROUTE_POLICIES: tuple[str, ...] = get_args(RoutePolicy)
POLICY_NAMES = ", ".join(ROUTE_POLICIES[:-1]) + " or " + ROUTE_POLICIES[-1]  # for messages


@dataclass(frozen=True)
class RouteSpec:
    """Routes as one method (ragate.methods.route): ``routes`` names registered methods, cheapest first (closed-book,
    one retrieval, many), all in one answer format (every route a chain-of-thought method, or every route
    single-shot) so that their answers and checks compare. ``policy`` "cascade": answer with the first route and
    stop when its answer checks out, else pay for the next. A route's answer checks out when its normalised NLL is
    at most that stage's ``stop_nll`` (one per route but the last; None: DTR's default tau for each), or, with
    ``agree``, when it agrees with the answer of the route before it (PAIRS's idea, applied after the answer). With
    ``evidence`` (off by default), an answer written from documents stops only where it is found whole in them (the evidence check,
    :func:`ragate.text.supported`). A stop threshold of -inf: that stage never stops on NLL. ``policy``
    "adaptive-rag" or "learned" chooses from features instead, with the fitted ``model`` a route calibration file
    holds (:mod:`ragate.methods.route_policy`)."""

    routes: tuple[str, ...]
    policy: RoutePolicy = "cascade"
    stop_nll: tuple[float, ...] | None = None
    agree: bool = True
    evidence: bool = False  # opt-in: see ragate.methods.route
    max_tokens: int | None = None  # every route's answer length (None: each route's own)
    k: int | None = None  # every route's documents per retrieval (None: each route's own)
    model: RoutePolicyModel | None = None  # the adaptive-rag or learned policy's fit


@dataclass(frozen=True)
class MethodSpec:
    name: str
    description: str
    gate: GateSpec
    selector: SelectorSpec
    prompts: PromptSet = DTR
    max_tokens: int = 64
    # DTR's and PAIRS's pseudo-context: the authors' code allows 1024 tokens. Measured on the first 50 NQ
    # questions with Qwen2.5-Coder-1.5B (benchmarks/pseudo_length.py, results/pseudo_length.txt): PAIRS's prompt
    # gives a median of 258 tokens, 37 of 50 end by themselves (all but one within 512) and 13 repeat themselves
    # until cut, so no cap up to 1024 lets 90% end; DTR's, a median of 99, 49 of 50 end (384 would cover 94%).
    # 128 (ragate before 2026-11-26) cut 92% and 30%. The record counts the calls that hit the cap.
    pseudo_max_tokens: int = 1024
    expansion_max_tokens: int = 128  # HyDE's, Query2doc's and CoT's generated text (Query2doc: 128)
    dynamic: DynamicSpec | None = None  # set: a dynamic-RAG method (gate and selector unused)
    crag: CragSpec | None = None  # set: CRAG-lite (gate unused: it retrieves, then grades what it found)
    route: RouteSpec | None = None  # set: routes chosen per question (gate, selector and prompts: each route's)

    def with_(self, **changes: object) -> MethodSpec:
        return replace(self, **changes)  # type: ignore[arg-type]

    def with_limits(self, max_tokens: int | None, k: int | None) -> MethodSpec:
        """This method with every answer stage bounded to ``max_tokens`` and ``k`` documents read (a dynamic
        method's per retrieval; a selector's pool at least ``k``); None keeps the method's own."""
        spec = self
        if max_tokens is not None:
            spec = replace(spec, max_tokens=max_tokens)
            if spec.dynamic is not None:
                spec = replace(spec, dynamic=replace(spec.dynamic, max_tokens=max_tokens))
        if k is not None:
            spec = replace(spec, selector=replace(spec.selector, k=k, n=max(spec.selector.n, k)))
            if spec.dynamic is not None:
                spec = replace(spec, dynamic=replace(spec.dynamic, k=k))
        return spec

    def with_threshold(self, tau: float | None) -> MethodSpec:
        """This method with its gate's threshold (a dynamic method: its trigger's; a route method: its policy's, the
        learned policy's lambda, each stage's NLL or, for the calibrated cascade, P(right) to stop at; adaptive-rag
        has none) set to ``tau`` (None: as is)."""
        if tau is None:
            return self
        if self.route is not None and self.route.policy == "learned" and self.route.model is not None:
            if not tau >= 0:  # the learned policy's threshold is its price of one retrieval (a live route budget's)
                raise RagateError(f"the learned route policy's threshold is lambda, 0 or more, not {tau!r}")
            return replace(self, route=replace(self.route, model=replace(self.route.model, lam=float(tau))))
        if self.route is not None and self.route.policy == "adaptive-rag":
            raise RagateError("adaptive-rag chooses the route from the question alone: it has no threshold to set")
        if self.route is not None:  # one stop threshold for every stage's answer check
            stops = (float(tau),) * (len(self.route.routes) - 1)
            if self.route.policy == "calibrated" and self.route.model is not None:  # each stage's P(right) to stop
                return replace(self, route=replace(self.route, model=replace(self.route.model, stops=stops)))
            return replace(self, route=replace(self.route, stop_nll=stops))
        if self.dynamic is not None:
            return replace(self, dynamic=replace(self.dynamic, threshold=tau))
        return replace(self, gate=replace(self.gate, threshold=tau))

    @property
    def retrieves(self) -> bool:
        """Whether the method can ever read the index (and so needs one)."""
        if self.route is not None:
            return True  # a route after the first reads it (ragate.methods.route checks the order)
        if self.dynamic is not None:
            return self.dynamic.trigger != "none" or self.dynamic.initial
        return self.crag is not None or self.gate.kind != "never"

    def no_index(self) -> ValueError:
        """The error for this method run without the index it reads."""
        return ValueError(f"method {self.name!r} retrieves: give it an index (--index DIR)")
