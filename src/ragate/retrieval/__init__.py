"""Retrieval: passages, encoders, BM25 / dense / hybrid indexes on disk, and a Milvus retriever.

Importing this package is cheap: the names below load their modules (and bm25s, FAISS, torch) on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from ragate.retrieval.types import Hit, Passage, Retriever

_LAZY = (
    ("Encoder", "ragate.retrieval.encoders"),
    ("SentenceTransformerEncoder", "ragate.retrieval.encoders"),
    ("load_encoder", "ragate.retrieval.encoders"),
    ("DEFAULT_ENCODER", "ragate.retrieval.encoders"),
    ("build_index", "ragate.retrieval.index"),
    ("open_index", "ragate.retrieval.index"),
    ("index_info", "ragate.retrieval.index"),
    ("BM25Params", "ragate.retrieval.bm25"),
    ("BM25Retriever", "ragate.retrieval.bm25"),
    ("HNSWParams", "ragate.retrieval.dense"),
    ("DenseRetriever", "ragate.retrieval.dense"),
    ("HybridRetriever", "ragate.retrieval.hybrid"),
    ("MilvusRetriever", "ragate.retrieval.milvus"),
)

__all__ = [
    "DEFAULT_ENCODER",
    "BM25Params",
    "BM25Retriever",
    "DenseRetriever",
    "Encoder",
    "HNSWParams",
    "Hit",
    "HybridRetriever",
    "MilvusRetriever",
    "Passage",
    "Retriever",
    "SentenceTransformerEncoder",
    "build_index",
    "index_info",
    "load_encoder",
    "open_index",
]


def __getattr__(name: str) -> Any:
    for attr, module in _LAZY:
        if attr == name:
            return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module 'ragate.retrieval' has no attribute {name!r}")
