"""Running evaluations: datasets and their readers, metrics, runs that resume (configs, run directories, records,
summaries), each distinct LM call computed once, pinned workers, shards and the Ray engine, sweeps, thresholds
from a budget and a tune file's settings applied. Tuning is :mod:`ragate.tuning`, reporting :mod:`ragate.report`.

May import: core, models, backends, retrieval, gates, methods, dynamic (docs/architecture.md).
"""
