"""The feedback store that service replicas share, in Valkey or Redis: ``ragate serve --feedback-store
redis://HOST:PORT/DB``, ``Pipeline(feedback_store="redis://...")``, ``ragate gate learn --store redis://...``.

The same answers, features and labels as the SQLite store (:mod:`ragate.feedback`), so that a label posted to one
replica (``POST /v1/feedback``, a shadow answer) is seen by every replica's refit and by ``ragate gate learn``.
Keys, under ``ragate:feedback:``: ``seq`` (a counter), ``answers`` (a sorted set of answer ids by their sequence
number: the bound drops the lowest), ``answer:<id>`` (a hash of the answer's fields; the hidden state base64 of its
float32 bytes), ``labels:<id>`` (a list of JSON labels, oldest first), ``labelled`` (the ids with a label) and
``label_rows`` (the gate labels kept). A label is in the store when its call returns (the server's own persistence
settings decide what survives a restart of the store). A value that does not parse is an error naming the key.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

import numpy as np

from ragate.errors import RagateError
from ragate.feedback import (
    DEFAULT_MAX_ANSWERS,
    LABEL_KINDS,
    FeedbackRules,
    FeedbackStore,
    LabelKind,
    LabelledRows,
    StoredAnswer,
    check_label,
    unknown_answer,
)
from ragate.shared import StoreUnavailable, connect, parse_state_url

PREFIX = "ragate:feedback:"


class SharedFeedbackStore(FeedbackRules):
    """The feedback store in Valkey/Redis (see the module docstring); safe to share between threads."""

    def __init__(self, url: str, *, max_answers: int = DEFAULT_MAX_ANSWERS) -> None:
        if max_answers < 1:
            raise RagateError(f"max_answers must be at least 1, not {max_answers}")
        import valkey

        self.url = parse_state_url(url)
        self.name = self.url.shown
        self.max_answers = max_answers
        self._errors = (valkey.exceptions.ValkeyError, OSError)
        self._db = connect(self.url)

    def _key(self, *parts: str) -> str:
        return PREFIX + ":".join(parts)

    def _do(self, build: Any) -> list[Any]:
        try:
            pipe = self._db.pipeline(transaction=True)
            build(pipe)
            return list(pipe.execute())
        except self._errors as err:
            raise StoreUnavailable(
                f"the feedback store {self.name} could not be used ({type(err).__name__}: {err})"
            ) from None

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
    ) -> None:
        """Keep one answer and its features (the oldest answers beyond ``max_answers`` go, with their labels)."""
        from ragate.version import __version__

        fields = {
            "created": repr(time.time()), "question": question, "method": method, "prompts": prompts,
            "answer": answer, "retrieved": "1" if retrieved else "0",
            "features": json.dumps({k: float(v) for k, v in features.items()}),
            "hidden": "" if hidden is None else base64.b64encode(np.asarray(hidden, dtype=np.float32).tobytes()).decode(),
            "model": json.dumps(dict(model)), "corpus": json.dumps(dict(corpus)) if corpus else "",
            "encoder": json.dumps(dict(encoder)) if encoder else "", "version": __version__,
            "closed_answer": "" if retrieved else answer, "open_answer": answer if retrieved else "",
            "has_closed": "0" if retrieved else "1", "has_open": "1" if retrieved else "0",
        }  # fmt: skip
        seq = self._do(lambda p: p.incr(self._key("seq")))[0]

        def build(p: Any) -> None:
            p.delete(self._key("answer", answer_id))
            p.hset(self._key("answer", answer_id), mapping=fields)
            p.zadd(self._key("answers"), {answer_id: seq})
            p.zcard(self._key("answers"))

        over = int(self._do(build)[-1]) - self.max_answers
        if over > 0:
            self._drop(over)

    def _drop(self, n: int) -> None:
        """The ``n`` oldest answers go, with their labels."""
        oldest = self._do(lambda p: p.zpopmin(self._key("answers"), n))[0]
        for answer_id, _ in oldest:
            labels = self._do(lambda p, a=answer_id: p.lrange(self._key("labels", a), 0, -1))[0]
            gate = sum(1 for raw in labels if _label(raw, answer_id).get("kind") != "note")

            def build(p: Any, a: str = answer_id, gate: int = gate) -> None:
                p.delete(self._key("answer", a), self._key("labels", a))
                p.srem(self._key("labelled"), a)
                p.decrby(self._key("label_rows"), gate)

            self._do(build)

    def set_twin(self, answer_id: str, *, closed: str | None = None, opened: str | None = None) -> None:
        """Record the other path's answer (a shadow answer) beside an answer."""
        if not self._do(lambda p: p.exists(self._key("answer", answer_id)))[0]:
            return
        fields: dict[str, str] = {}
        if closed is not None:
            fields |= {"closed_answer": closed, "has_closed": "1"}
        if opened is not None:
            fields |= {"open_answer": opened, "has_open": "1"}
        if fields:
            self._do(lambda p: p.hset(self._key("answer", answer_id), mapping=fields))

    def add_label(
        self,
        answer_id: str,
        *,
        source: str,
        kind: LabelKind,
        value: bool,
        detail: Mapping[str, Any] | None = None,
    ) -> None:
        """Keep one label of an answer the store holds (an :class:`UnknownAnswer` otherwise)."""
        check_label(source, kind)
        self._append(answer_id, {"source": source, "kind": kind, "value": bool(value), "detail": dict(detail or {})})

    def add_label_note(self, answer_id: str, detail: Mapping[str, Any]) -> None:
        self._append(answer_id, {"source": "feedback", "kind": "note", "value": False, "detail": dict(detail)})

    def _append(self, answer_id: str, label: dict[str, Any]) -> None:
        if not self._do(lambda p: p.exists(self._key("answer", answer_id)))[0]:
            raise unknown_answer(answer_id)
        entry = json.dumps({"created": time.time(), **label})

        def build(p: Any) -> None:
            p.rpush(self._key("labels", answer_id), entry)
            if label["kind"] != "note":
                p.sadd(self._key("labelled"), answer_id)
                p.incr(self._key("label_rows"))

        self._do(build)

    # -- reading -----------------------------------------------------------------------------------------------
    def get(self, answer_id: str) -> StoredAnswer | None:
        row = self._do(lambda p: p.hgetall(self._key("answer", answer_id)))[0]
        return _answer(answer_id, row, self._key("answer", answer_id)) if row else None

    def labelled(self, kind: LabelKind, *, prompts: str | None = None) -> LabelledRows:
        """Every answer with a label of ``kind`` (its latest one), oldest first; only those of prompt set
        ``prompts`` when given."""
        if kind not in LABEL_KINDS:
            raise RagateError(f"unknown label kind {kind!r}: one of {', '.join(LABEL_KINDS)}")
        ids = self._do(lambda p: p.zrange(self._key("answers"), 0, -1))[0]
        marked = set(self._do(lambda p: p.smembers(self._key("labelled")))[0])
        ids = [a for a in ids if a in marked]

        def build(p: Any) -> None:
            for a in ids:
                p.hgetall(self._key("answer", a))
                p.lrange(self._key("labels", a), 0, -1)

        got = self._do(build) if ids else []
        rows = []
        for i, a in enumerate(ids):
            fields, labels = got[2 * i], got[2 * i + 1]
            mine = [lab for lab in (_label(raw, a) for raw in labels) if lab.get("kind") == kind]
            if not fields or not mine or (prompts and fields.get("prompts") != prompts):
                continue
            rows.append((_answer(a, fields, self._key("answer", a)), mine[-1]))
        return LabelledRows(
            tuple(r.id for r, _ in rows),
            tuple(r.question for r, _ in rows),
            tuple(r.features for r, _ in rows),
            tuple(r.hidden for r, _ in rows),
            np.array([bool(lab["value"]) for _, lab in rows], dtype=bool),
            tuple(str(lab.get("source")) for _, lab in rows),
            tuple(str((r.model or {}).get("model")) for r, _ in rows),
        )

    def label_rows(self) -> int:
        """Every gate label kept (an answer labelled twice counts twice): what a periodic refit counts."""
        return int(self._do(lambda p: p.get(self._key("label_rows")))[0] or 0)

    def counts(self) -> dict[str, Any]:
        """Answers kept, and labels by kind and value (answers counted once per kind and value)."""
        answers = int(self._do(lambda p: p.zcard(self._key("answers")))[0])
        ids = sorted(self._do(lambda p: p.smembers(self._key("labelled")))[0])

        def build(p: Any) -> None:
            for a in ids:
                p.lrange(self._key("labels", a), 0, -1)

        out: dict[str, Any] = {"answers": answers}
        for kind in LABEL_KINDS:
            out[kind] = {"retrieve": 0, "no_retrieve": 0}
        for a, labels in zip(ids, self._do(build) if ids else [], strict=True):
            seen = {(lab["kind"], bool(lab["value"])) for lab in (_label(raw, a) for raw in labels)
                    if lab.get("kind") in LABEL_KINDS}  # fmt: skip
            for kind, value in seen:
                out[kind]["retrieve" if value else "no_retrieve"] += 1
        return out

    def gate_path(self) -> Path:
        from ragate.models import ragate_home

        return ragate_home() / "service" / "shared-feedback-gate.json"

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _label(raw: str, answer_id: str) -> dict[str, Any]:
    try:
        label = json.loads(raw)
    except ValueError:
        label = None
    if not isinstance(label, dict) or "kind" not in label:
        raise RagateError(f"the shared feedback store holds a damaged label of answer {answer_id[:80]!r}: {raw[:80]!r}")
    return label


