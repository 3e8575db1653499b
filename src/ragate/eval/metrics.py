"""Answer metrics, retrieval recall and bootstrap intervals: pure functions (answer extraction and matching an
answer against references, ``exact_match``, ``f1`` and ``contains``: :mod:`ragate.text`).

Where each rule comes from:

- ``exact_match`` / ``f1``: the official SQuAD v1.1 evaluation script (``evaluate-v1.1.py``: ``exact_match_score``,
  ``f1_score``, ``metric_max_over_ground_truths``), with ``normalize_answer`` from :mod:`ragate.text`.
- ``squad_v2_empty``: the SQuAD v2.0 script's rule for unanswerable questions (``evaluate-v2.0.py``).
- ``contains``: FlashRAG's ``acc`` metric (``Sub_ExactMatch.calculate_sub_em``).
- ``regex_match``: DPR's ``regex_match`` (``dpr/utils/qa_validation.py``), used for CuratedTREC.
- ``bootstrap_ci`` / ``paired_bootstrap_diff``: the percentile bootstrap (Efron & Tibshirani 1993, ch. 13).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ragate.text import (
    contains,
    exact_match,
    extract_answer,  # noqa: F401 (re-exported: answer extraction lives in ragate.text)
    f1,
    normalize_answer,
)

AnswerKind = Literal["span", "yesno", "regex"]
SCORE_KEYS = ("em", "f1", "acc")
YES_NO_MAYBE = ("yes", "no", "maybe")

# Regex guard: the text a pattern is searched in is cut to this many characters (extracted answers are short).
MAX_REGEX_TEXT = 4096
# Bootstrap resamples are drawn in blocks of about this many indices, to bound memory on large runs.
_BOOTSTRAP_BLOCK = 1 << 22


@dataclass(frozen=True)
class Resampling:
    """A bootstrap's resamples and numpy seed: one for a whole report (a results spec's ``samples`` and ``seed``,
    docs/results/spec.toml, reach every generated table through it)."""

    samples: int = 1000
    seed: int = 0


DEFAULT_BOOT = Resampling()


# --- SQuAD ----------------------------------------------------------------------------------------------------


def squad_v2_empty(prediction: str, answers: Sequence[str]) -> float:
    """SQuAD v2.0's exact match, which differs from v1.1 only for unanswerable questions.

    As ``evaluate-v2.0.py`` does, aliases that normalise to empty are dropped; if none is left the question is
    unanswerable and the prediction scores 1.0 iff it normalises to empty (v2.0's F1 gives the same value there).
    Otherwise this is :func:`exact_match` over the remaining aliases."""
    gold = [a for a in answers if normalize_answer(a)]
    if not gold:
        return float(normalize_answer(prediction) == "")
    return exact_match(prediction, gold)


# --- containment, labels, regexes -----------------------------------------------------------------------------


def read_label(prediction: str, labels: Sequence[str] = YES_NO_MAYBE) -> str | None:
    """The label a prediction states: the allowed label that occurs earliest as whole word(s) in the normalised
    prediction (``"Yes, because no ..."`` reads ``"yes"``), returned normalised; None if no label occurs.

    Our rule (PubMedQA/BoolQ-style answers): call :func:`extract_answer` first, so a chain of thought before the
    answer is not read."""
    tokens = normalize_answer(prediction).split()
    wanted = [(normalize_answer(label), normalize_answer(label).split()) for label in labels]
    for i in range(len(tokens)):
        for name, label_tokens in wanted:
            if label_tokens and tokens[i : i + len(label_tokens)] == label_tokens:
                return name
    return None


def label_accuracy(prediction: str, label: str, labels: Sequence[str] = YES_NO_MAYBE) -> float:
    """1.0 if :func:`read_label` of the prediction equals the normalised gold ``label``."""
    read = read_label(prediction, labels)
    return float(read is not None and read == normalize_answer(label))


# A guard against catastrophic backtracking in gold patterns (they come from a data file).
_QUANTIFIER = re.compile(r"[*+?]|\{(\d*)(,?)(\d*)\}")
_GROUP_PREFIX = re.compile(r"\?(P<\w+>|<[=!]|[=!:]|[aiLmsux-]+:?)?")
_ZERO_WIDTH_ESCAPES = frozenset("bBAZ")


class _NestedRepeat(Exception):
    pass


def _quantifier(pattern: str, i: int) -> tuple[int, bool, bool]:
    """The quantifier at ``pattern[i]``, if any: (index after it, unbounded, may match zero times)."""
    m = _QUANTIFIER.match(pattern, i)
    if m is None:
        return i, False, False
    end = m.end() + (m.end() < len(pattern) and pattern[m.end()] in "?+")  # lazy or possessive
    token = m.group(0)
    if token in ("*", "+", "?"):
        return end, token != "?", token != "+"
    low, comma, high = m.groups()
    return end, bool(comma) and not high, not low or int(low) == 0


def _class_end(pattern: str, i: int) -> int:
    """The index after the character class that opens at ``pattern[i] == "["``."""
    j = i + 1
    if j < len(pattern) and pattern[j] == "^":
        j += 1
    if j < len(pattern) and pattern[j] == "]":
        j += 1
    while j < len(pattern) and pattern[j] != "]":
        j += 2 if pattern[j] == "\\" else 1
    return j + 1


def _scan(pattern: str, i: int) -> tuple[int, bool, bool]:
    """Scan alternatives from ``pattern[i]`` to the closing ``)`` or the end. Returns (that index, the span holds
    an unbounded repeat, every branch has an item that must consume a character, not under an unbounded or
    optional quantifier); raises
    ``_NestedRepeat`` on an unbounded repeat of a group whose body holds one and has no such item."""
    unbounded, all_branches, branch = False, True, False
    while i < len(pattern) and pattern[i] != ")":
        ch = pattern[i]
        if ch == "|":
            all_branches, branch, i = all_branches and branch, False, i + 1
            continue
        inner_unbounded = False
        if ch == "(":
            prefix = _GROUP_PREFIX.match(pattern, i + 1)
            body = prefix.end() if prefix and prefix.group(0) else i + 1
            close, inner_unbounded, consumes = _scan(pattern, body)
            consumes = consumes and not (prefix and prefix.group(1) in ("=", "!", "<=", "<!"))
            atom_end = close + 1
        elif ch == "[":
            atom_end, consumes = _class_end(pattern, i), True
        elif ch == "\\":
            atom_end, consumes = i + 2, pattern[i + 1 : i + 2] not in _ZERO_WIDTH_ESCAPES
        else:
            atom_end, consumes = i + 1, ch not in "^$"
        i, repeat_unbounded, may_skip = _quantifier(pattern, atom_end)
        if repeat_unbounded and inner_unbounded and not consumes:
            raise _NestedRepeat
        unbounded = unbounded or inner_unbounded or repeat_unbounded
        branch = branch or (consumes and not may_skip and not repeat_unbounded)
    return i, unbounded, all_branches and branch


def has_nested_repeat(pattern: str) -> bool:
    """Whether a group is repeated without bound while its body holds an unbounded repeat and nothing else it must
    consume (``(a+)+``, ``(\\w+\\s?)*``): the classic shape of catastrophic backtracking. ``((9|1[0-5])\\s*)+``
    passes, since each round must match a digit. A heuristic scan, not a full parser: overlapping alternatives
    such as ``(a|aa)+`` are not caught."""
    try:
        _scan(pattern, 0)
    except (_NestedRepeat, RecursionError):
        return True
    return False


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """A gold pattern compiled as DPR does (``re.IGNORECASE | re.UNICODE | re.MULTILINE``).

    Deviations, both ours: a pattern that does not compile is matched as literal text (``re.escape``) where DPR
    scores it False, and so is one with a nested unbounded repeat (:func:`has_nested_repeat`), which could
    backtrack for minutes on a long prediction."""
    flags = re.IGNORECASE | re.UNICODE | re.MULTILINE
    if not has_nested_repeat(pattern):
        try:
            return re.compile(pattern, flags)
        except re.error:
            pass
    return re.compile(re.escape(pattern), flags)


def regex_match(prediction: str, patterns: Sequence[str]) -> float:
    """CuratedTREC: 1.0 if any gold pattern matches anywhere in the prediction (``re.search``, as DPR's
    ``regex_match``; DrQA's ``regex_match_score`` used the anchored ``re.match``).

    The prediction is NFC-normalised (patterns such as ``Qu[eé]bec`` are written composed; DPR's NFD would break
    them) and cut to :data:`MAX_REGEX_TEXT` characters, which bounds the cost of any pattern."""
    text = unicodedata.normalize("NFC", prediction)[:MAX_REGEX_TEXT]
    return float(any(compile_pattern(p).search(text) is not None for p in patterns))


# --- one question's scores ------------------------------------------------------------------------------------


def score(
    prediction: str, example_answers: Sequence[str], kind: str, label: str | None = None
) -> dict[str, float]:
    """The scores of one (extracted) prediction, always under the keys ``em``, ``f1``, ``acc``.

    ``kind`` is one of ``"span"`` (EM, F1, contains), ``"yesno"`` (label accuracy under all three keys; the gold
    label is ``label``, or the first answer when None) or ``"regex"`` (regex match under all three keys)."""
    if kind == "span":
        return {
            "em": exact_match(prediction, example_answers),
            "f1": f1(prediction, example_answers),
            "acc": contains(prediction, example_answers),
        }
    if kind == "yesno":
        gold = label if label is not None else (example_answers[0] if example_answers else None)
        if gold is None:
            raise ValueError("a yes/no question needs a label or an answer")
        value = label_accuracy(prediction, gold)
    elif kind == "regex":
        value = regex_match(prediction, example_answers)
    else:
        raise ValueError(f"unknown answer kind {kind!r}; expected one of span, yesno, regex")
    return dict.fromkeys(SCORE_KEYS, value)


# --- retrieval ------------------------------------------------------------------------------------------------


def doc_id(passage_id: str) -> str:
    """The document a passage id belongs to: a chunk id ``"docid#n"`` counts for ``"docid"``."""
    return passage_id.split("#", 1)[0]


def _top_k_hits(retrieved_ids: Sequence[str], gold_ids: Sequence[str], k: int) -> tuple[int, int]:
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    gold = {doc_id(g) for g in gold_ids}
    top = {doc_id(r) for r in retrieved_ids[:k]}
    return len(gold & top), len(gold)


def recall_at_k(retrieved_ids: Sequence[str], gold_ids: Sequence[str], k: int) -> float | None:
    """The share of gold documents among the first ``k`` retrieved passages; None when there is no gold id.

    Ids compare on their part before ``"#"`` (:func:`doc_id`), on both sides, and gold ids are counted once each;
    ``k`` counts retrieved passages (chunks), not distinct documents."""
    found, total = _top_k_hits(retrieved_ids, gold_ids, k)
    return None if total == 0 else found / total


def hit_at_k(retrieved_ids: Sequence[str], gold_ids: Sequence[str], k: int) -> float | None:
    """1.0 if any gold document is among the first ``k`` retrieved passages; None when there is no gold id."""
    found, total = _top_k_hits(retrieved_ids, gold_ids, k)
    return None if total == 0 else float(found > 0)


# --- bootstrap ------------------------------------------------------------------------------------------------


def bootstrap_ci(
    values: Sequence[float], *, samples: int = 1000, confidence: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean: resample ``values`` with replacement ``samples`` times
    (``numpy.random.default_rng(seed)``), take the ``(1 - confidence) / 2`` and ``(1 + confidence) / 2``
    quantiles of the resampled means. One value gives ``(v, v)``; no value raises ValueError."""
    data = np.asarray(values, dtype=float)
    if data.ndim != 1 or data.size == 0:
        raise ValueError("bootstrap_ci needs a non-empty 1-D sequence of values")
    if samples < 1 or not 0.0 < confidence < 1.0:
        raise ValueError(f"need samples >= 1 and 0 < confidence < 1, got {samples} and {confidence}")
    if data.size == 1:
        return float(data[0]), float(data[0])
    rng = np.random.default_rng(seed)
    block = max(1, _BOOTSTRAP_BLOCK // data.size)
    means = np.concatenate(
        [
            data[rng.integers(0, data.size, size=(min(block, samples - start), data.size))].mean(axis=1)
            for start in range(0, samples, block)
        ]
    )
    low, high = np.quantile(means, [(1.0 - confidence) / 2, (1.0 + confidence) / 2])
    return float(low), float(high)


def paired_bootstrap_diff(
    a: Sequence[float], b: Sequence[float], *, samples: int = 1000, confidence: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``mean(a - b)`` over the same questions (resampling the pairs together,
    which is :func:`bootstrap_ci` of the per-question differences)."""
    if len(a) != len(b):
        raise ValueError(f"paired values need equal lengths, got {len(a)} and {len(b)}")
    diffs = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    lo, hi = bootstrap_ci(diffs.tolist(), samples=samples, confidence=confidence, seed=seed)
    # a bound that is 0 in exact arithmetic comes out as +-1e-17 from float sums (e.g. against a random gate's
    # fractional expectation): rounded away, so an interval touching 0 is "not established", not "higher"
    return float(np.round(lo, 12)) + 0.0, float(np.round(hi, 12)) + 0.0
