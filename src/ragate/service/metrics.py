"""Prometheus metrics of one app, in the app's own ``CollectorRegistry`` (never the global one), so two apps in
one process (tests) or a reloaded app never share or clash over counters.

Exposed at ``GET /metrics``:

- ``ragate_http_requests_total{endpoint, status}`` and ``ragate_http_request_duration_seconds{endpoint}``
- ``ragate_answers_total{method}``, ``ragate_retrievals_total{method}`` and ``ragate_retrieval_rate{method}``
  (retrievals / answers since start; over a window use ``rate(retrievals) / rate(answers)`` in PromQL)
- ``ragate_stage_duration_seconds{stage}``: draft, pseudo-context, retrieve, answer, ... per answered question
- ``ragate_errors_total{type}``: every 4xx/5xx answer by error type (``rate_limit_exceeded`` = 429s)
- ``ragate_requests_in_progress``: requests holding a concurrency slot
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from ragate.methods.trace import Trace

# Seconds: one LM call on CPU takes 0.1 s to a minute; a 135M model answers in a fraction of a second.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
ENDPOINTS = frozenset(
    {"/v1/answer", "/v1/search", "/v1/chat/completions", "/v1/models", "/healthz", "/metrics"}
)


@dataclass(frozen=True)
class ServiceMetrics:
    """The collectors of one app and the tallies behind the retrieval-rate gauge."""

    registry: CollectorRegistry
    requests: Counter
    latency: Histogram
    answers: Counter
    retrievals: Counter
    retrieval_rate: Gauge
    stages: Histogram
    errors: Counter
    in_progress: Gauge
    budget: Gauge
    budget_tau: Gauge
    budget_rate: Gauge
    _tally: dict[str, tuple[int, int]] = field(
        default_factory=dict, repr=False
    )  # method -> (answers, retrieved)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def create(cls) -> ServiceMetrics:
        r = CollectorRegistry(auto_describe=True)
        return cls(
            registry=r,
            requests=Counter(
                "ragate_http_requests", "HTTP requests answered", ["endpoint", "status"], registry=r
            ),
            latency=Histogram(
                "ragate_http_request_duration_seconds",
                "wall time from request to response",
                ["endpoint"],
                buckets=LATENCY_BUCKETS,
                registry=r,
            ),
            answers=Counter("ragate_answers", "questions answered", ["method"], registry=r),
            retrievals=Counter(
                "ragate_retrievals", "answered questions that retrieved", ["method"], registry=r
            ),
            retrieval_rate=Gauge(
                "ragate_retrieval_rate", "retrievals / answers since start", ["method"], registry=r
            ),
            stages=Histogram(
                "ragate_stage_duration_seconds",
                "seconds per pipeline stage",
                ["stage"],
                buckets=LATENCY_BUCKETS,
                registry=r,
            ),
            errors=Counter("ragate_errors", "error answers (4xx/5xx) by type", ["type"], registry=r),
            in_progress=Gauge(
                "ragate_requests_in_progress", "requests holding a concurrency slot", registry=r
            ),
            budget=Gauge("ragate_budget", "the retrieval budget (serve --budget)", registry=r),
            budget_tau=Gauge("ragate_budget_threshold", "the gate threshold the budget sets now", registry=r),
            budget_rate=Gauge(
                "ragate_budget_window_rate", "retrieval rate over the budget's window of requests", registry=r
            ),
        )

    def observe_request(self, path: str, status: int, seconds: float) -> None:
        """One HTTP exchange; unknown paths share the label ``other`` so labels stay bounded."""
        endpoint = path if path in ENDPOINTS else "other"
        self.requests.labels(endpoint, str(status)).inc()
        self.latency.labels(endpoint).observe(seconds)

    def observe_error(self, error_type: str) -> None:
        self.errors.labels(error_type).inc()

    def observe_trace(self, trace: Trace) -> None:
        """One answered question: whether it retrieved, and how long each stage took."""
        self.answers.labels(trace.method).inc()
        if trace.retrieved:
            self.retrievals.labels(trace.method).inc()
        with self._lock:
            n, k = self._tally.get(trace.method, (0, 0))
            n, k = n + 1, k + int(trace.retrieved)
            self._tally[trace.method] = (n, k)
        self.retrieval_rate.labels(trace.method).set(k / n)
        for stage in trace.stages:
            self.stages.labels(stage.name).observe(stage.seconds)

    def observe_budget(self, budget: float, tau: float, rate: float | None) -> None:
        """The live budget: its target, the threshold it sets now, and the rate over its window."""
        self.budget.set(budget)
        self.budget_tau.set(tau)
        if rate is not None:
            self.budget_rate.set(rate)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
