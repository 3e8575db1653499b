"""The checks of :class:`ragate.Pipeline`'s arguments, before anything loads: each of the wrong type or value is
refused naming it and what it takes."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ragate.errors import ArgumentTypeError, RagateError


def check_types(
    *, method: Any, index: Any, calibration: Any, budget_state: Any, base_url: Any, feedback_store: Any = None
) -> None:
    """The arguments a wrong type of would fail deep inside ragate or the standard library (``method=None``:
    "'NoneType' object is not iterable"): an :class:`~ragate.errors.ArgumentTypeError` naming each (a feedback
    store's URL of a scheme ragate does not serve: a :class:`~ragate.errors.RagateError`)."""
    if not isinstance(method, str) or not method.strip():
        raise ArgumentTypeError(
            f"method must be a method's name (a non-empty string, e.g. 'targ-margin'; ragate.all_methods() "
            f"lists them), not {method!r:.60}"
        )
    for name, value in (("index", index), ("calibration", calibration), ("budget_state", budget_state)):
        if value is not None and not isinstance(value, str | Path):
            raise ArgumentTypeError(f"{name} must be a path (str or pathlib.Path), not {type(value).__name__}")
    if feedback_store is not None:
        from ragate.learning.shared_store import is_shared_store
        from ragate.learning.store import FeedbackRules

        if not isinstance(feedback_store, FeedbackRules):
            is_shared_store(feedback_store)
    urls = [base_url] if isinstance(base_url, str) else base_url
    if base_url is not None and (
        not isinstance(urls, Sequence) or not urls or not all(isinstance(u, str) and u for u in urls)
    ):
        raise ArgumentTypeError(
            "base_url must be a server's URL (a str like 'http://127.0.0.1:8080/v1') or a list of them, not "
            f"{base_url!r:.60}"
        )


_TEXT = ("method", "model", "backend", "gate", "selector", "fallback", "prompts")
_COUNTS = {"window": 1, "max_tokens": 1, "k": 1, "seed": 0, "max_question_chars": 1}  # the least each may be


def check_arguments(**given: Any) -> None:
    """Refuse a Pipeline argument of the wrong type or value, naming it (None means "not given")."""
    for name, value in given.items():
        if value is None:
            continue
        if name in _TEXT:
            if not isinstance(value, str) or not value.strip():
                raise RagateError(f"{name} must be a non-empty string, not {value!r:.60}")
        elif name in _COUNTS:
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise RagateError(
                    f"{name} must be a whole number, not {value!r:.60} ({type(value).__name__})"
                )
            if value < _COUNTS[name]:
                raise RagateError(f"{name} must be at least {_COUNTS[name]}, got {value}")
        else:  # threshold, budget, budget_gain: finite real numbers
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise RagateError(f"{name} must be a number, not {value!r:.60} ({type(value).__name__})")
            if not math.isfinite(value):
                raise RagateError(
                    f"{name} must be a finite number, got {value}" + (" (a NaN threshold never retrieves)"
                    if name == "threshold" and math.isnan(value) else "")
                )  # fmt: skip


