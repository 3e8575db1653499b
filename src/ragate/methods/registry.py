"""Named methods with their papers' defaults. ``get_method("dtr")``; a typo gets "did you mean".

Recipes are small frozen records; the modules that run them are imported only when a method runs. Beside
ragate's own methods (:data:`METHODS`), a registered gate or trigger names a method of its own (the method its
``like`` names, with that gate or trigger), and :func:`register_method` adds any other recipe; all of them run
in ``ragate ask``, ``eval``, ``sweep``, ``calibrate``, ``serve`` and :class:`ragate.Pipeline`.
"""

from __future__ import annotations

import difflib
import threading
from collections.abc import Callable
from dataclasses import replace

from ragate.errors import RagateError
from ragate.gates.base import Gate
from ragate.gates.registry import GATE_REGISTRY, get_gate
from ragate.methods.corpus import CORPUS_METHODS
from ragate.methods.no_model import LEARNED_METHOD, NO_MODEL_METHODS
from ragate.methods.prompts import PAIRS, TARG, TARG_CONTEXT_FIRST
from ragate.methods.spec import CragSpec, DynamicSpec, GateSpec, MethodSpec, RouteSpec, SelectorSpec
from ragate.methods.triggers import TRIGGER_REGISTRY, Trigger, trigger_class
from ragate.methods.triggers import register_trigger as add_trigger

_Q = SelectorSpec("question")
_DPR = SelectorSpec("dpr-ais")
_TARG_SELECT = SelectorSpec("question", k=5)  # TARG: top-K = 5, "[title] text"

