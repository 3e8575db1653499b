"""The live state of a service: the retrieval budget's controller (``budget.py``: tau re-set before each question
so that a share of the last answers retrieves), the route budget's (``route_budget.py``: a learned route policy's
lambda re-set so that the last answers spend B retrievals each on average) and the window that replicas share in
Valkey/Redis (``shared.py``).

May import: core, gates, methods, eval (docs/architecture.md).
"""
