"""TARG's prefix gates: score a short no-context draft (k = 20 tokens by default) and retrieve iff U > tau.

- entropy (Eq. 1): U = mean over the first k steps of the step entropy H_t (exact when the backend gives the
  full distribution, else the labelled top-k approximation);
- margin (Eq. 2): U = mean of exp(-g_t / beta), g_t the top-1/top-2 logit gap, beta = 3;
- variance (Eq. 3): N = 5 extra prefixes sampled at T = 0.7; d_t = 1 - (share of the most common token at t),
  U = mean d_t in [0, (N-1)/N].

A draft that ends (end of sequence, which is not a step) before k tokens is divided by k as Eqs. 1-2 write it: the
steps it did not write add nothing. ``targ-entropy-present`` and ``targ-margin-present`` divide by the steps
present instead (ragate before 2026-11-28; every TARG score in docs/results.md from before then is of that form).
An empty draft retrieves. Thresholds are model-specific: calibrate tau to a retrieval budget (TARG section 3.3)
rather than reusing the paper's numbers.

Exact early exit. Every per-step term of Eqs. 1-2 is >= 0 (an entropy; exp(-g/beta) > 0) and U divides
their sum by a fixed k, so after j < k tokens (1/k) sum_{t<=j} u_t is a lower bound on U, in floating point too
(:func:`ragate.uncertainty.prefix_bound`). Once it exceeds tau the decision "retrieve" cannot change, and the
entropy and margin gates stop the draft there (:class:`Settled`); when the decision is "no" the draft goes on to k
tokens and then on as the answer, as without it. Decisions and answers are those of the full draft; the score of
a draft stopped early is that lower bound (the reason says so), so sweeps, calibration and a live budget, which
rank scores, read full drafts (``ragate.methods.runner.decide`` never stops early). Of ragate's other gates none
qualifies: DTR's UGT divides by the answer's own length T (Eq. 3), which grows with the draft, so a later
confident token lowers it; the variance gate's d_t (Eq. 3) needs all N samples at step t, which are generated one
after another; the rest read whole replies (PAIRS, the judge, self-eval, verbal confidence, Self-RAG-lite) or no
draft at all (SKR, random, never, always).

Anytime gates (lossy, unlike the early exit): ``targ-entropy@k=5``, ``targ-entropy@k=10``, ``targ-margin@k=5`` and
``targ-margin@k=10`` read Eqs. 1-2 over a draft of k = 5 or 10 tokens, from TARG's prefix-length grid (A.5, A.8:
k in {5, 10, 20, 30, 40}). Their scores are on another scale than k = 20's, so each takes its own tau_k
(``ragate calibrate --gate targ-margin@k=5``), and ``ragate calibrate --prefixes 5,10,20`` chooses k and tau
together for a budget, the best dev EM at that budget (A.8's "EM versus k when tau is chosen to match a fixed
retrieval budget"), reporting how often each k decides as k = 20 does. When the gate says "no", the short draft
is continued into the answer, as a stopped draft is.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ClassVar

from ragate.gates.base import Gate, GateContext, GateDecision, Need, TokenUncertainty
from ragate.types import Generation, GenerationRequest
from ragate.uncertainty import (
    DEFAULT_MARGIN_BETA,
    DivideBy,
    disagreement,
    margin_uncertainty,
    mean_entropy,
    mean_margin_uncertainty,
    prefix_bound,
)

if TYPE_CHECKING:
    from ragate.gates.spec import GateSpec

DEFAULT_PREFIX = 20
DEFAULT_SAMPLES = 5
DEFAULT_SAMPLE_TEMPERATURE = 0.7


def _decide(name: str, u: float, tau: float, detail: str = "") -> GateDecision:
    retrieve = u > tau
    return GateDecision(
        retrieve, u, tau, f"{name} U = {u:.4g} {'>' if retrieve else '<='} tau = {tau:g}{detail}"
    )


def _empty(tau: float) -> GateDecision:
    return GateDecision(True, math.inf, tau, "empty draft: nothing to score")


def targ_entropy(
    draft: Generation, tau: float, *, k: int = DEFAULT_PREFIX, divide_by: DivideBy = "k", early: bool = False
) -> GateDecision:
    """TARG Eq. 1 over the draft's first ``k`` steps (``divide_by``: see :func:`ragate.uncertainty.mean_entropy`).
    ``early``: the draft was stopped once the decision was settled (:class:`Settled`); the score is then the
    lower bound (1/k) sum H_t over the steps written, which already exceeds ``tau``."""
    if len(draft) == 0:
        return _empty(tau)
    entropies, exact = draft.step_entropies()
    detail = "" if exact else " (top-k entropy approximation)"
    if early:
        return _settled("mean entropy", prefix_bound(entropies, k), tau, len(draft), k, detail)
    return _decide("mean entropy", mean_entropy(entropies, k, divide_by=divide_by), tau, detail)


def targ_margin(
    draft: Generation,
    tau: float,
    *,
    k: int = DEFAULT_PREFIX,
    beta: float = DEFAULT_MARGIN_BETA,
    divide_by: DivideBy = "k",
    early: bool = False,
) -> GateDecision:
    """TARG Eq. 2 over the draft's first ``k`` steps; needs at least the top-2 log-probabilities per step.
    ``divide_by`` and ``early`` as in :func:`targ_entropy`."""
    if len(draft) == 0:
        return _empty(tau)
    name = f"margin (beta={beta:g})"
    if early:
        terms = [margin_uncertainty(g, beta) for g in draft.top1_top2_gaps]
        return _settled(name, prefix_bound(terms, k), tau, len(draft), k)
    return _decide(name, mean_margin_uncertainty(draft.top1_top2_gaps, k, beta, divide_by=divide_by), tau)


def _settled(name: str, bound: float, tau: float, n: int, k: int, detail: str = "") -> GateDecision:
    retrieve = bound > tau  # True whenever Settled stopped the draft; checked, not assumed
    return GateDecision(
        retrieve,
        bound,
        tau,
        f"{name} U >= {bound:.4g} {'>' if retrieve else '<='} tau = {tau:g} from the first {n} of k = {k} draft "
        f"tokens (exact early exit: the other terms are >= 0, so the decision is settled){detail}",
    )


class Settled:
    """Watches a TARG draft as it is decoded and says when the decision "retrieve" is settled: the lower bound
    (1/k) sum_{t<=j} u_t (TARG Eqs. 1-2, :func:`ragate.uncertainty.prefix_bound`) exceeds ``tau`` after j < k
    tokens. ``terms`` gives a draft's per-step terms u_t (each >= 0). It remembers where it fired (``at``), so that
    the gate knows that the draft it gets back was stopped there (:meth:`stopped`)."""

    def __init__(self, terms: Callable[[Generation], Sequence[float]], k: int, tau: float) -> None:
        self.terms, self.k, self.tau = terms, k, tau
        self.at: int | None = None

    def __call__(self, draft: Generation) -> bool:
        if len(draft) >= self.k:  # the draft is whole: nothing left to save
            return False
        if prefix_bound(self.terms(draft), self.k) > self.tau:
            self.at = len(draft)
            return True
        return False

    def stopped(self, draft: Generation) -> bool:
        """Whether ``draft`` is the one this watcher stopped (its length is where it fired)."""
        return self.at is not None and len(draft) == self.at


def _entropies(draft: Generation) -> Sequence[float]:
    return draft.step_entropies()[0]


def targ_variance(samples: Sequence[Generation], tau: float, *, k: int = DEFAULT_PREFIX) -> GateDecision:
    """TARG Eq. 3 across N sampled prefixes of the same prompt: their token ids when the backend has them, else
    their token strings; a text-only backend (no per-token output) gives neither, and then the first ``k`` words
    of each sample stand in for its tokens (an approximation, said in the reason)."""
    if not samples:
        raise ValueError("the variance gate needs the N sampled prefixes (N = 5 by default)")
    by_words = all(not s.tokens for s in samples)
    sequences = [s.text.split() if by_words else (s.token_ids or s.tokens) for s in samples]
    if all(len(s) == 0 for s in sequences):
        return _empty(tau)
    unit = " (words: no per-token output)" if by_words else ""
    return _decide(f"disagreement over {len(samples)} samples", disagreement(sequences, k), tau, unit)


_CALIBRATE = "model-specific: calibrate it to a budget (section 3.3)"
_ENTROPY_TAU = f"TARG Table 1 (Qwen2.5-7B) uses 0.80 on TriviaQA and PopQA, 0.85 on NQ-Open; {_CALIBRATE}"
_MARGIN_TAU = f"the midpoint of TARG Table 1's 0.15-0.35 (Qwen2.5-7B); {_CALIBRATE}"
_VARIANCE_TAU = (
    "inside TARG Table 1's 0.40-0.75 (Qwen2.5-7B; 0.60 on NQ-Open), below its midpoint 0.575: ragate's choice, "
    f"not a value of the paper; {_CALIBRATE}"
)


class TargEntropy(Gate):
    description = "TARG: mean entropy of a 20-token draft (Eq. 1)"
    need = Need(token_logprobs=True, top_k=1, entropy=True)
    default_tau = 0.8
    tau_source = _ENTROPY_TAU
    like = "targ-entropy"
    divide_by: ClassVar[DivideBy] = "k"
    prefix: ClassVar[int | None] = None  # an anytime gate's own k (None: GateSpec.prefix, 20 by default)

    def decide(self, ctx: GateContext, tau: float) -> GateDecision:
        k = self.prefix or ctx.params.prefix
        settled = Settled(_entropies, k, tau)
        draft = ctx.draft(k, settled=settled)
        return targ_entropy(draft, tau, k=k, divide_by=self.divide_by, early=settled.stopped(draft))

    def token_uncertainty(self, draft: Generation, params: GateSpec) -> TokenUncertainty:
        entropies, exact = draft.step_entropies()
        measure = "entropy H" + ("" if exact else " (top-k approximation)")
        k = self.prefix or params.prefix
        scored = min(k, len(entropies))
        return TokenUncertainty(
            measure, tuple(entropies), scored, None, k if self.divide_by == "k" else scored
        )


class TargMargin(Gate):
    description = "TARG: mean exp(-gap/beta) of a 20-token draft (Eq. 2)"
    need = Need(token_logprobs=True, top_k=2)  # the top-1/top-2 gap is exact from the top-2 logprobs
    default_tau = 0.25
    tau_source = _MARGIN_TAU
    like = "targ-margin"
    divide_by: ClassVar[DivideBy] = "k"
    prefix: ClassVar[int | None] = None  # an anytime gate's own k (None: GateSpec.prefix, 20 by default)

    def decide(self, ctx: GateContext, tau: float) -> GateDecision:
        p = ctx.params
        k = self.prefix or p.prefix

        def terms(draft: Generation) -> list[float]:
            return [margin_uncertainty(g, p.beta) for g in draft.top1_top2_gaps]

        settled = Settled(terms, k, tau)
        draft = ctx.draft(k, settled=settled)
        early = settled.stopped(draft)
        return targ_margin(draft, tau, k=k, beta=p.beta, divide_by=self.divide_by, early=early)

    def token_uncertainty(self, draft: Generation, params: GateSpec) -> TokenUncertainty:
        values = tuple(margin_uncertainty(g, params.beta) for g in draft.top1_top2_gaps)
        k = self.prefix or params.prefix
        scored = min(k, len(values))
        divisor = k if self.divide_by == "k" else scored
        return TokenUncertainty(f"margin exp(-g/{params.beta:g})", values, scored, 1.0, divisor)


class TargEntropyPresent(TargEntropy):
    description = (
        "TARG's entropy gate (Eq. 1) with a draft shorter than k averaged over its tokens, not divided by k "
        "(ragate before 2026-11-28)"
    )
    like = "targ-entropy"
    divide_by = "present"


class TargMarginPresent(TargMargin):
    description = (
        "TARG's margin gate (Eq. 2) with a draft shorter than k averaged over its tokens, not divided by k "
        "(ragate before 2026-11-28)"
    )
    like = "targ-margin"
    divide_by = "present"


_ANYTIME_TAU = (
    "TARG A.8 calibrates tau for each prefix length k (its tau for k = 20 does not carry over): set this gate's own "
    "tau_k with `ragate calibrate` (or choose k and tau together with --prefixes)"
)


class TargEntropyK5(TargEntropy):
    description = (
        "TARG's entropy gate (Eq. 1) read after 5 draft tokens: an anytime gate, tau calibrated for k = 5"
    )
    prefix = 5
    tau_source = _ANYTIME_TAU


class TargEntropyK10(TargEntropy):
    description = (
        "TARG's entropy gate (Eq. 1) read after 10 draft tokens: an anytime gate, tau calibrated for k = 10"
    )
    prefix = 10
    tau_source = _ANYTIME_TAU


class TargMarginK5(TargMargin):
    description = (
        "TARG's margin gate (Eq. 2) read after 5 draft tokens: an anytime gate, tau calibrated for k = 5"
    )
    prefix = 5
    tau_source = _ANYTIME_TAU


class TargMarginK10(TargMargin):
    description = (
        "TARG's margin gate (Eq. 2) read after 10 draft tokens: an anytime gate, tau calibrated for k = 10"
    )
    prefix = 10
    tau_source = _ANYTIME_TAU


class TargVariance(Gate):
    description = "TARG: disagreement of N sampled 20-token drafts (Eq. 3)"
    need = Need(sampling=True, tokens=True)  # sampled prefixes' tokens, else their words
    default_tau = 0.5
    tau_source = _VARIANCE_TAU
    like = "targ-variance"

    def decide(self, ctx: GateContext, tau: float) -> GateDecision:
        p = ctx.params
        ctx.draft(p.prefix)  # the greedy draft: the answer when the gate says "no"
        requests = [
            GenerationRequest(
                ctx.messages(ctx.prompts.direct),
                max_tokens=p.prefix,
                temperature=p.sample_temperature,
                seed=ctx.seed * 1000 + i,
                top_logprobs=0,
            )
            for i in range(p.samples)
        ]
        return targ_variance(ctx.generate("samples", requests, overhead=True), tau, k=p.prefix)
