"""One computation per distinct LM call in an evaluation: a content-addressed record of each call.

Many methods make identical calls for the same question: no-retrieval's answer is DTR's draft, standard-rag's
reading prompt is llm-judge's and random's when they retrieve, the three TARG gates share a draft. A
:class:`CallCache` wraps a backend and keys every deterministic call by what decides its output: the model file's
sha256, the engine and its version, the exact prompt token ids, the decoding parameters and (for sampling only)
the seed. A call seen before returns the stored :class:`~ragate.types.Generation`, bit for bit, *with the cost
measured when it was computed*, so a method is still charged every call it makes; the cache counts what was
really paid beside it.

For a stored answer to equal a fresh one, a call must not depend on what ran before it. The local engines keep
their key/value cache between calls and reuse a shared prefix, and a prompt evaluated partly from that cache gives
slightly different logits (a near-tie can flip a greedy token). So the wrapper clears the engine's cache before
every call it computes, with the store on or off: each call is then a pure function of its key, and turning the
store off changes no prediction. A batch of requests (TARG's N samples) is one call: it is computed together,
with the reuse inside the batch, and stored together.

With ``exact_prefixes`` (the eval's default when the store is on) a computed call's prompt may start from the kept
state of an earlier prompt where the engine offers it (llama.cpp: ``exact_prefix_reuse``), cut at a length that
gives the same logits bit for bit (:mod:`ragate.backends.prompt_states`). The call is then cheaper to compute than
on its own, so the cost is split: ``paid`` is what was measured, and the call is *charged* that plus what its reused
tokens took when they were evaluated (apportioned by token count), an estimate of what it costs computed alone, so
a method's cost columns do not depend on which method happened to run before it.

Not stored: requests that ask for attentions (arrays), sampling without a seed, watched generations (the
dynamic loop's, whose end depends on the trigger watching them) and a gate's draft that stopped early because its
decision was settled (:meth:`CallCache.generate_settled`; one that ran to its end is the whole call's, and is).

The store is one SQLite file (WAL mode), safe for several worker processes at once; values are zlib-compressed
JSON, never pickle.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from ragate.backends.base import Backend
from ragate.backends.decoding import Watch, replay
from ragate.backends.prompt_states import PrefixReuse
from ragate.errors import CallCacheError
from ragate.types import Generation, GenerationRequest, TopLogprob

KEY_VERSION = 1  # bump when ragate's decoding loop changes what a call returns


@dataclass(frozen=True)
class Cost:
    """What LM calls cost: wall and CPU seconds, prompt and completion tokens, and how many calls."""

    seconds: float = 0.0
    cpu_seconds: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0

    def __add__(self, other: Cost) -> Cost:
        return Cost(
            self.seconds + other.seconds,
            self.cpu_seconds + other.cpu_seconds,
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.calls + other.calls,
        )

    def __sub__(self, other: Cost) -> Cost:
        return Cost(
            self.seconds - other.seconds,
            self.cpu_seconds - other.cpu_seconds,
            self.prompt_tokens - other.prompt_tokens,
            self.completion_tokens - other.completion_tokens,
            self.calls - other.calls,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "cpu_seconds": self.cpu_seconds,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "calls": self.calls,
        }


def generation_to_json(gen: Generation) -> dict[str, Any]:
    """A Generation as plain JSON (floats round-trip exactly); attentions are not kept."""
    return {
        "text": gen.text,
        "tokens": list(gen.tokens),
        "token_ids": list(gen.token_ids),
        "logprobs": list(gen.logprobs),
        "top_logprobs": [[[t.token_id, t.token, t.logprob] for t in step] for step in gen.top_logprobs],
        "offsets": [list(o) for o in gen.offsets],
        "finish_reason": gen.finish_reason,
        "prompt_tokens": gen.prompt_tokens,
        "completion_tokens": gen.completion_tokens,
        "seconds": gen.seconds,
        "entropies": None if gen.entropies is None else list(gen.entropies),
    }


def generation_from_json(data: dict[str, Any]) -> Generation:
    return Generation(
        text=data["text"],
        tokens=tuple(data["tokens"]),
        token_ids=tuple(data["token_ids"]),
        logprobs=tuple(data["logprobs"]),
        top_logprobs=tuple(tuple(TopLogprob(i, t, lp) for i, t, lp in step) for step in data["top_logprobs"]),
        offsets=tuple((a, b) for a, b in data["offsets"]),
        finish_reason=data["finish_reason"],
        prompt_tokens=data["prompt_tokens"],
        completion_tokens=data["completion_tokens"],
        seconds=data["seconds"],
        entropies=None if data["entropies"] is None else tuple(data["entropies"]),
    )


@dataclass
class Tally:
    """What the calls made inside one :meth:`CallCache.tally` block were charged and really paid (mutable: it
    fills while the block runs)."""

    charged: Cost = Cost()
    paid: Cost = Cost()
    hits: int = 0
    reused_tokens: int = 0  # prompt tokens of computed calls taken from an earlier prompt's state


def _stored_generations(value: dict[str, Any] | None, n: int) -> tuple[list[Generation], float, float] | None:
    """A stored value's generations and charged CPU and wall seconds; None for a miss or an entry that is not the
    shape :meth:`CallCache._generate` writes (a damaged or foreign entry is recomputed, and then overwritten)."""
    if value is None:
        return None
    try:
        gens = [generation_from_json(g) for g in value["generations"]]
        cpu_seconds, seconds = float(value["cpu_seconds"]), float(value["seconds"])
    except (KeyError, TypeError, ValueError):
        return None
    return (gens, cpu_seconds, seconds) if len(gens) == n else None


_FIX = "delete it (it only saves time) or pass another --call-cache path"


class CallStore:
    """A key -> JSON value table in one SQLite file, shared safely by concurrent processes (WAL, busy timeout).

    Opening checks the file: a damaged database, a table of another shape (not ragate's cache) or a path that
    cannot be a file is a :class:`~ragate.errors.CallCacheError` before any call is made; damage found later
    (pages overwritten while a run reads) is one too, and stops the run rather than failing each question."""

    def __init__(self, path: Path | str, *, check: bool = True) -> None:
        self.path = Path(path).expanduser()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise CallCacheError(
                f"the call cache {self.path} cannot be created ({type(err).__name__}: {err}); pass a "
                "--call-cache path in a folder ragate can write"
            ) from None
        if self.path.is_dir():
            raise CallCacheError(f"the call cache {self.path} is a directory; pass a --call-cache file path")
        self._lock = threading.Lock()
        try:
            # one connection for every thread of a run (questions in flight over a server), used under a lock
            self._db = sqlite3.connect(self.path, timeout=60, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("CREATE TABLE IF NOT EXISTS calls (key TEXT PRIMARY KEY, value BLOB NOT NULL)")
            columns = [(row[1], row[2]) for row in self._db.execute("PRAGMA table_info(calls)")]
            # every page read once (~0.1 s for 300 MB): done once per run, by check_call_cache
            verdict = self._db.execute("PRAGMA quick_check").fetchone()[0] if check else "ok"
        except sqlite3.DatabaseError as err:
            raise self._error(err) from None
        if columns != [("key", "TEXT"), ("value", "BLOB")]:
            self._db.close()
            raise CallCacheError(
                f"{self.path} holds a table 'calls' of another shape {columns}: it is not ragate's call cache; "
                "pass another --call-cache path"
            )
        if verdict != "ok":
            self._db.close()
            raise CallCacheError(f"the call cache {self.path} is damaged ({verdict}); {_FIX}")

    def _error(self, err: sqlite3.DatabaseError) -> CallCacheError:
        """What a SQLite error means for the user: a lock held past the busy timeout, or a damaged file."""
        text = str(err)
        if isinstance(err, sqlite3.OperationalError) and ("locked" in text or "busy" in text):
            return CallCacheError(
                f"could not use the call cache {self.path} ({text}): another process has held it for over a "
                "minute; rerun, or pass another --call-cache path"
            )
        if isinstance(err, sqlite3.OperationalError) and ("disk" in text or "I/O" in text or "full" in text):
            return CallCacheError(
                f"could not use the call cache {self.path} ({text}); free disk space, or {_FIX}"
            )
        return CallCacheError(f"the call cache {self.path} is damaged or not a call cache ({text}); {_FIX}")

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            with self._lock:
                row = self._db.execute("SELECT value FROM calls WHERE key = ?", (key,)).fetchone()
        except sqlite3.DatabaseError as err:
            raise self._error(err) from None
        if row is None:
            return None
        try:
            value = json.loads(zlib.decompress(row[0]))
        except (zlib.error, ValueError, TypeError):
            return None  # a damaged entry is recomputed
        return value if isinstance(value, dict) else None

    def put(self, key: str, value: dict[str, Any]) -> None:
        blob = zlib.compress(json.dumps(value, separators=(",", ":")).encode("utf-8"), 6)
        try:
            with self._lock:
                self._db.execute("INSERT OR REPLACE INTO calls (key, value) VALUES (?, ?)", (key, blob))
        except sqlite3.DatabaseError as err:
            raise self._error(err) from None

    def __len__(self) -> int:
        try:
            with self._lock:
                return int(self._db.execute("SELECT COUNT(*) FROM calls").fetchone()[0])
        except sqlite3.DatabaseError as err:
            raise self._error(err) from None

    def close(self) -> None:
        with self._lock:
            self._db.close()


def check_call_cache(path: Path | str) -> None:
    """Open the store at ``path`` once with its full check (SQLite's quick_check, its table's shape) and close it:
    what a run does before any worker or model starts."""
    CallStore(path).close()


def engine_version(engine: str) -> str | None:
    package = {"llama.cpp": "llama_cpp_python", "transformers": "transformers"}.get(engine)
    if package is None:
        return None
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _prompt_key(lm: Backend, request: GenerationRequest) -> Any:
    """The exact token ids the engine will read, where it exposes its tokenizer; else the prompt itself."""
    tokenize = getattr(lm, "tokenize", None)
    if tokenize is not None:
        return tokenize(request.prompt, request.assistant_prefix)
    prompt = request.prompt
    messages = prompt if isinstance(prompt, str) else [[m.role, m.content] for m in prompt]
    return {"prompt": messages, "assistant_prefix": request.assistant_prefix}


def request_key(lm: Backend, identity: str, requests: Sequence[GenerationRequest]) -> str | None:
    """The sha256 key of a batch of requests, or None when it must not be stored (attentions, unseeded sampling)."""
    parts = []
    for r in requests:
        if r.attentions or (not r.greedy and r.seed is None):
            return None
        parts.append(
            {
                "prompt": _prompt_key(lm, r),
                "max_tokens": r.max_tokens,
                "temperature": r.temperature,
                "top_p": r.top_p,
                "stop": list(r.stop),
                "top_logprobs": r.top_logprobs,
                "repetition_penalty": r.repetition_penalty,
                "seed": None if r.greedy else r.seed,  # a greedy answer does not depend on the seed
            }
        )
    head = {"v": KEY_VERSION, "model": identity, "engine": lm.engine, "version": engine_version(lm.engine)}
    blob = json.dumps([head, parts], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class CallCache(Backend):
    """``inner`` with every call computed from a cleared engine cache and, with a ``store``, computed once.

    ``identity`` names the model exactly (the GGUF file's sha256; a server's URL and model name). ``charged`` is
    the measured cost of every call made through the wrapper (stored calls at their original cost), ``paid`` the
    cost of the calls it really computed; ``hits`` counts calls answered from the store, ``reused_tokens`` the prompt
    tokens of computed calls taken from an earlier prompt's state.
    """

    def __init__(
        self, inner: Backend, store: CallStore | None, identity: str, *, exact_prefixes: bool = False
    ) -> None:
        self.inner, self.store, self.identity = inner, store, identity
        self._reuse = getattr(inner, "exact_prefix_reuse", None) if exact_prefixes else None
        self.engine, self.model, self.capabilities = inner.engine, inner.model, inner.capabilities
        self.max_context = getattr(inner, "max_context", None)
        self.charged = Cost()
        self.paid = Cost()
        self.hits = 0
        self.reused_tokens = 0
        self._lock = threading.Lock()
        self._local = threading.local()  # each thread's open tallies (concurrent questions on a server)

    @contextmanager
    def tally(self) -> Iterator[Tally]:
        """Count the calls this thread makes inside the block."""
        stack = self._local.__dict__.setdefault("stack", [])
        counted = Tally()
        stack.append(counted)
        try:
            yield counted
        finally:
            stack.remove(counted)

    def _count(self, cost: Cost, *, paid: Cost | None, reused: int = 0) -> None:
        """Charge ``cost``; ``paid`` is what computing it really took (None: it came from the store), ``reused``
        its prompt tokens taken from an earlier prompt's state."""
        tallies: list[Any] = [self, *getattr(self._local, "stack", [])]
        with self._lock:
            for t in tallies:
                t.charged += cost
                t.reused_tokens += reused
                if paid is not None:
                    t.paid += paid
                else:
                    t.hits += 1

    def _generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        key = request_key(self.inner, self.identity, requests) if self.store is not None else None
        if key is not None and self.store is not None:
            hit = _stored_generations(self.store.get(key), len(requests))
            if hit is not None:
                gens, cpu_seconds, seconds = hit
                self._count(_cost(gens, cpu_seconds, seconds), paid=None)
                return gens
        self.inner.clear_cache()
        gens, charged = self._computed(lambda: self.inner.generate(requests))
        if key is not None and self.store is not None:
            value = {
                "generations": [generation_to_json(g) for g in gens],
                "seconds": charged.seconds,
                "cpu_seconds": charged.cpu_seconds,
            }
            self.store.put(key, value)
        return gens

    def generate_watched(
        self, request: GenerationRequest, watch: Watch, *, recompute: bool = False
    ) -> Generation:
        """Watched generations are not stored (their end depends on the watcher) and are not started from a cleared
        cache: one that extends the engine's current sequence (a dynamic loop writing on) continues it. A prompt
        the engine evaluates from a cleared cache (the loop's first, after :func:`~ragate.dynamic.loop.run_dynamic`
        cleared it) starts from a kept prompt state as other calls do."""
        gens, _ = self._computed(lambda: [self.inner.generate_watched(request, watch, recompute=recompute)])
        return gens[0]

    def generate_settled(self, request: GenerationRequest, settled: Watch) -> Generation:
        """A gate's draft that may stop once its decision is settled (:meth:`Backend.generate_settled`), computed as
        every call here is: from a cleared cache (and kept prompt states), so that it is the stored call's
        generation cut where ``settled`` fires. A stored whole generation on which ``settled`` never fires is the
        answer, at its stored cost; one on which it fires is computed again, stopping there, so that the call is
        charged what the early exit costs. A computed generation that ran to its end is stored (it is the whole
        call's); one that stopped early is not."""
        key = request_key(self.inner, self.identity, [request]) if self.store is not None else None
        if key is not None and self.store is not None:
            hit = _stored_generations(self.store.get(key), 1)
            if hit is not None and replay(hit[0][0], settled) is hit[0][0]:
                gens, cpu_seconds, seconds = hit
                self._count(_cost(gens, cpu_seconds, seconds), paid=None)
                return gens[0]
        fired: list[bool] = []

        def watch(gen: Generation) -> bool:
            fired.append(settled(gen))
            return fired[-1]

        self.inner.clear_cache()
        gens, charged = self._computed(lambda: [self.inner.generate_settled(request, watch)])
        if key is not None and self.store is not None and not (fired and fired[-1]):
            value = {
                "generations": [generation_to_json(g) for g in gens],
                "seconds": charged.seconds,
                "cpu_seconds": charged.cpu_seconds,
            }
            self.store.put(key, value)
        return gens[0]

    @contextmanager
    def prefix_reuse(self) -> Iterator[PrefixReuse]:
        """The engine's exact prefix reuse where this cache turns it on, else a block that reuses nothing: a dynamic
        loop, which calls the engine itself, answers inside it in ``ragate eval``, so that each question's first
        prompt starts from the kept state of the instruction and exemplars (or of the same prompt another route
        evaluated) as it does through :class:`ragate.Pipeline`. The block's count says what was reused."""
        with self._reuse() if self._reuse is not None else nullcontext(PrefixReuse()) as reused:
            yield reused

    def _computed(self, compute: Callable[[], list[Generation]]) -> tuple[list[Generation], Cost]:
        """Run ``compute`` (inside the engine's exact prefix reuse, where on), count it, and return its generations
        and what it is charged: what it measured plus what its reused prompt tokens took when first evaluated."""
        with self.prefix_reuse() as reused:
            clock = time.thread_time if self.engine == "openai" else time.process_time  # see below
            wall, cpu = time.perf_counter(), clock()
            gens = compute()
            # a local engine computes in its own threads (the process's CPU); a server's client computes in the
            # calling thread alone, and other questions' threads must not be charged to this call
            wall, cpu = time.perf_counter() - wall, clock() - cpu
        paid = _cost(gens, cpu, wall)
        charged = paid + reuse_cost(reused)
        self._count(charged, paid=paid, reused=reused.tokens)
        return gens, charged

    def hidden_state(self, prompt: Any, assistant_prefix: str = "") -> Any:
        """The engine's last-layer hidden state at the prompt's last token (``Capabilities.hidden_states``),
        evaluated as a computed call is: from a cleared cache, inside the engine's exact prefix reuse, so a
        generation of the same prompt after it starts from its kept state (its work is charged to that generation
        as reused prompt tokens) and its output does not depend on the calls before it."""
        self.inner.clear_cache()
        with self._reuse() if self._reuse is not None else nullcontext():
            return self.inner.hidden_state(prompt, assistant_prefix)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> Any:
        # engine-specific helpers the dynamic loop uses (head_attentions, token_spans, piece, ...)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def clear_cache(self) -> None:
        self.inner.clear_cache()

    def close(self) -> None:
        """The wrapped backend and the store belong to the caller."""


def reuse_cost(reused: PrefixReuse) -> Cost:
    """What the prompt tokens a block took from kept states took when first evaluated: charged on top of what the
    calls that reused them paid, so a call costs what it would alone."""
    return Cost(seconds=reused.seconds, cpu_seconds=reused.cpu_seconds)


def _cost(gens: Sequence[Generation], cpu_seconds: float, wall: float) -> Cost:
    return Cost(
        seconds=wall,
        cpu_seconds=cpu_seconds,
        prompt_tokens=sum(g.prompt_tokens for g in gens),
        completion_tokens=sum(g.completion_tokens for g in gens),
        calls=1,
    )


def exact_calls(lm: Backend) -> Backend:
    """``lm`` computing each call from a cleared cache and kept prompt states, where the engine keeps them
    (llama.cpp's ``exact_prefix_reuse``: what a Pipeline answers with); other backends as they are."""
    if isinstance(lm, CallCache) or not hasattr(lm, "exact_prefix_reuse"):
        return lm
    return CallCache(lm, None, f"{lm.engine}:{lm.model}", exact_prefixes=True)
