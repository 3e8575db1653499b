"""What every gate returns (:class:`GateDecision`), what it may ask of the model (:class:`GateContext`), and the
class a gate is (:class:`Gate`): one object per gate, registered by name (:mod:`ragate.gates.registry`).

A gate's formula stays a pure function in its module (``ugt.ugt``, ``targ.targ_margin``, ...); the gate object
is the recipe around it: what it needs from the backend and the index, its default threshold and where that
number comes from, and which generations it asks for before deciding. It asks through the context, never loads a
model and never does I/O, so the same gate runs in ``ragate ask``, ``eval``, ``sweep``, ``calibrate``, ``serve``
and :class:`ragate.Pipeline`.
"""

from __future__ import annotations

import contextlib
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

import numpy as np

from ragate.types import Generation, GenerationRequest, Message

if TYPE_CHECKING:
    from ragate.backends.base import Capabilities
    from ragate.gates.spec import GateSpec
    from ragate.retrieval.types import ScoredHits


@dataclass(frozen=True)
class GateDecision:
    """Whether to retrieve, the gate's score and the threshold it was compared with, and why, in words.

    ``score`` is oriented so that higher means "more reason to retrieve" for every gate, which makes thresholds,
    budgets and sweeps uniform (``retrieve == score > threshold`` unless the gate says otherwise in ``reason``).
    """

    retrieve: bool
    score: float
    threshold: float
    reason: str


@dataclass(frozen=True)
class TokenUncertainty:
    """What a gate reads in each token of its draft, for showing it (``ragate serve``'s page colours the tokens):
    what the values are (``measure``), one per draft token (higher: less sure), how many of the first tokens the
    gate's score reads (``scored``; the rest are shown, not scored), and the value drawn as fully uncertain
    (``scale``; None: the largest in the draft). The score is the sum of the scored values over ``divisor`` (None:
    over ``scored``, their mean; TARG's Eqs. 1-2 divide by k even when the draft stopped before k tokens)."""

    measure: str
    values: tuple[float, ...]
    scored: int
    scale: float | None = None
    divisor: int | None = None


@dataclass(frozen=True)
class Need:
    """What a gate or trigger reads from its generations.

    ``token_logprobs``: the log-probability of each generated token (DTR's NLL, FLARE's token probability, and
    the per-token output every dynamic loop cuts and replays). ``top_k``: alternatives per step (2 for TARG's
    margin and the judge's P(yes)). ``entropy``: per-step entropies, exact with the full distribution and
    approximate from the top-k otherwise. ``sampling``: seeded sampling (TARG's variance). ``text_fallback``: the
    decision can still be read from the reply text when ``top_k`` is missing. ``tokens``: compares generated
    tokens, and words where a text-only backend returns no per-token output (an approximation). ``hidden``: the
    model's last-layer hidden state (llama.cpp, transformers; never a server).
    """

    token_logprobs: bool = False
    top_k: int = 0
    entropy: bool = False
    sampling: bool = False
    text_fallback: bool = False
    tokens: bool = False
    hidden: bool = False  # the model's hidden state at the prompt's last token (a learned gate's file that reads it)

    def describe(self) -> str:
        parts = ["the model's hidden state"] if self.hidden else []
        if self.entropy:
            parts.append("per-step entropies (full distribution; top-k logprobs give an approximation)")
        elif self.top_k:
            parts.append(f"top-{self.top_k} logprobs per token")
        elif self.token_logprobs:
            parts.append("token logprobs")
        if self.sampling:
            parts.append("seeded sampling")
        return " and ".join(parts) or "text only"


Support = Literal["exact", "approximate", "text", "unavailable"]


def support(need: Need, caps: Capabilities) -> tuple[Support, str]:
    """How a method with ``need`` runs on a backend with ``caps``, and (unless exact) what is missing."""
    if need.sampling and not caps.sampling:
        return "unavailable", "the backend cannot sample"
    if need.hidden and not caps.hidden_states:
        return "unavailable", (
            "the backend gives no hidden state (learn a gate without it for this backend: "
            "`ragate gate learn --no-hidden`)"
        )
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


@dataclass(frozen=True)
class FittedFile:
    """A fitted gate file (``GateSpec.weights``) as a run checks and records it: the digests of the questions it
    was fitted on (``trained``, each made by ``digest`` from a question's text; a run must not score those), and
    what the run keeps of it besides its path and sha256 (``record``: its label, features and question count)."""

    trained: frozenset[str] = frozenset()
    digest: Callable[[str], str] = str
    record: Mapping[str, Any] = field(default_factory=dict)

    def overlap(self, questions: Sequence[str]) -> list[str]:
        """The given questions that trained the file."""
        return [q for q in questions if self.digest(q) in self.trained] if self.trained else []


