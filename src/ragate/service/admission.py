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
    42 s, because searches took milliseconds."""

    def __init__(
        self, n: int, on_change: Callable[[int], None], clock: Callable[[], float] = time.perf_counter
    ):
        self.n, self.used = n, 0
        self._lock, self._on_change, self._clock = threading.Lock(), on_change, clock
        self._means: dict[str, float] = {}
        self._at_work: list[tuple[float, str]] = []  # when each request at work took its slot, and its kind

    def take(self, kind: str = "answer") -> bool:
        with self._lock:
            if self.used >= self.n:
                return False
            self.used += 1
            self._at_work.append((self._clock(), kind))
            self._on_change(self.used)
            return True

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

    def retry_after(self) -> int:
        with self._lock:
            if self.used < self.n or not self._at_work:
                return 1
            now = self._clock()
            left = min(self._means.get(kind, 1.0) - (now - start) for start, kind in self._at_work)
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
