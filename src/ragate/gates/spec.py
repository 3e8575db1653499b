"""A gate's settings (:class:`GateSpec`): which registered gate, its threshold and its parameters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ragate.gates.registry import get_gate
from ragate.gates.targ import DEFAULT_PREFIX, DEFAULT_SAMPLE_TEMPERATURE, DEFAULT_SAMPLES
from ragate.uncertainty import DEFAULT_MARGIN_BETA


@dataclass(frozen=True)
class GateSpec:
    """Which gate (a name in :mod:`ragate.gates.registry`) and its parameters (``threshold`` None: the gate's
    default, ``Gate.default_tau``, with the paper and model it comes from in ``Gate.tau_source``)."""

    kind: str
    threshold: float | None = None
    prefix: int = DEFAULT_PREFIX  # TARG's draft length k
    beta: float = DEFAULT_MARGIN_BETA
    samples: int = DEFAULT_SAMPLES
    sample_temperature: float = DEFAULT_SAMPLE_TEMPERATURE
    rate: float = 0.5  # random gate
    compare: Literal["gt", "ge"] = "gt"  # UGT: paper ">" or the authors' code ">="
    labels: str | None = None  # SKR: the label set from `ragate skr fit` (a path)
    neighbours: int = 10  # SKR: k of the kNN vote
    weights: str | None = None  # a trained gate (no-model-lr): the weights file from `ragate gate fit` (a path)
    proxy: str | None = None  # a proxy gate's small model (a name or GGUF path; None: SmolLM2-135M)

    @property
    def tau(self) -> float:
        if self.threshold is not None:
            return self.threshold
        return get_gate(self.kind).default_tau
