"""What a :class:`ragate.Pipeline` returns: an answer, its documents, a retrieval and a calibration
(``answer.py``), and what each answer saved against always retrieving, with the answer log and its report
(``savings.py``).

May import: core, retrieval, gates, methods, eval (docs/architecture.md).
"""
