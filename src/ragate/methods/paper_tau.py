"""Thresholds that come from a paper's model, and the hint when one is used, uncalibrated, with another model.

A gate's default tau (``Gate.default_tau``, its origin in ``Gate.tau_source``) is where the gate decides when no
threshold, calibration file or budget is given. For DTR's UGT gate and TARG's gates that number is the paper's,
set on the paper's 7B-8B models (:data:`PAPER_TAUS`); a gate's scores depend on the model (a small model is less
sure of everything), so on another model the same tau retrieves for a very different share of questions (DTR's
0.001 retrieved for 20 of 20 questions with Qwen2.5-Coder-1.5B). The other gates' defaults are
ragate's own choices or the reply's own verdict (P(yes) = 0.5), which mean the same on any model.

:class:`TauHints` gives a :class:`~ragate.pipeline.Pipeline` (``ragate ask --method``, ``ragate serve``) one line,
once per gate, the first time it decides with such a tau and a model whose size (read from its name: ``135M``,
``1.5b``, ``7B``) is not the paper's or cannot be read::

    ragate: hint: targ-margin decides at tau = 0.25, TARG's value for Qwen2.5-7B; scores differ by model ...

It is logged as a warning on the ``ragate`` logger, which Python prints to stderr when logging is not set up.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ragate.gates.base import Gate
    from ragate.methods.spec import MethodSpec

log = logging.getLogger("ragate")

CALIBRATE = "ragate calibrate --gate {method} --questions FILE --budget 0.3"
_SIZE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)([bm])(?![a-z0-9])", re.IGNORECASE)


@dataclass(frozen=True)
class PaperTau:
    """A default tau taken from a paper: the paper, the models it was set on, their sizes in billions."""

    paper: str
    models: str
    sizes: tuple[float, ...]


def paper_tau(gate: Gate) -> PaperTau | None:
    """Where ``gate``'s default tau comes from, if a paper's model set it (subclasses included)."""
    from ragate.gates.targ import TargEntropy, TargMargin, TargVariance
    from ragate.gates.ugt import UGT

    if isinstance(gate, UGT):
        return PaperTau("DTR", "Qwen2.5-7B and Llama-3-8B", (7.0, 8.0))
    if isinstance(gate, TargEntropy | TargMargin | TargVariance):
        return PaperTau("TARG", "Qwen2.5-7B", (7.0,))
    return None


def model_size(name: str) -> float | None:
    """A model's size in billions of parameters as its name gives it (``SmolLM2-135M`` 0.135, ``qwen2.5-coder-1.5b``
    1.5, ``Llama-3-8B`` 8), or None. A size in B wins over one in M (``Qwen2.5-7B-Instruct-1M`` is 7)."""
    found = [(float(n), unit.lower()) for n, unit in _SIZE.findall(name)]
    billions = [n for n, unit in found if unit == "b"]
    if billions:
        return billions[0]
    millions = [n for n, unit in found if unit == "m"]
    return millions[0] / 1000 if millions else None


def tau_hint(spec: MethodSpec, model: str, method: str | None = None) -> str | None:
    """The one-line hint for deciding with ``spec`` on ``model`` (its name or file name), or None: the gate's tau
    is set (threshold, calibration, budget), is not a paper's, or the model is the paper's size."""
    from ragate.gates.registry import get_gate

    if spec.dynamic is not None or spec.crag is not None or spec.gate.threshold is not None:
        return None
    gate = get_gate(spec.gate.kind)
    origin = paper_tau(gate)
    if origin is None:
        return None
    size = model_size(model)
    if size is not None and any(abs(size - s) <= 0.1 * s for s in origin.sizes):
        return None
    name = method or spec.name
    which = f"{model} ({'size unknown' if size is None else f'{size:g}B'})"
    return (
        f"ragate: hint: {name} decides at tau = {gate.default_tau:g}, {origin.paper}'s value for {origin.models}, "
        f"not set for {which}; a gate's scores depend on the model, so its retrieval rate here can be anything "
        f"from 0 to 100%. Set tau on your own questions (no answers needed): {CALIBRATE.format(method=name)}, "
        "then --calibration FILE (Python: Pipeline(calibration=FILE), or rag.calibrate(questions, budget=0.3))"
    )


class TauHints:
    """Logs :func:`tau_hint` once per gate for one pipeline (thread-safe); ``given`` holds the hints logged."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        self.given: list[str] = []

    def note(self, spec: MethodSpec, model: str, method: str | None = None) -> None:
        with self._lock:
            if spec.gate.kind in self._seen or spec.gate.threshold is not None:
                return
            self._seen.add(spec.gate.kind)
        hint = tau_hint(spec, model, method)
        if hint is not None:
            self.given.append(hint)
            log.warning(hint)
