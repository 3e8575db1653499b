"""Answer text: SQuAD normalisation, answer extraction and matching an answer against references (SQuAD v1.1's
``exact_match`` and ``f1``, the official ``evaluate-v1.1.py`` rules; FlashRAG's ``contains``), shared by gates, the
dynamic loop, evaluation and the feedback store's labels."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from typing import Literal

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_OPEN_TAG = re.compile(r"<answer>(.*)", re.DOTALL | re.IGNORECASE)
_PUNCTUATION = frozenset(string.punctuation)
ContainsMode = Literal["substring", "tokens"]

ExtractStyle = Literal["auto", "tagged", "answer-is", "first-line", "none"]


def normalize_answer(text: str) -> str:
    """SQuAD v1.1's official normalisation, step for step: lower-case, delete ASCII punctuation, replace the
    articles a/an/the with a space, fold white space. (Unicode punctuation is kept, as the official script does.)"""
    no_punct = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", no_punct).split())


def extract_tagged_answer(text: str) -> str:
    """The content of the first ``<answer>...</answer>`` (PAIRS Fig. 9 prompts); after an unclosed ``<answer>``
    the rest of the text; otherwise the whole text. Stripped."""
    if m := _ANSWER_TAG.search(text):
        return m.group(1).strip()
    if m := _OPEN_TAG.search(text):
        return m.group(1).strip()
    return text.strip()


def has_digit(text: str) -> bool:
    """Whether ``text`` contains a decimal digit (PAIRS's "exclude num" rule)."""
    return any(ch.isdigit() for ch in text)


_ANSWER_IS = re.compile(r"\banswer\s+is\b\s*:?\s*(?P<x>[^\n]*)", re.IGNORECASE)
# A sentence ends at . ! ? before white space or the end, unless the period follows a lone capital ("U.S. Army").
_SENTENCE_END = re.compile(r"(?<!\b[A-Z])[.!?](?=\s|$)")


def _answer_is(text: str) -> str | None:
    """X from the last "the answer is X" / "So the answer is: X", up to the end of its sentence; None if absent.

    The last occurrence wins: chain-of-thought prompts (IRCoT, Self-Ask) end with "So the answer is X."."""
    matches = list(_ANSWER_IS.finditer(text))
    if not matches:
        return None
    x = matches[-1].group("x")
    if end := _SENTENCE_END.search(x):
        x = x[: end.start()]
    x = x.strip()
    return x[:-1].rstrip() if x.endswith(".") else x


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def extract_answer(text: str, style: ExtractStyle = "auto") -> str:
    """The short answer in a generation.

    ``"tagged"``: the ``<answer>`` content (:func:`ragate.text.extract_tagged_answer`; the whole text without tags).
    ``"answer-is"``: X of "the answer is X" (the text, stripped, when absent). ``"first-line"``: the first
    non-empty line. ``"none"``: the text unchanged. ``"auto"``: tags if there are any, else "the answer is X",
    else the first non-empty line."""
    if style == "none":
        return text
    if style == "tagged" or (style == "auto" and "<answer>" in text.lower()):
        return extract_tagged_answer(text)
    if style == "first-line":
        return _first_line(text)
    found = _answer_is(text)
    if style == "answer-is":
        return text.strip() if found is None else found
    if style != "auto":
        raise ValueError(f"unknown extraction style {style!r}")
    return _first_line(text) if found is None else found


# --- matching an answer against references (SQuAD v1.1 EM and F1, FlashRAG's acc) ---------------------------


def _exact_match_one(prediction: str, answer: str) -> float:
    """SQuAD v1.1 ``exact_match_score``: the two normalised strings are equal."""
    return float(normalize_answer(prediction) == normalize_answer(answer))


def _f1_one(prediction: str, answer: str) -> float:
    """SQuAD v1.1 ``f1_score``: token F1 over the bag (``Counter``) overlap of the normalised tokens.

    As in v1.1, no common token gives 0, and that includes both sides normalising to empty (v2.0 would give 1
    there; see :func:`ragate.eval.metrics.squad_v2_empty`)."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(answer).split()
    num_same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, answers: Sequence[str]) -> float:
    """SQuAD v1.1 EM: 1.0 if the normalised prediction equals any normalised alias (the max over aliases).

    An empty ``answers`` gives 0.0 (the official script would fail on ``max([])``). Note v1.1's quirk, kept: a
    prediction and an alias that both normalise to empty (``""`` and ``"The"``) match."""
    return max((_exact_match_one(prediction, a) for a in answers), default=0.0)


def f1(prediction: str, answers: Sequence[str]) -> float:
    """SQuAD v1.1 token F1, the max over aliases; 0.0 for an empty ``answers``."""
    return max((_f1_one(prediction, a) for a in answers), default=0.0)


def _contains_tokens(haystack: list[str], needle: list[str]) -> bool:
    n = len(needle)
    return any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


def contains(prediction: str, answers: Sequence[str], mode: ContainsMode = "substring") -> float:
    """1.0 if some normalised alias occurs in the normalised prediction (FlashRAG's ``acc``).

    ``mode="substring"`` (default) is FlashRAG's form: a raw substring test on the normalised strings, so the alias
    ``"cat"`` is found in ``"concatenate"``. ``mode="tokens"`` asks for a whole-token subsequence instead. Unlike
    FlashRAG, an alias that normalises to empty never counts (``"" in s`` is always true)."""
    pred = normalize_answer(prediction)
    pred_tokens = pred.split()
    for answer in answers:
        gold = normalize_answer(answer)
        if not gold:
            continue
        found = gold in pred if mode == "substring" else _contains_tokens(pred_tokens, gold.split())
        if found:
            return 1.0
    return 0.0


def evidence_applies(answer: str) -> bool:
    """Whether finding the answer's words in its passages says anything: not for "yes" or "no" (a comparison's
    answer is seldom written in a passage, and "no" is written in many as a common word)."""
    return normalize_answer(answer) not in ("yes", "no")


def supported(answer: str, passages: Sequence[str]) -> bool:
    """Whether the answer's normalised words appear, whole and in order, in one of the (normalised) passages it was
    written from: the evidence check of a route cascade (no model call). An answer that normalises to empty is
    supported by nothing; callers leave out answers the check says nothing about (:func:`evidence_applies`)."""
    return any(contains(passage, [answer], mode="tokens") for passage in passages)
