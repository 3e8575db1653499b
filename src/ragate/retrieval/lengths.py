"""Are the passages longer than what reads them? A check run after every ``ragate index build``.

Dense and hybrid indexes: an encoder reads at most ``max_seq_length`` word pieces of ``prefix + title + "\\n" +
text`` (256 for all-MiniLM-L6-v2, counted with its own tokenizer, special tokens included) and ignores the
rest, so text past the window cannot be found by dense search. A passage slightly over the window loses a few
word pieces at its end, most of which the chunker's overlap (100 characters, ~20 word pieces) repeats at the
start of the next chunk; and TARG's 1000-character chunks of English prose are sometimes slightly over MiniLM's
window (the demo sample's Wikipedia text, concatenated and chunked: 3 of 273 chunks over 256, the longest 293).
So the check warns when a passage is over the window by more than a quarter (``window * 5 / 4`` word pieces),
or when more than 5% of the passages are over it at all.

BM25 indexes read whole passages, but a retrieved passage goes into the reader's prompt: over 2,000 characters
(about 500 tokens, twice TARG's chunks) five of them take ~2,500 tokens, more than a 2,048-token context, and a
long passage matches a query by any one of its paragraphs. The check warns for any passage over 2,000 characters.

The fix is to chunk: with ``--docs``, no chunk size at all (chunks then fit the encoder's window, counted in its
word pieces: :mod:`ragate.retrieval.fit`), else ``--chunk-size N``; the suggested N is
``0.8 · window · (characters per word piece)``, rounded down to 50 (the chunker lets a chunk grow by up to
``--min-chunk`` characters to avoid a short tail).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import islice
from statistics import median
from typing import Any, Literal

from tqdm.auto import tqdm

from ragate.retrieval.encoders import Encoder
from ragate.retrieval.types import Passage

MAX_PASSAGE_CHARS = 2000
OVER_SHARE = 0.05
TOKENIZE_BATCH = 1024


@dataclass(frozen=True)
class LengthCheck:
    """How many passages are longer than ``limit`` (``unit``: word pieces of ``reader``'s tokenizer, or
    characters), the longest, and the chunk size that would fit."""

    passages: int
    over: int
    limit: int
    unit: Literal["word pieces", "characters"]
    reader: str  # the encoder's name, or "the reader's prompt" for BM25
    longest: int
    longest_id: str | None
    suggested_chunk_size: int

    @property
    def should_warn(self) -> bool:
        if self.unit == "characters":
            return self.over > 0
        return self.longest > self.limit * 5 // 4 or self.over > OVER_SHARE * self.passages

    def warning(self, *, fit: bool = False) -> str:
        """The message ``ragate index build`` prints when :attr:`should_warn` (what, how many, why, the fix).
        ``fit``: the passages are documents chunked by a character size given (``--docs`` with ``--chunk-size``),
        so the first fix is to give none, which fits the chunks to the encoder's window in one pass."""
        if self.unit == "characters":
            why = (
                f"each retrieved passage goes whole into the reader's prompt: five of {self.limit:,}+ characters "
                f"are ~{5 * self.limit // 4:,}+ tokens, more than a small model's 2,048-token context"
            )
        else:
            why = (
                f"{self.reader} reads the first {self.limit} and ignores the rest, so dense search cannot find "
                "what comes after"
            )
        verb = "is" if self.over == 1 else "are"
        fix = f"rebuild with --chunk-size {self.suggested_chunk_size}"
        if fit and self.unit == "word pieces":
            fix = (
                "rebuild without a chunk size, which fits each chunk to the encoder's window (or with --chunk-size "
                f"{self.suggested_chunk_size})"
            )
        return (
            f"{self.over:,} of {self.passages:,} passages {verb} longer than {self.limit:,} {self.unit} "
            f"(longest: {self.longest:,} {self.unit}, passage {self.longest_id}); {why}. Chunk them: {fix}"
        )


def check_passage_lengths(
    passages: Iterable[Passage], encoder: Encoder | None = None, *, progress: bool = False
) -> LengthCheck:
    """Count the passages longer than ``encoder`` reads (its tokenizer and ``max_seq_length``), or, without an
    encoder (BM25), longer than :data:`MAX_PASSAGE_CHARS` characters. An encoder that exposes no
    sentence-transformers model (``encoder.model.tokenizer``) is checked by characters too."""
    model: Any = getattr(encoder, "model", None)
    tokenizer = getattr(model, "tokenizer", None)
    window = getattr(model, "max_seq_length", None)
    if encoder is None or tokenizer is None or not window:
        return _by_characters(passages, progress=progress)
    return _by_tokens(passages, encoder, tokenizer, int(window), progress=progress)


def _by_characters(passages: Iterable[Passage], *, progress: bool) -> LengthCheck:
    n = over = longest = 0
    longest_id = None
    for passage in tqdm(passages, desc="check lengths", unit=" passages", disable=not progress):
        n += 1
        length = len(passage.text)
        over += length > MAX_PASSAGE_CHARS
        if length > longest:
            longest, longest_id = length, passage.id
    return LengthCheck(
        n, over, MAX_PASSAGE_CHARS, "characters", "the reader's prompt", longest, longest_id, 1000
    )


def _by_tokens(
    passages: Iterable[Passage], encoder: Encoder, tokenizer: Any, window: int, *, progress: bool
) -> LengthCheck:
    n = over = longest = 0
    longest_id = None
    ratios: list[float] = []  # characters per word piece of each over-long passage
    stream = iter(passages)
    with tqdm(desc="check lengths", unit=" passages", disable=not progress) as bar:
        while batch := list(islice(stream, TOKENIZE_BATCH)):
            texts = [encoder.document_prefix + p.contents for p in batch]
            # verbose=False: no "longer than the model's maximum" message for each long text
            lengths = [len(ids) for ids in tokenizer(texts, verbose=False)["input_ids"]]
            for passage, text, length in zip(batch, texts, lengths, strict=True):
                if length > window:
                    over += 1
                    ratios.append(len(text) / length)
                if length > longest:
                    longest, longest_id = length, passage.id
            n += len(batch)
            bar.update(len(batch))
    chars_per_piece = median(ratios) if ratios else 4.0
    suggested = max(100, int(0.8 * window * chars_per_piece) // 50 * 50)
    return LengthCheck(n, over, window, "word pieces", encoder.name, longest, longest_id, suggested)
