"""The trigger interface (:class:`Trigger`, :class:`Fire`) and the triggers by name: ragate's own (imported on first
use) and any a user registers.

A trigger is built for one question from the method's :class:`~ragate.methods.spec.DynamicSpec` and sees the
block generated since the last retrieval after every token; the loop that runs it is :mod:`ragate.dynamic.loop`,
which this module never imports, so that recipes and the checks of what a method needs can read a trigger without
it. ``register_trigger("name")`` is a class decorator; an installed package can declare an entry point in the
group ``ragate.triggers`` instead. "none" is not a trigger: the method never retrieves while it writes (Single RAG,
w/o RAG).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from ragate.gates.base import Need
from ragate.plugins import Registry
from ragate.types import Generation

if TYPE_CHECKING:
    from ragate.backends.base import Backend
    from ragate.methods.spec import DynamicSpec


@dataclass(frozen=True)
class Fire:
    """A trigger's hit in the current block: keep ``block.tokens[:keep]``, then retrieve.

    ``hit`` and ``sentence`` are token spans ``[start, end)`` of what fired and of the sentence around it; the
    query is formed from them. ``score`` and ``threshold`` are the trigger's numbers, ``reason`` says it in words.
    """

    keep: int
    score: float
    threshold: float
    reason: str
    hit: tuple[int, int]
    sentence: tuple[int, int]


class Trigger:
    """What watches a dynamic method's generation and says where to cut and retrieve (one per question).

    ``check(block, done)`` sees the tokens generated since the last retrieval (a :class:`Generation`) after every
    new token and once more when generation ends (``done``), and returns a :class:`Fire` or None; it must be a
    pure function of the block, so a trigger gives the same positions while decoding and over a finished reply.
    ``need`` is what it reads from the backend, ``default_threshold`` its default (None: the trigger keeps its
    own), ``like`` the method whose query, cut and retrieval limits a registered trigger's own method copies.
    Register one with :func:`ragate.register_trigger`.
    """

    name: ClassVar[str] = ""
    need: ClassVar[Need] = Need(token_logprobs=True)  # every dynamic loop watches tokens as they come
    default_threshold: ClassVar[float | None] = None
    like: ClassVar[str | None] = "flare"

    @classmethod
    def build(cls, spec: DynamicSpec, lm: Backend, stop_words: frozenset[str]) -> Trigger:
        """The trigger for one question of the method ``spec`` (its threshold, cut, stride) on ``lm``."""
        raise NotImplementedError(f"trigger {cls.name!r} must define build(spec, lm, stop_words)")

    @classmethod
    def threshold_for(cls, spec: DynamicSpec) -> float | None:
        """The method's threshold, else this trigger's default."""
        return spec.threshold if spec.threshold is not None else cls.default_threshold

    def check(self, block: Generation, done: bool) -> Fire | None:
        raise NotImplementedError(f"trigger {self.name!r} must define check(block, done)")


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
    """Class decorator: register a :class:`Trigger` subclass under ``name``."""
    return TRIGGER_REGISTRY.decorator(name)


def trigger_class(name: str) -> type[Trigger]:
    return TRIGGER_REGISTRY.get(name)


def trigger_need(name: str) -> Need:
    """What the trigger named ``name`` reads ("none": the token stream every dynamic loop watches)."""
    return Trigger.need if name == NO_TRIGGER else trigger_class(name).need


def default_threshold(name: str) -> float | None:
    return None if name == NO_TRIGGER else trigger_class(name).default_threshold
