"""Corpus files: read passages (ragate JSONL, FlashRAG JSONL, DPR TSV; ``.gz`` too), write them atomically, chunk.

Every reader yields :class:`~ragate.retrieval.types.Passage`. A malformed line raises
:class:`~ragate.errors.CorpusFormatError` naming the file and line; ``skip_bad=True`` (``--skip-bad``) skips such
lines and counts them in a :class:`ReadStats` the caller passes in.

Chunking follows TARG's setting by default: ~1000 characters, 100 overlap, no piece under 200. A document that is
split gets chunk ids ``"{id}#{n}"`` (n from 0); :func:`document_id` maps a chunk id back to its document.
"""

from __future__ import annotations

import csv
import gzip
import json
import re
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from ragate.errors import CorpusFormatError, DataNotFoundError
from ragate.fileio import BOM, atomic_writer, lone_surrogate
from ragate.retrieval.types import Passage

Format = Literal["jsonl", "flashrag", "tsv"]
FORMATS: tuple[str, ...] = get_args(Format)
DPR_HEADER = ("id", "text", "title")
MAX_EXAMPLES = 10


@dataclass
class ReadStats:
    """What one :func:`read_passages` call saw. Mutable on purpose: the reader fills it in as it goes, so a caller
    that passes one in can read the counts after (or while) iterating."""

    format: str = ""
    lines: int = 0
    passages: int = 0
    malformed: int = 0
    duplicates: int = 0
    examples: list[str] = field(default_factory=list)  # the first few problems, "file:line: reason"

    @property
    def skipped(self) -> int:
        return self.malformed + self.duplicates


class _BadLine(Exception):
    """A line that does not parse; the reader adds file and line number."""


class _DuplicateId(_BadLine):
    """A line whose id an earlier line already used."""


# ----------------------------------------------------------------------------------------------- reading


def detect_format(path: Path | str) -> Format:
    """``tsv`` for ``.tsv``/``.tsv.gz``; otherwise the first non-blank line decides: a JSON object with ``contents``
    and no ``text`` is FlashRAG's form, any other JSON object ragate's, a tab-separated line DPR's TSV."""
    path = Path(path)
    name = path.name.lower().removesuffix(".gz")
    if name.endswith(".tsv"):
        return "tsv"
    for _, raw in _lines(path):
        line = raw.decode("utf-8", errors="replace").strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            if "\t" in line:
                return "tsv"
            raise CorpusFormatError(
                f"{path}: cannot tell the corpus format from its first line (neither JSON nor tab-separated); "
                f"pass --format {'|'.join(FORMATS)}"
            ) from None
        except (ValueError, RecursionError):
            return "jsonl"  # JSON with a number too long or nesting too deep: the reader names the line
        if isinstance(obj, dict) and "contents" in obj and "text" not in obj:
            return "flashrag"
        return "jsonl"
    return "jsonl"  # an empty file: any format reads it as no passages


