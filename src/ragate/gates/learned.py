"""The learned gate (``learned``): a calibrated classifier over every signal ragate computes for a question, the
answering model's own hidden state included, fitted on labels from the traffic it serves (``ragate gate learn``,
:mod:`ragate.learning.scores`), and read here with numpy alone from a plain-JSON gate file (no pickle).

**Features.** Scalars by name: the question- and retrieval-side signals of the no-model gates
(:data:`ragate.gates.signals.FEATURES`: the question's length, question word, digits and dates, the top-5 search
scores' best value, gap and spread), and, for the second stage of a cascade, the TARG scores of a 20-token draft
(``targ-entropy``, Eq. 1; ``targ-margin``, Eq. 2). And ``hidden``: the model's last-layer hidden state at the
last token of the direct prompt (:meth:`ragate.methods.question.QuestionRun.hidden_state`), taken from the prefill
the closed-book answer computes anyway; the file keeps a projection of it to a few components (PCA, fitted with
the classifier). Probes of this state predict "needs retrieval" in the literature (SeaKR, Probing-RAG); here it is
one feature group among the others, and a file fitted without it serves a backend that cannot give it (a server).

**Score.** P(label | features) = sigmoid(a * z + b), z = intercept + coef . (x - mean) / scale, where x is the
scalars followed by the hidden state's components and (a, b) is Platt scaling fitted on cross-fitted scores, so
0.5 is even odds and a budget's tau is a probability. The label is ``closed-wrong`` (the closed-book answer is
wrong: gold, from a reference or feedback) or ``retrieval-changed`` (retrieval changed the answer: the silver label
of shadow answers); higher means more reason to retrieve either way.

**Cascade.** A file may hold two probes: ``cheap`` (no draft) and ``full`` (the same features and the draft's
TARG scores), with a ``band`` (lo, hi) of the cheap probability. Outside the band the cheap probe decides alone
with no draft; inside it the 20-token draft runs (it is then the start of the answer, as TARG's own gates reuse it)
and the full probe decides. The band is chosen for a target share of drafted questions. The decision's reason
names the stage that decided.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import threading
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ragate.errors import RagateError
from ragate.fileio import atomic_writer, lone_surrogate, parse_json, utf8_text
from ragate.gates.base import FittedFile, Gate, GateContext, GateDecision, Need
from ragate.gates.signals import FEATURES, RETRIEVAL_FEATURES, SIGNAL_K, signals
from ragate.gates.weights import REACH, logit_bound, overflow_fault

LEARNED_FORMAT = "ragate-learned-gate"
LEARNED_VERSION = 1
DRAFT_FEATURES = ("targ-entropy", "targ-margin")
ALL_SCALARS = (*FEATURES, *DRAFT_FEATURES)
LEARNED_LABELS = ("closed-wrong", "retrieval-changed")
DRAFT_TOKENS = 20  # TARG's k


def sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


@dataclass(frozen=True, eq=False)
class Probe:
    """One fitted linear probe: the named scalar features, then (when ``components`` is not None) the hidden state
    projected on ``components`` after subtracting ``hidden_mean``; standardised by ``mean``/``scale``; a logistic
    regression (``coef``, ``intercept``) with Platt scaling ``platt`` = (a, b)."""

    features: tuple[str, ...]
    mean: np.ndarray
    scale: np.ndarray
    coef: np.ndarray
    intercept: float
    platt: tuple[float, float] = (1.0, 0.0)
    hidden_mean: np.ndarray | None = None
    components: np.ndarray | None = None  # (n_components, hidden dim)

    def __post_init__(self) -> None:
        fault = _probe_fault(self)
        if fault is not None:
            raise RagateError(f"learned gate probe: {fault}")

    @property
    def reads_hidden(self) -> bool:
        return self.components is not None

    @property
    def hidden_dim(self) -> int | None:
        return None if self.components is None else int(self.components.shape[1])

    @property
    def width(self) -> int:
        return len(self.features) + (0 if self.components is None else int(self.components.shape[0]))

    def design(self, scalars: np.ndarray, hidden: np.ndarray | None) -> np.ndarray:
        """The rows the regression reads: scalars (n x features) then the hidden states' components."""
        x = np.atleast_2d(np.asarray(scalars, dtype=np.float64))
        if self.components is None:
            return x
        if hidden is None:
            raise RagateError(
                "this learned gate reads the model's hidden state, and none was given (a backend without "
                "hidden states, such as an OpenAI-compatible server): learn one without it "
                "(`ragate gate learn --no-hidden`)"
            )
        h = np.atleast_2d(np.asarray(hidden, dtype=np.float64))
        assert self.hidden_mean is not None
        if h.shape[1] != self.components.shape[1]:
            raise RagateError(
                f"the learned gate was fitted on hidden states of {self.components.shape[1]} values, but the model "
                f"gives {h.shape[1]}: it was learned on another model; learn it again on this one"
            )
        return np.hstack([x, (h - self.hidden_mean) @ self.components.T])

    def logits(self, scalars: np.ndarray, hidden: np.ndarray | None) -> np.ndarray:
        x = self.design(scalars, hidden)
        return self.intercept + ((x - self.mean) / self.scale) @ self.coef

    def probabilities(self, scalars: np.ndarray, hidden: np.ndarray | None) -> np.ndarray:
        a, b = self.platt
        z = a * self.logits(scalars, hidden) + b
        return np.array([sigmoid(float(v)) for v in z])

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "features": list(self.features),
            "mean": self.mean.tolist(),
            "scale": self.scale.tolist(),
            "coef": self.coef.tolist(),
            "intercept": self.intercept,
            "platt": list(self.platt),
            "hidden": None,
        }
        if self.components is not None and self.hidden_mean is not None:
            out["hidden"] = {
                "mean": [round(float(v), 7) for v in self.hidden_mean],
                "components": [[round(float(v), 7) for v in row] for row in self.components],
            }
        return out

    @classmethod
    def from_json(cls, data: Any) -> Probe:
        if not isinstance(data, dict):
            raise RagateError("a probe must be an object")
        hidden = data.get("hidden")
        if hidden is not None and not isinstance(hidden, dict):
            raise RagateError("a probe's hidden must be an object or null")
        try:
            features = data["features"]
            if not isinstance(features, list) or not all(isinstance(f, str) for f in features):
                raise RagateError("features must be a list of names")
            platt = data.get("platt", [1.0, 0.0])
            return cls(
                tuple(features),
                _floats(data["mean"], "mean"),
                _floats(data["scale"], "scale"),
                _floats(data["coef"], "coef"),
                float(_number(data["intercept"], "intercept")),
                (float(_number(platt[0], "platt")), float(_number(platt[1], "platt"))),
                _floats(hidden["mean"], "hidden mean") if hidden else None,
                _floats(hidden["components"], "hidden components", ndim=2) if hidden else None,
            )
        except (KeyError, IndexError, TypeError) as err:
            raise RagateError(f"a probe lacks {err}") from None


