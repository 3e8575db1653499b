"""Shared state behind the service's requests: admission slots and each request's ticket for its slot."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable


class Slots:
    """At most ``n`` requests at work. A slot is freed when its work ends, also when the client already got a
    504, so the limit bounds real work. ``retry_after`` estimates seconds until a slot frees: the mean request
    time (an exponential average of recent ones) minus how long the oldest request at work has run."""

    def __init__(
        self, n: int, on_change: Callable[[int], None], clock: Callable[[], float] = time.perf_counter
    ):
        self.n, self.used, self._mean = n, 0, 1.0
        self._lock, self._on_change, self._clock = threading.Lock(), on_change, clock
        self._started: list[float] = []  # when each request at work took its slot

    def take(self) -> bool:
        with self._lock:
            if self.used >= self.n:
                return False
            self.used += 1
            self._started.append(self._clock())
            self._on_change(self.used)
            return True

    def give(self, seconds: float | None) -> None:
        """Free a slot; ``seconds`` is how long its request took (None: it never ran)."""
        with self._lock:
            self.used -= 1
            if (
                self._started
            ):  # the request that took its slot ``seconds`` ago (else the newest: it never ran)
                when = self._clock() - seconds if seconds is not None else max(self._started)
                self._started.remove(min(self._started, key=lambda s: abs(s - when)))
            if seconds is not None:
                self._mean = 0.8 * self._mean + 0.2 * seconds
            self._on_change(self.used)

    def retry_after(self) -> int:
        with self._lock:
            if self.used < self.n or not self._started:
                return 1
            ran = self._clock() - min(self._started)
            return max(1, math.ceil(self._mean - ran))


class Ticket:
    """One request's slot, freed exactly once: by the worker thread when it ran, else by the request. A request
    that gave up (its timeout) also tells a worker still waiting for the model not to begin."""

    def __init__(self, slots: Slots) -> None:
        self._slots, self._lock, self._start = slots, threading.Lock(), time.perf_counter()
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
        self._slots.give(time.perf_counter() - self._start)

    def give_up(self) -> None:
        """The request is over (answered, failed or timed out); frees the slot if no worker ever began."""
        with self._lock:
            self._given_up = True
            if self._freed or self._started:
                return
            self._freed = True
        self._slots.give(None)
