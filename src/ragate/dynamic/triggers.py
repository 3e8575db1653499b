"""The trigger of each dynamic method by name: ragate's own (imported on first use) and any a user registers.

A trigger (:class:`~ragate.dynamic.steps.Trigger`) is built for one question from the method's
:class:`~ragate.methods.spec.DynamicSpec` and sees the block generated since the last retrieval after every token;
see :mod:`ragate.dynamic.loop`. ``register_trigger("name")`` is a class decorator; an installed package can declare
an entry point in the group ``ragate.triggers`` instead. "none" is not a trigger: the method never retrieves while
it writes (Single RAG, w/o RAG).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ragate.backends.base import Backend
from ragate.dynamic.steps import Trigger
from ragate.gates.base import Need
from ragate.methods.spec import DynamicSpec
from ragate.plugins import Registry

ENTRY_POINT_GROUP = "ragate.triggers"
NO_TRIGGER = "none"
_BUILTIN = {
    "etc": "ragate.dynamic.etc:EtcWatch",
    "etc-1st": "ragate.dynamic.etc:EtcWatch",
    "etc-no-smoothing": "ragate.dynamic.etc:EtcWatch",
    "etc-fixed": "ragate.dynamic.etc:EtcWatch",
    "etc-code": "ragate.dynamic.etc:EtcWatch",
    "dragin": "ragate.dynamic.dragin:DraginTrigger",
    "flare": "ragate.dynamic.flare:FlareTrigger",
    "ircot": "ragate.dynamic.ircot:IrcotTrigger",
    "ralm": "ragate.dynamic.ralm:RalmTrigger",
    "targ-recheck": "ragate.dynamic.targ_recheck:TargRecheckTrigger",
}
TRIGGER_REGISTRY: Registry[Trigger] = Registry("trigger", ENTRY_POINT_GROUP, _BUILTIN, Trigger)


def register_trigger(name: str) -> Callable[[type[Trigger]], type[Trigger]]:
    """Class decorator: register a :class:`~ragate.dynamic.steps.Trigger` subclass under ``name``."""
    return TRIGGER_REGISTRY.decorator(name)


def trigger_class(name: str) -> type[Trigger]:
    return TRIGGER_REGISTRY.get(name)


def trigger_need(name: str) -> Need:
    """What the trigger named ``name`` reads ("none": the token stream every dynamic loop watches)."""
    return Trigger.need if name == NO_TRIGGER else trigger_class(name).need


def default_threshold(name: str) -> float | None:
    return None if name == NO_TRIGGER else trigger_class(name).default_threshold


def attention_source(lm: Backend) -> Any:
    """The backend's ``head_attentions`` when it has attentions (transformers), else None."""
    return getattr(lm, "head_attentions", None) if lm.capabilities.attentions else None


def make_trigger(spec: DynamicSpec, lm: Backend, stop_words: frozenset[str]) -> Trigger | None:
    if spec.trigger == NO_TRIGGER:
        return None
    return trigger_class(spec.trigger).build(spec, lm, stop_words)
