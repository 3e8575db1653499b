"""What the page tells a newcomer: a decision in plain words, and the methods grouped by where they come from.

The gates' own reasons are exact ("U >= tau 0.25 (exact early exit)"); :func:`plain_reason` says the same in words
a reader who never saw the papers follows ("the model was unsure of its first words: retrieved"), by what the gate
reads. :func:`method_menu` groups every method under its paper (or ragate's own gates, or the baselines), with its
one-line description, for the page's menu.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ragate.methods.spec import MethodSpec
from ragate.methods.trace import RouteCheck, RouteInfo

# what a gate reads, in words: (when it retrieves, when it does not), by gate kind or its prefix
_WORDS: tuple[tuple[str, str, str], ...] = (
    ("targ-variance", "the model's sampled drafts disagreed", "the model's sampled drafts agreed"),
    ("targ-", "the model was unsure of its first words", "the model was sure of its first words"),
    ("proxy-", "a small model was unsure of its first words", "a small model was sure of its first words"),
    ("ugt", "the model doubted its own answer", "the model trusted its own answer"),
    ("pairs", "the model's two answers disagreed", "the model's two answers agreed"),
    ("llm-judge", "the model said it should look this up", "the model said it knows this"),
    ("self-eval", "the model said it should look this up", "the model said it knows this"),
    ("verbal-confidence", "the model said it was unsure", "the model said it was sure"),
    ("self-rag", "the model's reflection asked for evidence", "the model's reflection needed none"),
    ("skr", "similar past questions needed retrieval", "similar past questions did not"),
    ("corpus-or-margin", "your documents hold the question's terms, or the model was unsure",
     "your documents do not hold the question's terms and the model was sure"),
    ("corpus-coverage", "your documents hold the question's rare terms", "your documents lack the question's rare terms"),
    ("retrieval-", "the search found a close match", "the search found no close match"),
    ("question-", "the question's form suggests looking it up", "the question's form does not"),
    ("no-model-lr", "the question and the search suggest looking it up", "the question and the search do not"),
    ("learned", "what past answers taught the gate says retrieval helps here", "past answers say retrieval would not help here"),
    ("random", "a coin said retrieve", "a coin said answer directly"),
)  # fmt: skip


def plain_reason(gate: str, retrieved: bool, *, dynamic: bool = False) -> str:
    """The decision in plain words: why (by what ``gate`` reads) and what followed."""
    outcome = "retrieved" if retrieved else "answered from what it knows"
    if dynamic:
        return f"it retrieved while writing, where its trigger fired: {'retrieved' if retrieved else 'never fired'}"
    if gate == "always":
        return "this method always retrieves"
    if gate == "never":
        return "this method never retrieves: answered from what it knows"
    for prefix, yes, no in _WORDS:
        if gate == prefix or gate.startswith(prefix):
            return f"{yes if retrieved else no}: {outcome}"
    return f"the gate's score was {'above' if retrieved else 'not above'} its threshold: {outcome}"


_GROUPS = (
    "baselines: never or always retrieve",
    "DTR (Decide Then Retrieve)",
    "PAIRS (parametric-verified retrieval)",
    "TARG (a draft's uncertainty) and its §5.1 baselines",
    "dynamic retrieval while writing: ETC and its baselines",
    "ragate's own gates (no model, your corpus, a proxy model, learned)",
    "your registered gates",
    "routes: closed-book, one retrieval or many, chosen per question",
)
_DTR = ("dtr", "ugt", "llm-judge", "hyde", "q2d", "cot")
_PAIRS = ("pairs", "dpr-ais", "rerank")
_TARG = ("targ-", "self-eval", "self-rag-lite", "skr", "crag-lite", "flare-once", "verbal-confidence")
_OWN = ("retrieval-", "question-", "no-model-lr", "corpus-", "proxy-", "learned", "random")


def route_reason(route: RouteInfo) -> str:
    """A route method's path in plain words: the route that answered and the check that stopped it there (or the
    policy that chose it)."""
    kinds = {c.kind for c in route.checks if c.stop and c.route == route.taken}
    if "classifier" in kinds:
        return f"answered by {route.taken}: the question classifier (Adaptive-RAG) chose it for this question"
    if "learned" in kinds:
        return f"answered by {route.taken}: the learned policy expected it to pay best after the first answer"
    if not kinds:
        vetoed = any(
            c.kind == "supported" and not c.score and any(_passed(d) for d in route.checks if d.route == c.route)
            for c in route.checks
        )
        why = " (an answer not found in its passages went on)" if vetoed else ""
        return f"no earlier route's answer checked out{why}: answered by {route.taken}, the last route"
    why = "its answer agreed with the route before it" if "agree" in kinds else "its answer was confident enough"
    if "supported" in kinds:
        why += " and its passages hold it"
    return f"answered by {route.taken}: {why}, so no costlier route ran"


def _passed(check: RouteCheck) -> bool:
    """Whether an NLL or agreement check was met (whether or not the evidence check let it stop the cascade)."""
    if check.score is None:
        return False
    return check.score <= check.threshold if check.kind == "nll" else check.kind == "agree" and check.score >= 1.0


def method_group(name: str, spec: MethodSpec) -> str:
    """The menu group of one method."""
    gate = spec.gate.kind
    if spec.route is not None:
        return _GROUPS[7]
    if spec.dynamic is not None and not name.startswith("flare-once"):
        return _GROUPS[4]
    if name.startswith(("no-retrieval", "standard-rag")):
        return _GROUPS[0]
    if name.startswith(_TARG) or gate.startswith(_TARG):
        return _GROUPS[3]
    if name.startswith(_PAIRS) or gate == "pairs":
        return _GROUPS[2]
    if name.startswith(_DTR) or gate in ("ugt", "llm-judge"):
        return _GROUPS[1]
    if name.startswith(_OWN) or gate.startswith(_OWN):
        return _GROUPS[5]
    return _GROUPS[6]


def method_menu(methods: Mapping[str, MethodSpec]) -> list[dict[str, Any]]:
    """Every method as ``{"group", "methods": [{"name", "description"}]}``, the groups in a fixed order."""
    grouped: dict[str, list[dict[str, str]]] = {group: [] for group in _GROUPS}
    for name, spec in methods.items():
        grouped[method_group(name, spec)].append({"name": name, "description": spec.description})
    return [{"group": group, "methods": items} for group, items in grouped.items() if items]
