"""The per-question JSONL of a run: one record per (question, method), appended and fsync'ed as it finishes, so a
run killed at any moment loses at most the line it was writing, and a resumed run neither loses nor repeats one.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Self

from ragate.errors import RunFormatError
from ragate.fileio import atomic_writer, lone_surrogate

Check = Callable[[dict[str, Any]], "str | None"]


def read_records(
    path: Path, *, repair: bool = True, check: Check | None = None, fault: Check | None = None
) -> list[dict[str, Any]]:
    """Every complete record of ``path`` (none if it does not exist). A last line cut short by a kill (anywhere,
    also inside a multi-byte character) is dropped and the file rewritten without it (atomically), so appending
    can go on (``repair=False``: left as it is, for readers of a run another process may be appending to); a bad
    line anywhere else is a :class:`RunFormatError` naming the line, since that is not what a
    kill leaves behind. So is a record that parses but that the readers cannot use (:func:`record_fault`, and
    ``check``, e.g. a sweep's :func:`ragate.eval.sweep.sweep_fault`): a wrong type, NaN, a missing field.
    ``fault`` replaces :func:`record_fault` for JSON-lines files that are not a run's (a benchmark's rows), which
    keep the same append-and-resume handling."""
    fault = fault or record_fault
    if not path.exists():
        return []
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    records: list[dict[str, Any]] = []
    cut = False
    fix = "move the file aside, or delete that line and rerun with --resume to answer it again"
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line.decode("utf-8"))  # bytes to json.loads would pass encoded surrogates
        except (ValueError, RecursionError) as err:  # bad JSON or UTF-8, a number of over 4,300 digits
            if number == len(lines) or (number == len(lines) - 1 and not lines[-1]):
                cut = True  # the line a kill interrupted
                continue
            raise RunFormatError(f"{path}, line {number}: not a JSON record ({_why(err)}); {fix}") from None
        problem = fault(record) or (check(record) if check is not None else None)
        if problem is not None:
            raise RunFormatError(f"{path}, line {number}: {problem}; {fix}")
        records.append(record)
    if repair and (cut or (raw and not raw.endswith(b"\n"))):  # readers of a live run pass repair=False
        write_records(path, records)
    return records


def _why(err: Exception) -> str:
    if isinstance(err, json.JSONDecodeError):
        return err.msg
    if isinstance(err, UnicodeDecodeError):
        return "not valid UTF-8"
    return "nested too deeply" if isinstance(err, RecursionError) else str(err).split(";")[0]


# what the summary reads of every answer
ANSWER_KEYS = (
    "scores",
    "retrieved",
    "retrievals",
    "prompt_tokens",
    "completion_tokens",
    "overhead_tokens",
    "seconds",
)
COST_KEYS = ("seconds", "cpu_seconds", "prompt_tokens", "completion_tokens", "calls")
DYNAMIC_KEYS = ("first_retrieval_token", "tokens_before_first_retrieval", "generated_tokens")
SCORE_KEYS = ("em", "f1", "acc")


def _float(value: Any) -> float | None:
    """A JSON number as a float; None for anything else (``True`` and ``False`` are not numbers here, nor is an
    integer too large for a float)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def is_number(value: Any) -> bool:
    """A JSON number that is not NaN or infinite."""
    number = _float(value)
    return number is not None and math.isfinite(number)


def is_real(value: Any) -> bool:
    """A JSON number other than NaN, infinite ones included (a gate scores +inf for an empty draft)."""
    number = _float(value)
    return number is not None and not math.isnan(number)


def is_count(value: Any) -> bool:
    """A whole number from 0 to 2**53 (what a float holds exactly), as token counts and indexes are."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 2**53


def scores_fault(scores: Any, where: str = "scores") -> str | None:
    """What is wrong with an answer's ``scores`` ({"em", "f1", "acc"}, each in [0, 1]), else None."""
    if isinstance(scores, dict) and all(is_number(scores.get(k)) and 0 <= scores[k] <= 1 for k in SCORE_KEYS):
        return None
    return f'"{where}" must be {{"em", "f1", "acc"}}, each a number in [0, 1], not {short(scores)}'


def short(value: Any) -> str:
    """``repr(value)``, cut to 80 characters for an error message."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _texts(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(x, str) for x in value)


def _count_or_none(value: Any) -> bool:
    return value is None or is_count(value)


def _number_or_none(value: Any) -> bool:
    """Any number or null: a gate's score (+inf for an empty draft) and threshold are not summed by any reader."""
    return value is None or _float(value) is not None


def _costs(value: Any) -> bool:
    """What a record's LM calls were charged or paid: finite numbers, and counts of calls answered from the
    store and of prompt tokens started from an earlier prompt's state where recorded."""
    return (
        isinstance(value, dict)
        and all(is_number(value.get(k)) for k in COST_KEYS)
        and all(is_count(value.get(k, 0)) for k in ("cached_calls", "reused_prompt_tokens"))
    )


