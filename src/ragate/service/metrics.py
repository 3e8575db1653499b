"""Prometheus metrics of one app, in the app's own ``CollectorRegistry`` (never the global one), so two apps in
one process (tests) or a reloaded app never share or clash over counters.

Exposed at ``GET /metrics``:

- ``ragate_http_requests_total{endpoint, status}`` and ``ragate_http_request_duration_seconds{endpoint}``
- ``ragate_answers_total{method}``, ``ragate_retrievals_total{method}`` and ``ragate_retrieval_ratio{method}``
  (retrievals / answers since start; over a window use ``rate(retrievals) / rate(answers)`` in PromQL)
- ``ragate_stage_duration_seconds{stage}``: draft, pseudo-context, retrieve, answer, ... per answered question
- ``ragate_errors_total{type}``: every 4xx/5xx answer by error type (``rate_limit_exceeded`` = 429s)
- ``ragate_requests_in_progress``: requests holding a concurrency slot
- ``ragate_gate_decisions_total{method, decision}``: the gate's decisions, ``retrieve`` or ``skip``
- ``ragate_gate_score{method}``: a histogram of the gate's scores, to read a budget's threshold off
  (``histogram_quantile(1 - budget, ...)``: TARG 3.3's tau = F^-1(1 - budget) over live traffic)
- ``ragate_tokens_total{method}``: tokens spent answering (prompt + completion, every stage)
- ``ragate_always_retrieve_tokens_total{method, how}``: what always retrieving would have cost on the same answers,
  ``measured`` (answers that retrieved) or ``estimated`` (answers that skipped; :mod:`ragate.answers.savings`)
- ``ragate_saved_tokens_total{method}`` and ``ragate_gate_extra_tokens_total{method}``: per answer, always
  retrieving's tokens minus the answer's, counted in the first when positive and in the second when negative (the
  gate's own cost on an answer that retrieved); net savings = saved - extra
- ``ragate_gate_file_refusals_total``: versions of the served learned gate file that were refused (half-written,
  damaged, deleted, learned on another model) while the last good gate stayed in force (``/healthz`` says why)
- with ``--budget``: ``ragate_budget_target_ratio``, ``ragate_budget_realised_ratio`` (the retrieval rate over the
  controller's window) and ``ragate_budget_threshold`` (the tau it sets now); a route budget's are mean retrievals
  per question (which may pass 1) and the learned policy's lambda
"""

from __future__ import annotations

import math
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

from ragate.answers.savings import Savings
from ragate.methods.trace import Trace