_METHODS = (
    MethodSpec("no-retrieval", "answer from the question alone (DTR Fig. 11)", GateSpec("never"), _Q),
    MethodSpec(
        "standard-rag", "always retrieve top-3 for the question (DTR Fig. 12)", GateSpec("always"), _Q
    ),
    MethodSpec(
        "standard-rag-pairs-prompts",
        "Standard RAG (top-3 for the question) read with PAIRS's prompts: the reader-prompt ablation",
        GateSpec("always"),
        _Q,
        PAIRS,
    ),
    MethodSpec(
        "llm-judge", "ask the model whether it needs information (DTR Fig. 15)", GateSpec("llm-judge"), _Q
    ),
    MethodSpec(
        "hyde",
        "always retrieve with a hypothetical document (HyDE)",
        GateSpec("always"),
        SelectorSpec("hyde"),
    ),
    MethodSpec(
        "q2d",
        "always retrieve with question x5 + pseudo-document (Query2doc)",
        GateSpec("always"),
        SelectorSpec("q2d"),
    ),
    MethodSpec(
        "cot",
        "always retrieve with question x5 + chain of thought (DTR Fig. 14)",
        GateSpec("always"),
        SelectorSpec("cot"),
    ),
    *(  # PAIRS's baseline rows (its Table 2) read with PAIRS's own prompts (Fig. 9), not DTR's
        MethodSpec(
            f"{name}-pairs-prompts",
            f"{name} read with PAIRS's prompts (PAIRS Table 2's baseline row)",
            GateSpec(gate),
            selector,
            PAIRS,
        )
        for name, gate, selector in (
            ("no-retrieval", "never", _Q),
            ("hyde", "always", SelectorSpec("hyde")),
            ("q2d", "always", SelectorSpec("q2d")),
            ("cot", "always", SelectorSpec("cot")),
        )
    ),
    MethodSpec("dtr", "DTR: UGT gate (tau 0.001) + dual-path retrieval + AIS cos", GateSpec("ugt"), _DPR),
    MethodSpec("dtr-no-ugt", "DTR without UGT: DPR-AIS for every question", GateSpec("always"), _DPR),
    MethodSpec(
        "dpr-ais", "PAIRS's DPR-AIS for every question (PAIRS prompts)", GateSpec("always"), _DPR, PAIRS
    ),
    MethodSpec(
        "dpr-ais-dynamic",
        "DPR-AIS with PAIRS's dynamic alpha (Eq. 8)",
        GateSpec("always"),
        SelectorSpec("dpr-ais", score="dynamic"),
        PAIRS,
    ),
    MethodSpec(
        "dpr-ais-sum",
        "DPR pool ranked by cos(d,q) + cos(d,p) (PAIRS Eq. 1, DTR Eq. 4): Eq. 7 with the bi-encoder as K",
        GateSpec("always"),
        SelectorSpec("dpr-ais", score="sum"),
        PAIRS,
    ),
    MethodSpec(
        "dpr-ais-rerank",
        "DPR pool reranked by a cross-encoder, K(d,q) + K(d,p) (PAIRS Eq. 7; needs --cross-encoder)",
        GateSpec("always"),
        SelectorSpec("dpr-ais-rerank"),
        PAIRS,
    ),
    MethodSpec(
        "rerank",
        "PAIRS's Rerank baseline: the question's top 10 reordered by a cross-encoder, top 3 read (needs --cross-encoder)",
        GateSpec("always"),
        SelectorSpec("rerank", n=10),
        PAIRS,
    ),
    MethodSpec(
        "pairs",
        "PAIRS: skip retrieval when direct and pseudo-context answers agree, else DPR-AIS",
        GateSpec("pairs"),
        _DPR,
        PAIRS,
    ),
    MethodSpec(
        "pairs-exclude-num",
        "PAIRS, but answers with numbers always retrieve (Table 5)",
        GateSpec("pairs-exclude-num"),
        _DPR,
        PAIRS,
    ),
    MethodSpec(
        "pairs-lenient",
        "PAIRS, the two answers agreeing also when one contains the other as whole words (ragate's reading)",
        GateSpec("pairs-lenient"),
        _DPR,
        PAIRS,
    ),
    MethodSpec(
        "targ-entropy",
        "TARG: mean entropy of a 20-token draft (Eq. 1)",
        GateSpec("targ-entropy"),
        _TARG_SELECT,
        TARG,
    ),
    MethodSpec(
        "targ-margin",
        "TARG: mean exp(-gap/3) of a 20-token draft (Eq. 2)",
        GateSpec("targ-margin"),
        _TARG_SELECT,
        TARG,
    ),
    MethodSpec(
        "targ-variance",
        "TARG: disagreement of 5 sampled 20-token drafts at T=0.7 (Eq. 3)",
        GateSpec("targ-variance"),
        _TARG_SELECT,
        TARG,
    ),
    *(  # the form of Eqs. 1-2 ragate had before 2026-11-28: a draft shorter than k averaged over its tokens
        MethodSpec(
            f"targ-{gate}-present",
            f"TARG's {gate} gate with a draft that ends before k averaged over its tokens, not divided by k "
            "(ragate before 2026-11-28)",
            GateSpec(f"targ-{gate}-present"),
            _TARG_SELECT,
            TARG,
        )
        for gate in ("entropy", "margin")
    ),
    *(  # anytime gates: Eqs. 1-2 over a shorter draft, each with its own tau_k (TARG A.5, A.8)
        MethodSpec(
            f"targ-{gate}@k={k}",
            f"TARG's {gate} gate read after {k} draft tokens (an anytime gate: calibrate its own tau)",
            GateSpec(f"targ-{gate}@k={k}", prefix=k),
            _TARG_SELECT,
            TARG,
        )
        for gate in ("entropy", "margin")
        for k in (5, 10)
    ),
    *(  # a small proxy model's draft decides for the answering model (SlimPLM's idea; TARG's reader)
        MethodSpec(
            f"proxy-{gate}",
            f"TARG's {gate} gate over a small proxy model's 20-token draft (default SmolLM2-135M); the answering "
            "model is asked for text only",
            GateSpec(f"proxy-{gate}"),
            _TARG_SELECT,
            TARG,
        )
        for gate in ("margin", "entropy")
    ),
    MethodSpec(
        "targ-always",
        "TARG's reader for every question: the question, then the top-5 passages (Eq. 5)",
        GateSpec("always"),
        _TARG_SELECT,
        TARG,
    ),
    MethodSpec(
        "targ-always-context-first",
        "TARG's reader for every question with the passages before the question (ragate before 2026-11-26)",
        GateSpec("always"),
        _TARG_SELECT,
        TARG_CONTEXT_FIRST,
    ),
    MethodSpec(
        "verbal-confidence",
        "the model states P(its answer is right); retrieve below 0.5 (Tian et al. 2023; no logprobs needed)",
        GateSpec("verbal-confidence"),
        _Q,
    ),
    # TARG section 5.1's expanded baselines (Tables 3-4), each with TARG's reader (its prompts, top-5)
    MethodSpec(
        "self-eval",
        "TARG's Self-Eval gate: the model is asked 'do you need to search for this?'",
        GateSpec("self-eval"),
        _TARG_SELECT,
        TARG,
    ),
    MethodSpec(
        "self-rag-lite",
        "Self-RAG-lite: draft, one reflection on whether the draft needs evidence, retrieve once if so",
        GateSpec("self-rag-lite"),
        _TARG_SELECT,
        TARG,
    ),
    MethodSpec(
        "skr",
        "SKR: the k = 10 nearest labelled training questions vote on retrieval (needs --skr-labels)",
        GateSpec("skr"),
        _TARG_SELECT,
        TARG,
    ),
    MethodSpec(
        "crag-lite",
        "CRAG-lite: retrieve top-5, the model grades each passage; incorrect: answer closed-book",
        GateSpec("always"),
        _TARG_SELECT,
        TARG,
        crag=CragSpec(),
    ),
    MethodSpec(
        "crag-lite-rewrite",
        "CRAG-lite, but incorrect rewrites the query and retrieves once more (CRAG's action)",
        GateSpec("always"),
        _TARG_SELECT,
        TARG,
        crag=CragSpec(incorrect="rewrite"),
    ),
    MethodSpec("random", "retrieve for a random half of the questions (the control)", GateSpec("random"), _Q),
    *NO_MODEL_METHODS,  # gates that read no model (ragate.gates.nomodel), with TARG's reader
    *CORPUS_METHODS,  # corpus-aware gates (ragate.gates.corpus), with TARG's reader
    LEARNED_METHOD,  # the gate learned from labelled traffic (ragate.gates.learned), with TARG's reader
    # dynamic RAG (ragate.dynamic): few-shot chain of thought, retrieval decided while the model writes
    *(
        MethodSpec(name, description, GateSpec("never"), _Q, dynamic=dynamic)
        for name, description, dynamic in (
            (
                "etc",
                "ETC: retrieve when |smoothed 2nd difference of entropy| >= alpha",
                DynamicSpec("etc", max_retrievals=None, settle=True),
            ),
            (
                "etc-signed",
                "ETC comparing the trend signed, as the authors' code (a drop of entropy does not fire)",
                DynamicSpec("etc", max_retrievals=None, settle=True, signed=True),
            ),
            (
                "etc-per-word",
                "ETC over one entropy per content word (its first sub-token) instead of per token (Eqs. 3-4)",
                DynamicSpec("etc", max_retrievals=None, settle=True, entropy="word"),
            ),
            (
                "etc-sentence-passages",
                "ETC whose passages serve one sentence, as the authors' code",
                DynamicSpec("etc", max_retrievals=None, settle=True, passages="sentence"),
            ),
            (
                "etc-1st",
                "ETC with the smoothed 1st difference (ablation)",
                DynamicSpec("etc-1st", max_retrievals=None, settle=True),
            ),
            (
                "etc-no-smoothing",
                "ETC without smoothing (ablation)",
                DynamicSpec("etc-no-smoothing", max_retrievals=None, settle=True),
            ),
            (
                "etc-fixed",
                "ETC with a fixed weight w = 0.9 (ablation)",
                DynamicSpec("etc-fixed", max_retrievals=None, settle=True),
            ),
            (
                "etc-code",
                "ETC as the authors' code: signed, attention-weighted, per sentence, passages for one sentence",
                DynamicSpec("etc-code", max_retrievals=None, settle=True, passages="sentence"),
            ),
            (
                "etc-ragate-3",
                "ETC with ragate's own three exemplars per dataset family instead of the authors' (the old default)",
                DynamicSpec("etc", max_retrievals=None, settle=True, exemplars="ragate-3"),
            ),
            (
                "dragin",
                "DRAGIN: attention x entropy of a content word > 1.2",
                DynamicSpec("dragin", max_retrievals=None, settle=True),
            ),
            (
                "dragin-ragate-3",
                "DRAGIN with ragate's own three exemplars per dataset family instead of the authors' (the old default)",
                DynamicSpec("dragin", max_retrievals=None, settle=True, exemplars="ragate-3"),
            ),
            (
                "flare",
                "FLARE: a token of the next sentence below p = 0.4; masked query",
                DynamicSpec("flare", query="masked", cut="sentence"),
            ),
            (
                "flare-once",
                "FLARE bounded to one retrieval (TARG section 5.1's bound on every baseline)",
                DynamicSpec("flare", query="masked", cut="sentence", max_retrievals=1),
            ),
            (
                "ircot",
                "IRCoT: retrieve after every chain-of-thought sentence",
                DynamicSpec(
                    "ircot", query="sentence", cut="none", initial=True, accumulate=True, max_retrievals=5
                ),
            ),
            (
                "ralm",
                "In-Context RALM: retrieve every 16 tokens",
                DynamicSpec("ralm", query="chunk", cut="none", initial=True, max_retrievals=5),
            ),
            (
                "targ-recheck",
                "TARG re-check: mean entropy of the last 20 tokens every 16; retrieve once",
                DynamicSpec("targ-recheck", query="question", cut="none", max_retrievals=1),
            ),
            (
                "single-rag",
                "chain of thought over passages retrieved once for the question",
                DynamicSpec("none", initial=True),
            ),
            ("wo-rag", "chain of thought without retrieval", DynamicSpec("none")),
        )
    ),
    MethodSpec(  # Adaptive-RAG's three routes (its no / one / multi-step readers), chosen per question by a cascade
        "route",
        "routes per question: wo-rag, then single-rag, then ircot; a cascade pays for the next route only where the "
        "answer fails its checks (its NLL, agreement with the route before)",
        GateSpec("never"),
        _Q,
        route=RouteSpec(("wo-rag", "single-rag", "ircot")),
    ),
)
METHODS: dict[str, MethodSpec] = {m.name: m for m in _METHODS}
DYNAMIC_METHODS: tuple[str, ...] = tuple(m.name for m in _METHODS if m.dynamic is not None)


