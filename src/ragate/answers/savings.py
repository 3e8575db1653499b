"""What deciding saved: each answer's cost beside what always retrieving would have cost on it, and the answer
log a service writes so that ``ragate report`` can add it up over time.

For an answer that retrieved, always retrieving would have cost its own selection and reading stages (the stages
after the gate's, plus a pseudo-context the gate wrote that the selector reused): **measured**. For one the gate
answered without reading, nobody read the documents, so the cost is **estimated**: the mean of the measured cost
of the last answers of the same method that did retrieve (:class:`AlwaysRetrieveCost`). Until one has, it is
**unknown**. Dynamic methods and CRAG-lite decide while answering: there is no gate to take away (**n/a**).

A route method (``ragate.methods.route``) is compared with always taking its last, dearest route: measured where
the cascade went on to that route (its own stages), else estimated from the last answers that did, the same way;
its ``gate`` cost is the routes it ran before the one that answered.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ragate.errors import RunFormatError
from ragate.methods.trace import Stage, Trace

log = logging.getLogger("ragate.service")

LOG_KIND = "ragate.answer-log"
WINDOW = 100  # retrieved answers per method the estimate averages


@dataclass(frozen=True)
class Cost:
    """Tokens (prompt + completion) and seconds of LM and retrieval work."""

    tokens: int
    seconds: float

    @classmethod
    def of(cls, stages: Iterable[Stage]) -> Cost:
        stages = list(stages)
        return cls(sum(s.prompt_tokens + s.completion_tokens for s in stages), sum(s.seconds for s in stages))

    @classmethod
    def mean(cls, costs: list[Cost]) -> Cost:
        """The mean of ``costs`` (at least one), tokens rounded."""
        return cls(round(sum(c.tokens for c in costs) / len(costs)), sum(c.seconds for c in costs) / len(costs))

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.tokens + other.tokens, self.seconds + other.seconds)


@dataclass(frozen=True)
class Savings:
    """One answer's cost (``spent``), what its gate cost (``gate``), and what always retrieving would have cost
    (``always``; None when unknown or not applicable), with ``how`` that figure was had and by which ``estimator``."""

    spent: Cost
    gate: Cost
    always: Cost | None
    how: str  # measured | estimated | unknown | n/a
    estimator: str

    @property
    def saved(self) -> Cost | None:
        """Always retrieving's cost minus this answer's (negative when the gate cost more than it saved)."""
        if self.always is None:
            return None
        return Cost(self.always.tokens - self.spent.tokens, self.always.seconds - self.spent.seconds)

    def to_json(self) -> dict[str, Any]:
        saved = self.saved
        return {
            "spent": asdict(self.spent),
            "gate": asdict(self.gate),
            "always_retrieve": None if self.always is None else asdict(self.always),
            "how": self.how,
            "estimator": self.estimator,
            "saved": None if saved is None else asdict(saved),
        }


def gate_stages(trace: Trace) -> list[Stage]:
    """The stages the gate made (none for a method without a gate of its own)."""
    return list(trace.stages[: trace.gate_stages or 0])


def retrieval_path(trace: Trace) -> Cost:
    """What answering ``trace``'s question by always retrieving costs, measured on a trace that retrieved: its
    stages after the gate's, plus a pseudo-context the gate wrote that the selector reused (PAIRS) and a search
    the gate made whose hits the reader read (a gate that reads no model: its stage is then not overhead)."""
    n = trace.gate_stages or 0
    reused = [
        s for s in trace.stages[:n] if s.name == "pseudo-context" or (s.name == "retrieve" and not s.overhead)
    ]
    return Cost.of([*reused, *trace.stages[n:]])


@dataclass
class AlwaysRetrieveCost:
    """The running estimate of always retrieving's cost, per method: the mean measured cost of the last ``window``
    answers of that method that retrieved. Safe to share between threads."""

    window: int = WINDOW
    _seen: dict[str, deque[Cost]] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def savings(self, trace: Trace, *, read: Cost | None = None) -> Savings:
        """``trace``'s savings; a trace that retrieved also feeds the estimate for the next ones. ``read``: where
        another LLM read the documents (a framework's: ragate's trace then ends at the selection), what that read
        cost, from the LLM's own usage; it is added to this answer's cost and to what always retrieving costs."""
        spent, gate = Cost.of(trace.stages), Cost.of(gate_stages(trace))
        if read is not None:
            spent = spent + read
        if trace.route is not None and trace.route.stages:
            return self._route(trace, spent)
        if trace.gate_stages is None:
            return Savings(
                spent, gate, None, "n/a", f"{trace.method} decides while answering: no gate to remove"
            )
        if trace.retrieved:
            measured = retrieval_path(trace) if read is None else retrieval_path(trace) + read
            with self._lock:
                self._seen.setdefault(trace.method, deque(maxlen=self.window)).append(measured)
            how = "this answer's selection and reading stages"
            return Savings(spent, gate, measured, "measured", how if read is None else how + " (your LLM's read)")
        with self._lock:
            seen = list(self._seen.get(trace.method, ()))
        if not seen:
            return Savings(spent, gate, None, "unknown", f"no answer of {trace.method} has retrieved yet")
        mean = Cost.mean(seen)
        estimator = f"mean of the last {len(seen)} answers of {trace.method} that retrieved"
        return Savings(spent, gate, mean, "estimated", estimator)


    def _route(self, trace: Trace, spent: Cost) -> Savings:
        """A route method's answer beside always taking its last route (see the module docstring)."""
        route = trace.route
        assert route is not None
        last, ran = route.routes[-1], route.stages
        before = Cost.of(trace.stages[: sum(ran[:-1])])  # the routes run before the one that answered
        key = f"{trace.method}: always {last}"
        if route.taken == last:
            measured = Cost.of(trace.stages[sum(ran[:-1]) :])
            with self._lock:
                self._seen.setdefault(key, deque(maxlen=self.window)).append(measured)
            return Savings(spent, before, measured, "measured", f"this answer's {last} stages (its last route)")
        with self._lock:
            seen = list(self._seen.get(key, ()))
        if not seen:
            return Savings(spent, before, None, "unknown", f"no answer has gone on to {last} yet")
        mean = Cost.mean(seen)
        return Savings(spent, before, mean, "estimated", f"mean of the last {len(seen)} answers that took {last}")


