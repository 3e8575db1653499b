"""Route policies that choose a route from features instead of checking each answer in turn, evaluated live from
the numbers a route calibration file holds (``ragate calibrate --gate route --policy ...``; fitted by
:mod:`ragate.report.route_budget`, no pickle).

- ``adaptive-rag`` (Jeong et al., NAACL 2024, Section 3.3): a classifier of the question alone, trained on the
  cheapest route that answered each training question right (where none did, the dataset's kind), chooses the
  one route to run. The paper's classifier is a T5-Large; here a multinomial logistic regression on ragate's
  question features (:func:`question_vector`).
- ``learned`` (ragate's, after MBA-RAG's reward of right minus lambda times steps, COLING 2025): the first route
  always answers; then, for each route, P(right | the question's features and the first answer's) from a logistic
  fit per route, and the route maximising P(right) - lambda * its mean retrievals runs (the first route's answer
  stands where that is the first route). Lambda is chosen for a budget of mean retrievals per question.

Both fits are scikit-learn's ``StandardScaler`` then ``LogisticRegression``, kept as their numbers (:class:`Linear`)
so that the live choice is the fitted model's to the last digit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ragate.errors import RagateError
from ragate.gates.pairs import contains_words
from ragate.methods.spec import POLICY_NAMES
from ragate.text import normalize_answer


@dataclass(frozen=True)
class Linear:
    """A standardised logistic regression: features z = (x - mean) / scale, logits coef @ z + intercept, its
    ``classes`` in order (a binary fit keeps one row of coefficients, as scikit-learn does)."""

    mean: tuple[float, ...]
    scale: tuple[float, ...]
    coef: tuple[tuple[float, ...], ...]
    intercept: tuple[float, ...]
    classes: tuple[int, ...]

    def probabilities(self, x: np.ndarray) -> np.ndarray:
        """Each row's probability of each class (rows of ``x``: feature vectors), as ``predict_proba`` gives it."""
        z = (np.atleast_2d(np.asarray(x, dtype=float)) - np.asarray(self.mean)) / np.asarray(self.scale)
        with np.errstate(over="ignore", invalid="ignore"):
            logits = z @ np.asarray(self.coef).T + np.asarray(self.intercept)
        if not np.isfinite(logits).all():
            raise RagateError("the route policy's fitted model gives a non-finite value for these features: refit it")
        if len(self.coef) == 1:  # binary: the positive class's logit
            p = 1.0 / (1.0 + np.exp(-logits[:, 0]))
            return np.column_stack([1.0 - p, p])
        logits -= logits.max(axis=1, keepdims=True)
        e = np.exp(logits)
        return e / e.sum(axis=1, keepdims=True)  # type: ignore[no-any-return]

    @classmethod
    def from_sklearn(cls, model: Any) -> Linear:
        """The numbers of a fitted ``make_pipeline(StandardScaler(), LogisticRegression())``."""
        scaler, lr = model[0], model[-1]
        return cls(
            tuple(map(float, scaler.mean_)), tuple(float(s) or 1.0 for s in scaler.scale_),
            tuple(tuple(map(float, row)) for row in lr.coef_), tuple(map(float, lr.intercept_)),
            tuple(int(c) for c in lr.classes_),
        )  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {"mean": list(self.mean), "scale": list(self.scale), "coef": [list(r) for r in self.coef],
                "intercept": list(self.intercept), "classes": list(self.classes)}  # fmt: skip

    @classmethod
    def from_json(cls, data: Any, where: str) -> Linear:
        """A :class:`Linear` from its JSON form, every number checked (finite, shapes that agree); else a
        :class:`RagateError` naming ``where``."""

        def numbers(value: Any, what: str) -> tuple[float, ...]:
            if not isinstance(value, list) or not value or not all(_finite(v) for v in value):
                raise RagateError(f"{where}: {what!r} must be a list of finite numbers")
            return tuple(float(v) for v in value)

        if not isinstance(data, dict):
            raise RagateError(f"{where}: a fitted model is a JSON object, not {type(data).__name__}")
        mean, scale = numbers(data.get("mean"), "mean"), numbers(data.get("scale"), "scale")
        rows = data.get("coef")
        if not isinstance(rows, list) or not rows:
            raise RagateError(f"{where}: 'coef' must be a list of rows of coefficients")
        coef = tuple(numbers(r, "coef") for r in rows)
        intercept = numbers(data.get("intercept"), "intercept")
        classes = data.get("classes")
        if not isinstance(classes, list) or not all(isinstance(c, int) and not isinstance(c, bool) for c in classes):
            raise RagateError(f"{where}: 'classes' must be a list of route numbers")
        width = len(mean)
        if len(scale) != width or any(len(r) != width for r in coef) or min(scale) <= 0:
            raise RagateError(f"{where}: 'mean', 'scale' and each row of 'coef' must have one positive scale and "
                              f"one number per feature ({width})")  # fmt: skip
        if len(intercept) != len(coef) or len(classes) != (2 if len(coef) == 1 else len(coef)):
            raise RagateError(f"{where}: 'coef', 'intercept' and 'classes' do not agree in length")
        if len(set(classes)) != len(classes):
            raise RagateError(f"{where}: 'classes' names a route twice")
        return cls(mean, scale, coef, intercept, tuple(classes))