def _trace(value: Any) -> bool:
    stages = value.get("stages", []) if isinstance(value, dict) else None
    return isinstance(stages, list) and all(_stage(s) for s in stages)


def _stage(value: Any) -> bool:
    """A trace's stage as the readers rebuild it (``ragate.methods.trace.Stage``: what the route report's NLL and
    costs read): a name, its token counts and seconds, and its log-probability a number or null where held."""
    return (
        isinstance(value, dict)
        and isinstance(value.get("name"), str)
        and is_count(value.get("prompt_tokens"))
        and is_count(value.get("completion_tokens"))
        and is_number(value.get("seconds"))
        and _finite_or_none(value.get("logprob"))
    )


def _finite_or_none(value: Any) -> bool:
    return value is None or is_number(value)


_TRACE = ("an object (its stages a list of objects, each with a name, its prompt_tokens, completion_tokens and "
          "seconds, and a logprob that is a number or null)")
# the fields an eval record may hold, each with what it must be
_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "method": (lambda v: isinstance(v, str) and bool(v), "a method name"),
    **dict.fromkeys(
        ("dataset", "question", "prediction", "error"), (lambda v: isinstance(v, str), "a string")
    ),
    **dict.fromkeys(("answers", "doc_ids"), (_texts, "a list of strings")),
    "retrieved": (lambda v: isinstance(v, bool), "true or false"),
    "supported": (lambda v: v is None or isinstance(v, bool), "true, false or null"),
    **dict.fromkeys(
        ("retrievals", "prompt_tokens", "completion_tokens", "overhead_tokens", "generated_tokens"),
        (is_count, "a count"),
    ),
    **dict.fromkeys(DYNAMIC_KEYS[:2], (_count_or_none, "a count or null")),
    **dict.fromkeys(("seconds", "cpu_seconds"), (is_number, "a finite number")),
    **dict.fromkeys(("gate_score", "threshold"), (_number_or_none, "a number or null")),
    **dict.fromkeys(("charged", "paid"), (_costs, f"an object of finite numbers {', '.join(COST_KEYS)}")),
    "trace": (_trace, _TRACE),
}


def record_fault(record: Any) -> str | None:
    """What is wrong with one record of a run's JSON-lines file for its readers (resume, the summary, the report),
    else None. Every record needs a question id; a field it holds must have its type (numbers finite, no lone
    surrogate in any text); a record `ragate eval` wrote (it names its dataset) or one with a prediction is an
    error or an answer with every field the summary reads, and names its method. Records without those (a
    sweep's) are checked by the caller's ``check``."""
    if not isinstance(record, dict):
        return f"a record is a JSON object, not {type(record).__name__}"
    if not isinstance(record.get("id"), str) or not record["id"]:
        return f'no question id ("id" must be a non-empty string, not {short(record.get("id"))})'
    if (fault := lone_surrogate(record)) is not None:
        return f"{fault}, which is not text"
    for key, value in record.items():
        if key == "scores" and (fault := scores_fault(value)) is not None:
            return fault
        if key.startswith("recall@") and not (value is None or (is_number(value) and 0 <= value <= 1)):
            return f'"{key}" must be a number in [0, 1] or null, not {short(value)}'
        ok, what = _FIELDS.get(key, (None, ""))
        if ok is not None and not ok(value):
            return f'"{key}" must be {what}, not {short(value)}'
    needs: list[str] = []
    if "prediction" in record or "error" in record or "dataset" in record:
        needs.append("method")
    if "error" not in record and ("prediction" in record or "dataset" in record):
        needs += ANSWER_KEYS  # a record `ragate eval` wrote (it names its dataset) is an error or an answer
    if any(k in record for k in DYNAMIC_KEYS):
        needs += DYNAMIC_KEYS
    if "charged" in record or "paid" in record:
        needs += ["charged", "paid"]
    missing = [k for k in needs if k not in record]
    return f"no {', '.join(repr(k) for k in missing)} in this record" if missing else None


def latest(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per (id, method), the last written, in the order first seen. A resumed run retries the
    questions that failed, so a failure can be followed by its answer; the answer is what counts."""
    last: dict[tuple[Any, Any], dict[str, Any]] = {}
    for record in records:
        last[record["id"], record.get("method")] = record
    return list(last.values())


def write_records(path: Path, records: Iterable[dict[str, Any]]) -> None:
    """Replace ``path`` with ``records`` atomically."""
    with atomic_writer(path) as f:
        for record in records:
            f.write((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))


class RecordWriter:
    """Appends one JSON line per record, flushed and fsync'ed before :meth:`append` returns."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("a", encoding="utf-8")

    def append(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def by_method(records: Iterable[dict[str, Any]]) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Records grouped by method, methods in first-seen order."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault(r["method"], []).append(r)
    yield from groups.items()