def _number(v: Any, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise RagateError(f"{name} must be a finite number, not {str(v)[:30]}")
    return float(v)


def _floats(v: Any, name: str, ndim: int = 1) -> np.ndarray:
    try:
        a = np.asarray(v, dtype=np.float64)
    except (TypeError, ValueError):
        raise RagateError(f"{name} must be numbers") from None
    if a.ndim != ndim or a.size == 0 or not np.all(np.isfinite(a)):
        raise RagateError(f"{name} must be a non-empty {ndim}-d array of finite numbers")
    return a


def _probe_fault(p: Probe) -> str | None:
    unknown = [f for f in p.features if f not in ALL_SCALARS]
    if unknown:
        return f"unknown features {unknown[:3]} (known: {', '.join(ALL_SCALARS)})"
    if len(set(p.features)) != len(p.features):
        return "a feature is named twice"
    if (p.components is None) != (p.hidden_mean is None):
        return "a hidden projection needs both its mean and its components"
    if (
        p.components is not None
        and p.hidden_mean is not None
        and (p.components.ndim != 2 or p.hidden_mean.shape != (p.components.shape[1],))
    ):
        return "the hidden mean and components disagree in size"
    for name in ("mean", "scale", "coef"):
        arr = getattr(p, name)
        if arr.shape != (p.width,):
            return f"{name} has {arr.size} values for {p.width} inputs"
        if not np.all(np.isfinite(arr)):
            return f"{name} holds NaN or infinity"
    if not np.all(p.scale > 0):
        return "every scale must be positive"
    if not p.width:
        return "it reads no feature"
    reach = np.full(p.width, REACH)
    if p.components is not None and p.hidden_mean is not None:  # a component of a state with |h| <= REACH
        with np.errstate(over="ignore", invalid="ignore"):
            spread = (REACH + np.max(np.abs(p.hidden_mean))) * np.sum(np.abs(p.components), axis=1)
        reach[len(p.features) :] = np.maximum(spread, REACH)
    return overflow_fault(logit_bound(p.coef, p.scale, p.mean, p.intercept, p.platt, reach), p.coef, p.scale)


@dataclass(frozen=True, eq=False)
class LearnedGateFile:
    """A learned gate: the ``cheap`` probe (no draft), optionally a ``full`` probe (with the draft's TARG scores)
    and the ``band`` of cheap probabilities inside which the draft runs (a cascade); ``meta``: the label, the model,
    index and encoder it was learned with, how it was evaluated, and a digest of each question it was fitted on."""

    cheap: Probe
    full: Probe | None = None
    band: tuple[float, float] | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.full is None) != (self.band is None):
            raise RagateError("learned gate: a cascade needs both its full probe and its band")
        if self.band is not None and not (0.0 <= self.band[0] <= self.band[1] <= 1.0):
            raise RagateError(f"learned gate: the band {self.band} must satisfy 0 <= lo <= hi <= 1")
        if any(f in DRAFT_FEATURES for f in self.cheap.features):
            raise RagateError("learned gate: the cheap probe must not read the draft's scores")

    @property
    def label(self) -> str:
        return str(self.meta.get("label", "closed-wrong"))

    @property
    def reads_hidden(self) -> bool:
        return self.cheap.reads_hidden or (self.full is not None and self.full.reads_hidden)

    @property
    def need(self) -> Need:
        """What this file reads from a backend: the draft's TARG scores only in a cascade's band, the hidden state
        only where a probe reads it (a file learned with ``--no-hidden`` and no cascade runs on text alone)."""
        draft = self.full is not None
        return Need(token_logprobs=draft, top_k=2 if draft else 0, entropy=draft, hidden=self.reads_hidden)

    @property
    def reads_search(self) -> bool:
        probes = [self.cheap] + ([self.full] if self.full is not None else [])
        return any(f in RETRIEVAL_FEATURES for p in probes for f in p.features)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": LEARNED_FORMAT,
            "format_version": LEARNED_VERSION,
            "cheap": self.cheap.to_json(),
            "full": self.full.to_json() if self.full is not None else None,
            "band": list(self.band) if self.band is not None else None,
            **self.meta,
        }


