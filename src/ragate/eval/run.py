"""``ragate eval``: run methods over a dataset, one JSON line per (question, method) as it finishes, resumable.

A run directory holds
- ``config.json``: what was asked (dataset, methods, model, engine, index, thresholds, limit, seed) and the dataset
  *file* read (path, bytes, sha256); a resumed run must ask the same and read the same file, or it is refused with
  the difference named;
- ``questions.jsonl``: one record per (question, method): the prediction, its scores, whether and how often it
  retrieved, the documents' ids, recall@k where gold passages are known, tokens, seconds (charged), CPU seconds,
  what its LM calls were charged and what computing them paid, and the full Trace;
- ``results.json`` and ``results.md``, written (atomically) when the run completes: the summary table with
  bootstrap 95% intervals, package versions, model, dataset file and index identity, the git commit, and the
  run's charged and paid LM cost.

Every question runs every method back to back in rotated order (machine drift hits all methods alike). A
single-shot method's LM calls go through a :class:`~ragate.eval.calls.CallCache`: each call is computed from a
cleared engine cache (so no method is timed on another's prompt and an answer never depends on what ran before
it), and each distinct call is computed once and charged, at its measured cost, to every method that makes it.
``--workers N`` shards the questions over N pinned one-thread processes (:mod:`ragate.eval.workers`).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Self

from tqdm.auto import tqdm

from ragate.backends.base import Backend
from ragate.backends.prompt_states import PrefixReuse
from ragate.errors import CallCacheError, RagateError
from ragate.eval.calls import CallCache, CallStore, Cost, Tally, check_call_cache, reuse_cost
from ragate.eval.config import (
    EvalConfig,
    _urls,
    check_config,  # noqa: F401 (re-exported)
    check_no_leak,  # noqa: F401 (re-exported)
    check_weights_leak,  # noqa: F401 (re-exported)
    open_run,
)
from ragate.eval.datasets import Example
from ragate.eval.metrics import recall_at_k, score
from ragate.eval.provenance import provenance
from ragate.eval.ray_engine import RAY_START_TIMEOUT, check_engine, reach_cluster, run_ray
from ragate.eval.records import RecordWriter, latest, read_records
from ragate.eval.rundir import (
    LOCK_FILE,
    _kept_provenance,
    _kept_times,
    _save_config,
    check_asked,
    cost_totals,
    read_run_config,  # noqa: F401 (re-exported)
)
from ragate.eval.summary import summarize, summary_markdown
from ragate.eval.workers import fold_parts, part_path, run_workers
from ragate.fileio import atomic_writer, exclusive_lock
from ragate.methods import MethodSpec, run_method
from ragate.methods.needs import require, require_index
from ragate.models import model_identity
from ragate.retrieval.types import Retriever
from ragate.text import extract_answer

RECALL_K = 3


def answer_fields(trace: Any, example: Example) -> dict[str, Any]:
    """What an answer is worth: the extracted prediction, its scores, the documents read and their recall@k, and
    whether the prediction is found in them (``supported``, :attr:`ragate.methods.trace.Trace.supported`; None:
    nothing read, or a yes/no answer, which the check says nothing about)."""
    prediction = extract_answer(trace.answer)
    doc_ids = [h.id for h in trace.documents]
    return {
        "prediction": prediction,
        "scores": score(prediction, example.answers, example.kind, label=example.label),
        "doc_ids": doc_ids,
        f"recall@{RECALL_K}": recall_at_k(doc_ids, example.gold_ids, RECALL_K) if doc_ids else None,
        "supported": trace.supported,
    }


def record_for(
    example: Example,
    trace: Any,
    seconds: float,
    *,
    cpu_seconds: float | None = None,
    tally: Tally | None = None,
    reused: PrefixReuse | None = None,
) -> dict[str, Any]:
    """The JSON line of one (question, method): scores on the extracted answer, retrieval facts and costs.

    With a call-cache ``tally``, ``seconds`` and ``cpu_seconds`` are *charged*: what was measured, with each LM
    call at the cost measured when it was computed (a call answered from the store is charged its original cost);
    ``charged`` and ``paid`` give the LM calls' share of both. A dynamic method computes every call; its prompt
    tokens taken from kept states (``reused``) are charged what they took when first evaluated, so a record costs
    the same whether or not an earlier answer left the state."""
    if tally is not None:
        seconds = seconds - tally.paid.seconds + tally.charged.seconds
        if cpu_seconds is not None:
            cpu_seconds = cpu_seconds - tally.paid.cpu_seconds + tally.charged.cpu_seconds
        charged, paid, hits, reused_tokens = tally.charged, tally.paid, tally.hits, tally.reused_tokens
    else:  # every call computed here (dynamic methods): charged is paid, and what came from kept states
        lm_stages = [s for s in trace.stages if s.prompt_tokens or s.completion_tokens]
        paid = Cost(
            sum(s.seconds for s in lm_stages),
            cpu_seconds or 0.0,  # the method's CPU time: its LM calls are nearly all of it
            sum(s.prompt_tokens for s in lm_stages),
            sum(s.completion_tokens for s in lm_stages),
            len(lm_stages),
        )
        reused = reused if reused is not None else PrefixReuse()
        from_states = reuse_cost(reused)
        charged, hits, reused_tokens = paid + from_states, 0, reused.tokens
        seconds += from_states.seconds
        if cpu_seconds is not None:
            cpu_seconds += from_states.cpu_seconds
    paid_json = paid.to_json() | {"cached_calls": hits, "reused_prompt_tokens": reused_tokens}
    costs: dict[str, Any] = {"charged": charged.to_json(), "paid": paid_json}
    if cpu_seconds is not None:
        costs["cpu_seconds"] = cpu_seconds
    return {
        "id": example.id,
        "dataset": example.dataset,
        "method": trace.method,
        "question": example.question,
        "answers": list(example.answers),
        **answer_fields(trace, example),
        "retrieved": trace.retrieved,
        "retrievals": trace.retrievals,
        "gate_score": trace.gate.score,
        "threshold": trace.gate.threshold,
        "prompt_tokens": sum(s.prompt_tokens for s in trace.stages),
        "completion_tokens": sum(s.completion_tokens for s in trace.stages),
        "overhead_tokens": sum(s.prompt_tokens + s.completion_tokens for s in trace.stages if s.overhead),
        "seconds": seconds,
        **costs,
        **_dynamic_fields(trace),
        "trace": trace.to_json(),
    }


def _dynamic_fields(trace: Any) -> dict[str, Any]:
    """Dynamic methods: where the first triggered retrieval happened (answer tokens kept before it, tokens
    generated before it); None when the trigger never fired."""
    info = getattr(trace, "dynamic", None)
    if info is None:
        return {}
    first = info.first_retrieval
    return {
        "first_retrieval_token": None if first is None else first.at_token,
        "tokens_before_first_retrieval": None if first is None else first.generated,
        "generated_tokens": info.generated_tokens,
    }


def error_record(example: Example, method: str, err: Exception) -> dict[str, Any]:
    return {
        "id": example.id,
        "dataset": example.dataset,
        "method": method,
        "error": f"{type(err).__name__}: {err}",
    }


def run_eval(
    config: EvalConfig,
    out_dir: Path,
    *,
    resume: bool = False,
    progress: bool = True,
    concurrency: int = 1,
    lm: Backend | None = None,
    retriever: Retriever | None = None,
    examples: Sequence[Example] | None = None,
    workers: int = 1,
    call_cache: Path | None = None,
    cache: bool = True,
    accept_rebuilt_index: bool = False,
    engine: str = "local",
    ray_address: str | None = None,
    ray_workers: int | None = None,
    ray_start_timeout: float = RAY_START_TIMEOUT,
) -> dict[str, Any]:
    """Run (or finish) ``config`` into ``out_dir``; returns the results dict also written to ``results.json``.

    ``lm`` / ``retriever`` / ``examples`` replace the configured model, index and dataset (tests, services; the
    caller keeps ownership and closes them); ``concurrency`` > 1 sends that many questions at once, for a remote
    (OpenAI-compatible) backend. ``workers`` > 1 shards the questions over that many processes, each pinned to
    its own core with a one-thread engine (:mod:`ragate.eval.workers`). Single-shot methods' LM calls go through
    a :class:`~ragate.eval.calls.CallCache`: each distinct call is computed once, in the store at ``call_cache``
    (default :func:`default_call_cache`), and charged to every method that makes it; ``cache=False`` computes
    every call (same predictions, every call paid). ``accept_rebuilt_index``: see :func:`ragate.eval.config.check_config`.
    ``engine="ray"`` sends the questions to Ray actors instead (``ray_workers`` of them; default one per CPU of the
    cluster), joining the cluster at ``ray_address`` or starting a local one (:mod:`ragate.eval.ray_engine`), which
    must answer within ``ray_start_timeout`` seconds (an address where nothing answers is refused before ``out_dir``
    is written).
    ``config.tuned`` (``ragate tune`` files) sets those methods' trigger thresholds and refuses to score any of
    their validation questions (:func:`ragate.eval.tunefile.check_tuned`).
    """
    out_dir = Path(out_dir)
    if config.tuned:  # each tune file sets its method's trigger threshold, as --threshold METHOD=TAU does
        from ragate.eval.tunefile import apply_tuned

        config = apply_tuned(config)
    # a dataset that cannot be found, or a cluster address where nothing answers: refused before the run directory
    # is written
    if examples is None:
        from ragate.eval.datasets import dataset_paths

        dataset_paths(config.dataset)
    if engine == "ray":
        reach_cluster(ray_address, ray_start_timeout)
    out_dir.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(out_dir / LOCK_FILE, f"run directory {out_dir}"):  # one writer at a time
        recorded, examples = open_run(
            config, out_dir, resume=resume, examples=examples, accept_rebuilt_index=accept_rebuilt_index
        )
        if not examples:
            raise RagateError(f"dataset {config.dataset!r} has no questions to evaluate")
        for m in config.methods:
            config.spec(m)  # unknown names fail here, before any work
        if workers < 1:
            raise RagateError(f"--workers must be >= 1, not {workers}")
        check_engine(
            engine, ray_address=ray_address, ray_workers=ray_workers, workers=workers,
            handed_in=lm is not None or retriever is not None, concurrency=concurrency,
            ray_start_timeout=ray_start_timeout,
        )  # fmt: skip
        if workers > 1 and engine == "local" and (lm is not None or retriever is not None or concurrency > 1):
            raise RagateError(
                "--workers above 1 opens a model per worker: not with a backend handed in or --concurrency"
            )
        _save_config(out_dir, config.to_json() | recorded)
        path = out_dir / "questions.jsonl"
        fold_parts(path)  # a multi-worker run killed before it could fold
        stored = latest(read_records(path))
        check_asked(stored, examples, path, config.methods)
        # failures are retried: a resumed run answers them again
        done = {(r["id"], r["method"]) for r in stored if "error" not in r}
        jobs = [
            (i, ex, m)
            for i, ex in config.mine(examples)
            for m in _rotated(config.methods, i)
            if (ex.id, m) not in done
        ]
        started = time.time()
        # taken before the work: the commit and build the answers are computed with, not whatever the checkout
        # holds when a long run ends; a resume that computes nothing keeps the recorded one
        prov = _kept_provenance(out_dir / "results.json", computed=bool(jobs)) or provenance(config)
        store = None if not cache else (call_cache or default_call_cache())
        if store is not None and jobs:  # a damaged or misplaced cache: refused before any model loads
            check_call_cache(store)
        if engine == "ray" and jobs:
            run_ray(
                config, jobs, path, store, Answering, address=ray_address, workers=ray_workers, progress=progress,
                start_timeout=ray_start_timeout,
            )  # fmt: skip
        elif workers > 1 and jobs:
            shares = [[j for j in jobs if j[0] % workers == w] for w in range(workers)]
            try:
                run_workers(
                    _answer_jobs,
                    [(config, share, part_path(path, w), store) for w, share in enumerate(shares)],
                    [part_path(path, w) for w in range(workers)],
                    total=len(jobs),
                    desc=f"eval {config.dataset} ({workers} workers)",
                    progress=progress,
                )
            finally:  # what the workers wrote is kept, even when one of them was killed
                fold_parts(path)
        elif jobs:
            _answer_jobs(
                config,
                jobs,
                path,
                store,
                lm=lm,
                retriever=retriever,
                progress=progress,
                concurrency=concurrency,
            )
        records = latest(read_records(path))
        times = _kept_times(out_dir / "results.json", computed=bool(jobs)) or {
            "started": started,
            "finished": time.time(),
        }
        results = {
            "config": config.to_json(),
            "questions": len(config.mine(examples)),
            "dataset_files": recorded["dataset_files"],
            "provenance": prov,
            **times,
            "calls": {"cache": None if store is None else str(store), "workers": workers}
            | ({"engine": "ray", "ray_workers": ray_workers} if engine == "ray" else {})
            | cost_totals(records),
            "summary": summarize(records, [m for m in config.methods]),
        }
        with atomic_writer(out_dir / "results.json") as f:
            f.write(json.dumps(results, indent=2).encode())
        with atomic_writer(out_dir / "results.md") as f:
            f.write(summary_markdown(results).encode())
        return results


def default_call_cache() -> Path:
    """Where LM calls are stored unless told otherwise: ``<ragate home>/calls.sqlite`` (shared by every run, so a
    sweep over the questions of an earlier eval pays almost nothing)."""
    from ragate.models import ragate_home

    return ragate_home() / "calls.sqlite"


def open_call_cache(
    lm: Backend, store: Path | None, config: EvalConfig, *, own: bool
) -> tuple[CallCache, CallStore | None]:
    """``lm`` wrapped so that each distinct call is computed once (into ``store``; None: every call computed in
    full, as before the store existed), keyed by the model file's sha256 when the run opened the model itself. With
    the store on, a computed prompt also starts from an earlier prompt's state where that is exact
    (:mod:`ragate.backends.prompt_states`)."""
    identity = f"{lm.engine}:{lm.model}"
    if own:
        info = model_identity(config.model, config.engine, config.base_url)
        where = info.get("path") or _urls(info.get("base_url"))
        identity = info.get("sha256") or f"{where}:{config.model}"
    opened = CallStore(store, check=False) if store is not None else None  # checked by check_call_cache
    return CallCache(lm, opened, identity, exact_prefixes=opened is not None), opened


class Opened:
    """The model, index and call store a run opened (``own_*``: which of them are its to close)."""

    lm: Backend
    retriever: Retriever | None
    opened: CallStore | None
    own_lm: bool
    own_retriever: bool

    def close(self) -> None:
        if self.opened is not None:
            self.opened.close()
        if self.own_retriever and self.retriever is not None:
            self.retriever.close()
        if self.own_lm:
            self.lm.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Answering(Opened):
    """What answering a run's questions needs, opened once: the model behind the call cache, the index, the
    methods' specs (a method the backend cannot serve is refused here, or runs with the fallback gate). The
    one-process run, each worker process and each Ray worker (:mod:`ragate.eval.ray_engine`) answer jobs with
    :meth:`record`. ``lm`` / ``retriever`` handed in stay the caller's."""

    def __init__(
        self,
        config: EvalConfig,
        store: Path | None,
        *,
        methods: Sequence[str] | None = None,
        lm: Backend | None = None,
        retriever: Retriever | None = None,
        concurrency: int = 1,
    ) -> None:
        self.config = config
        self.specs = {m: config.spec(m) for m in config.methods}
        self.own_lm, self.own_retriever = lm is None, retriever is None
        self.lm = lm or _open_lm(config, concurrency)
        self.retriever: Retriever | None = None
        self.opened: CallStore | None = None
        try:
            self.specs = {
                m: require(s, self.lm.capabilities, engine=self.lm.engine, fallback=config.fallback, rename=False)
                for m, s in self.specs.items()
            }
        except RagateError:
            self.close()
            raise
        self.retriever = retriever
        try:
            if retriever is None and any(self.specs[m].retrieves for m in (methods or config.methods)):
                self.retriever = _open_retriever(config)
            if self.retriever is not None:
                check_index(self.specs.values(), self.retriever)
            self.calls, self.opened = open_call_cache(self.lm, store, config, own=self.own_lm)
        except BaseException:
            self.close()
            raise
        # questions in flight share the process: each record is charged its own thread's CPU (the model computes
        # on the server); one at a time, the process's (a local engine computes in its own threads)
        self.clock = time.thread_time if concurrency > 1 else time.process_time
        self._warm = not self.own_lm  # a backend handed in is the caller's, warm or scripted
        self._warming = threading.Lock()

    def record(self, job: tuple[int, Example, str]) -> dict[str, Any]:
        """Answer one job (question index, example, method): its record, or an error record."""
        i, ex, method = job
        with self._warming:  # once, before the first answer, whichever thread comes first
            if not self._warm:
                _warm_up(self.lm, self.retriever, ex.question)
                self._warm = True
        spec = self.specs[method]
        # single-shot calls are computed once each; the dynamic loop keeps the engine's prefix reuse
        # (its first prompt started from a kept state where the call cache turns exact reuse on, as a Pipeline does)
        target: Backend = self.calls if spec.dynamic is None else self.lm
        self.lm.clear_cache()
        try:
            reuse = self.calls.prefix_reuse() if target is self.lm else nullcontext()
            with self.calls.tally() as tally, reuse as reused:
                start, cpu = time.perf_counter(), self.clock()
                trace = run_method(
                    spec, ex.question, target, self.retriever, seed=self.config.seed + i, dataset=ex.dataset,
                    early_exit=self.config.early_exit,
                )  # fmt: skip
                wall, cpu = time.perf_counter() - start, self.clock() - cpu
            counted = tally if target is self.calls else None
            return record_for(ex, trace, wall, cpu_seconds=cpu, tally=counted, reused=reused)
        except CallCacheError:
            raise  # the run's store, not this question: stop (answers so far are kept; --resume)
        except (RagateError, ValueError) as err:
            return error_record(ex, method, err)


