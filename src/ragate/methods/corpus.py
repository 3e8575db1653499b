"""The methods of the corpus-aware gates (:mod:`ragate.gates.corpus`): TARG's reader (its prompts, the question's
top 5), so that they share TARG's closed-book and retrieval answers in a sweep and a "retrieve" reads the very hits
the gate scored."""

from __future__ import annotations

from ragate.methods.prompts import TARG
from ragate.methods.spec import GateSpec, MethodSpec, SelectorSpec

_TARG_SELECT = SelectorSpec("question", k=5)

CORPUS_METHODS = (
    MethodSpec(
        "corpus-coverage",
        "no LM call to decide: retrieve when a top-5 passage holds the question's rare terms (idf-weighted coverage)",
        GateSpec("corpus-coverage"),
        _TARG_SELECT,
        TARG,
    ),
    MethodSpec(
        "corpus-or-margin",
        "retrieve when the corpus clearly holds the question's terms or TARG's margin says the model is unsure",
        GateSpec("corpus-or-margin"),
        _TARG_SELECT,
        TARG,
    ),
)