def save_learned(gate: LearnedGateFile, path: str | Path) -> Path:
    """Write ``gate`` as one JSON object, atomically (a gate in force is swapped whole or not at all)."""
    path = Path(path)
    with atomic_writer(path) as f:
        f.write((json.dumps(gate.to_json(), ensure_ascii=False) + "\n").encode())
    return path


def load_learned(path: str | Path) -> LearnedGateFile:
    """Read a file written by :func:`save_learned`; a damaged or foreign file is an error naming the fix."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise RagateError(
            f"learned gate file {str(path)!r} not found: make one with `ragate gate learn --out FILE`"
        )
    stat = path.stat()
    return _load(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)  # keyed by mtime and size: a file learned again is read again
def _load(path: str, mtime_ns: int, size: int) -> LearnedGateFile:
    fix = "learn it again with `ragate gate learn`"
    try:
        data = parse_json(utf8_text(path, RagateError, fix), path, RagateError, fix)
    except OSError as err:
        raise RagateError(f"{path} cannot be read ({err.strerror}); {fix}") from None
    if not isinstance(data, dict) or data.get("format") != LEARNED_FORMAT:
        raise RagateError(f"{path} is not a learned gate file (format {LEARNED_FORMAT}); {fix}")
    if data.get("format_version") != LEARNED_VERSION:
        raise RagateError(
            f"{path} is learned gate format version {data.get('format_version')!r}, not {LEARNED_VERSION}; {fix}"
        )
    if (found := lone_surrogate(data)) is not None:
        raise RagateError(f"{path}: damaged learned gate: {found}; {fix}")
    if data.get("label", "closed-wrong") not in LEARNED_LABELS:
        raise RagateError(f"{path}: damaged learned gate: unknown label {str(data.get('label'))[:40]}; {fix}")
    try:
        band = data.get("band")
        return LearnedGateFile(
            Probe.from_json(data.get("cheap")),
            Probe.from_json(data["full"]) if data.get("full") is not None else None,
            (float(_number(band[0], "band")), float(_number(band[1], "band"))) if band is not None else None,
            {k: v for k, v in data.items() if k not in ("format", "format_version", "cheap", "full", "band")},
        )
    except RagateError as err:
        raise RagateError(f"{path}: damaged learned gate: {err}; {fix}") from None
    except (TypeError, IndexError):
        raise RagateError(f"{path}: damaged learned gate: the band must be two numbers; {fix}") from None


def serving_fault(gate: LearnedGateFile, lm: Any) -> str | None:
    """Why ``gate`` cannot decide for a run answering with ``lm`` (a backend: its ``model`` and ``capabilities``),
    in words that end with the fix, or None: learned on another model's answers and hidden states, or reading what
    the backend cannot give (a hidden state over a server)."""
    fitted = (gate.meta.get("model") or {}).get("model")
    if fitted and Path(str(fitted)).name != Path(str(lm.model)).name:
        return (
            f"was learned on the answers and hidden states of {fitted!r}, but this run answers with {lm.model!r}: "
            "learn one on this model's traffic (`ragate gate learn --store FEEDBACK.db --out GATE.json`, or "
            "Pipeline.learn()), or serve the model it was learned on"
        )
    caps = getattr(lm, "capabilities", None)
    if caps is None:
        return None
    from ragate.gates.base import support

    status, why = support(gate.need, caps)
    if status == "unavailable":
        return f"reads what the {getattr(lm, 'engine', '')} backend cannot give: {why}"
    return None


@dataclass(frozen=True)
class GateFileState:
    """The learned gate in force from one file while runs read it (:func:`gate_in_force`): ``gate``, the last
    version of the file that loaded and checked; ``problem``, why the file as it is now is not in force (None: it
    is); ``refusals``, how many versions of it were refused; ``stamp`` and ``refused``, the (mtime, size) of the
    version in force and of the one refused last ((0, -1): no file)."""

    gate: LearnedGateFile
    problem: str | None = None
    refusals: int = 0
    stamp: tuple[int, int] = (0, -1)
    refused: tuple[int, int] | None = None


# The gate in force per file (by absolute path), so that a file being rewritten, damaged or deleted while a service
# answers leaves the last good gate deciding rather than failing every answer.
_IN_FORCE: dict[str, GateFileState] = {}
_IN_FORCE_LOCK = threading.Lock()


def _stamp(path: str) -> tuple[int, int]:
    try:
        stat = os.stat(path)
    except OSError:
        return (0, -1)
    return (stat.st_mtime_ns, stat.st_size)


def _checked(path: str, lm: Any) -> LearnedGateFile:
    """The file at ``path`` loaded and checked for a run answering with ``lm`` (None: loaded only)."""
    gate = load_learned(path)
    fault = serving_fault(gate, lm) if lm is not None else None
    if fault is not None:
        raise RagateError(f"the learned gate file {path} {fault}")
    return gate


def put_in_force(path: str | Path, lm: Any) -> LearnedGateFile:
    """Load and check the file at ``path`` for a run answering with ``lm`` and make it the gate in force: a run's
    start, where a damaged file, numbers that overflow or a gate learned on another model are refused, naming it."""
    key = os.path.abspath(Path(path).expanduser())
    with _IN_FORCE_LOCK:
        stamp = _stamp(key)
        gate = _checked(key, lm)
        old = _IN_FORCE.get(key)
        _IN_FORCE[key] = GateFileState(gate, None, old.refusals if old is not None else 0, stamp)
    return gate


def gate_in_force(path: str | Path, lm: Any = None) -> GateFileState:
    """The learned gate in force from ``path``: the file as it is now where it loads and checks for ``lm``
    (:func:`serving_fault`), else the last version that did, with the reason (a file rewritten in place and read
    half-written, a damaged one swapped in, one deleted or learned on another model; a warning says so once per
    version); a file that never loaded is an error naming the fix. A file swapped in whole (``save_learned``)
    replaces the gate at the next call."""
    key = os.path.abspath(Path(path).expanduser())
    with _IN_FORCE_LOCK:
        stamp = _stamp(key)
        state = _IN_FORCE.get(key)
        if state is not None and stamp == state.stamp:  # the version in force (back again, if it had gone)
            if state.problem is not None:
                state = _IN_FORCE[key] = replace(state, problem=None, refused=None)
            return state
        if state is not None and stamp == state.refused:  # refused already: counted and said once
            return state
        try:
            gate = _checked(key, lm)
        except RagateError as err:
            if state is None:
                raise
            state = replace(state, problem=str(err), refusals=state.refusals + 1, refused=stamp)
            _IN_FORCE[key] = state
            warnings.warn(
                f"ragate: {err}; the learned gate read from it before stays in force",
                RuntimeWarning,
                stacklevel=2,
            )
            return state
        state = GateFileState(gate, None, state.refusals if state is not None else 0, stamp)
        _IN_FORCE[key] = state
        return state


def learned_in_force(path: str | Path) -> LearnedGateFile:
    """The gate a run keeps in force from ``path`` (:func:`gate_in_force`), else the file as it is: what a method
    reads from a backend follows the gate that decides."""
    with _IN_FORCE_LOCK:
        state = _IN_FORCE.get(os.path.abspath(Path(path).expanduser()))
    return state.gate if state is not None else load_learned(path)


def question_digest(question: str) -> str:
    """A training question's identity in a gate file: 16 hex digits of the sha256 of its text (no text kept)."""
    return hashlib.sha256(question.encode()).hexdigest()[:16]