def log_entry(trace: Trace, savings: Savings, *, model: str, at: float | None = None) -> dict[str, Any]:
    """One line of a service's answer log: the decision, the cost and the savings; no question, answer or
    document text (a log outlives requests; the trace spans carry text when asked)."""
    g = trace.gate
    return {
        "kind": LOG_KIND,
        "time": time.time() if at is None else at,
        "method": trace.method,
        "model": model,
        "retrieved": trace.retrieved,
        "score": g.score if math.isfinite(g.score) else None,
        "threshold": g.threshold if math.isfinite(g.threshold) else None,
        **savings.to_json(),
    }


class AnswerLogError(OSError):
    """A required answer log could not be written (``AnswerLog(required=True)``)."""


class AnswerLog:
    """Appends :func:`log_entry` lines to a file, one unbuffered write a line, from any thread.

    A side channel: a line that cannot be written (a full or failing disk) is counted (``failures``), kept as
    ``error`` until a write succeeds again, and logged once a minute; the answer it describes is not touched. With
    ``required=True`` (an audit trail) a failed write raises :class:`AnswerLogError` instead, which the service
    turns into a 503 before the answer leaves. A FIFO or a socket (a writer would block on it) is refused at start."""

    LOG_EVERY = 60.0  # seconds between two warnings of the same failing log

    def __init__(self, path: str | Path, *, required: bool = False) -> None:
        from ragate.errors import RagateError

        self.path = Path(path)
        self.required = required
        if self.path.is_dir():
            raise RagateError(f"answer log {path}: that is a directory; name a file to append to")
        if self.path.is_fifo() or self.path.is_socket():  # a writer would block on it, or lose the lines
            raise RagateError(f"answer log {path}: that is a FIFO or a socket; name a file to append to")
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o644)
        except OSError as err:
            raise RagateError(f"answer log {path}: cannot open it for appending ({err.strerror})") from None
        self._lock = threading.Lock()
        self.failures = 0
        self.error: str | None = None
        self._logged = -math.inf

    def write(self, entry: dict[str, Any]) -> bool:
        """Append one line; False (counted, logged, ``error`` set) where it could not be written."""
        data = (json.dumps(entry, ensure_ascii=False, allow_nan=False) + "\n").encode()
        with self._lock:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(self._fd, view) :]
            except OSError as err:
                self.failures += 1
                self.error = f"answer log: {err.strerror or err}"
                now = time.monotonic()
                if now - self._logged >= self.LOG_EVERY:
                    self._logged = now
                    log.warning("%s (%s; %d line(s) lost so far)", self.error, self.path, self.failures)
                if self.required:
                    raise AnswerLogError(err.errno, f"the required answer log {self.path} cannot be written: "
                                                    f"{err.strerror or err}") from None  # fmt: skip
                return False
            self.error = None
            return True

    def close(self) -> None:
        with self._lock:
            try:
                os.close(self._fd)
            except OSError:
                pass


