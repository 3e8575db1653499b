"""Shared state behind the service's requests: admission slots and each request's ticket for its slot."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable


class Slots:
    """At most ``n`` requests at work. A slot is freed when its work ends, also when the client already got a
    504, so the limit bounds real work.

    ``retry_after`` estimates seconds until a slot frees: for each request at work, the mean time of requests of
    its kind (answers, searches: an exponential average of recent ones, the first one taken as it is) minus how
    long it has run; the soonest of these. One mean over all kinds said 1 s while answers held every slot for
    42 s, because searches took milliseconds.

    With a ``deadline`` (the request timeout), a request is admitted only if it can finish within it: the
    requests of its kind at work ahead of it, ``parallel`` at a time (1 for a local model, which answers one
    request at a time), at the kind's mean time, then itself. Under overload the server then refuses early (429,
    ``Retry-After`` from the expected wait) instead of admitting work that ends in 504s."""

    def __init__(
        self,
        n: int,
        on_change: Callable[[int], None],
        clock: Callable[[], float] = time.perf_counter,
        *,
        deadline: float | None = None,
        parallel: int | None = None,
    ):
        self.n, self.used = n, 0
        self._lock, self._on_change, self._clock = threading.Lock(), on_change, clock
        self._means: dict[str, float] = {}
        self._at_work: list[tuple[float, str]] = []  # when each request at work took its slot, and its kind
        self.deadline = deadline  # the request timeout: admit only what can finish within it
        self.parallel = max(1, parallel or n)  # requests of one kind truly at work at once (1: a local model)

    def take(self, kind: str = "answer") -> bool:
        with self._lock:
            if self.used >= self.n or self._late(kind):
                return False
            self.used += 1
            self._at_work.append((self._clock(), kind))
            self._on_change(self.used)
            return True

    def _late(self, kind: str) -> bool:
        """Whether a new request of ``kind`` would finish past the deadline: those of its kind at work go first
        (``parallel`` at a time, each taking the kind's mean time, less what each has run), then it. Admitting
        it would only turn it into a 504 after holding a slot (goodput 0); refused, it hears when to retry."""
        mean = self._means.get(kind)
        if self.deadline is None or mean is None:
            return False
        return self._finish(kind, mean) > self.deadline

    def _finish(self, kind: str, mean: float) -> float:
        now = self._clock()
        ahead = sorted(max(0.0, mean - (now - start)) for start, k in self._at_work if k == kind)
        # with `parallel` lanes, the queue drains in order: the new one starts when a lane frees
        lanes = [0.0] * self.parallel
        for left in ahead:
            lanes[lanes.index(min(lanes))] += left
        return min(lanes) + mean

    def give(self, seconds: float | None, kind: str = "answer") -> None:
        """Free a slot; ``seconds`` is how long its request took (None: it never ran)."""
        with self._lock:
            self.used -= 1
            mine = [w for w in self._at_work if w[1] == kind] or self._at_work
            if mine:  # the request that took its slot ``seconds`` ago (else the newest: it never ran)
                when = self._clock() - seconds if seconds is not None else max(w[0] for w in mine)
                self._at_work.remove(min(mine, key=lambda w: abs(w[0] - when)))
            if seconds is not None:
                old = self._means.get(kind)
                self._means[kind] = seconds if old is None else 0.8 * old + 0.2 * seconds
            self._on_change(self.used)

    def retry_after(self, kind: str = "answer") -> int:
        """Seconds until a request of ``kind`` would be admitted: the soonest free slot, or, where the deadline
        refused it, until enough of the queue ahead of it has drained."""
        with self._lock:
            if not self._at_work:
                return 1
            now = self._clock()
            if self._late(kind):
                mean = self._means[kind]
                assert self.deadline is not None
                return max(1, math.ceil(self._finish(kind, mean) - self.deadline))
            if self.used < self.n:
                return 1
            left = min(self._means.get(k, 1.0) - (now - start) for start, k in self._at_work)
            return max(1, math.ceil(left))


class Ticket:
    """One request's slot, freed exactly once: by the worker thread when it ran, else by the request. A request
    that gave up (its timeout) also tells a worker still waiting for the model not to begin."""

    def __init__(self, slots: Slots, kind: str = "answer") -> None:
        self._slots, self._kind, self._lock, self._start = slots, kind, threading.Lock(), time.perf_counter()
        self._started = self._freed = self._given_up = False

    def start(self) -> bool:
        with self._lock:
            self._started = not self._freed
            return self._started

    def wanted(self) -> bool:
        return not self._given_up

    def done(self) -> None:
        """The worker finished (or failed)."""
        with self._lock:
            if self._freed:
                return
            self._freed = True
        self._slots.give(time.perf_counter() - self._start, self._kind)

    def give_up(self) -> None:
        """The request is over (answered, failed or timed out); frees the slot if no worker ever began."""
        with self._lock:
            self._given_up = True
            if self._freed or self._started:
                return
            self._freed = True
        self._slots.give(None, self._kind)
