"""Thresholds from a retrieval budget (TARG section 3.3) or from dev accuracy.

Every gate's score is oriented so that a higher score means "retrieve" and the gate retrieves iff score > tau
(``GateDecision``). A budget rho (the share of questions allowed to retrieve) gives tau = F^-1(1 - rho), the
empirical (1 - rho)-quantile of the dev scores, so that at most a share rho of the dev questions score above it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from tqdm.auto import tqdm

from ragate.errors import RagateError


def threshold_for_budget(scores: Sequence[float], budget: float) -> float:
    """tau = F^-1(1 - budget) over ``scores`` (TARG section 3.3), the inverted-CDF quantile: the smallest score
    s with F(s) >= 1 - budget, so the share of scores strictly above tau is at most ``budget``.

    A budget of 1 returns a value below every score (always retrieve), 0 the largest score (never retrieve).
    """
    if not 0.0 <= budget <= 1.0:
        raise ValueError(f"budget must be a share of questions in [0, 1], got {budget}")
    values = np.asarray(scores, dtype=np.float64)
    if values.size == 0:
        raise ValueError("no dev scores to calibrate on: score at least one question first")
    if not np.all(np.isfinite(values)):
        raise ValueError("dev scores contain NaN or infinity: check the gate's drafts")
    if budget >= 1.0:
        return float(np.nextafter(values.min(), -np.inf))
    return float(np.quantile(values, 1.0 - budget, method="inverted_cdf"))


def retrieval_rate(scores: Sequence[float], tau: float) -> float:
    """The share of ``scores`` above ``tau``: the rate a gate with that threshold retrieves at."""
    values = np.asarray(scores, dtype=np.float64)
    return float(np.mean(values > tau)) if values.size else 0.0


def calibrate(
    *,
    method: str,
    dev: str,
    objective: Literal["budget", "em"] = "budget",
    budget: float | None = None,
    limit: int | None = 200,
    model: str | None = None,
    engine: str = "llama.cpp",
    base_url: str | None = None,
    index: str | None = None,
    seed: int = 0,
    progress: bool = True,
    work_dir: Path | None = None,
) -> dict[str, Any]:
    """Score ``method``'s gate on the dev questions and pick tau: F^-1(1 - budget) (``objective="budget"``), or
    the tau of the best dev EM over the exact frontier (``"em"``, which needs the closed-book and retrieval
    answers too, so it runs a sweep pass in ``work_dir``). Returns what ``ragate calibrate`` saves."""
    from ragate.eval.datasets import load_dataset
    from ragate.eval.run import EvalConfig, _open_lm
    from ragate.methods import decide, get_method

    spec = get_method(method)
    if spec.gate.kind in ("never", "always"):
        raise RagateError(
            f"method {method!r} has no gate threshold to calibrate (its gate is {spec.gate.kind!r})"
        )
    config = EvalConfig(dev, (method,), model, engine, index, limit, seed, base_url=base_url)
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
    if objective == "budget":
        if budget is None:
            raise RagateError("a budget calibration needs --budget RHO in [0, 1]")
        lm = _open_lm(config)
        try:
            scores = [
                decide(spec, ex.question, lm, None, seed=seed + i).score
                for i, ex in enumerate(tqdm(examples, desc=f"score {method}", disable=not progress))
            ]
        finally:
            lm.close()
        tau = threshold_for_budget(scores, budget)
        return result | {"tau": tau, "dev_retrieval_rate": retrieval_rate(scores, tau), "dev_em": None}
    from ragate.eval.sweep import frontier, sweep_pass

    work = (
        work_dir or Path("calibration") / ".work" / f"{method}-{Path(dev).stem}-{model or 'default'}-{limit}"
    )
    records = sweep_pass(config, work, resume=True, progress=progress, examples=examples)
    best = frontier(records, method)["best_em"]
    return result | {"tau": best["tau"], "dev_retrieval_rate": best["retrieval_rate"], "dev_em": best["em"]}
