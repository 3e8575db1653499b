"""The feedback store that service replicas share, in Valkey or Redis: ``ragate serve --feedback-store
redis://HOST:PORT/DB``, ``Pipeline(feedback_store="redis://...")``, ``ragate gate learn --store redis://...``.

The same answers, features and labels as the SQLite store (:mod:`ragate.learning.store`), so that a label posted to one
replica (``POST /v1/feedback``, a shadow answer) is seen by every replica's refit and by ``ragate gate learn``.
Keys, under ``ragate:feedback:``: ``seq`` (a counter), ``answers`` (a sorted set of answer ids by their sequence
number: the bound drops the lowest), ``answer:<id>`` (a hash of the answer's fields; the hidden state base64 of its
float32 bytes), ``labels:<id>`` (a list of JSON labels, oldest first), ``labelled`` (the ids with a label) and
``label_rows`` (the gate labels kept). Adding a label to an answer, a twin to an answer, and dropping the oldest
answers with their labels each run as one server-side script, so another replica never sees half of one. A label is
in the store when its call returns (the server's own persistence settings decide what survives a restart of the
store). A value that does not parse is an error naming the key; a store that fails is not tried again for a second
(:class:`ragate.state.shared.Link`).
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

import numpy as np

from ragate.errors import ArgumentTypeError, RagateError
from ragate.learning.store import (
    ALL_KINDS,
    DEFAULT_MAX_ANSWERS,
    FeedbackRules,
    FeedbackStore,
    LabelKind,
    LabelledRows,
    StoredAnswer,
    check_label,
    empty_counts,
    unknown_answer,
    value_key,
)
from ragate.state.shared import SCHEMES, Link, StoreUnavailable, connect, parse_state_url

PREFIX = "ragate:feedback:"
CHUNK = 500  # answers read per round trip by labelled() and counts()
BULK_TIMEOUT_SECONDS = 30.0  # those reads' socket timeout (a store of 50,000 answers with hidden states)

# KEYS: the answer's hash, its label list, the labelled set, the label count; ARGV: the label (JSON), "1" for a gate
# label ("0": a note), the answer's id. 0 where the store does not hold the answer.
_APPEND = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[1])
if ARGV[2] == '1' then
  redis.call('SADD', KEYS[3], ARGV[3])
  redis.call('INCR', KEYS[4])
end
return 1
"""
# KEYS: the answer's hash; ARGV: field, value, ... (nothing where the answer is gone)
_TWIN = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
"""
# KEYS: the answers' sorted set, the labelled set, the label count; ARGV: how many go, the key prefix. Each answer
# goes with its hash and labels, and the count loses its gate labels (a label that does not parse counts as one).
_DROP = """
local gone = redis.call('ZPOPMIN', KEYS[1], ARGV[1])
for i = 1, #gone, 2 do
  local id = gone[i]
  local gate = 0
  for _, raw in ipairs(redis.call('LRANGE', ARGV[2] .. 'labels:' .. id, 0, -1)) do
    local ok, label = pcall(cjson.decode, raw)
    if not ok or type(label) ~= 'table' or label['kind'] ~= 'note' then gate = gate + 1 end
  end
  redis.call('DEL', ARGV[2] .. 'answer:' .. id, ARGV[2] .. 'labels:' .. id)
  redis.call('SREM', KEYS[2], id)
  redis.call('DECRBY', KEYS[3], gate)