def _finite(value: Any) -> bool:
    """A JSON number that is finite as a float (an integer too large for one is not)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


@dataclass(frozen=True)
class RoutePolicyModel:
    """A fitted route policy. ``adaptive-rag``: ``choose`` classifies the question (a :class:`Linear` over route
    numbers, or the one route every training question was labelled with). ``learned``: ``right`` holds, per
    route, P(right) as a :class:`Linear` (classes 0/1) or the constant its training questions gave, ``costs`` each
    route's mean retrievals (the first's 0: it has run), ``lam`` the price of one retrieval. ``calibrated`` (the
    cascade with its checks combined by a fit): ``right`` holds, per stage (every route but the last), P(right) of
    that route's answer from :func:`stage_vector`, and ``stops`` each stage's threshold (inf: never stops)."""

    kind: str
    choose: Linear | int | None = None
    right: tuple[Linear | float, ...] = ()
    costs: tuple[float, ...] = ()
    lam: float = 0.0
    stops: tuple[float, ...] = ()

    def to_json(self) -> dict[str, Any]:
        features = list(feature_names(self.kind))
        if self.kind == "adaptive-rag":
            return {"features": features,
                    "classifier": self.choose.to_json() if isinstance(self.choose, Linear) else self.choose}  # fmt: skip
        right = [r.to_json() if isinstance(r, Linear) else r for r in self.right]
        if self.kind == "calibrated":
            return {"features": features, "right": right, "stops": [s if math.isfinite(s) else None for s in self.stops]}
        return {"features": features, "right": right, "costs": list(self.costs), "lambda": self.lam}

    @classmethod
    def from_json(cls, kind: str, data: Mapping[str, Any], routes: int, where: str) -> RoutePolicyModel:
        """The policy a calibration file of ``routes`` routes holds, checked; a :class:`RagateError` naming
        ``where`` and the field otherwise."""
        check_features(data, kind, where)
        return cls._read(kind, data, routes, where)._checked(where)

    @classmethod
    def _read(cls, kind: str, data: Mapping[str, Any], routes: int, where: str) -> RoutePolicyModel:
        """:meth:`from_json`'s fields, each checked in itself."""
        if kind == "adaptive-rag":
            found = data.get("classifier")
            if isinstance(found, int) and not isinstance(found, bool):
                if not 0 <= found < routes:
                    raise RagateError(f"{where}: 'classifier' names route {found} of {routes}")
                return cls(kind, choose=found)
            classifier = Linear.from_json(found, f"{where}, 'classifier'")
            if any(not 0 <= c < routes for c in classifier.classes):
                raise RagateError(f"{where}: the classifier's classes name routes beyond the {routes} routes")
            return cls(kind, choose=classifier)
        if kind not in ("learned", "calibrated"):
            raise RagateError(f"{where}: unknown route policy {kind!r}: {POLICY_NAMES}")
        right, costs, lam = data.get("right"), data.get("costs"), data.get("lambda")
        fitted = routes if kind == "learned" else routes - 1
        if not isinstance(right, list) or len(right) != fitted:
            what = "route" if kind == "learned" else "stage (every route but the last)"
            raise RagateError(f"{where}: 'right' must hold one fit per {what} ({fitted})")
        if kind == "calibrated":
            stops = data.get("stops")
            if not isinstance(stops, list) or len(stops) != fitted or not all(s is None or _finite(s) for s in stops):
                raise RagateError(f"{where}: 'stops' must hold {fitted} thresholds (a number, or null: never stops)")
            return cls(kind, right=_right_fits(right, where),
                       stops=tuple(math.inf if s is None else float(s) for s in stops))  # fmt: skip
        if not isinstance(costs, list) or len(costs) != routes or not all(_finite(c) and c >= 0 for c in costs):
            raise RagateError(f"{where}: 'costs' must hold each route's mean retrievals ({routes} numbers, 0 or more)")
        if costs[0] != 0:
            raise RagateError(f"{where}: 'costs' starts with 0 (the first route has run when the policy chooses)")
        if not _finite(lam) or float(lam) < 0:  # type: ignore[arg-type]
            raise RagateError(f"{where}: 'lambda' must be a number, 0 or more, not {lam!r}")
        return cls(kind, right=_right_fits(right, where), costs=tuple(map(float, costs)), lam=float(lam))  # type: ignore[arg-type]

    def _checked(self, where: str) -> RoutePolicyModel:
        """This policy, refused naming ``where`` where a fitted model reads another number of features than the
        policy's names list (:meth:`_read` checks each :class:`Linear` only in itself)."""
        width = len(feature_names(self.kind))
        for fit in (self.choose, *self.right):
            if isinstance(fit, Linear) and len(fit.mean) != width:
                raise RagateError(
                    f"{where}: a fitted model reads {len(fit.mean)} features, and the {self.kind} policy's are "
                    f"{width} (the file's 'features'): the file is damaged"
                )
        return self


