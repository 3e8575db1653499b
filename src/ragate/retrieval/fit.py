"""Chunks that fit the encoder: how ``--docs`` (and :func:`~ragate.retrieval.documents.index_documents`) chunk for a
dense or hybrid index unless a character chunk size is given.

An encoder reads at most ``max_seq_length`` word pieces of ``document_prefix + title + "\\n" + text`` (special
tokens included; 256 for all-MiniLM-L6-v2) and ignores the rest (:mod:`ragate.retrieval.lengths`). TARG's
1000-character chunks run over that window on text with many word pieces per character (code, identifiers, names,
numbers: 42 of 131 chunks of a software manual), and a character size that fits one text is too small or too
large for another. So each document is tokenized once with the encoder's own tokenizer, keeping each word piece's
character span, and chunked in word pieces:

- a chunk holds at most ``B = window - special tokens - pieces(prefix + title + "\\n")`` word pieces of text, and
  ends at the last sentence end (else white space) in its last 30%, as TARG's chunker cuts by characters;
- the next chunk starts ``overlap`` word pieces before the end (at the start of a word, when one is near);
- a document of at most ``B`` word pieces is one chunk; a tail shorter than ``min_size`` word pieces is not added
  to the chunk before it (that chunk would overflow) but read as the last ``B`` word pieces of the document, which
  overlap the chunk before by more;
- each chunk's contents are tokenized again as the encoder embeds them, in the same pass: a tokenizer that reads a
  chunk alone as more pieces than inside the document (one that merges across the cut) has that document chunked
  again with a budget smaller by the excess.

The overlap and the shortest chunk are a tenth and a fifth of the window (25 and 51 word pieces for MiniLM), TARG's
proportions (100 and 200 of 1000 characters). An encoder that exposes no fast tokenizer (a custom
:class:`~ragate.retrieval.encoders.Encoder`) is chunked by characters instead, as before (TARG's settings).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import islice
from typing import Any

import numpy as np

from ragate.retrieval.corpus import _cut
from ragate.retrieval.encoders import Encoder
from ragate.retrieval.pooled import ChunkSettings

UNIT = "word pieces"
RECHECKS = 4  # times a document is chunked again with a smaller budget before its chunks are kept as they are
BLOCK_CHARS = (
    200_000  # a long document is tokenized in blocks of about this many characters, cut at white space
)
BATCH = 1024  # chunks tokenized at once for the check


@dataclass(frozen=True)
class FitChunking:
    """Chunks of at most ``window`` word pieces of ``encoder``'s tokenizer (title, prefix and special tokens
    included), ``overlap`` word pieces of overlap, none under ``min_size`` word pieces unless the document is."""

    window: int
    overlap: int
    min_size: int
    encoder: str

    @classmethod
    def for_window(cls, window: int, encoder: str) -> FitChunking:
        return cls(window, window // 10, window // 5, encoder)

    def to_manifest(self) -> dict[str, Any]:
        """The manifest's ``chunking`` entry (an index built by characters has ``size``/``overlap``/``min_size``
        alone, in characters)."""
        return {
            "unit": UNIT,
            "size": self.window,
            "overlap": self.overlap,
            "min_size": self.min_size,
            "encoder": self.encoder,
        }


def encoder_tokenizer(encoder: Encoder | None) -> tuple[Any, int] | None:
    """The encoder's fast tokenizer and window (``max_seq_length``), or None where it exposes none."""
    model: Any = getattr(encoder, "model", None) if encoder is not None else None
    tokenizer = getattr(model, "tokenizer", None)
    window = getattr(model, "max_seq_length", None)
    if tokenizer is None or not window or not getattr(tokenizer, "is_fast", False):
        return None
    return tokenizer, int(window)