end
return #gone / 2
"""


class SharedFeedbackStore(FeedbackRules):
    """The feedback store in Valkey/Redis (see the module docstring); safe to share between threads."""

    def __init__(self, url: str, *, max_answers: int = DEFAULT_MAX_ANSWERS) -> None:
        if max_answers < 1:
            raise RagateError(f"max_answers must be at least 1, not {max_answers}")
        self.url = parse_state_url(url)
        self.name = self.url.shown
        self.max_answers = max_answers
        self._db = connect(self.url)
        self._bulk: Any = None  # a second connection with a longer timeout, for reading every labelled answer
        self._link = Link(self.name, meanwhile="answers go on without their features and labels until it is back")
        self._append_script = self._db.register_script(_APPEND)
        self._twin_script = self._db.register_script(_TWIN)
        self._drop_script = self._db.register_script(_DROP)

    def _key(self, *parts: str) -> str:
        return PREFIX + ":".join(parts)

    def _do(self, build: Any, *, transaction: bool = True, bulk: bool = False) -> list[Any]:
        """Run ``build(pipe)``'s commands; a store that failed is not tried again for a second (the answer that
        records its features does not wait on a dead store each time)."""
        if not self._link.due():
            raise StoreUnavailable(f"the feedback store {self._link.error}")
        try:
            if bulk and self._bulk is None:
                self._bulk = connect(self.url, timeout=BULK_TIMEOUT_SECONDS)
            pipe = (self._bulk if bulk else self._db).pipeline(transaction=transaction)
            build(pipe)
            out = list(pipe.execute())
        except Exception as err:  # noqa: BLE001 (a side channel: named, never a stray exception)
            failure = StoreUnavailable(f"{type(err).__name__}: {err}")
            self._link.failed(failure)
            raise StoreUnavailable(f"the feedback store {self.name} could not be used ({failure})") from None
        self._link.ok()
        return out

    def _script(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        return self._do(lambda p: script(keys=keys, args=args, client=p))[0]

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
        """Keep one answer and its features (the oldest answers beyond ``max_answers`` go, with their labels);
        ``paths``: its closed-book and retrieval paths' answers where they are not the answer itself (a route's)."""
        from ragate.version import __version__

        closed, opened = paths if paths is not None else ((None, answer) if retrieved else (answer, None))
        fields = {
            "created": repr(time.time()), "question": question, "method": method, "prompts": prompts,
            "answer": answer, "retrieved": "1" if retrieved else "0",
            "features": json.dumps({k: float(v) for k, v in features.items()}),
            "hidden": "" if hidden is None else base64.b64encode(np.asarray(hidden, dtype=np.float32).tobytes()).decode(),
            "model": json.dumps(dict(model)), "corpus": json.dumps(dict(corpus)) if corpus else "",
            "encoder": json.dumps(dict(encoder)) if encoder else "", "version": __version__,
            "closed_answer": closed or "", "open_answer": opened or "",
            "has_closed": "0" if closed is None else "1", "has_open": "0" if opened is None else "1",
        }  # fmt: skip
        seq = self._do(lambda p: p.incr(self._key("seq")))[0]

        def build(p: Any) -> None:
            p.delete(self._key("answer", answer_id))
            p.hset(self._key("answer", answer_id), mapping=fields)
            p.zadd(self._key("answers"), {answer_id: seq})
            p.zcard(self._key("answers"))

        over = int(self._do(build)[-1]) - self.max_answers
        if over > 0:  # the oldest go with their labels, in one script (nothing left behind half-deleted)
            self._script(self._drop_script, [self._key("answers"), self._key("labelled"), self._key("label_rows")],
                         [over, PREFIX])  # fmt: skip

    def set_twin(self, answer_id: str, *, closed: str | None = None, opened: str | None = None) -> None:
        """Record the other path's answer (a shadow answer) beside an answer it still holds."""
        fields: list[str] = []
        if closed is not None:
            fields += ["closed_answer", closed, "has_closed", "1"]
        if opened is not None:
            fields += ["open_answer", opened, "has_open", "1"]
        if fields:
            self._script(self._twin_script, [self._key("answer", answer_id)], fields)

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
        """Add a label to an answer the store holds, in one script (the answer cannot go in between)."""
        entry = json.dumps({"created": time.time(), **label})
        keys = [self._key("answer", answer_id), self._key("labels", answer_id), self._key("labelled"),
                self._key("label_rows")]  # fmt: skip
        if not self._script(self._append_script, keys, [entry, "0" if label["kind"] == "note" else "1", answer_id]):
            raise unknown_answer(answer_id)

    # -- reading -----------------------------------------------------------------------------------------------
    def get(self, answer_id: str) -> StoredAnswer | None:
        row = self._do(lambda p: p.hgetall(self._key("answer", answer_id)))[0]
        return _answer(answer_id, row, self._key("answer", answer_id)) if row else None

    def labelled(self, kind: LabelKind, *, prompts: str | None = None) -> LabelledRows:
        """Every answer with a label of ``kind`` (its latest one), oldest first; only those of prompt set
        ``prompts`` when given."""
        if kind not in ALL_KINDS:
            raise RagateError(f"unknown label kind {kind!r}: one of {', '.join(ALL_KINDS)}")
        ids = self._do(lambda p: p.zrange(self._key("answers"), 0, -1))[0]
        marked = set(self._do(lambda p: p.smembers(self._key("labelled")))[0])
        ids = [a for a in ids if a in marked]

        got: list[Any] = []
        for start in range(0, len(ids), CHUNK):  # in chunks, outside a transaction: other replicas go on meanwhile

            def build(p: Any, chunk: list[str] = ids[start : start + CHUNK]) -> None:
                for a in chunk:
                    p.hgetall(self._key("answer", a))
                    p.lrange(self._key("labels", a), 0, -1)

            got += self._do(build, transaction=False, bulk=True)
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

        lists: list[Any] = []
        for start in range(0, len(ids), CHUNK):

            def build(p: Any, chunk: list[str] = ids[start : start + CHUNK]) -> None:
                for a in chunk:
                    p.lrange(self._key("labels", a), 0, -1)

            lists += self._do(build, transaction=False, bulk=True)
        out: dict[str, Any] = {"answers": answers, **empty_counts()}
        for a, labels in zip(ids, lists, strict=True):
            seen = {(lab["kind"], bool(lab["value"])) for lab in (_label(raw, a) for raw in labels)
                    if lab.get("kind") in ALL_KINDS}  # fmt: skip
            for kind, value in seen:
                out[kind][value_key(kind, value)] += 1
        return out

    def gate_path(self) -> Path:
        from ragate.models import ragate_home

        return ragate_home() / "service" / "shared-feedback-gate.json"

    def close(self) -> None:
        self._db.close()
        if self._bulk is not None:
            self._bulk.close()

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