def _answer_jobs(
    config: EvalConfig,
    jobs: Sequence[tuple[int, Example, str]],
    path: Path,
    store: Path | None,
    *,
    lm: Backend | None = None,
    retriever: Retriever | None = None,
    progress: bool = False,
    concurrency: int = 1,
) -> None:
    """Answer ``jobs`` (question index, example, method) and append one record each to ``path``."""
    answering = Answering(
        config, store, methods=sorted({m for _, _, m in jobs}), lm=lm, retriever=retriever, concurrency=concurrency
    )
    lock = threading.Lock()
    try:
        with (
            RecordWriter(path) as writer,
            tqdm(total=len(jobs), desc=f"eval {config.dataset}", unit="answer", disable=not progress) as bar,
        ):

            def work(job: tuple[int, Example, str]) -> None:
                record = answering.record(job)
                with lock:  # one writer and one bar, whichever thread finishes
                    writer.append(record)
                    bar.update(1)

            run_concurrently(work, jobs, concurrency)
    finally:
        answering.close()


def run_concurrently(work: Callable[[Any], None], jobs: Sequence[Any], concurrency: int) -> None:
    """``work(job)`` for every job, ``concurrency`` at a time (each job's own calls stay in order in its thread);
    one at a time in this thread when ``concurrency`` is 1. The first failure is raised once the pool stops."""
    if concurrency <= 1:
        for job in jobs:
            work(job)
        return
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(work, jobs))