class FitChunker:
    """Chunk documents to fit ``encoder``'s window (see the module docstring); ``spans(text, title)`` gives the
    character spans ``[start, end)`` of one document's chunks."""

    def __init__(self, encoder: Encoder, settings: FitChunking | None = None) -> None:
        found = encoder_tokenizer(encoder)
        if found is None:
            raise ValueError(f"encoder {encoder.name!r} exposes no fast tokenizer to count word pieces with")
        self.tokenizer, window = found
        self.settings = settings or FitChunking.for_window(window, encoder.name)
        self.prefix = encoder.document_prefix
        self.specials = int(self.tokenizer.num_special_tokens_to_add(pair=False))

    @classmethod
    def of(cls, encoder: Encoder | None) -> FitChunker | None:
        """The chunker for ``encoder``, or None where it cannot count word pieces (characters are used then)."""
        return cls(encoder) if encoder is not None and encoder_tokenizer(encoder) is not None else None

    def to_manifest(self) -> dict[str, Any]:
        return self.settings.to_manifest()

    def _pieces(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])

    def contents(self, title: str, text: str) -> str:
        """What the encoder embeds for a passage (its prefix, then :attr:`Passage.contents`)."""
        return self.prefix + (f"{title}\n{text}" if title else text)

    def spans(self, text: str, title: str = "") -> list[tuple[int, int]]:
        if not text.strip():
            return []
        s = self.settings
        header = self._pieces(self.prefix + (f"{title}\n" if title else ""))
        budget = max(s.window - self.specials - header, s.window // 4)
        starts, ends = self._offsets(text)
        spans: list[tuple[int, int]] = []
        for _ in range(RECHECKS + 1):
            spans = self._chunk(text, starts, ends, budget)
            over = self._longest(title, text, spans) - s.window
            if over <= 0 or budget <= s.window // 4:
                break
            budget = max(budget - over, s.window // 4)
        return spans

    def _offsets(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """The start and end character of every word piece of ``text``, tokenized in blocks cut at white space
        (which a word piece never spans), so that a long document needs no more memory than its offsets."""
        starts: list[np.ndarray] = []
        ends: list[np.ndarray] = []
        pos, n = 0, len(text)
        while pos < n:
            cut = n if n - pos <= BLOCK_CHARS else pos + BLOCK_CHARS
            if cut < n:
                space = max(
                    text.rfind("\n", pos + BLOCK_CHARS // 2, cut),
                    text.rfind(" ", pos + BLOCK_CHARS // 2, cut),
                )
                cut = space + 1 if space > pos else cut
            found = self.tokenizer(
                text[pos:cut], add_special_tokens=False, return_offsets_mapping=True, verbose=False
            )["offset_mapping"]
            block = np.asarray(found, dtype=np.int64).reshape(-1, 2) + pos
            starts.append(block[:, 0])
            ends.append(block[:, 1])
            pos = cut
        return np.concatenate(starts), np.concatenate(ends)

    def _longest(self, title: str, text: str, spans: list[tuple[int, int]]) -> int:
        """The most word pieces any of these chunks takes as the encoder reads it (special tokens included)."""
        longest = 0
        stream = iter(spans)
        while batch := list(islice(stream, BATCH)):
            chunks = [self.contents(title, text[a:b].strip()) for a, b in batch]
            longest = max(longest, *(len(ids) for ids in self.tokenizer(chunks, verbose=False)["input_ids"]))
        return longest

    def _chunk(self, text: str, starts: np.ndarray, ends: np.ndarray, budget: int) -> list[tuple[int, int]]:
        n, m = len(text), len(starts)
        s = self.settings
        min_size = min(s.min_size, budget // 2)
        overlap = min(s.overlap, budget // 2)

        def word_start(q: int) -> bool:
            return bool(starts[q] == 0 or text[int(starts[q]) - 1].isspace())

        spans: list[tuple[int, int]] = []
        i, start = 0, 0  # the chunk's first word piece and first character
        while True:
            if m - i <= budget:
                spans.append((start, n))
                return spans
            hi = int(ends[i + budget - 1])
            end = _cut(text, start + max(int((hi - start) * 0.7), 1), hi)
            j = max(
                int(np.searchsorted(ends, end, side="right")), i + 1
            )  # the word pieces that end by ``end``
            if m - j < min_size:  # a short tail: the last chunk is the document's last ``budget`` word pieces
                spans.append((start, end))
                last = next((q for q in range(m - budget, j + 1) if word_start(q)), m - budget)
                spans.append((int(starts[last]), n))
                return spans
            spans.append((start, end))
            k = max(j - overlap, i + 1)
            back = next((q for q in range(k, max(k - overlap // 5, i + 1) - 1, -1) if word_start(q)), None)
            i = back if back is not None else k
            start = int(starts[i])


def chunk_spans_for(text: str, title: str, chunking: ChunkSettings | FitChunker) -> list[tuple[int, int]]:
    """The chunk spans of one document under either chunking."""
    from ragate.retrieval.corpus import chunk_spans

    if isinstance(chunking, FitChunker):
        return chunking.spans(text, title)
    return chunk_spans(text, chunking.size, chunking.overlap, chunking.min_size)


def manifest_chunking(chunking: ChunkSettings | FitChunker) -> dict[str, Any]:
    """The manifest's ``chunking`` entry for either chunking."""
    if isinstance(chunking, FitChunker):
        return chunking.to_manifest()
    return {"size": chunking.size, "overlap": chunking.overlap, "min_size": chunking.min_size}


def chunking_from_manifest(entry: Mapping[str, Any], encoder: Encoder | None) -> ChunkSettings | FitChunker:
    """The chunking an index was built with, from its manifest entry, to chunk documents added to it the same way;
    ``ValueError`` when it chunks in word pieces and ``encoder`` (the index's) cannot count them."""
    if entry.get("unit", "characters") != UNIT:
        return ChunkSettings(int(entry["size"]), int(entry["overlap"]), int(entry["min_size"]))
    settings = FitChunking(
        int(entry["size"]), int(entry["overlap"]), int(entry["min_size"]), str(entry["encoder"])
    )
    if encoder is None or encoder_tokenizer(encoder) is None:
        raise ValueError(
            f"the index is chunked in word pieces of {settings.encoder}, which this encoder cannot count; pass the "
            "index's own encoder"
        )
    return FitChunker(encoder, settings)


def describe_chunking(entry: Mapping[str, Any]) -> str:
    """A manifest's ``chunking`` entry in words: ``chunks of ~1,000 characters, 100 overlap, min 200`` or ``chunks
    of at most 256 word pieces of all-MiniLM-L6-v2 (its window, title included), 25 overlap, min 51``."""
    if entry.get("unit", "characters") == UNIT:
        return (
            f"chunks of at most {entry['size']:,} word pieces of {entry.get('encoder')} (its window, title "
            f"included), {entry['overlap']:,} overlap, min {entry['min_size']:,}"
        )
    return f"chunks of ~{entry['size']:,} characters, {entry['overlap']:,} overlap, min {entry['min_size']:,}"
