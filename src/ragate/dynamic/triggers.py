"""What the dynamic loop builds a method's trigger with: the trigger for one question, the backend's attentions.

The trigger interface and the triggers by name live with the method recipes (:mod:`ragate.methods.triggers`),
below this package, so that a recipe can name its trigger without importing the loop.
"""

from __future__ import annotations

from typing import Any

from ragate.backends.base import Backend
from ragate.methods.spec import DynamicSpec
from ragate.methods.triggers import NO_TRIGGER, Trigger, trigger_class


def attention_source(lm: Backend) -> Any:
    """The backend's ``head_attentions`` when it has attentions (transformers), else None."""
    return getattr(lm, "head_attentions", None) if lm.capabilities.attentions else None


def make_trigger(spec: DynamicSpec, lm: Backend, stop_words: frozenset[str]) -> Trigger | None:
    if spec.trigger == NO_TRIGGER:
        return None
    return trigger_class(spec.trigger).build(spec, lm, stop_words)
