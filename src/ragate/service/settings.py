"""What one ``ragate serve`` process serves (method, model, index) and the limits that keep it safe.

Settings are a frozen record built once (by ``ragate serve`` or :meth:`ServiceSettings.from_env`) and kept on
``app.state``; nothing reads the environment after start-up. Several uvicorn workers each build the same settings
from ``RAGATE_SERVICE_SETTINGS`` (JSON written by ``ragate serve --workers N``).
"""

from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from ragate.backends.turns import DEFAULT_SHARE

SETTINGS_ENV = "RAGATE_SERVICE_SETTINGS"
API_KEY_ENV = "RAGATE_API_KEY"
LOOPBACK_NAMES = ("localhost",)


@dataclass(frozen=True)
class ServiceSettings:
    """The served pipeline and the limits. Defaults are safe: loopback only, bounded bodies, queue and time.

    ``index`` None serves the demo index; ``milvus_uri`` serves a Milvus collection instead of an index directory.
    ``engine`` "openai" sends every LM call to ``openai_base_url`` (vLLM, SGLang, llama.cpp server), or spreads the
    calls over a fleet of servers of one model (a tuple of URLs).
    ``max_concurrency`` bounds the requests being answered at once (the rest get 429 with ``Retry-After``); a local
    model is additionally used by one request at a time. ``request_timeout`` bounds one request's wall time (504);
    ``read_timeout`` the time its body may take to arrive (408, and the connection closed: a slow client cannot
    hold a socket open by trickling a promised body). ``backend_timeout`` bounds one exchange with an LM server
    (connect, headers and body together) and ``max_reply_bytes`` the reply read from it: an upstream that stalls
    or floods fails over to another server of the fleet (see :mod:`ragate.backends.fleet`).
    """

    method: str = "dtr"
    index: str | None = None
    milvus_uri: str | None = None
    milvus_collection: str = "ragate"
    model: str | None = None
    engine: str = "llama.cpp"
    openai_base_url: str | tuple[str, ...] | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    workers: int = 1
    max_body_bytes: int = 64 * 1024
    max_question_chars: int = 4000
    max_tokens: int = 512  # the largest options.max_tokens a request may ask for
    max_k: int = 20  # the most documents a request may ask for (options.k, /v1/search k)
    max_concurrency: int = 8
    request_timeout: float = 300.0  # queueing included: DTR with the 1.5B model on 2 cores takes ~45-90 s a request
    read_timeout: float = 10.0  # a client sending its request body slower than this gets 408 and is cut off
    backend_timeout: float = 60.0  # one exchange with an LM server: connect, headers and body together
    backend_retries: int = 2
    max_reply_bytes: int = 32 * 2**20  # the longest reply read from an LM server; a longer one fails it over
    health_timeout: float = 2.0
    budget: float | None = None  # a live retrieval budget for the served method (ragate.state.budget)
    budget_window: int = 200
    budget_gain: float | None = None  # feedback of the windowed error (0: none; None: 16 for a gate, 2 for routes)
    budget_state: str | None = None  # where the controller keeps its state (default: RAGATE_HOME/service/)
    state: str | None = None  # redis://HOST:PORT/DB: the budget window replicas share (ragate.state.shared)
    fallback: str | None = None  # the gate served where the backend cannot serve the method's own
    openai_logprobs: str = "auto"  # what the OpenAI-compatible server returns: auto (asked once), on, off
    skr_labels: str | None = None  # the SKR label set (`ragate skr fit`) that the skr gate votes with
    gate_weights: str | None = None  # a trained gate's weights (`ragate gate fit`) that no-model-lr reads
    calibration: str | None = None  # a `ragate calibrate` file: the served method's threshold
    prompt_state_mb: int = 512  # llama.cpp: the prompt states kept for exact prefix reuse (0: none)
    threads: int | None = None  # a local engine's threads (None: auto, the CPUs others leave free)
    batch_threads: int | None = None  # llama.cpp's prompt-evaluation threads (None: as threads)
    early_exit: bool = True  # TARG's entropy/margin drafts stop once "retrieve" is settled (ragate.gates.targ)
    prompts: str | None = None  # another prompt set for the served method (e.g. targ: its documents first)
    routes: tuple[str, ...] | None = None  # with --method route: the methods it routes between, cheapest first
    answer_log: str | None = None  # a file each answer's decision, cost and savings are appended to (JSON lines)
    answer_log_required: bool = False  # an audit trail: an answer whose line cannot be written is a 503
    trace_file: str | None = None  # a file the OpenTelemetry spans are appended to (else the global provider's)
    trace_content: bool = False  # spans carry the question, answer and documents
    feedback_store: str | None = None  # a SQLite file each answer's features and labels go to (ragate.learning.store)
    shadow: float = 0.0  # the share of answers whose other path runs after the response (ragate.learning.shadow)
    shadow_share: float = DEFAULT_SHARE  # the part of a local model's time shadow work takes while requests wait
    refit_every: int = 0  # learn the gate again after this many new labels (0: never; `ragate gate learn` by hand)
    learned_gate: str | None = None  # where a refit writes the learned gate (default: beside the store)
    refit_cascade: float | None = None  # a refit's cascade: the share of questions it may draft for (None: none)

    def __post_init__(self) -> None:
        positive = {
            "port": self.port, "workers": self.workers, "max_body_bytes": self.max_body_bytes,
            "max_question_chars": self.max_question_chars, "max_tokens": self.max_tokens, "max_k": self.max_k,
            "max_concurrency": self.max_concurrency, "request_timeout": self.request_timeout,
            "read_timeout": self.read_timeout,
            "backend_timeout": self.backend_timeout, "health_timeout": self.health_timeout,
        }  # fmt: skip
        bad = [f"{name} = {value}" for name, value in positive.items() if not value > 0]
        if bad:
            raise ValueError(f"service settings must be positive: {', '.join(bad)}")
        if self.port > 65535:
            raise ValueError(f"port must be at most 65535, got {self.port}")
        from ragate.backends.threads import check_threads

        for name, value in (("threads", self.threads), ("batch_threads", self.batch_threads)):
            check_threads(value, f"--{name.replace('_', '-')}")
        if self.engine == "openai" and (self.threads is not None or self.batch_threads is not None):
            raise ValueError("--threads and --batch-threads set a local engine's threads; a model server sets its own")
        if self.prompt_state_mb < 0:
            raise ValueError(f"--prompt-state-mb must be >= 0 (0 keeps no prompt states), got {self.prompt_state_mb}")
        if self.backend_retries < 0:
            raise ValueError(f"backend_retries must be >= 0, got {self.backend_retries}")
        if self.max_reply_bytes < 1024:
            raise ValueError(
                f"--max-reply-bytes must be at least 1024 (a one-token answer is longer), got {self.max_reply_bytes}"
            )
        if self.engine == "openai" and not self.openai_base_url:
            raise ValueError("the openai engine needs openai_base_url (e.g. http://127.0.0.1:8080/v1)")
        if self.index and self.milvus_uri:
            raise ValueError("serve an index directory or a Milvus collection, not both")
        if self.state is not None and self.budget is None:
            raise ValueError("--state shares the live budget's window among replicas: give --budget too")
        if self.budget is not None and self.workers > 1 and self.state is None:
            raise ValueError(
                "--budget keeps one window of recent requests per server: use --workers 1 with it (one process "
                "answers a local model at a time anyway), or share the window with --state redis://HOST:PORT/DB"
            )
        if self.openai_logprobs not in ("auto", "on", "off"):
            raise ValueError(f"openai_logprobs must be auto, on or off, got {self.openai_logprobs!r}")
        if self.skr_labels is not None and self.method != "skr":
            raise ValueError(f"--skr-labels goes with --method skr, not {self.method!r}")
        if self.method == "skr" and self.skr_labels is None:
            raise ValueError(
                "--method skr needs --skr-labels FILE: run `ragate sweep` on a training split, then "
                "`ragate skr fit --sweep DIR --out FILE`"
            )
        if self.gate_weights is not None or self.method in ("no-model-lr", "learned"):
            from ragate.gates.registry import get_gate
            from ragate.methods import get_method

            reads = get_gate(get_method(self.method).gate.kind).reads_weights
            if self.gate_weights is not None and not reads:
                raise ValueError(f"--gate-weights goes with --method no-model-lr or learned, not {self.method!r}")
            if reads and self.gate_weights is None:
                raise ValueError(
                    f"--method {self.method} needs --gate-weights FILE: "
                    + ("`ragate gate learn --store FEEDBACK.db --out FILE.json`" if self.method == "learned" else
                       "run `ragate sweep` on a training split, then `ragate gate fit --sweep DIR --out FILE.json`")
                )
        if not 0.0 <= self.shadow <= 1.0:
            raise ValueError(f"--shadow is a share of answers in [0, 1], not {self.shadow}")
        if not 0.0 <= self.shadow_share < 1.0:
            raise ValueError(f"--shadow-share is a part of the model's time in [0, 1), not {self.shadow_share}")
        if self.refit_every < 0:
            raise ValueError(f"--refit-every is a number of new labels (0: never), not {self.refit_every}")
        if self.refit_cascade is not None and not 0.0 <= self.refit_cascade <= 1.0:
            raise ValueError(f"--refit-cascade is a share of questions in [0, 1], not {self.refit_cascade}")
        if self.refit_cascade is not None and self.method == "route":
            raise ValueError(
                "--refit-cascade makes the refit's learned gate a cascade; with --method route the refit learns the "
                "route policy, which has no such cascade: drop --refit-cascade"
            )
        if self.refit_every and self.feedback_store is None and self.shadow == 0:
            raise ValueError("--refit-every learns from the labels of --feedback-store or --shadow: give one of them")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("the API key is empty: pass a non-empty key or none")
        if self.api_key is not None and not (
            self.api_key.isascii() and self.api_key.isprintable() and " " not in self.api_key
        ):
            # an HTTP header carries ASCII and the server strips spaces from what it reads: such a key could
            # never be matched, so every request would get 401
            raise ValueError(
                "the API key must be printable ASCII without spaces (a client's 'Authorization: Bearer <key>' "
                "header cannot carry other characters, so it could never match); choose another key, e.g. the "
                "output of `python -c 'import secrets; print(secrets.token_urlsafe(32))'`"
            )

    @property
    def loopback(self) -> bool:
        """Whether ``host`` only accepts connections from this machine."""
        if self.host in LOOPBACK_NAMES:
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    @property
    def backend_options(self) -> dict[str, Any]:
        """Constructor options for the LM backend: the kept prompt states' bound (llama.cpp), the server and its
        limits (OpenAI-compatible)."""
        from ragate.backends.threads import thread_options

        if self.engine == "llama.cpp":
            threads = thread_options(self.engine, self.threads, self.batch_threads)
            return {"prompt_state_bytes": self.prompt_state_mb * 2**20, **threads}
        if self.engine != "openai":
            return thread_options(self.engine, self.threads, self.batch_threads)
        return {
            "base_url": self.openai_base_url,
            "timeout": min(self.backend_timeout, self.request_timeout),
            "max_retries": self.backend_retries,
            "backoff": 0.25,
            "logprobs": self.openai_logprobs,
            "max_reply_bytes": self.max_reply_bytes,
        }

    def public(self) -> dict[str, Any]:
        """The settings without the API key (for logs and /healthz)."""
        out = asdict(self)
        out["api_key"] = "set" if self.api_key else None
        return out

    def to_json(self) -> str:
        """JSON for ``$RAGATE_SERVICE_SETTINGS``, without the API key (that travels in ``$RAGATE_API_KEY``)."""
        return json.dumps({**asdict(self), "api_key": None})

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> ServiceSettings:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown service settings: {', '.join(unknown)}")
        return cls(**dict(data))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ServiceSettings:
        """Settings from ``$RAGATE_SERVICE_SETTINGS`` (JSON; defaults when unset), the API key from
        ``$RAGATE_API_KEY`` when the JSON gives none. This is what each uvicorn worker calls."""
        env = os.environ if environ is None else environ
        raw = env.get(SETTINGS_ENV)
        settings = cls.from_mapping(json.loads(raw)) if raw else cls()
        key = env.get(API_KEY_ENV)
        if settings.api_key is None and key:
            settings = replace(settings, api_key=key)
        return settings
