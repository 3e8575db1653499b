"""Reporting runs: analyses of sweeps and runs (``analysis.py``: AUROC, frontiers, deciles, bootstrap intervals),
comparisons at a matched budget (``matched.py``), the routes' frontier replayed from a run's records
(``routes.py``), a run directory's report (``tables.py``, its figures in ``plots.py``) and the papers' tables
reproduced (``reproduce.py``).

May import: core, gates, methods, eval (docs/architecture.md).
"""
