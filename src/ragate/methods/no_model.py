"""The methods of the gates that read no model (:mod:`ragate.gates.nomodel`): each reads with TARG's reader (its
prompts, the question's top 5), so that it shares TARG's closed-book and retrieval answers in a sweep (one family)
and its gate's search is the one the reader would run: when the gate says "retrieve", those hits are read."""

from __future__ import annotations

from ragate.methods.prompts import TARG
from ragate.methods.spec import GateSpec, MethodSpec, SelectorSpec

_TARG_SELECT = SelectorSpec("question", k=5)

NO_MODEL_METHODS = tuple(
    MethodSpec(name, description, GateSpec(name), _TARG_SELECT, TARG)
    for name, description in (
        ("retrieval-top1", "no LM call to decide: retrieve when the question's top-1 search score is high"),
        (
            "retrieval-gap",
            "no LM call to decide: retrieve when the top-1 passage stands out (top-1 minus top-2)",
        ),
        ("retrieval-dispersion", "no LM call to decide: retrieve when the top-5 search scores spread (std)"),
        ("question-length", "no LM call to decide: retrieve for questions longer than tau words"),
        ("question-numeric", "no LM call to decide: retrieve when the question holds a digit or a date"),
        (
            "question-rarity",
            "no LM call to decide: retrieve when the question's rarest term is rare in the corpus",
        ),
        (
            "no-model-lr",
            "no LM call to decide: a logistic regression over those signals fitted on a sweep (needs --gate-weights)",
        ),
    )
)

# the learned gate (ragate.gates.learned) reads with TARG's reader too: its hidden state is that of TARG's direct
# prompt, and a cascade's draft is TARG's draft, which a "no" continues into the answer
LEARNED_METHOD = MethodSpec(
    "learned",
    "a calibrated classifier over the question's signals and the model's hidden state, learned from labelled "
    "traffic (needs --gate-weights from `ragate gate learn`); a cascade drafts only when unsure",
    GateSpec("learned"),
    _TARG_SELECT,
    TARG,
)
