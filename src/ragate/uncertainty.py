"""Uncertainty math: pure functions over log-probabilities, and how well a score ranks labels.

Every gate and trigger in ragate scores a draft with one of these. They take plain sequences of floats (natural
log-probabilities) so that they can be checked by hand and used on any backend's output. The AUROC functions take
scores and labels (arrays or sequences) and judge such a score against what happened.

References (equation numbers as in ``../shared/papers``):
- token entropy: TARG Eq. 1 (mean over a k-token prefix), ETC Eq. 3 (per step);
- top-1/top-2 margin and the link exp(-g/beta): TARG Eq. 2 (beta = 3 by default);
- the lower bound on Eqs. 1-2 from a draft's first tokens (their exact early exit): :func:`prefix_bound`;
- normalised answer NLL: DTR Eqs. 2-3;
- empirical disagreement across N samples: TARG Eq. 3 (N = 5, T = 0.7 by default);
- how well a score ranks labels: AUROC (Mann-Whitney form), its bootstrap interval and the paired gap of two
  scores over the same questions (the learned gate's fit and the reports judge scores by these).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence
from typing import Literal

import numpy as np

from ragate.errors import RagateError

DEFAULT_MARGIN_BETA = 3.0
DivideBy = Literal["k", "present"]  # what TARG's mean divides a draft shorter than k by (Eqs. 1-2: k)
END_OF_SAMPLE = "\x00<end>"  # the symbol a sample that already ended contributes at later steps


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Natural log-probabilities from logits over the last axis, computed stably in float64."""
    x = np.asarray(logits, dtype=np.float64)
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def entropy(logprobs: Sequence[float] | np.ndarray) -> float:
    """Exact entropy H = -sum_v p(v) log p(v) of one full next-token distribution (ETC Eq. 3; TARG's H_t).

    ``logprobs`` must cover the whole vocabulary (they are renormalised, so raw logits work too).
    Zero-probability entries contribute 0 (the limit of p log p).
    """
    lp = log_softmax(np.asarray(logprobs, dtype=np.float64))
    p = np.exp(lp)
    return float(-(p[p > 0] * lp[p > 0]).sum())


TailModel = Literal["lumped", "capped", "uniform"]


def topk_entropy(
    top_logprobs: Sequence[float], tail: TailModel = "lumped", vocab_size: int | None = None
) -> float:
    """APPROXIMATE entropy from only the top-k log-probabilities of a step (APIs give k <= 20).

    The top k tokens' share -sum_k p_k log p_k is exact; the tail mass r = 1 - sum(p_k) is unseen except that no
    tail token is more likely than the k-th, p_min. Three ways to count the tail:

    - ``lumped``: r as one outcome, -r log r. The smallest entropy any distribution with these top-k could have
      if the tail were one token, which the cap p_min usually forbids: a loose lower bound.
    - ``capped`` (the default): r split into as few tokens as the cap allows (floor(r / p_min) tokens of p_min
      and the rest): the tightest lower bound (entropy is Schur-concave, and this tail majorises every admissible
      one). Measured with Qwen2.5-Coder-1.5B over 200 NQ and 200 HotpotQA questions
      (benchmarks/topk_fidelity.py): from the top 20, TARG's mean entropy keeps a Spearman correlation of
      0.99 with the exact score and 95% of its retrieve/skip decisions at the paper's tau (lumped: 0.80).
    - ``uniform``: r spread evenly over the other ``vocab_size - k`` tokens: the upper bound.

    All three equal the exact :func:`entropy` when the top k hold all the mass.
    """
    if len(top_logprobs) == 0:
        raise ValueError("topk_entropy needs at least one log-probability")
    p = np.exp(np.asarray(top_logprobs, dtype=np.float64))
    total = float(p.sum())
    if total > 1 + 1e-3:
        raise ValueError(f"top-k probabilities sum to {total:.6f} > 1: are these log-probabilities?")
    if total > 1:  # rounded logprobs (servers send a few decimals) can overshoot 1 by a little
        p, total = p / total, 1.0
    rest = max(0.0, 1.0 - total)
    h = float(-(p[p > 0] * np.log(p[p > 0])).sum())
    if rest <= 1e-12:
        return h
    if tail == "lumped":
        return h - rest * math.log(rest)
    if tail == "uniform":
        if vocab_size is None or vocab_size <= len(p):
            raise ValueError("the uniform tail needs the vocabulary size (more tokens than the top k)")
        return h - rest * math.log(rest / (vocab_size - len(p)))
    if tail != "capped":
        raise ValueError(f"tail must be 'lumped', 'capped' or 'uniform', got {tail!r}")
    cap = float(p.min())
    if cap <= 0:
        return h - rest * math.log(rest)
    full = math.floor(rest / cap)
    left = rest - full * cap
    return h - full * cap * math.log(cap) - (left * math.log(left) if left > 1e-15 else 0.0)


