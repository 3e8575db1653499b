"""Single-shot adaptive-retrieval methods: named recipes (registry), their prompts, and the runner."""

from ragate.methods.registry import METHODS, get_method
from ragate.methods.runner import decide, run_method
from ragate.methods.spec import GateSpec, MethodSpec, SelectorSpec
from ragate.methods.trace import Stage, Trace

__all__ = [
    "METHODS",
    "GateSpec",
    "MethodSpec",
    "SelectorSpec",
    "Stage",
    "Trace",
    "decide",
    "get_method",
    "run_method",
]
