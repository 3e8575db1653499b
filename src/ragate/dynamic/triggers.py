"""The trigger of each dynamic method, built for one question from its :class:`~ragate.methods.spec.DynamicSpec`.

A trigger's ``check(block, done)`` sees the tokens generated since the last retrieval (a :class:`Generation`),
after every new token and once more when generation ends (``done``), and returns a
:class:`~ragate.dynamic.steps.Fire` or None. Checks are pure functions of the block, so a trigger gives the same
positions whether it runs while decoding or over a finished reply (:func:`ragate.backends.decoding.replay`).
"""

from __future__ import annotations

from typing import Any, Protocol

from ragate.backends.base import Backend
from ragate.dynamic import dragin, flare, ralm, targ_recheck
from ragate.dynamic.etc import EtcConfig, EtcWatch
from ragate.dynamic.ircot import IrcotTrigger
from ragate.dynamic.steps import Fire
from ragate.methods.spec import DynamicSpec
from ragate.types import Generation


class Trigger(Protocol):
    name: str

    def check(self, block: Generation, done: bool) -> Fire | None: ...


DEFAULT_THRESHOLDS = {
    "dragin": dragin.DEFAULT_THRESHOLD,
    "flare": flare.DEFAULT_THRESHOLD,
    "targ-recheck": targ_recheck.DEFAULT_THRESHOLD,
}


def attention_source(lm: Backend) -> Any:
    """The backend's ``head_attentions`` when it has attentions (transformers), else None."""
    return getattr(lm, "head_attentions", None) if lm.capabilities.attentions else None


def make_trigger(spec: DynamicSpec, lm: Backend, stop_words: frozenset[str]) -> Trigger | None:
    kind = spec.trigger
    if kind == "none":
        return None
    threshold = spec.threshold
    if kind.startswith("etc"):
        config = EtcConfig(variant=kind) if threshold is None else EtcConfig(variant=kind, alpha=threshold)  # type: ignore[arg-type]
        return EtcWatch(config, stop_words, cut=spec.cut, attention=attention_source(lm))
    if kind == "dragin":
        return dragin.DraginTrigger(
            dragin.DEFAULT_THRESHOLD if threshold is None else threshold,
            stop_words,
            cut=spec.cut,
            attention=attention_source(lm),
        )
    if kind == "flare":
        return flare.FlareTrigger(flare.DEFAULT_THRESHOLD if threshold is None else threshold)
    if kind == "ircot":
        return IrcotTrigger()
    if kind == "ralm":
        return ralm.RalmTrigger(spec.every)
    if kind == "targ-recheck":
        return targ_recheck.TargRecheckTrigger(
            targ_recheck.DEFAULT_THRESHOLD if threshold is None else threshold, spec.every
        )
    raise ValueError(f"unknown trigger {kind!r}")
