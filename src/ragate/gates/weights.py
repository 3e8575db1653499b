"""The trained no-model gate's weights (``ragate gate fit``, read by ``no-model-lr``): the plain-JSON file, its
checks against the model and index it is used with, and the questions it was fitted on."""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ragate.errors import RagateError
from ragate.fileio import atomic_writer, lone_surrogate, parse_json, utf8_text
from ragate.gates.signals import FEATURES, RETRIEVAL_FEATURES

LABELS = ("closed-wrong", "retrieval-fixed")
WEIGHTS_FORMAT = "ragate-gate-weights"
WEIGHTS_VERSION = 1
REACH = 1e6  # inputs a fitted file must score finitely: |x| up to this (a question's words, a BM25 score, a state)


def logit_bound(
    coef: np.ndarray, scale: np.ndarray, mean: np.ndarray, intercept: float, platt: tuple[float, float] = (1.0, 0.0),
    reach: np.ndarray | float = REACH,
) -> float:  # fmt: skip
    """The largest logit a standardised linear model ``a * (intercept + coef . (x - mean) / scale) + b`` gives for
    inputs with ``|x| <= reach``: ``|b| + |a| (|intercept| + sum(|coef| (reach + |mean|) / scale))``; infinite where
    its numbers overflow on such inputs (coef 1e308 over scale 1e-308), which would score every answer NaN or
    infinity. A fit standardises its inputs, so its coefficients are a few units and its scales at least 1e-12."""
    a, b = platt
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        # the largest |x - mean| / scale
        spread = (np.asarray(reach, dtype=np.float64) + np.abs(mean)) / scale
        if not np.all(np.isfinite(spread)):
            return math.inf
        bound = abs(b) + abs(a) * (abs(intercept) + float(np.sum(np.abs(coef) * spread)))
    return bound if math.isfinite(bound) else math.inf


def overflow_fault(bound: float, coef: np.ndarray, scale: np.ndarray) -> str | None:
    """What :func:`logit_bound` found, in words (None where the numbers score every input finitely)."""
    if math.isfinite(bound):
        return None
    return (
        f"its numbers overflow (a coefficient of {float(np.max(np.abs(coef))):.3g} over a scale of "
        f"{float(np.min(scale)):.3g}): an input of {REACH:g} or less would score NaN or infinity, and a fit gives "
        "coefficients of a few units over scales of at least 1e-12"
    )


@dataclass(frozen=True, eq=False)
class GateWeights:
    """A standardised logistic regression: score = sigmoid(intercept + coef . (x - mean) / scale) over the named
    ``features``; ``meta`` records the label, the model, the index's corpus, the encoder and the signals' score
    kind it was fitted with, and where the records came from."""

    features: tuple[str, ...]
    mean: np.ndarray
    scale: np.ndarray
    coef: np.ndarray
    intercept: float
    meta: Mapping[str, Any]

    def __post_init__(self) -> None:
        fault = _weights_fault(list(self.features), self.mean, self.scale, self.coef, self.intercept)
        if fault is not None:
            raise RagateError(f"gate weights: {fault}")

    def score(self, x: np.ndarray) -> float:
        """P(label | x) under the fitted model."""
        z = self.intercept + float(
            np.dot(self.coef, (np.asarray(x, dtype=np.float64) - self.mean) / self.scale)
        )
        return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))

    @property
    def reads_search(self) -> bool:
        return any(f in RETRIEVAL_FEATURES for f in self.features)

    @property
    def reads_corpus(self) -> bool:
        return self.reads_search or "rarity" in self.features

    def to_json(self) -> dict[str, Any]:
        return {
            "format": WEIGHTS_FORMAT,
            "format_version": WEIGHTS_VERSION,
            "features": list(self.features),
            "mean": self.mean.tolist(),
            "scale": self.scale.tolist(),
            "coef": self.coef.tolist(),
            "intercept": self.intercept,
            **self.meta,
        }