def margin(top_logprobs: Sequence[float]) -> float:
    """Top-1 minus top-2 gap g_t >= 0 of one step (TARG Eq. 2).

    The gap between the two largest logits equals the gap between their log-probabilities (the softmax
    normaliser cancels), so top-2 log-probabilities suffice. The order of ``top_logprobs`` does not matter.
    """
    if len(top_logprobs) < 2:
        raise ValueError("margin needs the top-2 log-probabilities of the step (request top_logprobs >= 2)")
    first, second = sorted(top_logprobs, reverse=True)[:2]
    return float(first - second)


def margin_uncertainty(gap: float, beta: float = DEFAULT_MARGIN_BETA) -> float:
    """The margin link phi(g) = exp(-g / beta) in (0, 1] (TARG Eq. 2): a small gap means high uncertainty."""
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if gap < 0:
        raise ValueError(f"a top-1/top-2 gap is >= 0, got {gap}")
    return math.exp(-gap / beta)


def mean_entropy(entropies: Sequence[float], k: int | None = None, *, divide_by: DivideBy = "k") -> float:
    """U_ent(k) = (1/k) sum_{t<=k} H_t (TARG Eq. 1) over the first ``k`` steps (all steps when ``k`` is None).

    A draft that ended (end of sequence) before step k has no H_t for the steps it did not write: Eq. 1 still
    divides by k (``divide_by="k"``, the default: the missing steps add nothing), while ``divide_by="present"``
    averages over the steps present (ragate before 2026-11-28). With ``k`` None both are the mean of all steps."""
    return _mean_prefix(entropies, k, "mean_entropy", divide_by)


def mean_margin_uncertainty(
    gaps: Sequence[float], k: int | None = None, beta: float = DEFAULT_MARGIN_BETA, *, divide_by: DivideBy = "k"
) -> float:
    """U_mar(k; beta) = (1/k) sum_{t<=k} exp(-g_t / beta) in (0, 1] (TARG Eq. 2); ``divide_by`` as in
    :func:`mean_entropy` (a draft shorter than k: the Eq. divides by k, "present" by the steps there are)."""
    return _mean_prefix(
        [margin_uncertainty(g, beta) for g in _prefix(gaps, k)], k, "mean_margin_uncertainty", divide_by
    )


def prefix_bound(terms: Sequence[float], k: int) -> float:
    """(1/k) sum_{t<=j} u_t over the j <= k per-step terms a draft has so far: a lower bound, for every j, on
    TARG's U = (1/k) sum_{t<=k} u_t (Eqs. 1-2) and on the mean over the steps present, because every term is >= 0
    (an entropy H_t, a margin link exp(-g_t/beta)) and the steps present are at most k.

    It is computed exactly as :func:`mean_entropy` computes U (a correctly rounded ``math.fsum``, then one
    division), and rounding is monotone, so ``prefix_bound(...) > tau`` after j steps implies U > tau for the whole
    draft in floating point too: the decision "retrieve" is settled, and the rest of the draft need not be decoded
    (TARG's exact early exit)."""
    if k < 1:
        raise ValueError(f"prefix length k must be >= 1, got {k}")
    return float(math.fsum(terms[:k]) / k)


def normalised_nll(logprobs: Sequence[float]) -> float:
    """u = -(1/T) sum_t log P(a_t | q, a_<t) (DTR Eqs. 2-3): the length-normalised NLL of an answer.

    ``logprobs`` are the answer tokens' log-probabilities, end-of-sequence excluded (T = answer tokens).
    """
    if len(logprobs) == 0:
        raise ValueError("normalised_nll of an empty answer is undefined (T = 0)")
    return float(-math.fsum(logprobs) / len(logprobs))


