"""Shared state behind the service's requests: admission slots and each request's ticket for its slot."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

SPREAD = 2.0  # admission's margin, in standard deviations of a request's time, for each request in the queue
ALPHA = 0.2  # weight of the newest time in a kind's running mean and variance
FORGET = 0.995  # per finished request, how much of the largest recent overrun of an estimate is kept


@dataclass
class Work:
    """One request holding a slot: its kind, when it took the slot, and when its model work began (None while it
    waits for the model behind others)."""

    kind: str
    taken: float
    began: float | None = None
    expected: float | None = None  # seconds from ``taken`` to its end, as reckoned when it was admitted


@dataclass
class _Times:
    """A kind's time per request (its service time; on one lane, the time it held the lane: from the end of the
    one before it, or its own start, to its end): an exponentially weighted mean and variance of recent ones, the
    first one taken as it is."""

    mean: float
    var: float = 0.0
    overrun: float = 0.0  # the largest recent excess of a request's time over its expected time, as a share of it

    def add(self, seconds: float) -> None:
        d = seconds - self.mean
        self.mean += ALPHA * d
        self.var = (1.0 - ALPHA) * (self.var + ALPHA * d * d)

    @property
    def sd(self) -> float:
        return max(math.sqrt(self.var), 0.1 * self.mean)  # a floor while few times are known


class Slots:
    """At most ``n`` requests at work. A slot is freed when its work ends, also when the client already got a
    504, so the limit bounds real work.

    ``retry_after`` estimates seconds until a slot frees: for each request at work, the mean service time of
    requests of its kind (answers, searches) minus how long it has been served (all of it while it still waits for
    the model); the soonest of these. One mean over all kinds said 1 s while answers held every slot for 42 s,
    because searches took milliseconds.

    With a ``deadline`` (the request timeout), a request behind others of its kind is admitted only if it can
    finish within it (one with none of its kind at work is always admitted, see :meth:`_ahead`): the requests of
    its kind at work ahead of it, ``parallel`` at a time (1 for a local model, which answers one request at a
    time), each for what is left of the kind's mean time, then itself, plus :data:`SPREAD` standard deviations of
    a request's time for each of them (the times of requests in one queue move together with the machine's load,
    so their sum spreads by sd * n, not the sd * sqrt(n) of independent ones), or, where larger, the largest share
    by which a recent queued request's time overran what was expected when it was admitted (:data:`FORGET`): on a
    busy core the queue drains slower than its requests' recent times add up to (the server's own HTTP work grows
    with the arrivals, other processes), and the admission learns by how much. A request's time counts from when
    its model work began
    (:meth:`begin`), not from when it took its slot (its wait in the queue would be counted twice); on one lane
    from the end of the request before it where that is later, so the gaps between requests on a busy server
    count. Under overload the server then refuses early (429, ``Retry-After`` from the expected wait) instead of
    admitting work that ends in 504s: with the mean alone, 2 of 403 arrivals at 5x capacity were admitted and then
    timed out; with service times and an independent spread but no overrun, 11 of 163 at 2x, and with the overrun
    4 of 419 at 5x, on one core shared with the server's HTTP work (``benchmarks/load.py --overload``,
    docs/service.md)."""

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
        self._times: dict[str, _Times] = {}
        self._last_end: dict[str, float] = {}  # when the last request of each kind that ran ended
        self._at_work: list[Work] = []
        self.deadline = deadline  # the request timeout: admit behind others only what can finish within it
        self.parallel = max(1, parallel or n)  # requests of one kind truly at work at once (1: a local model)

    def now(self) -> float:
        return self._clock()

    def take(self, kind: str = "answer") -> Work | None:
        """A slot for a request of ``kind``, or None: all are taken, or it would finish past the deadline."""
        with self._lock:
            if self.used >= self.n:
                return None
            expected = None
            if kind in self._times:  # the queue is reckoned once: the refusal and the work's expected end
                expected, margin = self._finish(kind)
                if self._ahead(kind) and self.deadline is not None and expected + margin > self.deadline:
                    return None
            self.used += 1
            work = Work(kind, self._clock(), expected=expected)
            self._at_work.append(work)
            self._on_change(self.used)
            return work

    def begin(self, work: Work) -> None:
        """The request's model work begins (it got the model); its service time counts from here."""
        with self._lock:
            if work.began is None:
                work.began = self._clock()

    def _late(self, kind: str) -> bool:
        """Whether a new request of ``kind`` would finish past the deadline (its expected time plus the margin).
        Admitting it would only turn it into a 504 after holding a slot (goodput 0); refused, it hears when to
        retry."""
        if self.deadline is None or kind not in self._times or not self._ahead(kind):
            return False
        return sum(self._finish(kind)) > self.deadline

    def _ahead(self, kind: str) -> bool:
        """Whether a request of ``kind`` is at work. With none, a new one is admitted whatever the estimate says:
        it is the probe by which a stale estimate mends (one slow answer's spread, or the overrun learnt while the
        model stalled, kept an idle server refusing every request, since a refused request teaches nothing). One
        at a time, also with several lanes: a server that is truly too slow for the deadline spends one request's
        work at a time on finding out."""
        return any(w.kind == kind for w in self._at_work)

    def _lanes(self, kind: str, now: float) -> list[tuple[float, int]]:
        """The requests of ``kind`` at work, drained in order over ``parallel`` lanes: per lane, the seconds
        expected until it frees and how many requests it holds."""
        lanes = [(0.0, 0)] * self.parallel
        for left in sorted((self._left(w, now) for w in self._at_work if w.kind == kind), reverse=True):
            i = min(range(len(lanes)), key=lambda j: lanes[j][0])  # the first lane to free
            lanes[i] = (lanes[i][0] + left, lanes[i][1] + 1)
        return lanes

    def _left(self, work: Work, now: float) -> float:
        mean = self._times[work.kind].mean if work.kind in self._times else 1.0
        return max(0.0, mean - (now - work.began)) if work.began is not None else mean

    def _finish(self, kind: str) -> tuple[float, float]:
        """Seconds until a request of ``kind`` admitted now would finish as expected, and the margin kept above
        that (:data:`SPREAD` standard deviations, or the recent overrun where larger)."""
        times = self._times[kind]
        # with `parallel` lanes the queue drains in order: the new one starts when the first lane frees
        seconds, count = min(self._lanes(kind, self._clock()), key=lambda lane: lane[0])
        expected = seconds + times.mean
        return expected, max(SPREAD * times.sd * (count + 1), expected * times.overrun)

    def give(self, work: Work, seconds: float | None, *, ran: bool | None = None) -> None:
        """Free ``work``'s slot; ``seconds`` is how long it was served (None: it never ran, or was cut short).
        ``ran`` (default: whether ``seconds`` is given): it got the model, so its time from its slot to now says
        how far the admission's expectation was off."""
        with self._lock:
            self.used -= 1
            if work in self._at_work:
                self._at_work.remove(work)
            times, now = self._times.get(work.kind), self._clock()
            ran = ran if ran is not None else seconds is not None
            if seconds is not None and self.parallel == 1:  # one lane: the gaps between requests count too
                seconds = max(seconds, now - max(work.taken, self._last_end.get(work.kind, work.taken)))
            if ran:
                self._last_end[work.kind] = now
            if seconds is not None:
                if times is None:
                    times = self._times[work.kind] = _Times(seconds)
                else:
                    times.add(seconds)
            if times is not None and ran:
                times.overrun *= FORGET
                if work.expected is not None and work.expected >= 2 * times.mean:
                    # queued behind others: how far the queue drained slower than reckoned, a share of the reckoning
                    times.overrun = max(times.overrun, (now - work.taken) / work.expected - 1.0)
            self._on_change(self.used)

    def retry_after(self, kind: str = "answer") -> int:
        """Seconds until a request of ``kind`` would be admitted: the soonest free slot, or, where the deadline
        refused it, until enough of the queue ahead of it has drained (at most until all of it has: a request
        with none of its kind at work is admitted)."""
        with self._lock:
            if not self._at_work:
                return 1
            now = self._clock()
            if self._late(kind):  # until it would fit, or until nothing of its kind is at work (then admitted)
                assert self.deadline is not None
                fits = sum(self._finish(kind)) - self.deadline
                drained = max(seconds for seconds, _ in self._lanes(kind, now))  # then nothing is ahead
                return max(1, math.ceil(min(fits, drained)))
            if self.used < self.n:
                return 1
            return max(1, math.ceil(min(self._left(w, now) for w in self._at_work)))


