"""Learning the traffic: how ragate's gate gets better where it runs.

Holds the feedback store of answers, features and labels (``store.py``; its Valkey/Redis twin shared by replicas,
``shared_store.py``), shadow answers run after the response (``shadow.py``), labelled rows from a store or a sweep
and the fit that writes the learned gate (``fit.py``; the rows of a sweep, ``sweeps.py``; the fit's scores and
the comparison with the gate in force, ``scores.py``), the no-model gate's fit (``gatefit.py``), the learned
route policy fitted on labelled route answers (``route_traffic.py``, with the route fits of ``report``) and what a
:class:`ragate.Pipeline` holds to learn (``learner.py``: :class:`~ragate.learning.learner.Learner`).

May import: core, models, backends, retrieval, gates, methods, eval, report, answers, state (docs/architecture.md).
"""
