"""Shadow answers: on a sample of requests, the path the gate did not take, run after the response is sent, so
that the pair of answers labels the question (:mod:`ragate.feedback`).

A request the gate answered closed-book gets a retrieval answer (the method's own selector and reader, as if the
gate had said "retrieve"); one that retrieved gets the closed-book answer. The pair gives the silver label
``retrieval-changed`` (the answers disagree: :func:`ragate.feedback.answers_agree`), and with a reference answer the
closed-book one is scored too (``closed-wrong``). The work is kept off a request's critical path: requests go into
a bounded queue (a full queue drops the sample and counts it), and one background thread takes them, waiting
until no request wants the model (``busy``) before each, and giving the model up at the next stage boundary
(a draft, an answer, a search) when a request arrives while it runs (the job starts again later), so shadow work
fills the model's idle time and a request waits at most for one stage of it. Sampling is
seeded: the same requests in the same order are sampled the same way.
"""

from __future__ import annotations

import queue
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ragate.errors import RagateError


class Preempted(Exception):
    """A request arrived while a shadow job held the model: the job gives it up at a stage boundary and is tried
    again once the model is idle (its answer is the same: each call is computed from a cleared cache)."""


@dataclass(frozen=True)
class ShadowJob:
    answer_id: str
    question: str
    retrieved: bool
    answer: str
    method: str | None
    reference: str | None = None


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
    ``label(job, other)`` records what the pair says; ``busy()`` says whether a request is being answered."""

    def __init__(
        self,
        rate: float,
        run_other: Callable[[ShadowJob], str],
        label: Callable[[ShadowJob, str], dict[str, bool]],
        *,
        busy: Callable[[], bool] = lambda: False,
        queue_size: int = 64,
        seed: int = 0,
    ) -> None:
        if not 0.0 <= rate <= 1.0:
            raise RagateError(f"shadow must be a share of requests in [0, 1], not {rate}")
        self.rate = rate
        self._run_other, self._label, self._busy = run_other, label, busy
        self._queue: queue.Queue[ShadowJob | None] = queue.Queue(maxsize=queue_size)
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self.stats = ShadowStats()
        self._idle = threading.Event()
        self._idle.set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, name="ragate-shadow", daemon=True)
        self._thread.start()

    def offer(self, job: ShadowJob) -> bool:
        """Sample ``job`` at the shadow rate; True when it was queued."""
        with self._rng_lock:
            take = self.rate > 0 and self._rng.random() < self.rate
        if not take:
            return False
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            self.stats.dropped += 1
            return False
        self.stats.sampled += 1
        self._idle.clear()
        return True

    def _work(self) -> None:
        while not self._stop.is_set():
            try:
                job = self._queue.get(timeout=0.2)
            except queue.Empty:
                self._idle.set()
                continue
            if job is None:
                break
            try:
                other = self._run_preemptible(job)
                if other is None:
                    break  # stopping
                for kind, value in self._label(job, other).items():
                    key = f"{kind}={'retrieve' if value else 'no-retrieve'}"
                    self.stats.labels[key] = self.stats.labels.get(key, 0) + 1
                self.stats.done += 1
            except Exception as err:  # noqa: BLE001 (a shadow failure never reaches a request
                self.stats.failed += 1
                self.stats.last_error = f"{type(err).__name__}: {err}"[:300]
            finally:
                self._queue.task_done()
                if self._queue.empty():
                    self._idle.set()

    def _run_preemptible(self, job: ShadowJob) -> str | None:
        """The other path's answer, run while no request wants the model; started again after a preemption."""
        while not self._stop.is_set():
            while self._busy() and not self._stop.is_set():  # requests first
                self._stop.wait(0.01)
            try:
                return self._run_other(job)
            except Preempted:
                self.stats.preempted += 1
        return None

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the queued shadow work is done (tests, a clean shutdown); False if ``timeout`` passed first."""
        return self._idle.wait(timeout)

    def describe(self) -> dict[str, Any]:
        s = self.stats
        return {
            "rate": self.rate, "sampled": s.sampled, "done": s.done, "queued": self._queue.qsize(),
            "dropped": s.dropped, "failed": s.failed, "preempted": s.preempted, "last_error": s.last_error,
            "labels": dict(s.labels),
        }  # fmt: skip

    def close(self, wait: float | None = 0.0) -> None:
        """Stop the worker; queued work is dropped (``wait`` seconds to finish the current job first)."""
        self._stop.set()
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass
        self._thread.join(wait)