class Ticket:
    """One request's slot, freed exactly once: by the worker thread when it ran, else by the request. A request
    that gave up (its timeout) also tells a worker still waiting for the model not to begin. The worker's first
    ``wanted()`` (asked once the model is free, :meth:`ragate.Pipeline.answer`) marks when its model work began;
    work that does not wait for the model (``waits=False``: a search) begins when its thread starts. Work that
    failed before it began (a bad question) or was cut short (its caller gave up) leaves no service time."""

    def __init__(self, slots: Slots, work: Work, *, waits: bool = True) -> None:
        self._slots, self._work, self._waits, self._lock = slots, work, waits, threading.Lock()
        self._started = self._freed = self._given_up = False

    def start(self) -> bool:
        with self._lock:
            self._started = not self._freed
        if self._started and not self._waits:
            self._slots.begin(self._work)
        return self._started

    def wanted(self) -> bool:
        if self._work.began is None:
            self._slots.begin(self._work)
        return not self._given_up

    def done(self) -> None:
        """The worker finished (or failed)."""
        with self._lock:
            if self._freed:
                return
            self._freed = True
        began, cut = self._work.began, self._given_up
        served = self._slots.now() - began if began is not None and not cut else None
        self._slots.give(self._work, served, ran=began is not None)

    def give_up(self) -> None:
        """The request is over (answered, failed or timed out); frees the slot if no worker ever began."""
        with self._lock:
            self._given_up = True
            if self._freed or self._started:
                return
            self._freed = True
        self._slots.give(self._work, None)
