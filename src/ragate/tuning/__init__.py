"""Choosing a method's settings on questions: ``ragate calibrate`` (tau for a budget, ``calibrate.py``; TARG's
prefix length chosen with it, ``prefixes.py``) and ``ragate tune`` (``tune.py``).

May import: core, models, backends, retrieval, gates, methods, dynamic, eval (docs/architecture.md).
"""
