"""Answer text handling shared by gates and evaluation: SQuAD normalisation and answer extraction."""

from __future__ import annotations

import re
import string

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_OPEN_TAG = re.compile(r"<answer>(.*)", re.DOTALL | re.IGNORECASE)
_PUNCTUATION = frozenset(string.punctuation)


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
