"""Answer text: SQuAD normalisation and answer extraction, shared by gates, the dynamic loop and evaluation."""

from __future__ import annotations

import re
import string
from typing import Literal

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_OPEN_TAG = re.compile(r"<answer>(.*)", re.DOTALL | re.IGNORECASE)
_PUNCTUATION = frozenset(string.punctuation)

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
