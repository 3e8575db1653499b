"""``ragate calibrate``: a method's threshold from its scores on dev questions (a retrieval budget) or from dev
accuracy, by scoring them or from a sweep's stored scores. The budget-to-threshold math and the calibration file's
checks are :mod:`ragate.eval.thresholds` (their names stay importable here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from tqdm.auto import tqdm

from ragate.errors import RagateError
from ragate.eval.config import EvalConfig
from ragate.eval.run import Opened, _open_lm, _open_retriever, timeout_note
from ragate.eval.thresholds import (  # noqa: F401 (most re-exported)
    check_budget_value,
    check_calibratable,
    check_calibration,
    conservative_threshold,
    cross_fitted_taus,
    halves,
    read_calibration,
    retrieval_rate,
    threshold_for_budget,
    threshold_from_scores,
)


def calibrate(
    *,
    method: str,
    dev: str,
    objective: Literal["budget", "em"] = "budget",
    budget: float | None = None,
    confidence: float | None = None,
    batch: int | None = None,
    limit: int | None = 200,
    model: str | None = None,
    engine: str = "llama.cpp",
    base_url: str | tuple[str, ...] | None = None,
    index: str | None = None,
    seed: int = 0,
    progress: bool = True,
    work_dir: Path | None = None,
    concurrency: int = 1,
    extra_body: dict[str, Any] | None = None,
    openai_timeout: float | None = None,
    gate_weights: str | None = None,
    run_engine: str = "local",
    ray_address: str | None = None,
    ray_workers: int | None = None,
    ray_start_timeout: float = 30.0,
) -> dict[str, Any]:
    """Score ``method``'s gate on the dev questions and pick tau: F^-1(1 - budget) (``objective="budget"``; with
    ``confidence``, the :func:`conservative_threshold` that keeps new questions' rate at most ``budget`` with that
    confidence), or the tau of the best dev EM over the exact frontier (``"em"``, which needs the closed-book
    and retrieval answers too, so it runs a sweep pass in ``work_dir``). Returns what ``ragate calibrate``
    saves. ``concurrency``: questions scored at once over a server backend (``base_url``). A gate that searches or
    embeds to decide reads ``index`` (default: the demo index); a trained gate reads ``gate_weights``.
    ``run_engine="ray"``: the scores (or the sweep pass) computed on Ray workers (``ray_address``, ``ray_workers``,
    ``ray_start_timeout``; :mod:`ragate.eval.ray_engine`), the same as here."""
    from concurrent.futures import ThreadPoolExecutor

    from ragate.eval.datasets import load_dataset
    from ragate.eval.ray_engine import check_engine, map_ray, one_thread
    from ragate.methods import get_method

    spec = get_method(method)
    check_calibratable(spec)
    check_engine(
        run_engine, ray_address=ray_address, ray_workers=ray_workers, workers=1, handed_in=False,
        concurrency=concurrency, ray_start_timeout=ray_start_timeout,
    )  # fmt: skip
    config = EvalConfig(
        dev, (method,), model, engine, index, limit, seed, base_url=base_url, extra_body=extra_body,
        extra=timeout_note(openai_timeout), gate_weights=gate_weights,
    )  # fmt: skip
    spec = config.spec(method)
    examples = load_dataset(dev, limit=limit)
    if not examples:
        raise RagateError(f"dev set {dev!r} has no questions")
    result: dict[str, Any] = {
        "method": method,
        "gate": spec.gate.kind,
        "objective": objective,
        "budget": budget,
        "dev": dev,
        "n": len(examples),
        "model": model,
        "engine": engine,
        "seed": seed,
    }
    if gate_weights is not None:
        from ragate.fileio import sha256_file

        result["gate_weights"] = {"path": str(Path(gate_weights).resolve()), "sha256": sha256_file(gate_weights)}
    if objective == "budget":
        if budget is None:
            raise RagateError("a budget calibration needs --budget RHO in [0, 1]")
        jobs = [(i, ex.question) for i, ex in enumerate(examples)]
        if run_engine == "ray":
            scores = map_ray(
                jobs, GateScores, (one_thread(config), method), address=ray_address, workers=ray_workers,
                progress=progress, desc=f"score {method}", start_timeout=ray_start_timeout,
            )  # fmt: skip
        else:
            with GateScores(config, method, concurrency) as scoring, tqdm(
                total=len(examples), desc=f"score {method}", disable=not progress
            ) as bar:

                def score(job: tuple[int, str]) -> float:
                    found = scoring.record(job)
                    bar.update(1)
                    return found

                with ThreadPoolExecutor(max_workers=concurrency) as pool:
                    scores = list(pool.map(score, jobs))
        found = threshold_from_scores(scores, budget, confidence=confidence, batch=batch)
        rate = found.pop("retrieval_rate")
        found = {k: v for k, v in found.items() if k not in ("budget", "n")}
        if "rate_interval" in found:
            found["rate_interval"] = list(found["rate_interval"])
        return result | found | {"dev_retrieval_rate": rate, "dev_em": None}
    from ragate.eval.sweep import frontier, sweep_pass

    work = (
        work_dir or Path("calibration") / ".work" / f"{method}-{Path(dev).stem}-{model or 'default'}-{limit}"
    )
    records = sweep_pass(
        config, work, resume=True, progress=progress, examples=examples, concurrency=concurrency,
        engine=run_engine, ray_address=ray_address, ray_workers=ray_workers, ray_start_timeout=ray_start_timeout,
    )  # fmt: skip
    best = frontier(records, method)["best_em"]
    return result | {"tau": best["tau"], "dev_retrieval_rate": best["retrieval_rate"], "dev_em": best["em"]}


class GateScores(Opened):
    """A gate's score of question i (with seed ``seed + i``, as ``ragate eval``), over the model and, for a gate
    that searches or embeds to decide, the index of ``config``, opened once: in this process, or in each Ray
    worker (:func:`ragate.eval.ray_engine.map_ray`)."""

    def __init__(self, config: EvalConfig, method: str, concurrency: int = 1) -> None:
        from ragate.gates.registry import get_gate

        self.spec, self.seed = config.spec(method), config.seed
        self.opened, self.own_lm, self.own_retriever = None, True, True
        gate = get_gate(self.spec.gate.kind)
        self.retriever = _open_retriever(config) if gate.reads_index or gate.needs_embeddings else None
        if self.retriever is not None and concurrency > 1:
            from ragate.retrieval.serial import SerialRetriever

            self.retriever = SerialRetriever(self.retriever)
        try:
            self.lm = _open_lm(config, concurrency)
        except BaseException:
            if self.retriever is not None:
                self.retriever.close()
            raise

    def record(self, job: tuple[int, str]) -> float:
        from ragate.methods import decide

        i, question = job
        return decide(self.spec, question, self.lm, self.retriever, seed=self.seed + i).score


def calibrate_from_sweep(
    run_dir: str | Path,
    method: str,
    budget: float | None,
    *,
    confidence: float | None = None,
    batch: int | None = None,
) -> dict[str, Any]:
    """tau for a retrieval ``budget`` from the scores a ``ragate sweep`` already computed for ``method``'s gate
    (no model call); the file records the sweep's model and engine, as a calibration of that model."""
    from ragate.eval.sweep import finite_scores
    from ragate.methods import get_method

    if budget is None:
        raise RagateError("--from-sweep sets tau for a budget: pass --budget RHO")
    spec = get_method(method)
    check_calibratable(spec)
    run_dir = Path(run_dir)
    config, records = _read_sweep(run_dir)
    rows = [r for r in records if method in r["methods"] and method in r["gates"]]
    if not rows:
        raise RagateError(
            f"{run_dir / 'sweep.jsonl'} holds no score of {method!r}: resume the sweep with --methods {method}"
        )
    scores = finite_scores([r["gates"][method]["score"] for r in rows])
    found = threshold_from_scores(scores, budget, confidence=confidence, batch=batch)
    rate, n = found.pop("retrieval_rate"), found.pop("n")
    found.pop("budget")
    if "rate_interval" in found:
        found["rate_interval"] = list(found["rate_interval"])
    return {
        "method": method, "gate": spec.gate.kind, "objective": "budget", "budget": budget, "dev": str(run_dir),
        "n": n, "model": config.get("model"), "engine": config.get("engine", "llama.cpp"), "seed": config.get("seed"),
        "source": "sweep",
    } | found | {"dev_retrieval_rate": rate, "dev_em": None}  # fmt: skip


