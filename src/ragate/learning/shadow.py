"""Shadow answers: on a sample of requests, the path the gate did not take, run after the response is sent, so
that the pair of answers labels the question (:mod:`ragate.learning.store`).

A request the gate answered closed-book gets a retrieval answer (the method's own selector and reader, as if the
gate had said "retrieve"); one that retrieved gets the closed-book answer. The pair gives the silver label
``retrieval-changed`` (the answers disagree: :func:`ragate.learning.store.answers_agree`), and with a reference answer the
closed-book one is scored too (``closed-wrong``).

The work is kept off a request's critical path. Jobs wait in a bounded queue, those that settle a pending label
first: a job carrying a user's reference (feedback on a retrieved answer waits for its closed-book twin), then one
whose gate score was near its threshold (the uncertain band, where a label teaches the gate most), then the rest,
oldest first in each; a full queue drops its least useful job and counts it. One background thread takes them.
On a local llama.cpp model the job runs on a context of its own over the same weights and takes the model one
step at a time under :class:`ragate.backends.turns.ModelTurns`: a request waits for it at most one step, and while
requests keep coming it still gets its share of the model's time. On other engines it waits until no request wants
the model (``busy``) and gives the model up at the next stage boundary (a draft, an answer, a search) when one
arrives (the job starts again later). Sampling is seeded: the same requests in the same order are sampled the same
way.
"""

from __future__ import annotations

import heapq
import itertools
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ragate.backends.turns import GivenUp
from ragate.errors import RagateError

FEEDBACK, UNCERTAIN, SAMPLED = 0, 1, 2  # job priorities, most urgent first
PRIORITY_NAMES = {FEEDBACK: "feedback", UNCERTAIN: "uncertain", SAMPLED: "sampled"}
RATE_WINDOW = 3600.0  # seconds over which labels per hour are counted


class Preempted(Exception):
    """A request arrived while a shadow job held the model (engines without turns): the job gives it up at a stage
    boundary and is tried again once the model is idle (its answer is the same: each call is computed from a
    cleared cache)."""


@dataclass(frozen=True)
class ShadowJob:
    answer_id: str
    question: str
    retrieved: bool
    answer: str
    method: str | None
    reference: str | None = None
    priority: int = SAMPLED


@dataclass
class ShadowStats:
    sampled: int = 0
    done: int = 0
    dropped: int = 0
    failed: int = 0
    preempted: int = 0
    last_error: str | None = None
    labels: dict[str, int] = field(default_factory=dict)