def _weights_fault(features: Any, mean: Any, scale: Any, coef: Any, intercept: Any) -> str | None:
    if not isinstance(features, list) or not features or not all(isinstance(f, str) for f in features):
        return f"features must be a non-empty list of names, not {str(features)[:60]}"
    unknown = [f for f in features if f not in FEATURES]
    if unknown:
        return f"unknown features {unknown[:3]} (known: {', '.join(FEATURES)})"
    if len(set(features)) != len(features):
        return "a feature is named twice"
    arrays = {}
    for name, value in (("mean", mean), ("scale", scale), ("coef", coef)):
        if isinstance(value, np.ndarray):
            value = value.tolist()
        if not isinstance(value, list) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in value
        ):
            return f"{name} must be a list of numbers"
        arrays[name] = np.asarray(value, dtype=np.float64)
        if arrays[name].shape != (len(features),):
            return f"{name} has {arrays[name].size} values for {len(features)} features"
        if not np.all(np.isfinite(arrays[name])):
            return f"{name} holds NaN or infinity"
    if not np.all(arrays["scale"] > 0):
        return "every scale must be positive"
    if isinstance(intercept, bool) or not isinstance(intercept, int | float) or not math.isfinite(intercept):
        return f"the intercept must be a finite number, not {intercept!r:.40}"
    bound = logit_bound(arrays["coef"], arrays["scale"], arrays["mean"], float(intercept))
    return overflow_fault(bound, arrays["coef"], arrays["scale"])


def _record_fault(data: Mapping[str, Any]) -> str | None:
    """What is wrong with what a weights file records besides its numbers: its label, its model (an object),
    its index and encoder (objects or null), its score kind (text or null)."""
    for key in ("model", "index", "encoder"):
        if data.get(key) is not None and not isinstance(data.get(key), dict):
            return f"its {key} must be an object, not {str(data.get(key))[:40]}"
    if data.get("label") not in LABELS:
        return f"its label must be one of {', '.join(LABELS)}, not {str(data.get('label'))[:40]}"
    if not isinstance(data.get("model"), dict):
        return "it records no model"
    if data.get("score_kind") is not None and not isinstance(data.get("score_kind"), str):
        return "its score_kind must be a string"
    return None


def save_weights(weights: GateWeights, path: str | Path) -> Path:
    """Write ``weights`` as one JSON object, atomically."""
    path = Path(path)
    with atomic_writer(path) as f:
        f.write((json.dumps(weights.to_json(), ensure_ascii=False, indent=1) + "\n").encode())
    return path