_registered: dict[str, MethodSpec] = {}  # register_method's recipes (added to, never changed)
_lock = threading.Lock()


def register_method(spec: MethodSpec) -> MethodSpec:
    """Add a method recipe under ``spec.name`` (e.g. a registered gate with another selector); returns it."""
    with _lock:
        held = _registered.get(spec.name)
        if spec.name in METHODS or (held is not None and held != spec):
            raise RagateError(f"method name {spec.name!r} is taken: choose another name")
        _registered[spec.name] = spec
    return spec


def register_gate(name: str) -> Callable[[type[Gate]], type[Gate]]:
    """Class decorator: register a :class:`~ragate.gates.base.Gate` under ``name``; it also names a method (the
    gate's ``like`` method with this gate), unless ``like`` is None."""
    from ragate.gates.registry import register_gate as add_gate

    if name in METHODS:
        raise RagateError(f"{name!r} is the name of one of ragate's methods: choose another gate name")
    return add_gate(name)


def register_trigger(name: str) -> Callable[[type[Trigger]], type[Trigger]]:
    """Class decorator: register a :class:`~ragate.methods.triggers.Trigger` under ``name``; it also names a method
    (the trigger's ``like`` method, its query, cut and limits, with this trigger)."""
    if name in METHODS:
        raise RagateError(f"{name!r} is the name of one of ragate's methods: choose another trigger name")
    return add_trigger(name)