def draft_scores(draft: Any) -> dict[str, float]:
    """TARG's entropy (Eq. 1) and margin (Eq. 2) scores of a draft's first 20 tokens, divided by k = 20."""
    from ragate.gates.targ import targ_entropy, targ_margin

    return {
        "targ-entropy": targ_entropy(draft, math.inf, k=DRAFT_TOKENS).score,
        "targ-margin": targ_margin(draft, math.inf, k=DRAFT_TOKENS).score,
    }


def scalar_vector(
    question: str,
    names: Sequence[str],
    *,
    hits: Any = None,
    freqs: Any = None,
    draft: Mapping[str, float] | None = None,
) -> np.ndarray:
    """The named scalar features of one question (its signals, and the draft's scores when named)."""
    base = [n for n in names if n in FEATURES]
    found = signals(
        question,
        base,
        (lambda: hits) if hits is not None else None,
        (lambda: freqs) if freqs is not None else None,
    )
    values = dict(zip(base, found.vector(base), strict=True))
    for n in names:
        if n in DRAFT_FEATURES:
            if draft is None:
                raise RagateError(f"the feature {n!r} needs the draft's scores")
            values[n] = float(draft[n])
    return np.array([values[n] for n in names], dtype=np.float64)


class Learned(Gate):
    """The learned gate: :class:`LearnedGateFile` from ``GateSpec.weights`` (``ragate gate learn``)."""

    name = "learned"
    description = (
        "a calibrated classifier over the question's signals and the model's hidden state, learned from labelled "
        "traffic (needs --gate-weights FILE from `ragate gate learn`); a cascade drafts only when unsure"
    )
    need = Need(token_logprobs=True, top_k=2, entropy=True)
    default_tau = 0.5
    tau_source = "the calibrated probability of the label: 0.5 is even odds (calibrate it to a budget)"
    reads_weights = True
    reads_index = True
    like = "targ-entropy"
    weights_source = (
        "`ragate gate learn --store FEEDBACK.db --out GATE.json` (or `--sweep DIR` of a training split, e.g. a sweep "
        "run with --offset 300)"
    )

    def fitted_file(self, path: str) -> FittedFile:
        """:func:`load_learned`; its training questions are :func:`question_digest` digests."""
        gate = load_learned(path)
        probes = [gate.cheap] + ([gate.full] if gate.full is not None else [])
        features = list(dict.fromkeys(f for p in probes for f in p.features))
        listed = gate.meta.get("questions")
        trained = (
            frozenset(q for q in listed if isinstance(q, str)) if isinstance(listed, list) else frozenset()
        )
        return FittedFile(
            trained,
            question_digest,
            {
                "questions": len(trained),
                "label": gate.label,
                "features": features + (["hidden"] if gate.reads_hidden else []),
                "cascade": gate.band is not None,
            },
        )

    def check_file(self, path: str, lm: Any) -> None:
        """:func:`put_in_force`: the file as a whole (its numbers, its model, what it reads) before any answer."""
        put_in_force(path, lm)

    def decide(self, ctx: GateContext, tau: float) -> GateDecision:
        path = ctx.params.weights
        if path is None:
            raise RagateError(
                "the learned gate needs a gate file: `ragate gate learn --store FEEDBACK.db --out GATE.json` "
                "(or Pipeline.learn()), then pass --gate-weights GATE.json"
            )
        gate = gate_in_force(path, ctx.lm).gate  # a file that goes bad while serving leaves the last good one
        hits = ctx.scored_search(SIGNAL_K) if gate.reads_search else None
        hidden = None
        if gate.reads_hidden:
            hidden = getattr(ctx, "hidden_state", lambda: None)()
        with ctx.timed("gate-score", overhead=True):
            p = float(
                gate.cheap.probabilities(scalar_vector(ctx.question, gate.cheap.features, hits=hits), hidden)[
                    0
                ]
            )
        label = gate.label
        if gate.band is None or gate.full is None or not (gate.band[0] < p < gate.band[1]):
            stage = "cheap stage" + (
                f", outside the band ({gate.band[0]:.3g}, {gate.band[1]:.3g})" if gate.band else ""
            )
            return _decision(self.name, p, tau, f"P({label}) = {p:.3f} ({stage}; no draft)")
        draft = ctx.draft(DRAFT_TOKENS)
        scores = draft_scores(draft)
        with ctx.timed("gate-score", overhead=True):
            x = scalar_vector(ctx.question, gate.full.features, hits=hits, draft=scores)
            p2 = float(gate.full.probabilities(x, hidden)[0])
        return _decision(
            self.name, p2, tau,
            f"P({label}) = {p2:.3f} (draft stage: the cheap P = {p:.3f} was inside the band "
            f"({gate.band[0]:.3g}, {gate.band[1]:.3g}))",
        )  # fmt: skip


def _decision(name: str, p: float, tau: float, why: str) -> GateDecision:
    retrieve = p > tau
    return GateDecision(retrieve, p, tau, f"{name}: {why} {'>' if retrieve else '<='} tau = {tau:g}")
