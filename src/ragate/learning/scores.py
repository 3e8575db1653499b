"""``ragate gate learn``: fit the learned gate (:mod:`ragate.gates.learned`) on labelled questions, and say how
good it is without scoring a question it was fitted on.

The classifier is scikit-learn's: the hidden states reduced by PCA (fitted on the training rows), the scalars and
the components standardised, an L2 logistic regression, then Platt scaling fitted on *cross-fitted* scores (each
question scored by a model that did not see it), so the probability is calibrated. Everything reported here is
cross-fitted (stratified folds, seeded) or on a held-out set given apart: AUROC with a bootstrap interval, the
expected calibration error, the retrieval rate at a budget's tau, and the curve of AUROC against the number of
labels. A fit refuses, naming how many more labels it needs, while either class has fewer than
:data:`MIN_CLASS` questions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ragate.errors import RagateError
from ragate.gates.learned import DRAFT_FEATURES, LearnedGateFile, Probe, sigmoid
from ragate.uncertainty import auroc, auroc_interval

MIN_CLASS = 10
DEFAULT_COMPONENTS = 16
DEFAULT_C = 0.1
DEFAULT_FOLDS = 5


@dataclass(frozen=True, eq=False)
class Labelled:
    """Labelled questions: ``scalars`` (n x len(names)), ``hidden`` (n x d, or None), ``y`` (True: retrieve)."""

    ids: tuple[str, ...]
    names: tuple[str, ...]
    scalars: np.ndarray
    hidden: np.ndarray | None
    y: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, idx: np.ndarray | Sequence[int]) -> Labelled:
        idx = np.asarray(idx, dtype=int)
        return Labelled(
            tuple(self.ids[i] for i in idx),
            self.names,
            self.scalars[idx],
            None if self.hidden is None else self.hidden[idx],
            self.y[idx],
        )

    def select(self, names: Sequence[str], hidden: bool = True) -> Labelled:
        """The same questions with only the scalar features ``names`` (and the hidden state only if ``hidden``)."""
        cols = [self.names.index(n) for n in names]
        return Labelled(
            self.ids, tuple(names), self.scalars[:, cols], self.hidden if hidden else None, self.y
        )


def shortfall(retrieve: int, no_retrieve: int) -> str:
    """How many more labels of each class a fit needs, in words ("10 more 'retrieve' and 4 more 'no-retrieve'";
    empty where both classes have :data:`MIN_CLASS`)."""
    return " and ".join(
        f"{MIN_CLASS - n} more {name!r}"
        for name, n in (("retrieve", retrieve), ("no-retrieve", no_retrieve))
        if n < MIN_CLASS
    )


def check_labels(y: np.ndarray, label: str | None = None) -> None:
    """Refuse a fit while either class has fewer than :data:`MIN_CLASS` questions, naming how many more of each
    class it needs (of the label kind ``label``, where given)."""
    pos, neg = int(np.sum(y)), int(len(y) - np.sum(y))
    if min(pos, neg) < MIN_CLASS:
        of = f" of {label}" if label else ""
        raise RagateError(
            f"the labels{of} hold {pos} questions labelled 'retrieve' and {neg} labelled 'no-retrieve': a fit needs "
            f"at least {MIN_CLASS} of each, so {shortfall(pos, neg)} labels{of} (keep shadow answers on, post "
            "feedback, or import a labelled sweep)"
        )


def _raw_probe(data: Labelled, components: int, c: float, seed: int) -> Probe:
    """Scaler, PCA of the hidden states and logistic regression fitted on ``data`` (no Platt scaling yet)."""
    from sklearn.decomposition import PCA
    from sklearn.linear_model import LogisticRegression

    x = np.asarray(data.scalars, dtype=np.float64)
    hidden_mean = comps = None
    if data.hidden is not None and components > 0:
        h = np.asarray(data.hidden, dtype=np.float64)
        n = min(components, h.shape[0] - 1, h.shape[1])
        pca = PCA(n_components=n, random_state=seed).fit(h)
        hidden_mean, comps = pca.mean_, pca.components_
        x = np.hstack([x, (h - hidden_mean) @ comps.T])
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[~(scale > 1e-12)] = 1.0
    model = LogisticRegression(C=c, max_iter=5000).fit((x - mean) / scale, data.y.astype(int))
    return Probe(
        data.names, mean, scale, model.coef_[0].astype(np.float64), float(model.intercept_[0]),
        (1.0, 0.0), hidden_mean, comps,
    )  # fmt: skip


def _platt(logits: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    from sklearn.linear_model import LogisticRegression

    m = LogisticRegression(C=1e6, max_iter=5000).fit(logits.reshape(-1, 1), y.astype(int))
    return float(m.coef_[0][0]), float(m.intercept_[0])


def cross_fitted_logits(
    data: Labelled,
    *,
    components: int = DEFAULT_COMPONENTS,
    c: float = DEFAULT_C,
    seed: int = 0,
    folds: int = DEFAULT_FOLDS,
) -> np.ndarray:
    """Each question's logit from a probe fitted on the other folds (stratified, seeded)."""
    from sklearn.model_selection import StratifiedKFold

    k = max(2, min(folds, int(data.y.sum()), int((~data.y).sum())))
    out = np.zeros(len(data))
    for train, test in StratifiedKFold(n_splits=k, shuffle=True, random_state=seed).split(
        data.scalars, data.y
    ):
        probe = _raw_probe(data.take(train), components, c, seed)
        part = data.take(test)
        out[test] = probe.logits(part.scalars, part.hidden)
    return out


