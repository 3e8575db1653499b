"""Method recipes: a gate (when to retrieve) + a selector (how to choose what to read) + the paper's prompts.

Any gate combines with any selector: a named method is just a default pairing with its paper's settings.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, get_args

from ragate.gates.targ import DEFAULT_PREFIX, DEFAULT_SAMPLE_TEMPERATURE, DEFAULT_SAMPLES
from ragate.gates.ugt import DEFAULT_TAU
from ragate.methods.prompts import DTR, PromptSet
from ragate.selection.ais import AISScore
from ragate.uncertainty import DEFAULT_MARGIN_BETA

GateKind = Literal[
    "never", "always", "random", "ugt", "pairs", "pairs-exclude-num", "pairs-embedding",
    "targ-entropy", "targ-margin", "targ-variance", "llm-judge",
]  # fmt: skip
SelectorKind = Literal[
    "question", "hyde", "q2d", "cot", "dpr-ais", "dpr-ais-question", "dpr-ais-pseudo",
    "fixed-2q1p", "fixed-1q2p", "dpr-ais-rerank",
]  # fmt: skip

GATES: tuple[GateKind, ...] = get_args(GateKind)
SELECTORS: tuple[SelectorKind, ...] = get_args(SelectorKind)

# TARG's thresholds are model-specific and should be calibrated to a budget (TARG section 3.3); these defaults
# are the middle of the ranges TARG reports for Qwen2.5-7B (Table 1) and only a starting point.
DEFAULT_TARG_TAU = {"targ-entropy": 0.8, "targ-margin": 0.25, "targ-variance": 0.5}


@dataclass(frozen=True)
class GateSpec:
    """Which gate and its parameters (``threshold`` None: the gate's paper default)."""

    kind: GateKind
    threshold: float | None = None
    prefix: int = DEFAULT_PREFIX  # TARG's draft length k
    beta: float = DEFAULT_MARGIN_BETA
    samples: int = DEFAULT_SAMPLES
    sample_temperature: float = DEFAULT_SAMPLE_TEMPERATURE
    rate: float = 0.5  # random gate
    compare: Literal["gt", "ge"] = "gt"  # UGT: paper ">" or the authors' code ">="

    @property
    def tau(self) -> float:
        if self.threshold is not None:
            return self.threshold
        if self.kind == "ugt":
            return DEFAULT_TAU
        if self.kind == "pairs-embedding":
            return 0.9
        return DEFAULT_TARG_TAU.get(self.kind, 0.5)


@dataclass(frozen=True)
class SelectorSpec:
    """How documents are chosen once the gate says "retrieve"."""

    kind: SelectorKind
    k: int = 3  # documents the reader sees (DTR, PAIRS); TARG uses 5
    n: int = 5  # per path in DPR
    score: AISScore = "cos"
    hyde_samples: int = 1  # HyDE's N (the original uses 8 at T = 0.7; 1 greedy keeps CPU runs short)
    repeats: int = 5  # Q2D / CoT: the question repeated this many times before the generated text
    cross_encoder: str | None = None  # dpr-ais-rerank: a sentence-transformers CrossEncoder path


@dataclass(frozen=True)
class MethodSpec:
    name: str
    description: str
    gate: GateSpec
    selector: SelectorSpec
    prompts: PromptSet = DTR
    max_tokens: int = 64
    pseudo_max_tokens: int = 128  # MiniLM reads 256 word pieces at most; longer pseudo-contexts are unseen

    def with_(self, **changes: object) -> MethodSpec:
        return replace(self, **changes)  # type: ignore[arg-type]
