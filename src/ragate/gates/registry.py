"""Gates by name: ragate's own (imported on first use) and any a user registers.

``register_gate("name")`` is a class decorator; an installed package can instead declare an entry point in the
group ``ragate.gates`` (``my-gate = "my_package.gates:MyGate"``), found the first time ragate meets the name.
Either way the gate runs in ``ragate ask``, ``eval``, ``sweep``, ``calibrate``, ``serve`` (and its budget
controller) and :class:`ragate.Pipeline`, as a gate (``--gate NAME``) and as a method of its own name.
"""

from __future__ import annotations

from collections.abc import Callable

from ragate.gates.base import Gate
from ragate.plugins import Registry

ENTRY_POINT_GROUP = "ragate.gates"

# the order is the one reports and /healthz list them in
_BUILTIN = {
    "never": "ragate.gates.basic:Never",
    "always": "ragate.gates.basic:Always",
    "random": "ragate.gates.basic:Random",
    "ugt": "ragate.gates.ugt:UGT",
    "pairs": "ragate.gates.pairs:Pairs",
    "pairs-exclude-num": "ragate.gates.pairs:PairsExcludeNumbers",
    "pairs-embedding": "ragate.gates.pairs:PairsEmbedding",
    "pairs-lenient": "ragate.gates.pairs:PairsLenient",
    "targ-entropy": "ragate.gates.targ:TargEntropy",
    "targ-margin": "ragate.gates.targ:TargMargin",
    "targ-variance": "ragate.gates.targ:TargVariance",
    "targ-entropy-present": "ragate.gates.targ:TargEntropyPresent",
    "targ-margin-present": "ragate.gates.targ:TargMarginPresent",
    "targ-entropy@k=5": "ragate.gates.targ:TargEntropyK5",
    "targ-entropy@k=10": "ragate.gates.targ:TargEntropyK10",
    "targ-margin@k=5": "ragate.gates.targ:TargMarginK5",
    "targ-margin@k=10": "ragate.gates.targ:TargMarginK10",
    "llm-judge": "ragate.gates.judge:LLMJudge",
    "verbal-confidence": "ragate.gates.verbal:VerbalConfidence",
    "self-eval": "ragate.gates.self_eval:SelfEval",
    "self-rag-lite": "ragate.gates.self_rag:SelfRagLite",
    "skr": "ragate.gates.skr:SKR",
    "retrieval-top1": "ragate.gates.nomodel:RetrievalTop1",
    "retrieval-gap": "ragate.gates.nomodel:RetrievalGap",
    "retrieval-dispersion": "ragate.gates.nomodel:RetrievalDispersion",
    "question-length": "ragate.gates.nomodel:QuestionLength",
    "question-numeric": "ragate.gates.nomodel:QuestionNumeric",
    "question-rarity": "ragate.gates.nomodel:QuestionRarity",
    "no-model-lr": "ragate.gates.nomodel:NoModelLR",
    "learned": "ragate.gates.learned:Learned",
    "corpus-coverage": "ragate.gates.corpus:CorpusCoverage",
    "corpus-or-margin": "ragate.gates.corpus:CorpusOrMargin",
    "proxy-margin": "ragate.gates.proxy:ProxyMargin",
    "proxy-entropy": "ragate.gates.proxy:ProxyEntropy",
}
GATE_REGISTRY: Registry[Gate] = Registry("gate", ENTRY_POINT_GROUP, _BUILTIN, Gate)


def register_gate(name: str) -> Callable[[type[Gate]], type[Gate]]:
    """Class decorator: register a :class:`~ragate.gates.base.Gate` subclass under ``name``."""
    return GATE_REGISTRY.decorator(name)


def get_gate(name: str) -> Gate:
    """The gate named ``name`` (an unknown name is a RagateError with the closest one)."""
    return GATE_REGISTRY.get(name)()  # gates hold no state: an instance costs nothing


def gate_names(*, builtin_only: bool = False) -> tuple[str, ...]:
    """Every gate name: ragate's, then registered and installed ones."""
    return GATE_REGISTRY.names(builtin_only=builtin_only)