def disagreement(samples: Sequence[Sequence[Hashable]], k: int | None = None) -> float:
    """U_var(k, N) = (1/k) sum_{t<=k} d_t with d_t = 1 - max_j p_hat_t(j) (TARG Eq. 3).

    ``samples`` are N token sequences (ids or strings) drawn for the same prompt. p_hat_t is the empirical
    distribution of the N tokens at step t. A sample that ended before step t counts as one more symbol
    (``END_OF_SAMPLE``), so ending early disagrees with going on. Steps run to ``k`` or to the longest sample,
    whichever is shorter. The result lies in [0, (N-1)/N] (TARG Lemma 2); 0 when all samples are empty.
    """
    n = len(samples)
    if n == 0:
        raise ValueError("disagreement needs at least one sample")
    longest = max(len(s) for s in samples)
    steps = longest if k is None else min(k, longest)
    if steps == 0:
        return 0.0
    d = []
    for t in range(steps):
        counts = Counter(s[t] if t < len(s) else END_OF_SAMPLE for s in samples)
        d.append(1.0 - max(counts.values()) / n)
    return float(math.fsum(d) / steps)


def _prefix(values: Sequence[float], k: int | None) -> Sequence[float]:
    if k is not None and k < 1:
        raise ValueError(f"prefix length k must be >= 1, got {k}")
    return values if k is None else values[:k]


def _mean_prefix(values: Sequence[float], k: int | None, name: str, divide_by: DivideBy = "k") -> float:
    head = _prefix(values, k)
    if len(head) == 0:
        raise ValueError(f"{name} of an empty draft is undefined: the draft has no tokens")
    if divide_by not in ("k", "present"):
        raise ValueError(f"divide_by must be 'k' (TARG Eqs. 1-2) or 'present', got {divide_by!r}")
    n = k if k is not None and divide_by == "k" else len(head)
    return float(math.fsum(head) / n)


def auroc(scores: Sequence[float], labels: Sequence[bool | int]) -> float | None:
    """Area under the ROC curve of ``scores`` for ``labels`` (1 = positive), in the Mann-Whitney rank form
    AUC = (R+ - n+(n+ + 1)/2) / (n+ n-) with mid-ranks for ties, i.e. P(s+ > s-) + P(s+ = s-)/2. None when
    one class is empty."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=bool)
    if s.shape != y.shape or s.ndim != 1:
        raise ValueError(f"auroc needs one label per score, got {s.shape} scores and {y.shape} labels")
    pos = int(y.sum())
    neg = y.size - pos
    if pos == 0 or neg == 0:
        return None
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    midranks = ends - (counts - 1) / 2.0  # 1-based ranks, ties sharing their mean rank
    rank_sum = float(midranks[inverse][y].sum())
    return (rank_sum - pos * (pos + 1) / 2.0) / (pos * neg)


def auroc_interval(
    p: np.ndarray, y: np.ndarray, *, seed: int = 0, resamples: int = 2000
) -> tuple[float, float, float]:
    """AUROC with a percentile bootstrap 95% interval (resamples holding one class only are skipped)."""
    point = auroc(list(map(float, p)), list(map(bool, y)))
    if point is None:
        raise RagateError("an AUROC needs questions of both labels")
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(resamples):
        i = rng.integers(0, len(y), len(y))
        v = auroc(list(map(float, p[i])), list(map(bool, y[i])))
        if v is not None:
            values.append(v)
    lo, hi = np.percentile(values, [2.5, 97.5])
    return float(point), float(lo), float(hi)


def paired_auroc_gap(
    pa: np.ndarray, pb: np.ndarray, y: np.ndarray, *, seed: int = 0, resamples: int = 2000
) -> tuple[float, float, float]:
    """AUROC(pa) - AUROC(pb) over the same questions, with a paired bootstrap 95% interval."""
    a, b = auroc(list(map(float, pa)), list(map(bool, y))), auroc(list(map(float, pb)), list(map(bool, y)))
    if a is None or b is None:
        raise RagateError("an AUROC needs questions of both labels")
    rng = np.random.default_rng(seed)
    gaps = []
    for _ in range(resamples):
        i = rng.integers(0, len(y), len(y))
        va, vb = (
            auroc(list(map(float, pa[i])), list(map(bool, y[i]))),
            auroc(list(map(float, pb[i])), list(map(bool, y[i]))),
        )
        if va is not None and vb is not None:
            gaps.append(va - vb)
    lo, hi = np.percentile(gaps, [2.5, 97.5])
    return float(a - b), float(lo), float(hi)