class GateContext(Protocol):
    """What a gate may ask for while it decides on one question (implemented by the method runner).

    Every generation is recorded as a stage of the question's trace. ``draft()`` is the greedy direct answer
    (the method's own prompt, no documents); when the gate then says "no", that draft *is* the answer (continued
    if it was cut at ``max_tokens``), so a gate that reads the draft costs nothing beyond it. A gate that asks for
    no draft gets the direct answer generated after it decides "no".
    """

    question: str
    seed: int
    params: GateSpec  # the gate's settings: threshold, TARG's prefix k, beta, samples, the random rate, ...
    lm: Any  # the backend (for its name and capabilities; generate through the methods below)
    retriever: Any  # the index or search (None when the caller gave none)
    early_exit: bool  # a settled decision may skip the rest of its work (False for sweeps and calibration)

    @property
    def prompts(self) -> Any: ...  # the method's PromptSet: direct, with_context, pseudo_context, system

    def draft(
        self, max_tokens: int | None = None, *, settled: Callable[[Generation], bool] | None = None
    ) -> Generation:
        """The greedy draft (see above). ``settled``, if given, sees the draft after each token and returns True once
        the gate's decision can no longer change (TARG's exact early exit): the draft may then stop there, where the
        run allows it (not for sweeps and calibration, which need the full score). Unless it stops, the draft is the
        same as without ``settled``."""
        ...

    def one(
        self,
        name: str,
        template: str,
        *,
        max_tokens: int | None = None,
        overhead: bool = False,
        top_logprobs: int = 5,
        **fields: str,
    ) -> Generation: ...

    def messages(self, template: str, **fields: str) -> tuple[Message, ...]: ...

    def generate(
        self, name: str, requests: Sequence[GenerationRequest], *, overhead: bool = False
    ) -> list[Generation]: ...

    def pseudo_context(self) -> str: ...

    def proxy_draft(self, max_tokens: int, *, top_logprobs: int = 2) -> Generation:
        """The greedy no-context draft of the *proxy* model (a small local model that decides for the answering
        one, :mod:`ragate.gates.proxy`), recorded as overhead; an error naming the fix when no proxy is open."""
        ...

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...

    def scored_search(self, k: int) -> ScoredHits: ...  # the question's top-k, which a "question" selector reuses

    def need_retriever(self) -> Any: ...  # the index (an error naming --index when the caller gave none)

    def set_answer(self, text: str) -> None: ...

    def timed(self, name: str, *, overhead: bool = False) -> contextlib.AbstractContextManager[None]: ...

    def encoder_identity(self) -> dict[str, Any] | None: ...

    def model_identity(self) -> dict[str, Any]: ...


class Gate:
    """A retrieval gate: decides once per question whether to retrieve.

    Subclass it, set ``need`` (what it reads from the backend) and ``default_tau`` (with ``tau_source``: the paper
    and model that number comes from), implement :meth:`score` (higher means "more reason to retrieve"; the gate
    retrieves iff score > tau) or, for a rule of its own, :meth:`decide`, and register it::

        @ragate.register_gate("min-prob")
        class MinProb(ragate.Gate):
            "Retrieve when the least likely token of the direct answer is below 1 - tau."
            need = ragate.Need(token_logprobs=True)
            default_tau = 0.7
            tau_source = "ragate's choice (a starting point: calibrate it)"

            def score(self, ctx):
                return 1 - math.exp(min(ctx.draft().logprobs, default=0.0))

    A registered gate also names a method (``ragate ask --method min-prob``): the method ``like`` names (default
    ``standard-rag``: DTR's prompts, top-3 for the question) with this gate.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    need: ClassVar[Need] = Need()
    default_tau: ClassVar[float] = 0.5
    tau_source: ClassVar[str] = "ragate's choice, not a paper's: calibrate it to a budget"
    needs_embeddings: ClassVar[bool] = False  # reads the index's encoder (question or answer embeddings)
    reads_index: ClassVar[bool] = False  # searches the index or counts its passages to decide (gates/nomodel.py)
    counts_terms: ClassVar[bool] = False  # counts terms in the corpus: an index's passages or Pipeline(corpus=)
    reads_weights: ClassVar[bool] = False  # reads a fitted weights file (GateSpec.weights, `ragate gate fit`)
    weights_source: ClassVar[str] = "fit one"  # with reads_weights: how a user makes the file it reads
    thresholded: ClassVar[bool] = True  # False: the decision ignores tau (never, always): nothing to sweep
    budget_control: ClassVar[bool] = True  # `serve --budget` can move its tau (a score that ranks questions)
    calibration_note: ClassVar[str | None] = None  # why `ragate calibrate` does not take it, where it does not
    like: ClassVar[str | None] = "standard-rag"  # the method whose selector and prompts its own method uses

    def decide(self, ctx: GateContext, tau: float) -> GateDecision:
        """The decision for ``ctx.question`` at threshold ``tau``: retrieve iff :meth:`score` > tau."""
        score = self.score(ctx)
        if isinstance(score, bool) or not isinstance(score, numbers.Real):
            from ragate.errors import GateError

            raise GateError(
                f"the gate {self.name!r} scored {score!r:.60} ({type(score).__name__}); score() must return a number "
                "(higher: more reason to retrieve)"
            )
        return threshold_decision(self.name, float(score), tau)

    def fitted_file(self, path: str) -> FittedFile:
        """With ``reads_weights``: the file at ``path`` read with this gate's own loader (a damaged or foreign file
        is an error naming the fix) as a run checks it before any answer; the default knows no training questions."""
        return FittedFile()

    def check_file(self, path: str, lm: Any) -> None:
        """With ``reads_weights``: refuse the file at ``path`` for a run answering with ``lm`` (a backend) before any
        answer, where no answer could use it (fitted on another model, numbers that overflow), naming the file, what
        it was fitted on and the fix; the default checks nothing."""

    def token_uncertainty(self, draft: Generation, params: GateSpec) -> TokenUncertainty | None:
        """What this gate reads in each token of ``draft`` (the greedy draft it asked for), or None where its score
        is not made of per-token values (an agreement of two answers, a judge's reply, sampled drafts)."""
        return None

    def score(self, ctx: GateContext) -> float:
        raise NotImplementedError(f"gate {self.name!r} must define score(ctx) or decide(ctx, tau)")


def threshold_decision(name: str, score: float, tau: float, detail: str = "") -> GateDecision:
    """``score > tau`` as a decision, with the comparison in words."""
    retrieve = score > tau
    return GateDecision(
        retrieve, score, tau, f"{name} score {score:.4g} {'>' if retrieve else '<='} tau = {tau:g}{detail}"
    )