def read_passages(
    path: Path | str,
    *,
    format: Format | Literal["auto"] = "auto",
    skip_bad: bool = False,
    stats: ReadStats | None = None,
) -> Iterator[Passage]:
    """Yield the passages of a corpus file, in file order. Blank lines are ignored.

    Raises :class:`CorpusFormatError` on a malformed line (bad JSON, missing or mistyped field, wrong column count,
    a truncated last line) or an id seen on an earlier line, unless ``skip_bad``: then the line is skipped and
    counted in ``stats.malformed`` / ``stats.duplicates`` (the first passage with an id wins).
    """
    path = Path(path)
    if not path.is_file():
        raise DataNotFoundError(
            f"no corpus file at {path}; check the path (formats: {', '.join(FORMATS)}, .gz ok)"
        )
    fmt: Format = detect_format(path) if format == "auto" else format
    if fmt not in FORMATS:
        raise CorpusFormatError(f"unknown corpus format {fmt!r}; use one of: auto, {', '.join(FORMATS)}")
    stats = stats if stats is not None else ReadStats()
    stats.format = fmt
    seen: dict[str, int] = {}
    for line_no, raw in _lines(path):
        stats.lines += 1
        try:
            line = raw.decode("utf-8")
            if not line.strip():
                continue
            if fmt == "tsv":
                fields = _tsv_fields(line)
                if line_no == 1 and tuple(f.strip().lower() for f in fields) == DPR_HEADER:
                    continue
                passage = _from_tsv(fields)
            else:
                obj = _json_object(line)
                passage = _from_flashrag(obj) if fmt == "flashrag" else _from_jsonl(obj)
            first = seen.get(passage.id)
            if first is not None:
                raise _DuplicateId(f"duplicate id {passage.id!r} (first on line {first})")
        except (_BadLine, UnicodeDecodeError) as bad:
            reason = str(bad) if isinstance(bad, _BadLine) else "not valid UTF-8"
            if not raw.endswith(b"\n"):
                reason += " (the last line has no newline: the file looks truncated)"
            problem = f"{path}:{line_no}: {reason}"
            if not skip_bad:
                raise CorpusFormatError(
                    f"{problem}. Fix or remove the line, or pass --skip-bad (skip_bad=True) to skip and count "
                    "malformed lines"
                ) from None
            if isinstance(bad, _DuplicateId):
                stats.duplicates += 1
            else:
                stats.malformed += 1
            if len(stats.examples) < MAX_EXAMPLES:
                stats.examples.append(problem)
            continue
        seen[passage.id] = line_no
        stats.passages += 1
        yield passage


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, raw bytes with their newline); a truncated or corrupt ``.gz`` is an error."""
    opener: Any = gzip.open if path.name.lower().endswith(".gz") else open
    line_no = 0
    try:
        with opener(path, "rb") as f:
            for line_no, raw in enumerate(f, start=1):
                yield line_no, raw.removeprefix(BOM) if line_no == 1 else raw  # an editor's byte-order mark
    except (EOFError, gzip.BadGzipFile, zlib.error) as err:
        raise CorpusFormatError(
            f"{path}: the gzip stream is truncated or corrupt after line {line_no} ({err}); re-create or "
            "re-download the file (--skip-bad cannot skip a broken stream)"
        ) from None


def _json_object(line: str) -> dict[str, Any]:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as err:
        raise _BadLine(f"not valid JSON ({err.msg} at column {err.colno})") from None
    except (ValueError, RecursionError) as err:  # a number of over 4,300 digits; nesting too deep
        why = "nested too deeply" if isinstance(err, RecursionError) else str(err).split(";")[0]
        raise _BadLine(f"not valid JSON ({why})") from None
    if not isinstance(obj, dict):
        raise _BadLine(f"expected a JSON object, found {type(obj).__name__}")
    if _SURROGATE_ESCAPE.search(line) and (fault := lone_surrogate(obj)) is not None:
        raise _BadLine(f"{fault} (a \\ud800-style escape without its pair), which is not text")
    return obj


# a JSON escape of a UTF-16 surrogate: the one way a line of valid UTF-8 can hold a lone one
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _id(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise _BadLine(
            'missing "id" (a string or integer)' if value is None else f'"id" must be a string, not {value!r}'
        )
    pid = str(value)
    if not pid.strip():
        raise _BadLine('"id" is empty')
    return pid


def _str_field(obj: dict[str, Any], key: str, *, required: bool) -> str | None:
    value = obj.get(key)
    if value is None:
        if required:
            raise _BadLine(f'missing "{key}"')
        return None
    if not isinstance(value, str):
        raise _BadLine(f'"{key}" must be a string, not {type(value).__name__}')
    return value


def _from_jsonl(obj: dict[str, Any]) -> Passage:
    """ragate's form ``{"id", "title", "text", "source"?, "span"?}``; a missing or null title reads as ``""``."""
    text = _str_field(obj, "text", required=True)
    assert text is not None
    title = _str_field(obj, "title", required=False) or ""
    return Passage(
        id=_id(obj.get("id")),
        title=title,
        text=text,
        source=_str_field(obj, "source", required=False),
        span=_span(obj.get("span")),
    )


def _span(value: object) -> tuple[int, int] | None:
    """``"span": [start, end]`` (characters of the source document), or ``None`` when absent."""
    if value is None:
        return None
    if (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
        and value[0] <= value[1]
    ):
        return value[0], value[1]
    raise _BadLine(f'"span" must be [start, end] with 0 <= start <= end, not {value!r}')


def _from_flashrag(obj: dict[str, Any]) -> Passage:
    contents = _str_field(obj, "contents", required=True)
    assert contents is not None
    title, text = split_contents(contents)
    return Passage(id=_id(obj.get("id")), title=title, text=text)


def split_contents(contents: str) -> tuple[str, str]:
    """FlashRAG's ``contents`` is ``"title\\ntext"``: the first line is the title, sometimes wrapped in double
    quotes (stripped here). Without a newline the whole string is the text."""
    title, sep, text = contents.partition("\n")
    if not sep:
        return "", contents
    title = title.strip()
    if len(title) >= 2 and title[0] == '"' and title[-1] == '"':
        title = title[1:-1].strip()
    return title, text


def _tsv_fields(line: str) -> list[str]:
    try:
        return next(csv.reader([line.rstrip("\r\n")], delimiter="\t", strict=True))
    except (csv.Error, StopIteration) as err:
        raise _BadLine(f"bad TSV quoting ({err})") from None