def check_index(specs: Iterable[MethodSpec], retriever: Retriever, *, close: Sequence[Any] = ()) -> None:
    """Every method's needs of the index (DPR-AIS over a BM25 index is refused before any answer, not once per
    answer); on a refusal, ``close`` what the caller opened."""
    try:
        for spec in specs:
            require_index(spec, retriever)
    except RagateError:
        for opened in close:
            opened.close()
        raise


def _warm_up(lm: Backend, retriever: Retriever | None, question: str) -> None:
    """Load what loads lazily (the query encoder, the engine's first evaluation) before anything is timed, so the
    first question's first method does not pay for it."""
    from ragate.types import GenerationRequest, Message

    if retriever is not None:
        retriever.search([question], 1)
    # no alternatives asked: a server without logprobs refuses a request for them
    for engine in (lm, getattr(lm, "proxy", None)):  # a proxy gate's small model too (ragate.gates.proxy)
        if engine is not None:
            engine.generate([GenerationRequest((Message("user", question),), max_tokens=1, top_logprobs=0)])
            engine.clear_cache()


def _rotated(methods: Sequence[str], i: int) -> list[str]:
    k = i % len(methods)
    return list(methods[k:]) + list(methods[:k])


def timeout_note(seconds: float | None) -> dict[str, Any]:
    """``EvalConfig.extra`` for a client timeout of ``seconds`` per server call (none: the backend's default). A
    slow server (a CPU one under load) needs a longer one; it changes no answer, so a resume may change it."""
    return {"openai_timeout": float(seconds)} if seconds else {}