def load_weights(path: str | Path) -> GateWeights:
    """Read a weights file written by :func:`save_weights`; a damaged or foreign file is a named error."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise RagateError(
            f"gate weights {str(path)!r} not found: fit them with `ragate gate fit --sweep SWEEP_DIR --out FILE`"
        )
    stat = path.stat()
    return _load_weights(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)  # keyed by mtime and size: a refit is re-read
def _load_weights(path: str, mtime_ns: int, size: int) -> GateWeights:
    fix = "fit them again with `ragate gate fit`"
    try:
        data = parse_json(utf8_text(path, RagateError, fix), path, RagateError, fix)
    except OSError as err:
        raise RagateError(f"{path} cannot be read ({err.strerror}); {fix}") from None
    if not isinstance(data, dict) or data.get("format") != WEIGHTS_FORMAT:
        raise RagateError(f"{path} is not a gate weights file (format {WEIGHTS_FORMAT}); {fix}")
    if data.get("format_version") != WEIGHTS_VERSION:
        raise RagateError(
            f"{path} is gate weights format version {data.get('format_version')!r}; this ragate reads version "
            f"{WEIGHTS_VERSION}: {fix}"
        )
    if (found := lone_surrogate(data)) is not None:
        raise RagateError(f"{path}: damaged gate weights: {found}, which is not text; {fix}")
    numbers = (data.get(k) for k in ("features", "mean", "scale", "coef", "intercept"))
    fault = _weights_fault(*numbers) or _record_fault(data)
    if fault is not None:
        raise RagateError(f"{path}: damaged gate weights: {fault}; {fix}")
    keep = {"features", "mean", "scale", "coef", "intercept", "format", "format_version"}
    return GateWeights(
        tuple(data["features"]),
        np.asarray(data["mean"], dtype=np.float64),
        np.asarray(data["scale"], dtype=np.float64),
        np.asarray(data["coef"], dtype=np.float64),
        float(data["intercept"]),
        {k: v for k, v in data.items() if k not in keep},
    )


def check_weights(
    weights: GateWeights,
    *,
    model: Mapping[str, Any],
    encoder: Mapping[str, Any] | None,
    corpus: Mapping[str, Any] | None,
    score_kind: str | None,
    where: str = "this run",
) -> None:
    """Refuse weights fitted for another model (its answers gave the labels), another index's corpus (the
    document frequencies and the scores), another encoder or another kind of score (the retrieval signals)."""
    check_weights_model(weights, model, where)
    meta = weights.meta
    if not weights.reads_corpus:
        return
    built = meta.get("index") or {}
    if corpus is None:
        raise RagateError(
            f"the gate weights read the index's corpus ({', '.join(f for f in weights.features if f in (*RETRIEVAL_FEATURES, 'rarity'))}), "
            f"and {where} searches no index directory to check it against: use an index built by `ragate index build`"
        )
    if built.get("passages_sha256") != corpus.get("passages_sha256") or built.get("passages") != corpus.get(
        "passages"
    ):
        raise RagateError(
            f"the gate weights were fitted over an index of {built.get('passages')} passages (sha256 "
            f"{str(built.get('passages_sha256'))[:12]}), but {where} searches {corpus.get('passages')} passages "
            f"(sha256 {str(corpus.get('passages_sha256'))[:12]}): the signals differ; fit them with this index "
            "(`ragate gate fit --index ...`)"
        )
    if not weights.reads_search:
        return
    if meta.get("score_kind") != score_kind:
        raise RagateError(
            f"the gate weights read {meta.get('score_kind')!r} search scores, but {where} gives {score_kind!r} "
            f"scores (a {corpus.get('kind')} index): fit them with this index (`ragate gate fit --index ...`)"
        )
    fitted_encoder = meta.get("encoder") or {}
    now = encoder or {}
    keys = ("name", "dim", "query_prefix")
    if any(fitted_encoder.get(k) != now.get(k) for k in keys):
        raise RagateError(
            f"the gate weights read search scores of encoder {fitted_encoder.get('name')!r}, but {where} embeds with "
            f"{now.get('name')!r}: fit them with this index (`ragate gate fit --index ...`)"
        )


def check_weights_model(
    weights: GateWeights, model: Mapping[str, Any], where: str = "this run", path: str | None = None
) -> None:
    """Refuse weights fitted on what another model got wrong (its answers gave the labels), naming the fix; ``path``
    names the file (a run that checks it at start)."""
    fitted = weights.meta.get("model") or {}
    if fitted.get("sha256") and model.get("sha256"):
        same = fitted["sha256"] == model["sha256"]
    else:
        same = (fitted.get("engine"), fitted.get("model")) == (model.get("engine"), model.get("model"))
    if same:
        return
    digests = ""
    if fitted.get("sha256") or model.get("sha256"):  # the same name with other bytes: say which differ
        digests = f"; its file's sha256 {str(fitted.get('sha256'))[:16]}, this one's {str(model.get('sha256'))[:16]}"
    raise RagateError(
        f"the gate weights {f'{path} ' if path else ''}were fitted on what model {fitted.get('model')!r} "
        f"({fitted.get('engine')}) got wrong, but {where} uses {model.get('model')!r} ({model.get('engine')})"
        f"{digests}: a sweep of this model gives its labels (`ragate sweep ... --model M` then `ragate gate fit`), "
        "or serve them with the model they were fitted on"
    )


def question_digest(question: str) -> str:
    """A training question's identity in a weights file (16 hex digits of the sha256 of its SKR key)."""
    from ragate.gates.skr import question_key

    return hashlib.sha256(question_key(question).encode()).hexdigest()[:16]


def overlap(weights: GateWeights, questions: Sequence[str]) -> list[str]:
    """The given questions that trained ``weights`` (by :func:`question_digest`)."""
    trained = set(weights.meta.get("questions") or ())
    return [q for q in questions if question_digest(q) in trained]
