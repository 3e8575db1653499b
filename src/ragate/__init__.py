"""ragate: decide when a language model should retrieve, and how it should choose what to read.

The face of the package (imported lazily, so ``import ragate`` stays fast)::

    import ragate

    with ragate.Pipeline(method="targ-margin", index="my-index/") as rag:
        ans = rag.answer("When does the support contract renew?")

- :class:`Pipeline`, :class:`Answer`, :class:`Document`, :class:`Calibration`: answer questions with one method
  (:class:`Retrieval`: its decision and documents alone, for a framework's own reader; ``ragate.integrations``);
- :func:`index_documents` / :func:`add_documents`: your own files (txt, md, rst, html, jsonl, pdf, ...) as an index;
- :class:`Gate`, :class:`Need`, :class:`GateDecision`, :func:`register_gate`: a gate of your own, and
  :class:`Trigger`, :class:`Fire`, :func:`register_trigger` a dynamic trigger; :func:`register_method` a recipe;
- :func:`all_methods`, :func:`get_method`: what runs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ragate.types import Generation, GenerationRequest, Message, TopLogprob
from ragate.version import __version__

_LAZY = {
    "Pipeline": "ragate.pipeline",
    "Answer": "ragate.answers.answer",
    "Document": "ragate.answers.answer",
    "Calibration": "ragate.answers.answer",
    "Retrieval": "ragate.answers.answer",
    "Gate": "ragate.gates.base",
    "GateDecision": "ragate.gates.base",
    "GateContext": "ragate.gates.base",
    "Need": "ragate.gates.base",
    "Trigger": "ragate.methods.triggers",
    "Fire": "ragate.methods.triggers",
    "register_gate": "ragate.methods.registry",
    "register_trigger": "ragate.methods.registry",
    "register_method": "ragate.methods.registry",
    "all_methods": "ragate.methods.registry",
    "get_method": "ragate.methods.registry",
    "index_documents": "ragate.retrieval.documents",
    "add_documents": "ragate.retrieval.documents",
    "RagateError": "ragate.errors",
}

__all__ = [
    "Answer", "Calibration", "Document", "Fire", "Gate", "GateContext", "GateDecision", "Generation",
    "GenerationRequest", "Message", "Need", "Pipeline", "RagateError", "Retrieval", "TopLogprob", "Trigger", "__version__",
    "add_documents", "all_methods", "get_method", "index_documents", "register_gate", "register_method",
    "register_trigger",
]  # fmt: skip

if TYPE_CHECKING:
    from ragate.answers.answer import Answer, Calibration, Document, Retrieval
    from ragate.errors import RagateError
    from ragate.gates.base import Gate, GateContext, GateDecision, Need
    from ragate.methods.registry import (
        all_methods,
        get_method,
        register_gate,
        register_method,
        register_trigger,
    )
    from ragate.methods.triggers import Fire, Trigger
    from ragate.pipeline import Pipeline
    from ragate.retrieval.documents import add_documents, index_documents


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ragate' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next access skips this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