def server_options(
    concurrency: int, extra_body: dict[str, Any] | None, timeout: float | None
) -> dict[str, Any]:
    """An OpenAI-compatible backend's options for ``concurrency`` calls in flight (a connection each, at least
    4), with the server-specific request fields and the client timeout where given."""
    options: dict[str, Any] = {"max_concurrency": max(4, concurrency)}
    if extra_body:
        options["extra_body"] = extra_body
    if timeout:
        options["timeout"] = float(timeout)
    return options


def _open_lm(config: EvalConfig, concurrency: int = 1) -> Backend:
    """The run's model; a server backend with a connection for each of ``concurrency`` calls in flight."""
    from ragate.backends import load_backend
    from ragate.backends.threads import thread_options

    options: dict[str, Any] = {}
    if config.engine == "openai":
        timeout = config.extra.get("openai_timeout")
        options = {"base_url": config.base_url, **server_options(concurrency, config.extra_body, timeout)}
    else:  # threads change no computation (ragate.backends.threads): a note in extra, not compared on resume
        options = thread_options(config.engine, config.extra.get("threads"), config.extra.get("batch_threads"))
    lm = load_backend(config.model, config.engine, **options)
    from ragate.methods.proxy import attach_proxy

    try:  # a proxy gate's small model (ragate.gates.proxy), opened beside the answering one
        return attach_proxy(lm, [config.spec(m).gate for m in config.methods], threads=config.extra.get("threads"))
    except BaseException:
        lm.close()
        raise


def _open_retriever(config: EvalConfig) -> Retriever:
    from ragate.retrieval.demo import demo_index
    from ragate.retrieval.index import open_index

    return open_index(config.index or demo_index())