def _answer(answer_id: str, row: Mapping[str, str], key: str) -> StoredAnswer:
    try:
        hidden = np.frombuffer(base64.b64decode(row["hidden"]), dtype=np.float32).copy() if row.get("hidden") else None
        return StoredAnswer(
            answer_id, row["question"], row["method"], row["prompts"], row["answer"], row["retrieved"] == "1",
            {k: float(v) for k, v in json.loads(row["features"]).items()}, hidden, json.loads(row["model"]),
            row["closed_answer"] if row.get("has_closed") == "1" else None,
            row["open_answer"] if row.get("has_open") == "1" else None,
        )  # fmt: skip
    except (KeyError, ValueError, TypeError, AttributeError) as err:
        raise RagateError(f"the shared feedback store's {key} is damaged ({type(err).__name__}: {err})") from None


def open_feedback_store(where: str | Path, *, max_answers: int = DEFAULT_MAX_ANSWERS) -> FeedbackRules:
    """The store ``where`` names: a ``redis://`` / ``valkey://`` URL (the replicas' shared store) or a SQLite
    file (:class:`ragate.feedback.FeedbackStore`)."""
    text = str(where)
    if "://" in text and text.split("://", 1)[0] in ("redis", "rediss", "valkey", "valkeys"):
        return SharedFeedbackStore(text, max_answers=max_answers)
    return FeedbackStore(where, max_answers=max_answers)
