"""What each gate and dynamic trigger needs from a backend, and the check every entry point runs first (issue I).

A backend states what it returns (:class:`~ragate.backends.base.Capabilities`): the full next-token
distribution (llama.cpp, transformers), the top-k log-probabilities of each step (OpenAI-style APIs, k <= 20),
or text only (many hosted and reasoning models). A method states what its gate or trigger reads
(:data:`GATE_NEEDS`, :data:`TRIGGER_NEEDS`). :func:`support` compares the two and says how the method runs:

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
from dataclasses import dataclass, replace
from typing import Literal

from ragate.backends.base import Backend, Capabilities
from ragate.errors import CapabilityError
from ragate.methods.spec import GATES, GateKind, GateSpec, MethodSpec, TriggerKind

Support = Literal["exact", "approximate", "text", "unavailable"]
# the gate `ragate serve` falls back to when no method was named and the backend cannot serve the default's:
# PAIRS's agreement needs only answer text (verbalised confidence is cheaper, but Qwen2.5-Coder-1.5B states
# 0.9 for nearly every answer: benchmarks/topk_fidelity.py)
DEFAULT_TEXT_GATE = "pairs"


@dataclass(frozen=True)
class Need:
    """What a gate or trigger reads from its generations.

    ``token_logprobs``: the log-probability of each generated token (DTR's NLL, FLARE's token probability, and
    the per-token output every dynamic loop cuts and replays). ``top_k``: alternatives per step (2 for TARG's
    margin and the judge's P(yes)). ``entropy``: per-step entropies, exact with the full distribution and
    approximate from the top-k otherwise. ``sampling``: seeded sampling (TARG's variance). ``text_fallback``: the
    decision can still be read from the reply text when ``top_k`` is missing. ``tokens``: compares generated
    tokens, and words where a text-only backend returns no per-token output (an approximation).
    """

    token_logprobs: bool = False
    top_k: int = 0
    entropy: bool = False
    sampling: bool = False
    text_fallback: bool = False
    tokens: bool = False

    def describe(self) -> str:
        parts = []
        if self.entropy:
            parts.append("per-step entropies (full distribution; top-k logprobs give an approximation)")
        elif self.top_k:
            parts.append(f"top-{self.top_k} logprobs per token")
        elif self.token_logprobs:
            parts.append("token logprobs")
        if self.sampling:
            parts.append("seeded sampling")
        return " and ".join(parts) or "text only"


_TEXT = Need()
GATE_NEEDS: dict[GateKind, Need] = {
    "never": _TEXT,
    "always": _TEXT,
    "random": _TEXT,
    "ugt": Need(token_logprobs=True),  # DTR Eq. 1: NLL of the greedy answer's own tokens
    "pairs": _TEXT,  # PAIRS section 3.1: agreement of two answers' text
    "pairs-exclude-num": _TEXT,
    "pairs-embedding": _TEXT,
    "targ-entropy": Need(token_logprobs=True, top_k=1, entropy=True),  # TARG Eq. 1
    "targ-margin": Need(token_logprobs=True, top_k=2),  # TARG Eq. 2: the top-1/top-2 gap is exact from top-2
    "targ-variance": Need(
        sampling=True, tokens=True
    ),  # TARG Eq. 3: sampled prefixes' tokens, else their words
    "llm-judge": Need(
        token_logprobs=True, top_k=2, text_fallback=True
    ),  # P(yes); else the reply's first word
    "verbal-confidence": _TEXT,  # the stated probability is text
    "self-eval": Need(token_logprobs=True, top_k=2, text_fallback=True),  # P(yes), as the judge
    "self-rag-lite": Need(token_logprobs=True, top_k=2, text_fallback=True),
    "skr": _TEXT,  # a vote of labelled neighbours: no generation at all
}
_CRAG = Need(
    token_logprobs=True, top_k=2, text_fallback=True
)  # each passage's grade is P(yes), else its word
_STEPS = Need(token_logprobs=True)  # every dynamic loop watches tokens as they come
TRIGGER_NEEDS: dict[TriggerKind, Need] = {
    "none": _STEPS,
    "etc": Need(token_logprobs=True, top_k=1, entropy=True),
    "etc-1st": Need(token_logprobs=True, top_k=1, entropy=True),
    "etc-no-smoothing": Need(token_logprobs=True, top_k=1, entropy=True),
    "etc-fixed": Need(token_logprobs=True, top_k=1, entropy=True),
    "etc-code": Need(token_logprobs=True, top_k=1, entropy=True),
    "dragin": Need(token_logprobs=True, top_k=1, entropy=True),
    "flare": _STEPS,
    "ircot": _STEPS,
    "ralm": _STEPS,
    "targ-recheck": Need(token_logprobs=True, top_k=1, entropy=True),
}


def method_need(spec: MethodSpec) -> Need:
    if spec.dynamic is not None:
        return TRIGGER_NEEDS[spec.dynamic.trigger]
    return _CRAG if spec.crag is not None else GATE_NEEDS[spec.gate.kind]


def support(need: Need, caps: Capabilities) -> tuple[Support, str]:
    """How a method with ``need`` runs on a backend with ``caps``, and (unless exact) what is missing."""
    if need.sampling and not caps.sampling:
        return "unavailable", "the backend cannot sample"
    if need.token_logprobs and not caps.logprobs:
        if need.text_fallback:
            return "text", "no logprobs: decided from the reply text"
        return "unavailable", "the backend returns no logprobs"
    if need.top_k > caps.top_k:
        if need.text_fallback:
            return "text", f"top-{caps.top_k} logprobs: decided from the reply text"
        return "unavailable", f"the backend returns top-{caps.top_k} logprobs, {need.top_k} are needed"
    if need.tokens and not caps.logprobs:
        return "approximate", "no per-token output: sampled texts compared word by word"
    if need.entropy and not caps.full_distribution:
        return "approximate", f"entropy estimated from the top-{caps.top_k} logprobs (no full distribution)"
    return "exact", ""


def method_support(spec: MethodSpec, caps: Capabilities) -> tuple[Support, str]:
    return support(method_need(spec), caps)


def runnable(specs: Iterable[MethodSpec], caps: Capabilities) -> list[str]:
    """Names of the methods among ``specs`` that run on ``caps``."""
    return [s.name for s in specs if method_support(s, caps)[0] != "unavailable"]


def require(
    spec: MethodSpec, caps: Capabilities, *, engine: str, fallback: str | None = None, rename: bool = True
) -> MethodSpec:
    """``spec`` itself when it runs on ``caps``; else ``spec`` with the ``fallback`` gate, renamed
    ``NAME:fallback=GATE`` (``rename``; an eval run records the fallback in its config instead) so that answers
    say which gate decided; else a :class:`CapabilityError` naming what is missing and the methods that would
    run."""
    from ragate.methods.registry import METHODS  # the registry imports this module's users

    status, why = method_support(spec, caps)
    if status != "unavailable":
        return spec
    need = method_need(spec)
    if fallback is not None:
        if fallback not in GATES:
            raise CapabilityError(f"unknown fallback gate {fallback!r}; choose one of: {', '.join(GATES)}")
        if spec.dynamic is not None:
            raise CapabilityError(
                f"{spec.name!r} is a dynamic method ({why}); --fallback replaces a single-shot gate, so run a "
                f"single-shot method instead (e.g. --method pairs)"
            )
        gate = GateSpec(fallback)  # type: ignore[arg-type]
        fell, fell_why = support(GATE_NEEDS[gate.kind], caps)
        if fell == "unavailable":
            raise CapabilityError(f"the fallback gate {fallback!r} cannot run either: {fell_why}")
        return replace(spec, name=f"{spec.name}:fallback={fallback}" if rename else spec.name, gate=gate)
    would = runnable(METHODS.values(), caps)
    gates = [g for g in GATES if support(GATE_NEEDS[g], caps)[0] != "unavailable"]
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
        "gates": {g: support(GATE_NEEDS[g], caps)[0] for g in GATES},
    }


def capability_summary(backend: Backend) -> dict[str, object]:
    """:func:`capability_report` of a backend plus how its capabilities were found (``capability_note``)."""
    report = capability_report(backend.capabilities)
    note = getattr(backend, "capability_note", "")
    return {**report, "note": note} if note else report