def _read_sweep(run_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A ``ragate sweep`` directory's config and records; a folder without a sweep's config.json is an error."""
    from ragate.eval.rundir import read_run_config
    from ragate.eval.sweep import compact

    if not (run_dir / "config.json").is_file():
        raise RagateError(f"{run_dir} is not a sweep directory (no config.json): run `ragate sweep` first")
    return read_run_config(run_dir), compact(run_dir / "sweep.jsonl")


def calibrate_prefixes(
    gate: str,
    prefixes: tuple[int, ...],
    budget: float | None,
    *,
    from_sweep: str | Path | None = None,
    dev: str | None = None,
    limit: int | None = 200,
    model: str | None = None,
    engine: str = "llama.cpp",
    base_url: str | tuple[str, ...] | None = None,
    index: str | None = None,
    seed: int = 0,
    progress: bool = True,
    work_dir: Path | None = None,
    concurrency: int = 1,
    extra_body: dict[str, Any] | None = None,
    metric: str = "em",
    run_engine: str = "local",
    ray_address: str | None = None,
    ray_workers: int | None = None,
    ray_start_timeout: float = 30.0,
) -> dict[str, Any]:
    """k and tau together for a retrieval ``budget`` (TARG A.8; :func:`ragate.tuning.prefixes.choose_prefix`): from
    a sweep that scored every ``gate@k=...`` of the grid (no model call), or by sweeping the ``dev`` questions into
    ``work_dir`` (the two answers once per question, a draft per k; on Ray with ``run_engine="ray"``). Returns the chosen method's calibration
    file, with the grid's rows under ``prefixes``."""
    from ragate.eval.sweep import sweep_pass
    from ragate.tuning.prefixes import choose_prefix, prefix_method

    if budget is None:
        raise RagateError("--prefixes chooses k and tau for a budget: pass --budget RHO")
    methods = tuple(prefix_method(gate, k) for k in prefixes)
    if from_sweep is not None:
        saved, records = _read_sweep(Path(from_sweep))
        model, engine = saved.get("model"), saved.get("engine", "llama.cpp")
        seed = saved.get("seed", seed)  # the sweep's, which drew its answers, not the command line's
        source, n_dev = str(Path(from_sweep)), None
    else:
        from ragate.eval.datasets import load_dataset

        if dev is None:
            raise RagateError("--prefixes needs --dev DATASET or --from-sweep RUN_DIR")
        config = EvalConfig(
            dev, methods, model, engine, index, limit, seed, base_url=base_url, extra_body=extra_body
        )
        examples = load_dataset(dev, limit=limit)
        if not examples:
            raise RagateError(f"dev set {dev!r} has no questions")
        work = work_dir or Path("calibration") / ".work" / f"{gate}-prefixes-{Path(dev).stem}-{model or 'default'}"
        records = sweep_pass(
            config, work, resume=True, progress=progress, examples=examples, concurrency=concurrency,
            engine=run_engine, ray_address=ray_address, ray_workers=ray_workers,
            ray_start_timeout=ray_start_timeout,
        )  # fmt: skip
        source, n_dev = dev, len(examples)
    found = choose_prefix(records, gate, prefixes, budget, metric)
    chosen = found["chosen"]
    return {
        "method": chosen["method"], "gate": chosen["method"], "objective": "budget", "budget": budget,
        "dev": source, "n": found["n"] if n_dev is None else min(n_dev, found["n"]), "model": model,
        "engine": engine, "seed": seed, "tau": chosen["tau"], "bound": "plain quantile F^-1(1 - budget) (TARG 3.3)",
        "prefix": chosen["k"], "prefixes": found["prefixes"], "dev_retrieval_rate": chosen["retrieval_rate"],
        "dev_em": chosen.get("em"), "metric": metric,
        "chosen_by": f"the best dev {metric} at the budget over the prefix grid, ties to the shorter draft (TARG A.8)",
    }  # fmt: skip