class Shadow:
    """The background worker (see the module docstring). ``run_other(job)`` returns the other path's answer text;
    ``label(job, other)`` records what the pair says; ``busy()`` says whether a request is being answered (engines
    without turns at the model)."""

    def __init__(
        self,
        rate: float,
        run_other: Callable[[ShadowJob], str],
        label: Callable[[ShadowJob, str], dict[str, bool]],
        *,
        busy: Callable[[], bool] = lambda: False,
        queue_size: int = 64,
        seed: int = 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not 0.0 <= rate <= 1.0:
            raise RagateError(f"shadow must be a share of requests in [0, 1], not {rate}")
        if queue_size < 1:
            raise RagateError(f"the shadow queue holds at least 1 job, not {queue_size}")
        self.rate = rate
        self._run_other, self._label, self._busy, self._clock = run_other, label, busy, clock
        self._size = queue_size
        self._heap: list[tuple[int, int, float, ShadowJob]] = []
        self._order = itertools.count()
        self._cv = threading.Condition()
        self._running: ShadowJob | None = None
        self._rng = random.Random(seed)
        self.stats = ShadowStats()
        self._done_at: deque[float] = deque()
        self._idle = threading.Event()
        self._idle.set()
        self.stop_event = threading.Event()
        self._thread = threading.Thread(target=self._work, name="ragate-shadow", daemon=True)
        self._thread.start()

    # -- queueing -------------------------------------------------------------------------------------------------
    def offer(self, job: ShadowJob, *, uncertain: bool = False) -> bool:
        """Sample ``job`` at the shadow rate (``uncertain``: its gate score was near the threshold, so it goes ahead
        of other sampled jobs); True when it was queued."""
        with self._cv:
            take = self.rate > 0 and self._rng.random() < self.rate
            if not take:
                return False
            self.stats.sampled += 1
            return self._push(replace(job, priority=UNCERTAIN if uncertain else SAMPLED))

    def settle(self, job: ShadowJob) -> bool:
        """Queue ``job``, which carries a user's reference, ahead of every sampled job (its label waits on it): the
        queued or running job of the same answer takes the reference instead. True when the reference will be
        used."""
        with self._cv:
            if self.stop_event.is_set():
                return False
            if self._running is not None and self._running.answer_id == job.answer_id:
                self._running = replace(self._running, reference=job.reference, priority=FEEDBACK)
                return True
            for i, (_, order, at, queued) in enumerate(self._heap):
                if queued.answer_id == job.answer_id:
                    self._heap[i] = (FEEDBACK, order, at, replace(queued, reference=job.reference, priority=FEEDBACK))
                    heapq.heapify(self._heap)
                    return True
            return self._push(replace(job, priority=FEEDBACK))

    def _push(self, job: ShadowJob) -> bool:
        """Under ``_cv``: queue ``job``; a full queue drops the least useful job (maybe this one)."""
        entry = (job.priority, next(self._order), self._clock(), job)
        if len(self._heap) >= self._size:
            worst = max(self._heap, key=lambda e: (e[0], e[1]))
            self.stats.dropped += 1
            if (worst[0], worst[1]) < (entry[0], entry[1]):
                return False
            self._heap.remove(worst)
            heapq.heapify(self._heap)
        heapq.heappush(self._heap, entry)
        self._idle.clear()
        self._cv.notify_all()
        return True

    def _take(self) -> ShadowJob | None:
        with self._cv:
            while not self._heap and not self.stop_event.is_set():
                self._idle.set()
                self._cv.wait(0.2)
            if self.stop_event.is_set():
                return None
            self._running = heapq.heappop(self._heap)[3]
            return self._running

    # -- the worker -----------------------------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            job = self._take()
            if job is None:
                break
            try:
                other = self._run_preemptible(job)
                if other is None:
                    break  # stopping
                with self._cv:  # feedback may have attached a reference while it ran
                    job = self._running or job
                for kind, value in self._label(job, other).items():
                    key = f"{kind}={'retrieve' if value else 'no-retrieve'}"
                    self.stats.labels[key] = self.stats.labels.get(key, 0) + 1
                self.stats.done += 1
                self._done_at.append(self._clock())
            except GivenUp:
                break  # the pipeline closes: the job is dropped
            except Exception as err:  # noqa: BLE001 (a shadow failure never reaches a request
                self.stats.failed += 1
                self.stats.last_error = f"{type(err).__name__}: {err}"[:300]
            finally:
                with self._cv:
                    self._running = None
                    if not self._heap:
                        self._idle.set()
        with self._cv:
            self._running = None
            self._idle.set()

    def _run_preemptible(self, job: ShadowJob) -> str | None:
        """The other path's answer, run while no request wants the model (``busy``); started again after a
        preemption."""
        while not self.stop_event.is_set():
            while self._busy() and not self.stop_event.is_set():  # requests first
                self.stop_event.wait(0.01)
            try:
                return self._run_other(job)
            except Preempted:
                self.stats.preempted += 1
        return None

    # -- looking on -----------------------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        """Whether the worker thread still runs (after :meth:`close`: still inside a model step)."""
        return self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the queued shadow work is done (tests, a clean shutdown); False if ``timeout`` passed first."""
        return self._idle.wait(timeout)

    def labels_per_hour(self) -> float:
        """Jobs finished (each gives its labels) over the last hour, or since the worker started if sooner."""
        now = self._clock()
        while self._done_at and self._done_at[0] < now - RATE_WINDOW:
            self._done_at.popleft()
        return float(len(self._done_at))

    def describe(self) -> dict[str, Any]:
        s = self.stats
        with self._cv:
            now = self._clock()
            oldest = min((e[2] for e in self._heap), default=None)
            by_kind = {name: 0 for name in PRIORITY_NAMES.values()}
            for e in self._heap:
                by_kind[PRIORITY_NAMES[e[0]]] += 1
            queued = len(self._heap)
        return {
            "rate": self.rate, "sampled": s.sampled, "done": s.done, "queued": queued, "queued_by_kind": by_kind,
            "queue_age_seconds": round(now - oldest, 1) if oldest is not None else 0.0,
            "labels_last_hour": self.labels_per_hour(),
            "dropped": s.dropped, "failed": s.failed, "preempted": s.preempted, "last_error": s.last_error,
            "labels": dict(s.labels),
        }  # fmt: skip

    def close(self, wait: float | None = 0.0) -> None:
        """Stop the worker; queued work is dropped and a running job stops at its next model step (``wait``: seconds
        to wait for the thread to end)."""
        with self._cv:
            self.stop_event.set()
            dropped = len(self._heap)
            self._heap.clear()
            self.stats.dropped += dropped
            self._cv.notify_all()
        self._thread.join(wait)
