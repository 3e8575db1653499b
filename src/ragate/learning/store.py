"""The feedback store: answers a pipeline gave, with the features its gate could read, and the labels that say
whether retrieval was needed, from three sources, in one SQLite file.

- **shadow** (:mod:`ragate.learning.shadow`): on a sample of requests the path the gate did not take is run after the
  response, and the pair of answers gives a *silver* label, ``retrieval-changed``: the closed-book and the retrieval
  answers disagree (their SQuAD token F1, after normalisation, is below :data:`AGREE_F1`); with a reference answer
  the closed-book one is also scored (a *gold* ``closed-wrong`` label).
- **feedback** (``Pipeline.feedback``, ``POST /v1/feedback``): the user says an answer was correct or not, or
  gives the reference answer. A closed-book answer judged gives ``closed-wrong`` directly; a retrieved one does
  only where its closed-book twin is known (a shadow answer) and a reference scores it.
- **run**: labelled questions of a sweep (``ragate gate learn --sweep``).

Each answer row keeps the question, the method and prompt set, the answer, the gate's scalar features (JSON), the
model's hidden state (float32 bytes), and the model, corpus, encoder and ragate version it was computed with; a
label row names its answer, source, kind (``closed-wrong`` / ``retrieval-changed``) and value (1: retrieval was
needed). The file is written in transactions with SQLite's write-ahead log and full sync, so a label is on disk
when its call returns (a process killed after that loses none), and it is bounded: past ``max_answers`` the oldest
answers and their labels are dropped. A damaged file is an error naming it and the fix; so is a file that cannot be
created or opened for writing (a read-only folder), when the store opens. A write that fails later (a full or failing
disk) is a :class:`StoreWriteError`: a fault of the store, not of the caller, which the service answers with 503.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Self

import numpy as np

from ragate.errors import RagateError
from ragate.state.shared import StoreUnavailable

AGREE_F1 = 0.5
DEFAULT_MAX_ANSWERS = 50_000
MAX_REFERENCE_CHARS = 2000
LabelKind = Literal["closed-wrong", "retrieval-changed", "retrieved-wrong"]
LABEL_KINDS: tuple[LabelKind, ...] = ("closed-wrong", "retrieval-changed")  # what a gate is fitted on
# the retrieval route's answer judged (a label of that route, kept for route policies; not a gate label)
ROUTE_KINDS: tuple[LabelKind, ...] = ("retrieved-wrong",)
ALL_KINDS: tuple[LabelKind, ...] = LABEL_KINDS + ROUTE_KINDS
SOURCES = ("shadow", "feedback", "run")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS answers (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    created REAL NOT NULL,
    question TEXT NOT NULL,
    method TEXT NOT NULL,
    prompts TEXT NOT NULL,
    answer TEXT NOT NULL,
    retrieved INTEGER NOT NULL,
    features TEXT NOT NULL,
    hidden BLOB,
    model TEXT NOT NULL,
    corpus TEXT,
    encoder TEXT,
    version TEXT NOT NULL,
    closed_answer TEXT,
    open_answer TEXT
);
CREATE INDEX IF NOT EXISTS answers_seq ON answers(seq);
CREATE TABLE IF NOT EXISTS labels (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    answer_id TEXT NOT NULL REFERENCES answers(id) ON DELETE CASCADE,
    created REAL NOT NULL,
    source TEXT NOT NULL,
    kind TEXT NOT NULL,
    value INTEGER NOT NULL,
    detail TEXT
);
CREATE INDEX IF NOT EXISTS labels_answer ON labels(answer_id);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
FORMAT = "ragate-feedback"
FORMAT_VERSION = "1"


class UnknownAnswer(RagateError):
    """Feedback named an answer id the store does not hold (never given, or dropped as the oldest)."""


class StoreWriteError(StoreUnavailable):
    """The SQLite store could not be written (a full or failing disk, a lock held too long): the store's fault, not
    the caller's; the same kind of failure as the replicas' shared store not answering."""


def answers_agree(a: str, b: str) -> bool:
    """Two answers agree when their SQuAD token F1 (lower case, no punctuation or articles) is at least
    :data:`AGREE_F1` (exact agreement is too strict for answers written as sentences)."""
    from ragate.text import f1

    return f1(a, [b]) >= AGREE_F1


def answer_correct(prediction: str, reference: str) -> bool:
    """Whether ``prediction`` holds the reference answer as whole words (both normalised SQuAD-style, the reference's
    words a run of the prediction's): "1" is not found in "10", nor "cat" in "concatenate"."""
    from ragate.text import contains

    return contains(prediction, [reference], mode="tokens") > 0


@dataclass(frozen=True)
class FeedbackResult:
    """What a user's word on an answer gave: the ``labels`` made now, as (kind, value) pairs (value True: the answer
    of that kind was wrong / retrieval was needed), and the kinds ``pending``: labels that wait for the other
    route's answer, which shadow work computes with the reference attached (empty where nothing will compute it)."""

    labels: tuple[tuple[LabelKind, bool], ...]
    pending: tuple[LabelKind, ...] = ()


@dataclass(frozen=True)
class StoredAnswer:
    id: str
    question: str
    method: str
    prompts: str
    answer: str
    retrieved: bool
    features: dict[str, float]
    hidden: np.ndarray | None
    model: dict[str, Any]
    closed_answer: str | None
    open_answer: str | None


@dataclass(frozen=True)
class LabelledRows:
    """The store's labelled answers of one kind: each answer once, its latest label of that kind."""

    ids: tuple[str, ...]
    questions: tuple[str, ...]
    features: tuple[dict[str, float], ...]
    hidden: tuple[np.ndarray | None, ...]
    y: np.ndarray
    sources: tuple[str, ...]
    models: tuple[str, ...]


def value_key(kind: str, value: bool) -> str:
    """How counts name a label's value: a gate label says whether retrieval was needed ("retrieve" /
    "no_retrieve"), a route label whether that route's answer was "wrong" or "right"."""
    if kind in ROUTE_KINDS:
        return "wrong" if value else "right"
    return "retrieve" if value else "no_retrieve"


def label_json(kind: str, value: bool) -> dict[str, Any]:
    """One label as a reply shows it: ``{"kind", "retrieve"}`` for a gate label, ``{"kind", "wrong"}`` for a route's."""
    return {"kind": kind, ("wrong" if kind in ROUTE_KINDS else "retrieve"): value}


def empty_counts() -> dict[str, dict[str, int]]:
    return {kind: {value_key(kind, True): 0, value_key(kind, False): 0} for kind in ALL_KINDS}


def unknown_answer(answer_id: str) -> UnknownAnswer:
    return UnknownAnswer(
        f"no answer {answer_id[:80]!r} in the feedback store: feedback names the id an answer came with "
        "(it may have been dropped as the oldest past the store's bound)"
    )


def check_label(source: str, kind: str) -> None:
    if source not in SOURCES or kind not in ALL_KINDS:
        raise RagateError(f"a label's source is one of {SOURCES} and its kind one of {ALL_KINDS}")


class FeedbackRules:
    """A feedback store's interface, and what a user's word on an answer means over any store that can ``get`` an
    answer and add labels and notes (this SQLite file, or the replicas' shared store:
    :mod:`ragate.learning.shared_store`)."""

    name: str  # what messages and a learned gate's provenance call the store

    def get(self, answer_id: str) -> StoredAnswer | None:
        raise NotImplementedError

    def add_label(
        self, answer_id: str, *, source: str, kind: LabelKind, value: bool, detail: Mapping[str, Any] | None = None
    ) -> None:
        raise NotImplementedError

    def add_label_note(self, answer_id: str, detail: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def record_answer(
        self, answer_id: str, *, question: str, method: str, prompts: str, answer: str, retrieved: bool,
        features: Mapping[str, float], hidden: np.ndarray | None, model: Mapping[str, Any],
        paths: tuple[str | None, str | None] | None = None,
    ) -> None:  # fmt: skip
        """Keep one answer; ``paths``: its closed-book and retrieval paths' answers where they are not the answer
        itself (a route method's: the closed-book route's and the one-retrieval route's, each where it ran)."""
        raise NotImplementedError

    def set_twin(self, answer_id: str, *, closed: str | None = None, opened: str | None = None) -> None:
        raise NotImplementedError

    def labelled(self, kind: LabelKind, *, prompts: str | None = None) -> LabelledRows:
        raise NotImplementedError

    def label_rows(self) -> int:
        raise NotImplementedError

    def counts(self) -> dict[str, Any]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def gate_path(self) -> Path:
        """Where a gate learned from this store is written unless told otherwise."""
        raise NotImplementedError

    def feedback(
        self, answer_id: str, *, correct: bool | None = None, reference: str | None = None
    ) -> list[tuple[LabelKind, bool]]:
        """A user's word on an answer: ``correct`` (the answer was right or wrong) and/or a ``reference`` answer.
        Every word labels the path whose answer was judged at once: ``closed-wrong`` for a closed-book answer,
        ``retrieved-wrong`` for a retrieved one; a reference also scores the other path's answer where it is known
        (a shadow twin), which gives ``closed-wrong`` for a retrieved answer. ``correct`` alone judges the answer's
        text, so it labels only a path whose answer is that text (a route method's answer from a multi-step route
        labels the one-retrieval route only where that route wrote the same). Returns the labels made; what still
        waits for the other route's answer is :func:`pending_labels`."""
        if correct is None and reference is None:
            raise RagateError("feedback needs correct (true or false) or a reference answer")
        if correct is not None and not isinstance(correct, bool):
            raise RagateError(f"correct is true or false, not {correct!r:.40}")
        if reference is not None:
            if not isinstance(reference, str) or not reference.strip():
                raise RagateError("the reference answer must be non-empty text")
            if len(reference) > MAX_REFERENCE_CHARS:
                raise RagateError(
                    f"the reference answer has {len(reference)} characters; at most {MAX_REFERENCE_CHARS}"
                )
        row = self.get(answer_id)
        if row is None:
            raise unknown_answer(answer_id)
        detail = {"correct": correct, "reference": reference}
        labels: list[tuple[LabelKind, bool]] = []
        for kind, text, own in (
            ("closed-wrong", row.closed_answer, row.closed_answer == row.answer),
            ("retrieved-wrong", row.open_answer, row.open_answer == row.answer),
        ):
            if reference is not None and text is not None:
                wrong = not answer_correct(text, reference)
            elif own and correct is not None:
                wrong = not correct
            else:
                continue
            self.add_label(answer_id, source="feedback", kind=kind, value=wrong, detail=detail)  # type: ignore[arg-type]
            labels.append((kind, wrong))  # type: ignore[arg-type]
        if reference is not None and pending_labels(row, reference):
            self.add_label_note(answer_id, detail)  # the reference, for the twin that settles the rest
        return labels


def pending_labels(row: StoredAnswer, reference: str | None) -> tuple[LabelKind, ...]:
    """The labels a reference on ``row`` leaves waiting for a path's answer not yet computed (a plain answer's other
    path; a route answer's path whose route did not run, e.g. the one-retrieval route where a policy went straight
    to a multi-step route)."""
    if reference is None:
        return ()
    missing: tuple[LabelKind, ...] = ()
    if row.closed_answer is None:
        missing += ("closed-wrong",)
    if row.open_answer is None:
        missing += ("retrieved-wrong",)
    return missing


class FeedbackStore(FeedbackRules):
    """One SQLite feedback file (see the module docstring); safe to share between threads."""

    def __init__(self, path: str | Path, *, max_answers: int = DEFAULT_MAX_ANSWERS) -> None:
        if max_answers < 1:
            raise RagateError(f"max_answers must be at least 1, not {max_answers}")
        self.path = Path(path).expanduser()
        self.name = str(self.path)
        self.max_answers = max_answers
        self._lock = threading.Lock()
        if self.path.is_dir():
            raise RagateError(
                f"the feedback store {self.path} is a directory: name a file, e.g. {self.path / 'feedback.db'}"
            )
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not self.path.exists():
                self.path.touch()  # made here, so that a folder it cannot be written in is named now
        except OSError as err:
            raise RagateError(
                f"the feedback store {self.path} cannot be written ({err.strerror or err}): name a file in a folder "
                "this process can write (ragate serve --feedback-store FILE, Pipeline(feedback_store=FILE)), or set "
                "RAGATE_HOME to one (shadow work keeps its store there when none is named)"
            ) from None
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        except sqlite3.Error as err:
            raise self._unwritable(err) from None
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.executescript(_SCHEMA)
            found = dict(self._db.execute("SELECT key, value FROM meta").fetchall())
            if not found:
                self._db.execute(
                    "INSERT INTO meta VALUES ('format', ?), ('version', ?)", (FORMAT, FORMAT_VERSION)
                )
            elif found.get("format") != FORMAT or found.get("version") != FORMAT_VERSION:
                raise RagateError(
                    f"{self.path} is not a ragate feedback store of version {FORMAT_VERSION} "
                    f"(it says {found.get('format')!r} {found.get('version')!r}): name another file"
                )
        except sqlite3.OperationalError as err:  # the file may be fine; its folder or disk is not (read-only, full)
            self._db.close()
            raise self._unwritable(err) from None
        except sqlite3.DatabaseError as err:
            self._db.close()
            raise RagateError(
                f"the feedback store {self.path} cannot be opened ({err}): it is damaged or not SQLite; move it "
                "aside and a new one is started"
            ) from None

    def _unwritable(self, err: sqlite3.Error) -> RagateError:
        return RagateError(
            f"the feedback store {self.path} cannot be opened for writing ({err}): check its folder and disk, or name "
            "a file elsewhere (ragate serve --feedback-store FILE, Pipeline(feedback_store=FILE))"
        )

    # -- writing -----------------------------------------------------------------------------------------------
    def record_answer(
        self,
        answer_id: str,
        *,
        question: str,
        method: str,
        prompts: str,
        answer: str,
        retrieved: bool,
        features: Mapping[str, float],
        hidden: np.ndarray | None,
        model: Mapping[str, Any],
        corpus: Mapping[str, Any] | None = None,
        encoder: Mapping[str, Any] | None = None,
        paths: tuple[str | None, str | None] | None = None,
    ) -> None:
        """Keep one answer and its features (the oldest answers beyond ``max_answers`` go, with their labels)."""
        from ragate.version import __version__

        blob = None if hidden is None else np.asarray(hidden, dtype=np.float32).tobytes()
        with self._write() as db:
            seq = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM answers").fetchone()[0]
            db.execute(
                "INSERT OR REPLACE INTO answers (id, seq, created, question, method, prompts, answer, retrieved, "
                "features, hidden, model, corpus, encoder, version, closed_answer, open_answer) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    answer_id, seq, time.time(), question, method, prompts, answer, int(retrieved),
                    json.dumps({k: float(v) for k, v in features.items()}), blob, json.dumps(dict(model)),
                    json.dumps(dict(corpus)) if corpus else None, json.dumps(dict(encoder)) if encoder else None,
                    __version__, *(paths if paths is not None else ((None, answer) if retrieved else (answer, None))),
                ),
            )  # fmt: skip
            over = db.execute("SELECT COUNT(*) FROM answers").fetchone()[0] - self.max_answers
            if over > 0:
                db.execute(
                    "DELETE FROM answers WHERE id IN (SELECT id FROM answers ORDER BY seq LIMIT ?)", (over,)
                )

    def set_twin(self, answer_id: str, *, closed: str | None = None, opened: str | None = None) -> None:
        """Record the other path's answer (a shadow answer) beside an answer."""
        with self._write() as db:
            if closed is not None:
                db.execute("UPDATE answers SET closed_answer = ? WHERE id = ?", (closed, answer_id))
            if opened is not None:
                db.execute("UPDATE answers SET open_answer = ? WHERE id = ?", (opened, answer_id))

    def add_label(
        self,
        answer_id: str,
        *,
        source: str,
        kind: LabelKind,
        value: bool,
        detail: Mapping[str, Any] | None = None,
    ) -> None:
        """Keep one label of an answer the store holds (an :class:`UnknownAnswer` otherwise); on disk on return."""
        check_label(source, kind)
        with self._write() as db:
            if db.execute("SELECT 1 FROM answers WHERE id = ?", (answer_id,)).fetchone() is None:
                raise unknown_answer(answer_id)
            db.execute(
                "INSERT INTO labels (answer_id, created, source, kind, value, detail) VALUES (?, ?, ?, ?, ?, ?)",
                (answer_id, time.time(), source, kind, int(bool(value)), json.dumps(dict(detail or {}))),
            )

    def add_label_note(self, answer_id: str, detail: Mapping[str, Any]) -> None:
        with self._write() as db:
            db.execute(
                "INSERT INTO labels (answer_id, created, source, kind, value, detail) VALUES (?, ?, 'feedback', 'note', 0, ?)",
                (answer_id, time.time(), json.dumps(dict(detail))),
            )

    # -- reading -----------------------------------------------------------------------------------------------
    def get(self, answer_id: str) -> StoredAnswer | None:
        with self._lock:
            row = self._db.execute(
                "SELECT id, question, method, prompts, answer, retrieved, features, hidden, model, closed_answer, "
                "open_answer FROM answers WHERE id = ?",
                (answer_id,),
            ).fetchone()
        if row is None:
            return None
        return StoredAnswer(
            row[0], row[1], row[2], row[3], row[4], bool(row[5]), json.loads(row[6]),
            None if row[7] is None else np.frombuffer(row[7], dtype=np.float32).copy(),
            json.loads(row[8]), row[9], row[10],
        )  # fmt: skip

    def labelled(self, kind: LabelKind, *, prompts: str | None = None) -> LabelledRows:
        """Every answer with a label of ``kind`` (its latest one), oldest first; only those of prompt set
        ``prompts`` when given (hidden states of different prompts are not comparable)."""
        if kind not in ALL_KINDS:
            raise RagateError(f"unknown label kind {kind!r}: one of {', '.join(ALL_KINDS)}")
        query = (
            "SELECT a.id, a.question, a.features, a.hidden, l.value, l.source, a.model FROM answers a JOIN labels l "
            "ON l.answer_id = a.id WHERE l.kind = ? AND l.id = (SELECT MAX(id) FROM labels WHERE answer_id = a.id "
            "AND kind = ?)" + (" AND a.prompts = ?" if prompts else "") + " ORDER BY a.seq"
        )
        params: Sequence[Any] = (kind, kind, prompts) if prompts else (kind, kind)
        with self._lock:
            rows = self._db.execute(query, params).fetchall()
        return LabelledRows(
            tuple(r[0] for r in rows),
            tuple(r[1] for r in rows),
            tuple(json.loads(r[2]) for r in rows),
            tuple(None if r[3] is None else np.frombuffer(r[3], dtype=np.float32).copy() for r in rows),
            np.array([bool(r[4]) for r in rows], dtype=bool),
            tuple(r[5] for r in rows),
            tuple(str((json.loads(r[6]) or {}).get("model")) for r in rows),
        )

    def label_rows(self) -> int:
        """Every gate label kept (an answer labelled twice counts twice): what a periodic refit counts."""
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM labels WHERE kind != 'note'").fetchone()[0])

    def counts(self) -> dict[str, Any]:
        """Answers kept, and labels by kind and value (what /healthz and `ragate gate learn` show)."""
        with self._lock:
            answers = self._db.execute("SELECT COUNT(*) FROM answers").fetchone()[0]
            rows = self._db.execute(
                "SELECT kind, value, COUNT(DISTINCT answer_id) FROM labels WHERE kind != 'note' GROUP BY kind, value"
            ).fetchall()
        out: dict[str, Any] = {"answers": answers, **empty_counts()}
        for kind, value, n in rows:
            if kind in ALL_KINDS:
                out[kind][value_key(kind, bool(value))] = n
        return out

    def gate_path(self) -> Path:
        return self.path.with_name(self.path.stem + "-gate.json")

    # -- plumbing ----------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (committed on return, so on disk with full sync; rolled back on an error, a
        failed commit included, so that the next write starts afresh once the disk has room again)."""
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                    self._db.execute("COMMIT")
                except BaseException:
                    if self._db.in_transaction:
                        with contextlib.suppress(sqlite3.Error):
                            self._db.execute("ROLLBACK")
                    raise
            except sqlite3.DatabaseError as err:
                raise StoreWriteError(
                    f"the feedback store {self.path} could not be written ({err}): check the disk, or move the "
                    "file aside to start a new one"
                ) from None

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