# Seconds: one LM call on CPU takes 0.1 s to a minute; a 135M model answers in a fraction of a second.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
# Gate scores: TARG's margin and variance and PAIRS/judge votes lie in [0, 1] (fine steps there); DTR's normalised
# NLL and TARG's entropy in nats reach a few units.
SCORE_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, *(round(0.05 * i, 2) for i in range(2, 21)), 1.25, 1.5, 2.0, 2.5,
    3.0, 4.0, 5.0, 7.5, 10.0,
)  # fmt: skip
ENDPOINTS = frozenset(
    {"/v1/answer", "/v1/search", "/v1/chat/completions", "/v1/models", "/v1/budget", "/healthz", "/metrics"}
    | {"/"}  # the web page (its two files count as "other")
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
    side_failures: Counter
    in_progress: Gauge
    budget: Gauge
    budget_tau: Gauge
    budget_rate: Gauge
    decisions: Counter
    scores: Histogram
    tokens: Counter
    always_tokens: Counter
    saved_tokens: Counter
    extra_tokens: Counter
    gate_file_refusals: Counter
    # counts read from elsewhere (the gate file's refusals), as last seen
    _seen: dict[str, int] = field(default_factory=dict, repr=False)
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
                "ragate_retrieval_ratio", "retrievals / answers since start", ["method"], registry=r
            ),
            stages=Histogram(
                "ragate_stage_duration_seconds",
                "seconds per pipeline stage",
                ["stage"],
                buckets=LATENCY_BUCKETS,
                registry=r,
            ),
            errors=Counter("ragate_errors", "error answers (4xx/5xx) by type", ["type"], registry=r),
            side_failures=Counter(
                "ragate_side_channel_failures", "writes of a side channel (the answer log, the feedback store) "
                "that failed; the answers went on", ["channel"], registry=r,
            ),
            in_progress=Gauge(
                "ragate_requests_in_progress", "requests holding a concurrency slot", registry=r
            ),
            budget=Gauge(
                "ragate_budget_target_ratio",
                "the retrieval budget: target share of answers that retrieve (a route budget: mean retrievals)",
                registry=r,
            ),
            budget_tau=Gauge(
                "ragate_budget_threshold", "the gate threshold the budget sets now (a route budget: lambda)", registry=r
            ),
            budget_rate=Gauge(
                "ragate_budget_realised_ratio",
                "retrieval rate over the budget's window of requests (a route budget: mean retrievals)", registry=r,
            ),
            decisions=Counter(
                "ragate_gate_decisions", "the gate's decisions (retrieve or skip)", ["method", "decision"],
                registry=r,
            ),
            scores=Histogram(
                "ragate_gate_score", "the gate's scores (higher: more reason to retrieve)", ["method"],
                buckets=SCORE_BUCKETS, registry=r,
            ),
            tokens=Counter("ragate_tokens", "tokens spent answering (all stages)", ["method"], registry=r),
            always_tokens=Counter(
                "ragate_always_retrieve_tokens", "tokens always retrieving would have spent on the same answers",
                ["method", "how"], registry=r,
            ),
            saved_tokens=Counter(
                "ragate_saved_tokens", "tokens saved against always retrieving (answers where it saved)", ["method"],
                registry=r,
            ),
            extra_tokens=Counter(
                "ragate_gate_extra_tokens", "tokens spent beyond always retrieving (the gate's own cost)",
                ["method"], registry=r,
            ),
            gate_file_refusals=Counter(
                "ragate_gate_file_refusals", "versions of the learned gate file refused while the last good gate "
                "stayed in force", registry=r,
            ),
        )  # fmt: skip

    def observe_request(self, path: str, status: int, seconds: float) -> None:
        """One HTTP exchange; unknown paths share the label ``other`` so labels stay bounded."""
        endpoint = path if path in ENDPOINTS else "other"
        self.requests.labels(endpoint, str(status)).inc()
        self.latency.labels(endpoint).observe(seconds)

    def observe_side_failure(self, channel: str) -> None:
        """A side channel's write failed (the answer was not touched)."""
        self.side_failures.labels(channel=channel).inc()

    def observe_gate_file(self, refusals: int) -> None:
        """The served gate file's refused versions so far (:class:`ragate.gates.learned.GateFileState`)."""
        with self._lock:
            new = refusals - self._seen.get("gate_file_refusals", 0)
            self._seen["gate_file_refusals"] = max(refusals, self._seen.get("gate_file_refusals", 0))
        if new > 0:
            self.gate_file_refusals.inc(new)

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

    def observe_savings(self, trace: Trace, savings: Savings) -> None:
        """One answer's decision, score, tokens and what it saved against always retrieving (when known)."""
        method = trace.method
        if trace.gate_stages is not None:  # a gate decided apart from the answer
            self.decisions.labels(method, "retrieve" if trace.retrieved else "skip").inc()
            if math.isfinite(trace.gate.score):
                self.scores.labels(method).observe(trace.gate.score)
        self.tokens.labels(method).inc(savings.spent.tokens)
        saved = savings.saved
        if savings.always is None or saved is None:
            return
        self.always_tokens.labels(method, savings.how).inc(savings.always.tokens)
        if saved.tokens > 0:
            self.saved_tokens.labels(method).inc(saved.tokens)
        elif saved.tokens < 0:
            self.extra_tokens.labels(method).inc(-saved.tokens)

    def observe_budget(self, budget: float, tau: float, rate: float | None) -> None:
        """The live budget: its target, the threshold it sets now, and the rate over its window."""
        self.budget.set(budget)
        self.budget_tau.set(tau)
        if rate is not None:
            self.budget_rate.set(rate)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