def read_log(path: str | Path) -> Iterator[dict[str, Any]]:
    """The entries of an answer log. A last line cut short (the service was killed mid-write) is skipped; a
    damaged line elsewhere, or a file that is not an answer log, is a :class:`RunFormatError` naming the line."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    except OSError as err:
        raise RunFormatError(f"{path}: cannot read the answer log ({err.strerror})") from None
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            if not isinstance(entry, dict) or entry.get("kind") != LOG_KIND:
                raise ValueError(f"not a {LOG_KIND} line")
            _check_entry(entry)
        except (ValueError, KeyError, TypeError) as err:
            if i == last and not line.endswith("}"):
                return  # a write cut short by a kill
            raise RunFormatError(
                f"{path}, line {i + 1}: not an answer-log entry ({err}); the log `ragate serve --answer-log` "
                "writes has one JSON object a line"
            ) from None
        yield entry


LAST_TIME = 253402300799.0  # 9999-12-31 23:59:59 UTC: the last time a report can print as a date


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"


def _check_entry(entry: dict[str, Any]) -> None:
    """A ValueError or TypeError naming the first field of an answer-log entry that is not of its type: ``time`` a
    number of seconds since 1970 that is a date up to the year 9999, ``retrieved`` true or false, ``method`` a
    string, ``spent`` a cost, ``always_retrieve`` and ``saved`` a cost or null (a cost: whole ``tokens`` of at most
    2**53 and finite ``seconds``; ``saved`` may be negative). A report can add such numbers and print them."""
    from ragate.eval.records import is_count, is_number

    def cost(name: str, signed: bool = False) -> None:
        value = entry.get(name)
        if not isinstance(value, dict):
            raise TypeError(f"{name} is {value!r}, not a cost (tokens and seconds)")
        tokens, seconds = value.get("tokens"), value.get("seconds")
        if not isinstance(tokens, int) or isinstance(tokens, bool) or (tokens < 0 and not signed):
            raise ValueError(f"{name}.tokens is {_shown(tokens)}, not a whole number of tokens")
        if not is_count(abs(tokens)):
            raise ValueError(f"{name}.tokens is {_shown(tokens)}, more than 2**53 tokens")
        if not is_number(seconds) or isinstance(seconds, bool):
            raise ValueError(f"{name}.seconds is {seconds!r}, not a finite number")

    at = entry.get("time")
    if isinstance(at, bool) or not isinstance(at, int | float) or not is_number(at) or not 0 <= at <= LAST_TIME:
        raise ValueError(f"time is {_shown(at)}, not seconds since 1970 up to the year 9999")
    if not isinstance(entry.get("retrieved"), bool):
        raise TypeError(f"retrieved is {entry.get('retrieved')!r}, not true or false")
    if not isinstance(entry.get("method"), str):
        raise TypeError(f"method is {entry.get('method')!r}, not a string")
    cost("spent")
    for name in ("always_retrieve", "saved"):
        if entry.get(name) is not None:
            cost(name, signed=name == "saved")


def savings_report(entries: Iterable[dict[str, Any]], *, periods: int = 10) -> str:
    """Markdown: per method, the answers, retrieval rate, tokens spent and saved against always retrieving; then
    the retrieval rate and savings over time, in ``periods`` equal spans of the log's time."""
    rows = list(entries)
    if not rows:
        return "The answer log is empty: no answers yet.\n"
    lines = [
        (
            "| method | answers | retrieval rate | tokens spent | always retrieving (known) | saved tokens | saved % "
            "| seconds spent | saved seconds | no estimate |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for method in sorted({r["method"] for r in rows}):
        lines.append(_row(method, [r for r in rows if r["method"] == method]))
    if len({r["method"] for r in rows}) > 1:
        lines.append(_row("all", rows))
    start, end = min(r["time"] for r in rows), max(r["time"] for r in rows)
    n = max(1, min(periods, len(rows)))
    width = (end - start) / n or 1.0
    lines += [
        "",
        "| from (UTC) | answers | retrieval rate | tokens spent | saved tokens |",
        "|---|---|---|---|---|",
    ]
    for i in range(n):
        lo = start + i * width
        part = [r for r in rows if lo <= r["time"] < lo + width or (i == n - 1 and r["time"] == end)]
        if not part:
            continue
        rate = sum(bool(r["retrieved"]) for r in part) / len(part)
        saved = sum(r["saved"]["tokens"] for r in part if r.get("saved"))
        spent = sum(r["spent"]["tokens"] for r in part)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(lo))
        lines.append(f"| {stamp} | {len(part)} | {rate:.1%} | {spent} | {saved:+d} |")
    lines += [
        "",
        (
            "Always retrieving's cost is measured on answers that retrieved and estimated on those that skipped (the "
            "mean of the method's last answers that retrieved); `no estimate` counts answers before any had. Saved = "
            "always retrieving's cost minus the answer's, summed where known (negative: the gate cost more)."
        ),
    ]
    return "\n".join(lines) + "\n"


def _row(method: str, rows: list[dict[str, Any]]) -> str:
    known = [r for r in rows if r.get("always_retrieve") is not None]
    always = sum(r["always_retrieve"]["tokens"] for r in known)
    saved = sum(r["saved"]["tokens"] for r in known)
    saved_s = sum(r["saved"]["seconds"] for r in known)
    spent = sum(r["spent"]["tokens"] for r in rows)
    seconds = sum(r["spent"]["seconds"] for r in rows)
    rate = sum(bool(r["retrieved"]) for r in rows) / len(rows)
    share = f"{saved / always:+.1%}" if always else "-"
    return (
        f"| {method} | {len(rows)} | {rate:.1%} | {spent} | {always} | {saved:+d} | {share} | {seconds:.1f} "
        f"| {saved_s:+.1f} | {len(rows) - len(known)} |"
    )
