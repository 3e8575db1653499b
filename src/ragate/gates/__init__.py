"""Gates: pure functions that decide, once per question, whether to retrieve (DTR, PAIRS, TARG, LLM judge, ...).

A gate reads the question's draft (and any extra generations requested up front) and returns a
:class:`~ragate.gates.base.GateDecision`. Gates never load models and never do I/O.
"""

from ragate.gates.base import GateDecision

__all__ = ["GateDecision"]