def _right_fits(right: list[Any], where: str) -> tuple[Linear | float, ...]:
    """Fits of P(right), each a probability or a binary :class:`Linear` (classes 0, 1), checked."""
    fits: list[Linear | float] = []
    for j, r in enumerate(right):
        if _finite(r):
            if not 0 <= r <= 1:
                raise RagateError(f"{where}: 'right' of route {j} is a probability, not {r!r}")
            fits.append(float(r))
            continue
        fit = Linear.from_json(r, f"{where}, 'right' of route {j}")
        if fit.classes != (0, 1):
            raise RagateError(f"{where}: 'right' of route {j} must be a fit of right (1) or wrong (0)")
        fits.append(fit)
    return tuple(fits)


def answers_agree(a: str, b: str) -> bool:
    """Two answers agree when their SQuAD-normalised texts are equal, or one's words appear whole in the other's
    (a short answer inside a longer phrasing of it: ``pairs-lenient``'s test); an empty answer agrees with nothing."""
    return contains_words(normalize_answer(a), normalize_answer(b))


def question_vector(questions: Sequence[str]) -> np.ndarray:
    """ragate's question-side signals, one row per question (length, question word, digit, date; not rarity,
    which needs the index): the features both policies read of the question."""
    from ragate.gates.signals import QUESTION_FEATURES, signals

    names = tuple(n for n in QUESTION_FEATURES if n != "rarity")
    return np.array([signals(q, names, None, None).vector(names) for q in questions], dtype=float)


def answer_vector(nll: float | None, answer: str, tokens: float) -> list[float]:
    """What the first route's answer shows once written, at no further model call: its normalised NLL (0 where
    there is none, with a column saying whether there is one), its words (log), whether it is empty, and its
    tokens (log)."""
    value = nll if nll is not None and math.isfinite(nll) else None
    words = len(answer.split())
    return [value or 0.0, float(value is not None), math.log1p(words), float(not answer.strip()), math.log1p(tokens)]


ANSWER_FEATURES = ("answer_nll", "has_nll", "log_words", "empty", "log_tokens")  # answer_vector's, in order
STAGE_FEATURES = ("answer_nll", "has_nll", "agree", "supported", "has_supported", "log_words", "empty")


def stage_vector(nll: float | None, answer: str, before: str | None, found: bool | None) -> list[float]:
    """What a route's answer shows at no model call, for the calibrated cascade's stage fit: its normalised NLL
    (0 where there is none, with a column saying whether there is one), whether it agrees with the answer of the
    route before (0 for the first route), whether the passages it read hold it (0 where that says nothing, with a
    column saying whether it says), its words (log) and whether it is empty."""
    value = nll if nll is not None and math.isfinite(nll) else None
    words = len(answer.split())
    agree = before is not None and answers_agree(answer, before)
    return [value or 0.0, float(value is not None), float(agree), float(bool(found)), float(found is not None),
            math.log1p(words), float(words == 0)]  # fmt: skip


def feature_names(kind: str) -> tuple[str, ...]:
    """The features a policy reads, in order: the question's (:func:`question_vector`), then, for ``learned``,
    the first answer's (:func:`answer_vector`)."""
    from ragate.gates.signals import QUESTION_FEATURES

    if kind == "calibrated":
        return STAGE_FEATURES
    names = tuple(n for n in QUESTION_FEATURES if n != "rarity")
    return (*names, *ANSWER_FEATURES) if kind == "learned" else names


def check_features(data: Mapping[str, Any], kind: str, where: str) -> None:
    """Refuse a fit on other features than this version computes, by name and order (a file from another
    version)."""
    want = list(feature_names(kind))
    if data.get("features") != want:
        raise RagateError(
            f"{where} was fitted on the features {data.get('features')!r}, and this ragate computes {want}: rerun "
            "ragate calibrate --gate route with this version"
        )


def adaptive_choice(model: RoutePolicyModel, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Adaptive-RAG's route for each row of question features, and each route's probability (rows: questions)."""
    if not isinstance(model.choose, Linear):
        n = len(x)
        return np.full(n, int(model.choose or 0)), np.ones((n, 1))
    p = model.choose.probabilities(x)
    return np.asarray(model.choose.classes)[p.argmax(axis=1)], p


def right_probabilities(model: RoutePolicyModel, x: np.ndarray) -> np.ndarray:
    """P(right) of each route for each row of features (the question's, then the first answer's)."""
    return np.column_stack(
        [np.full(len(x), r) if isinstance(r, float) else r.probabilities(x)[:, 1] for r in model.right]
    )


def learned_values(model: RoutePolicyModel, x: np.ndarray) -> np.ndarray:
    """P(right) - lambda * cost of each route for each row of features: the learned policy takes the largest."""
    return right_probabilities(model, x) - model.lam * np.asarray(model.costs)  # type: ignore[no-any-return]