STORE_FORMS = (
    "a SQLite file's path (str or pathlib.Path), a redis://HOST:PORT/DB URL (rediss://, valkey://, valkeys:// too), "
    "or a store object (ragate.learning.store.FeedbackStore, ragate.learning.shared_store.SharedFeedbackStore)"
)


def is_shared_store(where: str | Path) -> bool:
    """Whether ``where`` names the replicas' shared store (a URL of a scheme in :data:`ragate.state.shared.SCHEMES`) rather
    than a SQLite file; a URL of another scheme (``http://``, a typo) is refused naming those ragate takes, where it
    would otherwise become a file at ``./http:/...``."""
    if not isinstance(where, str | Path):
        raise ArgumentTypeError(f"feedback_store must be {STORE_FORMS}, not {type(where).__name__}")
    found = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", where) if isinstance(where, str) else None
    if found is None or not isinstance(where, str):  # a pathlib.Path is a file's
        return False
    if found.group(1).lower() in SCHEMES:
        return True
    shown = re.sub(r"//[^/@]*@", "//", where)[:120]  # without a password
    raise RagateError(
        f"the feedback store {shown!r}: ragate keeps no feedback at {found.group(1)}:// URLs; give a "
        f"{', '.join(s + '://' for s in SCHEMES[:-1])} or {SCHEMES[-1]}:// URL (e.g. redis://127.0.0.1:6379/0) or a "
        "SQLite file's path "
        "(e.g. feedback.db)"
    )


def open_feedback_store(where: str | Path, *, max_answers: int = DEFAULT_MAX_ANSWERS) -> FeedbackRules:
    """The store ``where`` names: a ``redis://`` / ``valkey://`` URL (the replicas' shared store) or a SQLite
    file (:class:`ragate.learning.store.FeedbackStore`); a URL of another scheme is refused (:func:`is_shared_store`)."""
    if is_shared_store(where):
        return SharedFeedbackStore(str(where), max_answers=max_answers)
    return FeedbackStore(where, max_answers=max_answers)
