"""The health of a fleet of model servers, kept as a load balancer keeps it.

The rules (docs/service.md, "Fleet health"):

- A server is up until ``fail_after`` calls in a row fail on it, or at once when nothing accepts the connection.
  A failure is a connection that cannot be made or is dropped, no complete answer within the timeout, HTTP 5xx,
  a reply larger than the cap, or a reply that is not an OpenAI answer; 429 (busy) and other 4xx (the request's
  own fault) are not. The call that failed goes on at once to another server (failover).
- A down server gets no calls. It is probed once its back-off has passed: the first probe ``probe_backoff``
  seconds after it went down, each failed probe doubling the wait, up to ``probe_max``. A probe asks what a call
  asks (a one-token answer, checked as a call's would be: :meth:`Upstream._probe_down
  <ragate.backends.upstream.Upstream._probe_down>`), and is started by the next call or ``/healthz`` that finds
  it due (nobody asking, nothing to probe); ``/healthz`` also checks that each server up still lists its models.
- A failed probe of a server that is up counts as a failed call.
- A server that answers a probe is up again, on probation: its next failure puts it down at once, and the
  back-off starts where it left off (doubled for each time it went down since a call last succeeded on it). A
  call it answers clears its record.
- A lone server gets every call whatever its state, since there is nowhere else to send them: its state is what
  ``/healthz`` reports.

The transitions are pure functions of a frozen :class:`ServerState`; :class:`Fleet` keeps one per server under a
lock, with the in-flight counts the balancer picks by.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any

_log = logging.getLogger("ragate")


@dataclass(frozen=True)
class HealthPolicy:
    """When a server goes down (``fail_after`` failures in a row) and how often a down one is probed (from
    ``probe_backoff`` seconds, doubling, at most ``probe_max``)."""

    fail_after: int = 2
    probe_backoff: float = 0.5
    probe_max: float = 15.0

    def __post_init__(self) -> None:
        if self.fail_after < 1 or not 0 < self.probe_backoff <= self.probe_max:
            raise ValueError(
                f"need fail_after >= 1 and 0 < probe_backoff <= probe_max, got fail_after={self.fail_after}, "
                f"probe_backoff={self.probe_backoff}, probe_max={self.probe_max}"
            )

    def wait(self, n: int) -> float:
        """Seconds before the probe that follows ``n`` earlier waits: ``probe_backoff * 2**n``, capped."""
        return min(self.probe_backoff * 2 ** min(n, 60), self.probe_max)


@dataclass(frozen=True)
class ServerState:
    """What the balancer believes of one server."""

    up: bool = True
    since: float = 0.0  # time.time() when it last went up or down
    failures: int = 0  # calls (or probes) in a row that failed on it
    problem: str = ""  # the last failure
    ejections: int = 0  # times it went down since a call last succeeded on it
    probes: int = 0  # probes that failed since it went down
    next_probe: float = 0.0  # time.monotonic() when a down server is probed next
    probing: bool = False  # a probe of it is in flight
    probation: bool = False  # back on a probe; no call has succeeded on it since


def failed(
    s: ServerState, problem: str, policy: HealthPolicy, *, now: float, wall: float, gone: bool = False
) -> ServerState:
    """``s`` after a failed call (or probe of an up server); ``gone``: nothing accepted the connection."""
    if not s.up:  # a call that was in flight when it went down
        return replace(s, problem=problem)
    failures = s.failures + 1
    if gone or s.probation or failures >= policy.fail_after:
        return ServerState(
            up=False, since=wall, failures=failures, problem=problem, ejections=s.ejections + 1,
            next_probe=now + policy.wait(s.ejections),
        )  # fmt: skip
    return replace(s, failures=failures, problem=problem)


def answered(s: ServerState, *, wall: float) -> ServerState:
    """``s`` after a call it answered: up, with a clean record."""
    return ServerState(up=True, since=s.since if s.up else wall, probing=s.probing)


def probed(
    s: ServerState, problem: str | None, policy: HealthPolicy, *, now: float, wall: float, gone: bool = False
) -> ServerState:
    """``s`` after a probe that answered (``problem`` None) or failed (``gone``: nothing accepted the connection);
    a failed probe of an up server counts as a failed call."""
    if s.up:
        s = replace(s, probing=False)
        return s if problem is None else failed(s, problem, policy, now=now, wall=wall, gone=gone)
    if problem is None:
        return ServerState(up=True, since=wall, problem=s.problem, ejections=s.ejections, probation=True)
    probes = s.probes + 1
    return replace(
        s, problem=problem, probes=probes, probing=False,
        next_probe=now + policy.wait(s.ejections - 1 + probes),
    )  # fmt: skip


@dataclass(frozen=True)
class ServerView:
    """One server as ``/healthz`` reports it."""

    url: str
    up: bool
    since: float
    failures: int
    problem: str
    next_probe_in: float | None  # seconds, for a down server
    probation: bool
    in_flight: int
    calls: int  # sent to it so far

    def to_json(self, *, detail: bool = True) -> dict[str, Any]:
        """The server's state; without ``detail`` (a request without the API key) not its problem, which can
        name addresses."""
        stamp = datetime.datetime.fromtimestamp(self.since, datetime.UTC).isoformat(timespec="seconds")
        out: dict[str, Any] = {"state": "up" if self.up else "down", "since": stamp.replace("+00:00", "Z")}
        if self.up and self.probation:
            out["probation"] = True
        if self.next_probe_in is not None:
            out["next_probe_in_s"] = round(self.next_probe_in, 2)
        if detail:
            out |= {"failures": self.failures, "in_flight": self.in_flight, "calls": self.calls}
            if self.problem:
                out["problem" if not self.up else "last_problem"] = self.problem
        return out


class Fleet:
    """The servers' states and in-flight counts behind one lock; :meth:`pick` chooses a server for a call."""

    def __init__(self, urls: Sequence[str], policy: HealthPolicy) -> None:
        self.urls = tuple(urls)
        self.policy = policy
        self._lock = threading.Lock()
        started = time.time()
        self._states = {url: ServerState(since=started) for url in self.urls}
        self._in_flight = dict.fromkeys(self.urls, 0)
        self._sent = dict.fromkeys(self.urls, 0)

    def pick(self, exclude: Collection[str] = ()) -> str | None:
        """The up server not in ``exclude`` with the fewest calls in flight (ties: the one sent the fewest so
        far, so one call at a time takes turns), counted as taken until :meth:`release`; a lone server whatever
        its state; None when there is none."""
        with self._lock:
            live = [u for u in self.urls if u not in exclude and (self._states[u].up or len(self.urls) == 1)]
            if not live:
                return None
            url = min(live, key=lambda u: (self._in_flight[u], self._sent[u]))
            self._in_flight[url] += 1
            self._sent[url] += 1
            return url

    def release(self, url: str) -> None:
        with self._lock:
            self._in_flight[url] -= 1

    def failed(self, url: str, problem: str, *, gone: bool = False) -> None:
        """A call (or a probe of an up server) failed on ``url``."""
        with self._lock:
            before = self._states[url]
            after = failed(before, problem, self.policy, now=time.monotonic(), wall=time.time(), gone=gone)
            self._states[url] = after
            left = sum(s.up for s in self._states.values())
        if before.up and not after.up and len(self.urls) > 1:
            _log.warning(
                "ragate: the server at %s is down (%s); %d other(s) up; next probe in %.1f s",
                url, problem, left, after.next_probe - time.monotonic(),
            )  # fmt: skip

    def put_down(self, url: str, problem: str) -> None:
        """``url`` failed when the fleet opened: down at once, probed like any down server."""
        self.failed(url, problem, gone=True)

    def answered(self, url: str) -> None:
        with self._lock:
            before = self._states[url]
            self._states[url] = answered(before, wall=time.time())
        if not before.up and len(self.urls) > 1:
            _log.warning("ragate: the server at %s answered a call: back in the fleet", url)

    def probed(self, url: str, problem: str | None, *, gone: bool = False) -> None:
        with self._lock:
            before = self._states[url]
            after = probed(before, problem, self.policy, now=time.monotonic(), wall=time.time(), gone=gone)
            self._states[url] = after
        if not before.up and after.up and len(self.urls) > 1:
            _log.warning("ragate: the server at %s answered a probe: back in the fleet, on probation", url)
        elif before.up and not after.up and len(self.urls) > 1:
            _log.warning("ragate: the server at %s is down (its probe: %s)", url, problem)

    def due(self) -> list[str]:
        """The down servers whose probe is due and not in flight, marked as being probed: the caller probes
        each and reports with :meth:`probed`."""
        now = time.monotonic()
        with self._lock:
            chosen = [
                u for u, s in self._states.items() if not s.up and not s.probing and s.next_probe <= now
            ]
            for url in chosen:
                self._states[url] = replace(self._states[url], probing=True)
        return chosen

    def up_urls(self) -> list[str]:
        with self._lock:
            return [url for url, s in self._states.items() if s.up]

    def views(self) -> tuple[ServerView, ...]:
        """Each server's state, in the order the servers were given."""
        now = time.monotonic()
        with self._lock:
            return tuple(
                ServerView(
                    url=url, up=s.up, since=s.since, failures=s.failures, problem=s.problem,
                    next_probe_in=None if s.up else max(0.0, s.next_probe - now), probation=s.probation,
                    in_flight=self._in_flight[url], calls=self._sent[url],
                )
                for url, s in self._states.items()
            )  # fmt: skip

    def down_message(self) -> str:
        """Each down server, why, and when it is probed next (for the error of a call that found none up)."""
        return "; ".join(
            f"{v.url}: {v.problem or 'down'} (next probe in {v.next_probe_in or 0:.1f} s)"
            for v in self.views()
            if not v.up
        )
