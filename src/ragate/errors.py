"""Exceptions ragate raises. Each message names the problem and the fix."""

from __future__ import annotations


class RagateError(Exception):
    """Base class for every error ragate raises on purpose."""


class ModelNotFoundError(RagateError):
    """A model name or path that does not resolve to an installed model."""


class ChecksumError(RagateError):
    """A downloaded or joined file whose size or sha256 differs from what was expected."""


class BackendError(RagateError):
    """A language-model backend failed to answer a request (bad request, server error, timeout)."""


class BackendUnavailableError(BackendError):
    """The backend cannot be reached (server down, connection refused or dropped); retrying later may work."""


class BackendTimeoutError(BackendError):
    """The backend took longer than its client's timeout to answer (the server is stalled or the request too big)."""


class GateError(RagateError):
    """A gate (often a user's registered one) that raised, or returned something other than a decision with a
    number for a score, on one question; the message names the gate."""


class CapabilityError(RagateError):
    """A request asks a backend for something it cannot do (attentions from llama.cpp, too many top-k, ...)."""


class IndexFormatError(RagateError):
    """An index directory that is missing, incomplete, corrupted or of an unknown format version."""


class IndexNeedError(RagateError):
    """A method that reads something the index cannot give (embeddings from a BM25 index, search by vector)."""


class EncoderMismatchError(RagateError):
    """An index opened with an encoder other than the one that built it (another embedding space)."""


class CorpusFormatError(RagateError):
    """A corpus file that cannot be read as passages: bad JSON, a missing field, wrong columns, a duplicate id."""


class DataNotFoundError(RagateError):
    """A data file or directory (corpus, QA files) that is not where it was expected."""


class DatasetFormatError(RagateError):
    """A QA file that cannot be read as questions: bad JSON or TSV, a missing or empty field, a wrong type."""


class RunFormatError(RagateError, ValueError):
    """A run's JSON-lines file (questions.jsonl, sweep.jsonl) with a damaged line that a kill cannot explain."""


class CallCacheError(RagateError):
    """The call cache cannot be used (damaged, not ragate's, in a path that cannot be a file): it stops a run
    rather than being recorded as every question's error."""


class ArgumentTypeError(RagateError, TypeError):
    """An argument of the wrong type (``ragate.Pipeline(method=None)``), named with what it takes: a
    :class:`RagateError` for ragate's handlers and a ``TypeError`` for everyone else's."""