def _from_tsv(fields: list[str]) -> Passage:
    """DPR's ``id<TAB>text<TAB>title`` (psgs_w100.tsv); quoted fields are unquoted as in CSV."""
    if len(fields) != 3:
        raise _BadLine(f"expected 3 tab-separated columns (id, text, title), found {len(fields)}")
    pid, text, title = fields
    return Passage(id=_id(pid), title=title, text=text)


# ----------------------------------------------------------------------------------------------- writing


def passage_json(passage: Passage) -> str:
    """One line of ragate's JSONL form (``source`` and ``span`` only when set)."""
    obj: dict[str, Any] = {"id": passage.id, "title": passage.title, "text": passage.text}
    if passage.source is not None:
        obj["source"] = passage.source
    if passage.span is not None:
        obj["span"] = list(passage.span)
    return json.dumps(obj, ensure_ascii=False)


def write_passages(passages: Iterable[Passage], path: Path | str) -> int:
    """Write passages in ragate's JSONL form, atomically (``.gz`` compresses); returns how many were written."""
    n = 0
    with atomic_writer(path) as f:
        for passage in passages:
            f.write(passage_json(passage).encode("utf-8") + b"\n")
            n += 1
    return n


# ----------------------------------------------------------------------------------------------- chunking

_SENTENCE_END = re.compile(r"[.!?][\"')\]]*(?=\s)|\n")
_SPACE = re.compile(r"\s")


def chunk_spans(
    text: str, size: int = 1000, overlap: int = 100, min_size: int = 200
) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of the chunks of ``text``; see :func:`chunk_text`.

    Guarantees (tested as properties): the spans cover the text from 0 to ``len(text)``; each starts after the
    previous one and overlaps it by at least ``overlap`` characters (by at most ``overlap + overlap // 5`` when
    it can move back to a word start); each is at most ``size + min_size - 1`` long (a tail shorter than
    ``min_size`` is merged into the chunk before it), and all but the last are at most ``size`` before merging.
    """
    if size < 1 or not 0 <= overlap < size or not 0 <= min_size <= size:
        raise ValueError(
            f"need size >= 1, 0 <= overlap < size and 0 <= min_size <= size; got {size}, {overlap}, "
            f"{min_size}"
        )
    n = len(text)
    if n == 0:
        return []
    spans: list[tuple[int, int]] = []
    start = 0
    while True:
        if n - start <= size:
            spans.append((start, n))
            return spans
        end = _cut(text, start + max(int(size * 0.7), overlap + 1), start + size)
        if n - end < min_size:  # the piece after this chunk would be too short: take it in
            spans.append((start, n))
            return spans
        spans.append((start, end))
        nxt = end - overlap
        back = text.rfind(" ", max(nxt - overlap // 5, start + 1), nxt)  # prefer to start at a word
        start = back + 1 if back >= 0 else nxt


def _cut(text: str, lo_min: int, hi: int) -> int:
    """Where to end a chunk: the last sentence end in ``(lo_min, hi]``, else the last whitespace there, else
    ``hi``."""
    best = -1
    for match in _SENTENCE_END.finditer(text, lo_min, hi):
        best = match.end()
    if best > lo_min:
        return best
    for match in _SPACE.finditer(text, lo_min + 1, hi):
        best = match.start()
    return best if best > lo_min else hi


def chunk_text(text: str, size: int = 1000, overlap: int = 100, min_size: int = 200) -> list[str]:
    """Split ``text`` into pieces of about ``size`` characters that overlap by ``overlap``, cut at a sentence end
    (else whitespace) in the last 30% of the window; a trailing piece shorter than ``min_size`` joins the chunk
    before it. Text of at most ``size`` characters is one chunk; empty text gives none. Defaults are TARG's."""
    return [text[a:b] for a, b in chunk_spans(text, size, overlap, min_size)]


def chunk_passages(
    passages: Iterable[Passage], size: int = 1000, overlap: int = 100, min_size: int = 200
) -> Iterator[Passage]:
    """Chunk each passage's text (the title is kept on every chunk). A passage that fits stays as it is, id
    unchanged; a split one becomes ``"{id}#0"``, ``"{id}#1"``, ... Empty passages are dropped."""
    for passage in passages:
        pieces = chunk_text(passage.text, size, overlap, min_size)
        if len(pieces) == 1:
            yield passage
            continue
        for n, piece in enumerate(pieces):
            yield Passage(id=f"{passage.id}#{n}", title=passage.title, text=piece, source=passage.source)


_CHUNK_SUFFIX = re.compile(r"#\d+$")


def document_id(passage_id: str) -> str:
    """The document a passage id belongs to: ``"p1a2b#3"`` -> ``"p1a2b"``; an unsplit id is its own document."""
    return _CHUNK_SUFFIX.sub("", passage_id)


def demo_dir() -> Path:
    """The small real sample that ships with ragate: ``passages.jsonl`` and ``questions.jsonl`` (see its README)."""
    return Path(__file__).resolve().parents[1] / "data" / "demo"