def fit_probe(
    data: Labelled,
    *,
    components: int = DEFAULT_COMPONENTS,
    c: float = DEFAULT_C,
    seed: int = 0,
    folds: int = DEFAULT_FOLDS,
) -> tuple[Probe, np.ndarray]:
    """The probe fitted on all of ``data`` with Platt scaling from cross-fitted logits, and those cross-fitted
    probabilities (for reports: no question is scored by a model that saw it)."""
    check_labels(data.y)
    oof = cross_fitted_logits(data, components=components, c=c, seed=seed, folds=folds)
    a, b = _platt(oof, data.y)
    raw = _raw_probe(data, components, c, seed)
    probe = Probe(
        raw.features, raw.mean, raw.scale, raw.coef, raw.intercept, (a, b), raw.hidden_mean, raw.components
    )
    return probe, np.array([sigmoid(a * v + b) for v in oof])


def choose_band(p_cheap: np.ndarray, share: float) -> tuple[float, float]:
    """The band of cheap probabilities, centred on the median's side of 0.5 as the data fall, holding the share
    ``share`` of questions closest to the decision boundary 0.5 (those whose draft the cascade pays)."""
    if not 0.0 <= share <= 1.0:
        raise RagateError(f"the drafted share must be in [0, 1], not {share}")
    if share == 0.0 or len(p_cheap) == 0:
        return (0.5, 0.5)
    dist = np.sort(np.abs(np.asarray(p_cheap) - 0.5))
    half = float(dist[min(len(dist) - 1, max(0, int(np.ceil(share * len(dist))) - 1))]) + 1e-9
    return (max(0.0, 0.5 - half), min(1.0, 0.5 + half))


def cascade_probabilities(
    p_cheap: np.ndarray, p_full: np.ndarray, band: tuple[float, float]
) -> tuple[np.ndarray, np.ndarray]:
    """The cascade's probabilities (the full probe's inside the band, the cheap one's outside) and which drafted."""
    inside = (p_cheap > band[0]) & (p_cheap < band[1])
    return np.where(inside, p_full, p_cheap), inside


def ece(p: np.ndarray, y: np.ndarray, bins: int = 10) -> float:
    """Expected calibration error over ``bins`` equal-width bins of the probability."""
    p, y = np.asarray(p, dtype=float), np.asarray(y, dtype=float)
    edges = np.linspace(0, 1, bins + 1)
    total = 0.0
    for i in range(bins):
        m = (p >= edges[i]) & ((p < edges[i + 1]) if i < bins - 1 else (p <= edges[i + 1]))
        if m.any():
            total += m.mean() * abs(p[m].mean() - y[m].mean())
    return float(total)


def rate_at_tau(p: np.ndarray, tau: float) -> float:
    return float(np.mean(np.asarray(p) > tau)) if len(p) else 0.0