def _gate_method(name: str) -> MethodSpec | None:
    """The method a user's gate names: its ``like`` method with this gate (None when ``like`` is None)."""
    gate = get_gate(name)
    if gate.like is None:
        return None
    base = METHODS.get(gate.like)
    if base is None or base.dynamic is not None or base.crag is not None:
        raise RagateError(
            f"gate {name!r} sets like = {gate.like!r}: name a single-shot method of ragate's whose selector and "
            "prompts it takes (e.g. standard-rag, targ-margin, dtr)"
        )
    description = gate.description or f"{base.name}'s reader with the {name} gate"
    return replace(base, name=name, description=description, gate=GateSpec(name))


def _trigger_method(name: str) -> MethodSpec | None:
    trigger = trigger_class(name)
    base = METHODS.get(trigger.like) if trigger.like else None
    if trigger.like is None:
        return None
    if base is None or base.dynamic is None:
        raise RagateError(
            f"trigger {name!r} sets like = {trigger.like!r}: name one of ragate's dynamic methods whose query, "
            f"cut and limits it takes ({', '.join(DYNAMIC_METHODS)})"
        )
    dynamic = replace(base.dynamic, trigger=name, threshold=None)
    return replace(base, name=name, description=f"{base.name}'s loop with the {name} trigger", dynamic=dynamic)


def _plugin_names() -> tuple[list[str], list[str]]:
    """Names of the gates and triggers that are not ragate's own (registered or installed)."""
    gates = [g for g in GATE_REGISTRY.names() if not GATE_REGISTRY.is_builtin(g)]
    triggers = [t for t in TRIGGER_REGISTRY.names() if not TRIGGER_REGISTRY.is_builtin(t)]
    return gates, triggers


def _extra_method(name: str) -> MethodSpec | None:
    if name in _registered:
        return _registered[name]
    gates, triggers = _plugin_names()
    if name in gates:
        return _gate_method(name)
    if name in triggers:
        return _trigger_method(name)
    return None


def all_methods() -> dict[str, MethodSpec]:
    """Every method by name: ragate's, then registered recipes and those of registered gates and triggers."""
    out = dict(METHODS)
    gates, triggers = _plugin_names()
    for name in [*sorted(_registered), *gates, *triggers]:
        if name not in out and (spec := _extra_method(name)) is not None:
            out[name] = spec
    return out


def get_method(name: str) -> MethodSpec:
    spec = METHODS.get(name) or _extra_method(name)
    if spec is not None:
        return spec
    names = list(all_methods())
    close = difflib.get_close_matches(name, names, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise RagateError(f"unknown method {name!r}.{hint} Methods: {', '.join(names)}")
