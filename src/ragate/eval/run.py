"""``ragate eval``: run methods over a dataset, one JSON line per (question, method) as it finishes, resumable.

A run directory holds
- ``config.json``: what was asked (dataset, methods, model, engine, index, thresholds, limit, seed); a resumed run
  must ask the same, or it is refused with the difference named;
- ``questions.jsonl``: one record per (question, method): the prediction, its scores, whether and how often it
  retrieved, the documents' ids, recall@k where gold passages are known, tokens, seconds, and the full Trace;
- ``results.json`` and ``results.md``, written (atomically) when the run completes: the summary table with
  bootstrap 95% intervals, package versions, model and index identity and the git commit.

Every question runs every method back to back in rotated order (machine drift hits all methods alike), and the
backend's prompt cache is cleared before each call, so no method is timed on another's prompt and a resumed run
gives the same answers as an uninterrupted one.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ragate.backends.base import Backend
from ragate.errors import RagateError
from ragate.eval.datasets import Example, load_dataset
from ragate.eval.metrics import extract_answer, recall_at_k, score
from ragate.eval.provenance import provenance
from ragate.eval.records import RecordWriter, latest, read_records
from ragate.eval.summary import summarize, summary_markdown
from ragate.fileio import atomic_writer
from ragate.methods import MethodSpec, get_method, run_method
from ragate.retrieval.types import Retriever

RECALL_K = 3


@dataclass(frozen=True)
class EvalConfig:
    """What a run asks for; saved as ``config.json`` and compared on ``--resume``."""

    dataset: str
    methods: tuple[str, ...]
    model: str | None = None
    engine: str = "llama.cpp"
    index: str | None = None
    limit: int | None = None
    seed: int = 0
    thresholds: tuple[tuple[str, float], ...] = ()  # (method, tau) overrides, e.g. from `ragate calibrate`
    base_url: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # free-form notes (not compared on resume)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["methods"] = list(self.methods)
        data["thresholds"] = dict(self.thresholds)
        return data

    def spec(self, method: str) -> MethodSpec:
        spec = get_method(method)
        tau = dict(self.thresholds).get(method)
        if tau is None:
            return spec
        if spec.dynamic is not None:
            return spec.with_(dynamic=replace(spec.dynamic, threshold=tau))
        return spec.with_(gate=replace(spec.gate, threshold=tau))


def check_config(config: EvalConfig, out_dir: Path, *, resume: bool) -> None:
    """Refuse to mix runs: an existing run directory needs ``resume``, and then the same configuration."""
    saved_path = out_dir / "config.json"
    if not saved_path.exists():
        return
    if not resume:
        raise RagateError(
            f"{out_dir} already holds a run: pass --resume to continue it, or choose another --out directory"
        )
    saved = json.loads(saved_path.read_text())
    now = config.to_json()
    for key in ("dataset", "methods", "model", "engine", "index", "limit", "seed", "thresholds", "base_url"):
        if saved.get(key) != now.get(key):
            raise RagateError(
                f"cannot resume {out_dir}: it was run with {key}={saved.get(key)!r}, now {key}={now.get(key)!r}; "
                "rerun with the same settings or use another --out directory"
            )


def answer_fields(trace: Any, example: Example) -> dict[str, Any]:
    """What an answer is worth: the extracted prediction, its scores, the documents read and their recall@k."""
    prediction = extract_answer(trace.answer)
    doc_ids = [h.id for h in trace.documents]
    return {
        "prediction": prediction,
        "scores": score(prediction, example.answers, example.kind, label=example.label),
        "doc_ids": doc_ids,
        f"recall@{RECALL_K}": recall_at_k(doc_ids, example.gold_ids, RECALL_K) if doc_ids else None,
    }


def record_for(example: Example, trace: Any, seconds: float) -> dict[str, Any]:
    """The JSON line of one (question, method): scores on the extracted answer, retrieval facts and costs."""
    return {
        "id": example.id,
        "dataset": example.dataset,
        "method": trace.method,
        "question": example.question,
        "answers": list(example.answers),
        **answer_fields(trace, example),
        "retrieved": trace.retrieved,
        "retrievals": sum(1 for s in trace.stages if s.name == "retrieve"),
        "gate_score": trace.gate.score,
        "threshold": trace.gate.threshold,
        "prompt_tokens": sum(s.prompt_tokens for s in trace.stages),
        "completion_tokens": sum(s.completion_tokens for s in trace.stages),
        "overhead_tokens": sum(s.prompt_tokens + s.completion_tokens for s in trace.stages if s.overhead),
        "seconds": seconds,
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
) -> dict[str, Any]:
    """Run (or finish) ``config`` into ``out_dir``; returns the results dict also written to ``results.json``.

    ``lm`` / ``retriever`` / ``examples`` replace the configured model, index and dataset (tests, services; the
    caller keeps ownership and closes them); ``concurrency`` > 1 sends that many questions at once, for a remote
    (OpenAI-compatible) backend.
    """
    out_dir = Path(out_dir)
    check_config(config, out_dir, resume=resume)
    examples = list(examples) if examples is not None else load_dataset(config.dataset, limit=config.limit)
    if not examples:
        raise RagateError(f"dataset {config.dataset!r} has no questions to evaluate")
    specs = {m: config.spec(m) for m in config.methods}  # unknown names fail here, before any work
    out_dir.mkdir(parents=True, exist_ok=True)
    if not (out_dir / "config.json").exists():
        with atomic_writer(out_dir / "config.json") as f:
            f.write(json.dumps(config.to_json(), indent=2).encode())
    path = out_dir / "questions.jsonl"
    # failures are retried: a resumed run answers them again
    done = {(r["id"], r["method"]) for r in latest(read_records(path)) if "error" not in r}
    jobs = [
        (i, ex, m)
        for i, ex in enumerate(examples)
        for m in _rotated(config.methods, i)
        if (ex.id, m) not in done
    ]
    started = time.time()
    own_lm, own_retriever = lm is None, retriever is None
    lm = lm or _open_lm(config)
    needs_index = any(specs[m].retrieves for m in config.methods)
    if retriever is None and needs_index:
        retriever = _open_retriever(config)
    if jobs and own_lm:  # a backend handed in is the caller's, warm or scripted
        _warm_up(lm, retriever, jobs[0][1].question)
    lock = threading.Lock()
    try:
        with (
            RecordWriter(path) as writer,
            tqdm(total=len(jobs), desc=f"eval {config.dataset}", unit="answer", disable=not progress) as bar,
        ):

            def work(job: tuple[int, Example, str]) -> None:
                i, ex, method = job
                lm.clear_cache()
                start = time.perf_counter()
                try:
                    trace = run_method(
                        specs[method], ex.question, lm, retriever, seed=config.seed + i, dataset=ex.dataset
                    )
                    record = record_for(ex, trace, time.perf_counter() - start)
                except (RagateError, ValueError) as err:
                    record = error_record(ex, method, err)
                with lock:  # one writer and one bar, whichever thread finishes
                    writer.append(record)
                    bar.update(1)

            if concurrency <= 1:
                for job in jobs:
                    work(job)
            else:
                with ThreadPoolExecutor(max_workers=concurrency) as pool:
                    list(pool.map(work, jobs))
    finally:
        if own_retriever and retriever is not None:
            retriever.close()
        if own_lm:
            lm.close()
    records = latest(read_records(path))
    results = {
        "config": config.to_json(),
        "questions": len(examples),
        "provenance": provenance(config),
        "started": started,
        "finished": time.time(),
        "summary": summarize(records, [m for m in config.methods]),
    }
    with atomic_writer(out_dir / "results.json") as f:
        f.write(json.dumps(results, indent=2).encode())
    with atomic_writer(out_dir / "results.md") as f:
        f.write(summary_markdown(results).encode())
    return results


def _warm_up(lm: Backend, retriever: Retriever | None, question: str) -> None:
    """Load what loads lazily (the query encoder, the engine's first evaluation) before anything is timed, so the
    first question's first method does not pay for it."""
    from ragate.types import GenerationRequest, Message

    if retriever is not None:
        retriever.search([question], 1)
    lm.generate([GenerationRequest((Message("user", question),), max_tokens=1)])
    lm.clear_cache()


def _rotated(methods: Sequence[str], i: int) -> list[str]:
    k = i % len(methods)
    return list(methods[k:]) + list(methods[:k])


def _open_lm(config: EvalConfig) -> Backend:
    from ragate.backends import load_backend

    options: dict[str, Any] = {"base_url": config.base_url} if config.engine == "openai" else {}
    return load_backend(config.model, config.engine, **options)


def _open_retriever(config: EvalConfig) -> Retriever:
    from ragate.retrieval.demo import demo_index
    from ragate.retrieval.index import open_index

    return open_index(config.index or demo_index())