def learn_gate(
    data: Labelled,
    *,
    label: str,
    components: int = DEFAULT_COMPONENTS,
    c: float = DEFAULT_C,
    seed: int = 0,
    cascade_share: float | None = None,
    meta: dict[str, object] | None = None,
) -> tuple[LearnedGateFile, dict[str, object], np.ndarray]:
    """The learned gate on ``data``, its cross-fitted report, and each question's cross-fitted probability of the
    gate as it runs (the cascade's where there is one; each question scored by a fit that did not see it). With ``cascade_share`` (and draft scores among
    ``data.names``), a cascade: the cheap probe reads every feature but the draft's, the full probe all of them,
    and the band drafts that share of questions."""
    cheap_names = [n for n in data.names if n not in DRAFT_FEATURES]
    cheap, p_cheap = fit_probe(data.select(cheap_names), components=components, c=c, seed=seed)
    report: dict[str, object] = {
        "n": len(data),
        "positives": int(data.y.sum()),
        **_summary("cheap", p_cheap, data.y, seed),
    }
    full = band = None
    if cascade_share is not None:
        if not any(n in DRAFT_FEATURES for n in data.names):
            raise RagateError(
                "a cascade's second stage reads the draft's TARG scores, and these labels have none"
            )
        full, p_full = fit_probe(data, components=components, c=c, seed=seed)
        band = choose_band(p_cheap, cascade_share)
        p_cas, drafted = cascade_probabilities(p_cheap, p_full, band)
        report |= _summary("full", p_full, data.y, seed) | _summary("cascade", p_cas, data.y, seed)
        report["band"] = list(band)
        report["drafted_share"] = float(drafted.mean())
        p_cheap = p_cas
    gate = LearnedGateFile(cheap, full, band, {"label": label, "report": report, **(meta or {})})
    return gate, report, p_cheap


def _summary(name: str, p: np.ndarray, y: np.ndarray, seed: int) -> dict[str, object]:
    point, lo, hi = auroc_interval(p, y, seed=seed)
    return {
        f"{name}_auroc": [round(point, 4), round(lo, 4), round(hi, 4)],
        f"{name}_ece": round(ece(p, y), 4),
    }


def label_curve(
    train: Labelled,
    test: Labelled,
    sizes: Sequence[int],
    *,
    components: int = DEFAULT_COMPONENTS,
    c: float = DEFAULT_C,
    seed: int = 0,
) -> list[tuple[int, float | None]]:
    """AUROC on ``test`` of probes fitted on the first ``n`` training questions of a seeded shuffle, per size
    (None where those hold fewer than :data:`MIN_CLASS` of a class, or the size exceeds the training set)."""
    order = np.random.default_rng(seed).permutation(len(train))
    rows: list[tuple[int, float | None]] = []
    for n in sizes:
        part = train.take(order[:n])
        if n > len(train) or min(int(part.y.sum()), int((~part.y).sum())) < MIN_CLASS:
            rows.append((n, None))
            continue
        probe, _ = fit_probe(part, components=components, c=c, seed=seed)
        p = probe.probabilities(test.scalars, test.hidden)
        rows.append((n, auroc(list(map(float, p)), list(map(bool, test.y)))))
    return rows


def cross_fitted_curve(
    data: Labelled,
    sizes: Sequence[int] = (50, 100, 200, 400),
    *,
    components: int = DEFAULT_COMPONENTS,
    c: float = DEFAULT_C,
    seed: int = 0,
) -> list[tuple[int, float | None]]:
    """Cross-fitted AUROC over the first ``n`` labels of a seeded shuffle, per size up to the labels there are (None
    where a class has fewer than :data:`MIN_CLASS` of them): how the gate improves as labels accrue."""
    order = np.random.default_rng(seed).permutation(len(data))
    rows: list[tuple[int, float | None]] = []
    for n in [s for s in sizes if s < len(data)] + [len(data)]:
        part = data.take(order[:n])
        if min(int(part.y.sum()), int((~part.y).sum())) < MIN_CLASS:
            rows.append((n, None))
            continue
        p = cross_fitted_logits(part, components=components, c=c, seed=seed)
        rows.append((n, auroc(list(map(float, p)), list(map(bool, part.y)))))
    return rows


GRID_COMPONENTS = (4, 8, 16, 32, 64)
GRID_C = (0.01, 0.1, 1.0)


def tune(
    data: Labelled,
    *,
    components: Sequence[int] = GRID_COMPONENTS,
    cs: Sequence[float] = GRID_C,
    seeds: int = 3,
) -> tuple[int, float, float]:
    """The PCA size and L2 strength with the best cross-fitted AUROC on ``data`` (the training labels only: what is
    reported is scored elsewhere), averaged over ``seeds`` fold assignments: (components, C, that AUROC)."""
    check_labels(data.y)
    grid = [(k, c) for k in (components if data.hidden is not None else (0,)) for c in cs]
    best: tuple[float, int, float] | None = None
    for k, c in grid:
        values = [
            auroc(
                list(map(float, cross_fitted_logits(data, components=k, c=c, seed=s))),
                list(map(bool, data.y)),
            )
            for s in range(seeds)
        ]
        score = float(np.mean([v for v in values if v is not None]))
        if best is None or score > best[0] + 1e-12:
            best = (score, k, c)
    assert best is not None
    return best[1], best[2], best[0]
