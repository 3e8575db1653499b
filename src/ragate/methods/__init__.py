"""Adaptive-retrieval methods (single-shot and dynamic): named recipes (registry), their prompts, and the runner."""

from ragate.methods.registry import (
    DYNAMIC_METHODS,
    METHODS,
    all_methods,
    get_method,
    register_gate,
    register_method,
    register_trigger,
)
from ragate.methods.runner import decide, run_method
from ragate.methods.spec import DynamicSpec, GateSpec, MethodSpec, SelectorSpec
from ragate.methods.trace import Stage, Trace

__all__ = [
    "DYNAMIC_METHODS",
    "METHODS",
    "DynamicSpec",
    "GateSpec",
    "MethodSpec",
    "SelectorSpec",
    "Stage",
    "Trace",
    "all_methods",
    "decide",
    "get_method",
    "register_gate",
    "register_method",
    "register_trigger",
    "run_method",
]
