"""Turns at a local model, one decode step at a time, between the requests a pipeline answers and its background
(shadow) work.

A local model computes one step at a time: a prompt batch or one generated token. Requests and background work run
on separate contexts of the same weights (so neither loses its key/value cache to the other), and before each step
both ask :class:`ModelTurns` for the model:

- a request always gets the next step once the step running ends: it waits for background work at most one step;
- background work gets a step when no request is in flight, and while requests are in flight only within its
  ``share`` of the model's recent time (both times decay with a half-life of :data:`HALF_LIFE` seconds), never two
  steps in a row while a request waits for one; a background step that is due goes before a request's next step.
  So labels accrue under steady traffic at about ``share`` of the model, and requests are slowed by about
  ``share / (1 - share)`` at most.

A request's steps also ask whether it is still wanted (its caller did not time out): one that is not stops at its
next step with :class:`GivenUp`, so a request past its time limit stops computing.

Every wait of a request on background work is recorded (:meth:`ModelTurns.describe`: the longest wait, and the
most background steps one wait spanned, which the scheduling keeps at 1).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ragate.errors import RagateError

DEFAULT_SHARE = 0.1
HALF_LIFE = 30.0


class GivenUp(TimeoutError):
    """The request a step belongs to is no longer wanted (its caller timed out): its computation stops here."""


def check_share(share: object) -> float:
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 <= float(share) < 1.0:
        raise RagateError(
            f"the shadow share is the part of the model's time background work may take while requests wait, a "
            f"number in [0, 1), not {share!r:.40}"
        )
    return float(share)


def stop_when_given_up(
    progress: Callable[[str], None] | None, still_wanted: Callable[[], bool] | None
) -> Callable[[str], None] | None:
    """``progress`` (called as each stage of an answer starts) that first stops a request whose caller gave it up,
    on every engine (a local model's steps stop it sooner: :meth:`ModelTurns.wanted`)."""
    if still_wanted is None:
        return progress

    def stage(name: str) -> None:
        if not still_wanted():
            raise GivenUp(f"the request was given up before its {name} stage; its computation stops here")
        if progress is not None:
            progress(name)

    return stage


@dataclass
class _Decayed:
    """A sum of seconds that halves every :data:`HALF_LIFE` seconds."""

    value: float = 0.0
    at: float = 0.0

    def now(self, t: float) -> float:
        return self.value * math.pow(0.5, max(0.0, t - self.at) / HALF_LIFE)

    def add(self, t: float, seconds: float) -> None:
        self.value, self.at = self.now(t) + seconds, t


class ModelTurns:
    """See the module docstring. ``share``: background work's part of the model's time while requests are in
    flight (0: none until the requests are done)."""

    def __init__(self, share: float = DEFAULT_SHARE, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.share = check_share(share)
        self._clock = clock
        self._cv = threading.Condition()
        self._in_flight = 0
        self._running: str | None = None
        self._waiting = 0
        self._last_shadow = False  # the last step was background work's
        self._shadow_waiting = False  # background work waits for a step
        self._shadow_started = 0
        self._busy_request, self._busy_shadow = _Decayed(), _Decayed()
        self._wanted: Callable[[], bool] | None = None
        self._stopped = False
        self.request_steps = self.shadow_steps = self.shadow_steps_contended = 0
        self.request_seconds = self.shadow_seconds = self.shadow_seconds_contended = 0.0
        self.waits_on_shadow = 0
        self.max_wait_on_shadow = 0.0
        self.max_steps_waited = 0
        self.max_shadow_step = 0.0

    # -- requests -------------------------------------------------------------------------------------------------
    @contextmanager
    def in_flight(self) -> Iterator[None]:
        """Held by a request from before it waits for the model until it is done with it."""
        with self._cv:
            self._in_flight += 1
        try:
            yield
        finally:
            with self._cv:
                self._in_flight -= 1
                self._cv.notify_all()

    @property
    def requests_in_flight(self) -> int:
        return self._in_flight

    @contextmanager
    def wanted(self, wanted: Callable[[], bool] | None) -> Iterator[None]:
        """While the block runs, the request's steps stop with :class:`GivenUp` once ``wanted()`` is false (one
        request holds the model at a time, so one ``wanted`` is kept)."""
        before, self._wanted = self._wanted, wanted
        try:
            yield
        finally:
            self._wanted = before

    @contextmanager
    def request_step(self) -> Iterator[None]:
        """One step of a request: it lets a background step that is due go first (one, within its share), and
        waits for a background step that runs; so at most one."""
        with self._cv:
            start = self._clock()
            started_before = self._shadow_started - (1 if self._running == "shadow" else 0)
            self._waiting += 1
            try:
                while self._running is not None or self._shadow_due():
                    self._cv.wait(0.05)
            finally:
                self._waiting -= 1
            behind = self._shadow_started - started_before
            if behind:
                waited = self._clock() - start
                self.waits_on_shadow += 1
                self.max_wait_on_shadow = max(self.max_wait_on_shadow, waited)
                self.max_steps_waited = max(self.max_steps_waited, behind)
            wanted = self._wanted
            if wanted is not None and not wanted():
                self._cv.notify_all()
                raise GivenUp("the request was given up (its caller timed out); its computation stops here")
            self._running, self._last_shadow = "request", False
            began = self._clock()
        try:
            yield
        finally:
            with self._cv:
                end = self._clock()
                self._busy_request.add(end, end - began)
                self.request_steps += 1
                self.request_seconds += end - began
                self._running = None
                self._cv.notify_all()

    # -- background work ------------------------------------------------------------------------------------------
    def _credit(self) -> bool:
        """Whether background work is within its share of the model's recent time."""
        if self.share <= 0.0:
            return False
        t = self._clock()
        mine, theirs = self._busy_shadow.now(t), self._busy_request.now(t)
        return mine <= self.share * (mine + theirs)

    def _may_shadow(self) -> bool:
        if self._running is not None:
            return False
        if self._in_flight == 0 and self._waiting == 0:
            return True
        if self._waiting > 0 and self._last_shadow:
            return False  # never two background steps in a row while a request waits
        return self._credit()

    def _shadow_due(self) -> bool:
        """A background step waits, within its share, and the last step was a request's: it goes first (else a
        request's next step, asked for at once, would always win)."""
        return self._shadow_waiting and not self._last_shadow and self._credit()

    @contextmanager
    def shadow_step(self, stop: threading.Event | None = None) -> Iterator[None]:
        """One step of background work, when :meth:`_may_shadow` allows; :class:`GivenUp` once ``stop`` is set
        (the pipeline closes)."""
        with self._cv:
            self._shadow_waiting = True
            try:
                while not self._may_shadow():
                    if (stop is not None and stop.is_set()) or self._stopped:
                        raise GivenUp("background work stops: the pipeline closes")
                    self._cv.wait(0.05)
                if (stop is not None and stop.is_set()) or self._stopped:
                    raise GivenUp("background work stops: the pipeline closes")
            finally:
                self._shadow_waiting = False
                self._cv.notify_all()
            contended = self._in_flight > 0 or self._waiting > 0
            self._running, self._last_shadow = "shadow", True
            self._shadow_started += 1
            began = self._clock()
        try:
            yield
        finally:
            with self._cv:
                end = self._clock()
                took = end - began
                self._busy_shadow.add(end, took)
                self.shadow_steps += 1
                self.shadow_seconds += took
                if contended:
                    self.shadow_steps_contended += 1
                    self.shadow_seconds_contended += took
                self.max_shadow_step = max(self.max_shadow_step, took)
                self._running = None
                self._cv.notify_all()

    def stop(self) -> None:
        """Background steps asked for from now on raise :class:`GivenUp` (the pipeline closes)."""
        with self._cv:
            self._stopped = True
            self._cv.notify_all()

    def describe(self) -> dict[str, Any]:
        """The share asked for and taken, and how long requests waited on background work."""
        busy = self.request_seconds + self.shadow_seconds_contended
        return {
            "share": self.share,
            "share_taken": round(self.shadow_seconds_contended / busy, 4) if busy > 0 else 0.0,
            "shadow_steps": self.shadow_steps,
            "shadow_seconds": round(self.shadow_seconds, 3),
            "request_steps": self.request_steps,
            "request_seconds": round(self.request_seconds, 3),
            "waits_on_shadow": self.waits_on_shadow,
            "max_wait_on_shadow_seconds": round(self.max_wait_on_shadow, 4),
            "max_shadow_steps_waited": self.max_steps_waited,
            "max_shadow_step_seconds": round(self.max_shadow_step, 4),
        }
