"""Exact accuracy/retrieval frontiers in two passes (DESIGN.md section 1, "sweeps are exact and nearly free").

For a single-shot gate, neither the answer without retrieval nor the answer with it depends on the threshold.
Pass 1 computes, per question and per *family* (the methods that share prompts and selector), the closed-book
answer (the gate's "no" path: the draft reused), the retrieval answer (the "yes" path) and every gate's score
and default decision, once. Pass 2 is a lookup: at threshold tau a gate retrieves for the questions scoring
above tau, and its answer there is the retrieval answer, elsewhere the closed-book one. Every threshold, budget
and gate of the frontier costs nothing more.

Exactness: UGT's "no" answer *is* the greedy closed-book answer, so the lookup equals a direct run bit for bit
(tested). TARG's "no" answer is its 20-token draft continued, which equals the uninterrupted greedy answer up to
the engine's batch-vs-step arithmetic (rarely a different token). PAIRS and the LLM judge decide on text, not on
a threshold: their default point is their own decision; other thresholds use their scores (PAIRS: 1 when the
two answers disagree; judge: P(yes)). Dynamic methods (ETC, DRAGIN, ...) decide during generation and need a run
per threshold: they are not swept.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from ragate.errors import RagateError
from ragate.eval.calls import check_call_cache
from ragate.eval.config import EvalConfig, open_run
from ragate.eval.datasets import Example
from ragate.eval.provenance import provenance
from ragate.eval.ray_engine import RAY_START_TIMEOUT, check_engine, reach_cluster, run_ray
from ragate.eval.records import (
    RecordWriter,
    is_count,
    is_number,
    is_real,
    read_records,
    scores_fault,
    short,
    write_records,
)
from ragate.eval.run import (
    Opened,
    _open_lm,
    _open_retriever,
    answer_fields,
    check_index,
    default_call_cache,
    open_call_cache,
    run_concurrently,
)
from ragate.eval.rundir import LOCK_FILE, _kept_provenance, _save_config, check_asked, read_run_config
from ragate.eval.thresholds import threshold_for_budget
from ragate.eval.workers import fold_parts, part_path, run_workers
from ragate.fileio import atomic_writer, exclusive_lock
from ragate.gates.registry import get_gate
from ragate.methods import GateSpec, MethodSpec, decide, run_method
from ragate.methods.trace import Stage

BUDGETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def unswept(spec: MethodSpec) -> bool:
    """A gate whose decision ignores tau (never, always): the family's two answers are its only points."""
    return not get_gate(spec.gate.kind).thresholded


EXPANSIONS = ("hyde", "q2d", "cot")  # selectors whose generated query text is capped by expansion_max_tokens


def family_key(spec: MethodSpec) -> str:
    """Methods with the same prompts, selector and lengths share closed-book and retrieval answers. The
    pseudo-context cap is part of the key only where the selector writes one (not for "question")."""
    s = spec.selector
    key = (
        f"{spec.prompts.name}|{s.kind}|k={s.k}|n={s.n}|{s.score}|hyde={s.hyde_samples}|rep={s.repeats}"
        f"|ce={s.cross_encoder}|max={spec.max_tokens}"
    )
    if s.kind == "question":
        return key
    return f"{key}|pseudo={spec.expansion_max_tokens if s.kind in EXPANSIONS else spec.pseudo_max_tokens}"


def canonical_family(family: str) -> str:
    """A stored family key in today's form: sweeps written before 2026-11-26 put the pseudo-context cap in every
    key, also where the selector retrieves by the question alone and writes none."""
    parts = family.split("|")
    if len(parts) > 1 and parts[1] == "question" and parts[-1].startswith("pseudo="):
        return "|".join(parts[:-1])
    return family


def _answer(trace: Any, example: Example) -> dict[str, Any]:
    return answer_fields(trace, example) | {"seconds": trace.seconds, "tokens": trace.tokens}


def sweep_pass(
    config: EvalConfig,
    out_dir: Path,
    *,
    resume: bool = False,
    progress: bool = True,
    examples: Sequence[Example] | None = None,
    lm: Any = None,
    retriever: Any = None,
    workers: int = 1,
    call_cache: Path | None = None,
    cache: bool = True,
    accept_rebuilt_index: bool = False,
    concurrency: int = 1,
    engine: str = "local",
    ray_address: str | None = None,
    ray_workers: int | None = None,
    ray_start_timeout: float = RAY_START_TIMEOUT,
) -> list[dict[str, Any]]:
    """Pass 1 into ``out_dir/sweep.jsonl``: per (question, family) the two answers and every gate's score.

    ``concurrency``: (question, family) jobs in flight at once, for a server backend (each job's calls stay in
    order, so its record is the one a single job at a time writes).
    ``workers``, ``call_cache`` and ``cache`` as in :func:`ragate.eval.run.run_eval`: with the default shared
    store, a sweep over the questions of an earlier ``ragate eval`` with the same model reuses its calls;
    ``accept_rebuilt_index`` as in :func:`ragate.eval.config.check_config`; ``engine``, ``ray_address``,
    ``ray_workers`` and ``ray_start_timeout`` as in :func:`ragate.eval.run.run_eval`."""
    if config.fallback is not None:
        raise RagateError(
            f"--fallback {config.fallback} stands in for a gate in `ragate eval` and `serve`; a sweep scores each gate "
            f"it names, so sweep the stand-in itself (--methods {config.fallback})"
        )
    out_dir = Path(out_dir)
    # a cluster address where nothing answers: refused before the run directory is written
    if engine == "ray":
        reach_cluster(ray_address, ray_start_timeout)
    out_dir.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(out_dir / LOCK_FILE, f"run directory {out_dir}"):  # one writer at a time
        recorded, examples = open_run(
            config,
            out_dir,
            resume=resume,
            examples=examples,
            accept_rebuilt_index=accept_rebuilt_index,
            add_methods=True,
        )
        specs = {m: config.spec(m) for m in config.methods}
        if graded := [m for m, spec in specs.items() if spec.crag is not None]:
            raise RagateError(
                f"{', '.join(graded)}: CRAG-lite retrieves first and grades what it found, so it has no threshold to "
                "sweep; evaluate it with `ragate eval` (its one operating point joins `ragate report --budgets`)"
            )
        if dynamic := [m for m, spec in specs.items() if spec.dynamic is not None]:
            raise RagateError(
                f"{', '.join(dynamic)}: dynamic methods decide while generating, so their thresholds are not a lookup; "
                "sweep single-shot gates here and re-run dynamic methods with `ragate eval` at each threshold"
            )
        if workers < 1:
            raise RagateError(f"--workers must be >= 1, not {workers}")
        check_engine(
            engine, ray_address=ray_address, ray_workers=ray_workers, workers=workers,
            handed_in=lm is not None or retriever is not None, concurrency=concurrency,
            ray_start_timeout=ray_start_timeout,
        )  # fmt: skip
        if workers > 1 and (lm is not None or retriever is not None or concurrency > 1):
            raise RagateError(
                "--workers above 1 opens a model per worker: not with a backend handed in or --concurrency"
            )
        if concurrency < 1:
            raise RagateError(f"--concurrency must be >= 1, not {concurrency}")
        families = _families(specs)
        path = out_dir / "sweep.jsonl"
        fold_parts(path)
        done = {(r["id"], r["family"]): r for r in compact(path, rewrite=True)}
        check_asked(list(done.values()), examples, path)
        jobs = [
            (i, ex, fam, done.get((ex.id, fam)))
            for i, ex in config.mine(examples)
            for fam in families
            if _missing(done.get((ex.id, fam)), families[fam], specs)
        ]
        # what the last part that computed anything ran with: commit, packages, the model file's sha256 and the
        # llama.cpp build (pass 2 copies it into results.json); a resume with nothing to compute keeps it
        prov = _kept_provenance(out_dir / "config.json", computed=bool(jobs)) or provenance(config)
        _save_config(out_dir, config.to_json() | {"kind": "sweep", "provenance": prov} | recorded)
        store = None if not cache else (call_cache or default_call_cache())
        if store is not None and jobs:  # a damaged or misplaced cache: refused before any model loads
            check_call_cache(store)
        if engine == "ray" and jobs:
            run_ray(config, jobs, path, store, Sweeping, address=ray_address, workers=ray_workers,
                    progress=progress, desc="sweep", start_timeout=ray_start_timeout)  # fmt: skip
        elif workers > 1 and jobs:
            shares = [[j for j in jobs if j[0] % workers == w] for w in range(workers)]
            try:
                run_workers(
                    _sweep_jobs,
                    [(config, share, part_path(path, w), store) for w, share in enumerate(shares)],
                    [part_path(path, w) for w in range(workers)],
                    total=len(jobs),
                    desc=f"sweep {config.dataset} ({workers} workers)",
                    progress=progress,
                )
            finally:  # what the workers wrote is kept, even when one of them was killed
                fold_parts(path)
        elif jobs:
            _sweep_jobs(
                config,
                jobs,
                path,
                store,
                lm=lm,
                retriever=retriever,
                progress=progress,
                concurrency=concurrency,
            )
        return compact(path, rewrite=True)


def compact(path: Path, *, rewrite: bool = False) -> list[dict[str, Any]]:
    """The records of ``path``, one per (question, family): the last written, which holds every gate scored so
    far (a sweep that gained gates appends a fuller copy of a record). With ``rewrite`` (only the sweep itself,
    under the run's lock) the file is rewritten without the copies; readers leave it as it is."""
    records = read_records(path, repair=rewrite, check=sweep_fault)
    last: dict[tuple[str, str], dict[str, Any]] = {}
    for r in records:
        r["family"] = canonical_family(r["family"])
        last[r["id"], r["family"]] = r
    if rewrite and len(last) < len(records):
        write_records(path, last.values())
    return list(last.values())


def gate_cost(stages: Sequence[Stage]) -> dict[str, int]:
    """What deciding took, from the gate's stages: LM calls (a proxy model's included), the prompt and generated
    tokens of those calls, and searches (``retrieve`` stages)."""
    lm = [s for s in stages if s.prompt_tokens + s.completion_tokens > 0]
    return {
        "lm_calls": len(lm),
        "prompt_tokens": sum(s.prompt_tokens for s in lm),
        "decoded_tokens": sum(s.completion_tokens for s in lm),
        "searches": sum(s.name == "retrieve" for s in stages),
    }


def sweep_fault(record: dict[str, Any]) -> str | None:
    """What is wrong with one pass-1 record for pass 2 and its other readers (frontiers, SKR labels, calibration
    from a sweep), else None: its family and methods, the two answers and every gate's score (a gate may score
    +inf, an empty draft; never NaN)."""
    if not isinstance(record.get("family"), str) or not record["family"]:
        return f'"family" must be a family key, not {short(record.get("family"))}'
    methods = record.get("methods")
    if not isinstance(methods, list) or not all(isinstance(m, str) and m for m in methods):
        return f'"methods" must be a list of method names, not {short(methods)}'
    for side in ("closed", "open"):
        answer = record.get(side)
        if not isinstance(answer, dict) or not isinstance(answer.get("prediction"), str):
            return f'"{side}" must be an answer with a "prediction", not {short(answer)}'
        if (fault := scores_fault(answer.get("scores"), f"{side}.scores")) is not None:
            return fault
        if not is_number(answer.get("seconds")) or not is_count(answer.get("tokens")):
            return f'"{side}" needs "seconds" (a finite number) and "tokens" (a count)'
    if "question" in record and not isinstance(record["question"], str):
        return f'"question" must be the question\'s text, not {short(record["question"])}'
    gates = record.get("gates")
    if not isinstance(gates, dict):
        return f'"gates" must be an object of gate scores, not {short(gates)}'
    for method, gate in gates.items():
        if method not in methods:
            return f'"gates" scores {short(method)}, which is not one of the record\'s "methods"'
        if not _gate_ok(gate):
            return (
                f'"gates"."{method}" must be {{"score": a number (not NaN), "threshold": a finite number, '
                f'"retrieve": true or false, "seconds": a finite number}}, not {short(gate)}'
            )
    return None


def _gate_ok(gate: Any) -> bool:
    if not isinstance(gate, dict) or "threshold" not in gate:
        return False
    score, threshold = gate.get("score"), gate["threshold"]
    return (
        is_real(score)
        and (threshold is None or is_number(threshold))  # written to sweep.json as the default point's tau
        and isinstance(gate.get("retrieve"), bool)
        and is_number(gate.get("seconds"))
    )


def _missing(record: dict[str, Any] | None, methods: Sequence[str], specs: dict[str, MethodSpec]) -> bool:
    """Whether (question, family) still needs work: no record yet, or a gate of the family not scored in it."""
    if record is None:
        return True
    return any(m not in record["gates"] for m in methods if not unswept(specs[m]))


def _families(specs: dict[str, MethodSpec]) -> dict[str, list[str]]:
    families: dict[str, list[str]] = {}
    for m, spec in specs.items():
        families.setdefault(family_key(spec), []).append(m)
    return families


class Sweeping(Opened):
    """What pass 1 needs, opened once (the model behind the call cache, the index, the specs and their
    families); :meth:`record` scores one job. The one-process pass, each worker process and each Ray worker
    (:mod:`ragate.eval.ray_engine`) use it. ``lm`` / ``retriever`` handed in stay the caller's."""

    def __init__(
        self, config: EvalConfig, store: Path | None, *, lm: Any = None, retriever: Any = None, concurrency: int = 1
    ) -> None:
        self.config = config
        self.specs = {m: config.spec(m) for m in config.methods}
        self.families = _families(self.specs)
        self.own_lm, self.own_retriever = lm is None, retriever is None
        self.lm = lm or _open_lm(config, concurrency)
        self.retriever, self.opened = retriever, None
        try:
            self.retriever = retriever or _open_retriever(config)
            check_index(self.specs.values(), self.retriever)
            self.calls, self.opened = open_call_cache(self.lm, store, config, own=self.own_lm)
        except BaseException:
            self.close()
            raise

    def record(self, job: tuple[int, Example, str, dict[str, Any] | None]) -> dict[str, Any]:
        """Pass 1 for one job (question index, example, family, its stored record or None): a stored record keeps
        its two answers; only the gates it lacks are scored."""
        i, ex, fam, stored = job
        specs, calls, retriever = self.specs, self.calls, self.retriever
        base = specs[self.families[fam][0]]
        seed = self.config.seed + i
        if stored is None:
            closed = _answer(
                run_method(base.with_(gate=GateSpec("never")), ex.question, calls, retriever, seed=seed), ex
            )
            opened_answer = _answer(
                run_method(base.with_(gate=GateSpec("always")), ex.question, calls, retriever, seed=seed), ex
            )
        else:
            closed, opened_answer = stored["closed"], stored["open"]
        gates: dict[str, Any] = dict(stored["gates"]) if stored else {}
        for m in self.families[fam]:
            if unswept(specs[m]) or m in gates:
                continue
            stages: list[Stage] = []
            with calls.tally() as tally:
                start = time.perf_counter()
                d = decide(specs[m], ex.question, calls, retriever, seed=seed, stages=stages)
                wall = time.perf_counter() - start
            gates[m] = {
                "score": d.score,
                "threshold": d.threshold,
                "retrieve": d.retrieve,
                "seconds": wall - tally.paid.seconds + tally.charged.seconds,  # charged, as in eval
            } | gate_cost(stages)
        methods = list(dict.fromkeys([*(stored["methods"] if stored else ()), *self.families[fam]]))
        return {
            "id": ex.id,
            "question": ex.question,  # so that what reads the sweep needs no dataset file (learned gates, docs)
            "family": fam,
            "methods": methods,
            "closed": closed,
            "open": opened_answer,
            "gates": gates,
        }


def _sweep_jobs(
    config: EvalConfig,
    jobs: Sequence[tuple[int, Example, str, dict[str, Any] | None]],
    path: Path,
    store: Path | None,
    *,
    lm: Any = None,
    retriever: Any = None,
    progress: bool = False,
    concurrency: int = 1,
) -> None:
    """Pass 1 for ``jobs``, one record each appended to ``path``, ``concurrency`` jobs at a time."""
    sweeping = Sweeping(config, store, lm=lm, retriever=retriever, concurrency=concurrency)
    lock = threading.Lock()
    try:
        with (
            RecordWriter(path) as writer,
            tqdm(
                total=len(jobs), desc=f"sweep {config.dataset}", unit="question", disable=not progress
            ) as bar,
        ):

            def work(job: tuple[int, Example, str, dict[str, Any] | None]) -> None:
                record = sweeping.record(job)
                with lock:  # one writer and one bar, whichever thread finishes
                    writer.append(record)
                    bar.update(1)

            run_concurrently(work, jobs, concurrency)
    finally:
        sweeping.close()


def decisions(records: Sequence[dict[str, Any]], method: str, tau: float | None = None) -> list[bool]:
    """Per question, whether ``method`` retrieves at ``tau`` (None: its own default decision)."""
    out = []
    for r in records:
        g = r["gates"][method]
        out.append(bool(g["retrieve"]) if tau is None else g["score"] > tau)
    return out


def point(records: Sequence[dict[str, Any]], retrieve: Sequence[bool]) -> dict[str, float]:
    """Accuracy and retrieval rate when question i takes its retrieval answer iff ``retrieve[i]``."""
    chosen = [r["open"] if x else r["closed"] for r, x in zip(records, retrieve, strict=True)]
    out = {k: statistics.fmean(c["scores"][k] for c in chosen) for k in ("em", "f1", "acc")}
    out["retrieval_rate"] = statistics.fmean(float(x) for x in retrieve)
    return out


def method_records(records: Sequence[dict[str, Any]], method: str) -> list[dict[str, Any]]:
    rows = [r for r in records if method in r["methods"]]
    if not rows:
        raise RagateError(f"the sweep has no records for method {method!r}")
    return rows


def frontier(records: Sequence[dict[str, Any]], method: str) -> dict[str, Any]:
    """Every distinct operating point of ``method``'s gate, its default point, its best-EM point and its points
    at the standard budgets (tau = F^-1(1 - rho) on these questions' own scores)."""
    rows = [r for r in method_records(records, method) if method in r["gates"]]
    scores = np.array(finite_scores([r["gates"][method]["score"] for r in rows]))
    taus = [float(np.nextafter(scores.min(), -np.inf)), *sorted(set(scores.tolist()))]
    points = [{"tau": t} | point(rows, [s > t for s in scores]) for t in taus]
    default = {"tau": rows[0]["gates"][method]["threshold"]} | point(rows, decisions(rows, method))
    budgets = []
    for rho in BUDGETS:
        t = threshold_for_budget(scores.tolist(), rho)
        budgets.append({"budget": rho, "tau": t} | point(rows, [s > t for s in scores]))
    best = max(points, key=lambda p: (p["em"], -p["retrieval_rate"]))
    return {
        "method": method,
        "n": len(rows),
        "never": point(rows, [False] * len(rows)),
        "always": point(rows, [True] * len(rows)),
        "default": default,
        "best_em": best,
        "budgets": budgets,
        "points": points,
    }


def finite_scores(scores: Sequence[float]) -> list[float]:
    """Gate scores with +-inf (a gate's score for an empty draft) as +-1e300, beyond any real score: the order,
    and so every threshold's decisions (score > tau), stay the same, a budget's quantile becomes defined, and
    every tau (also one just below the smallest score) is a number JSON can write."""
    return np.clip(np.asarray(scores, dtype=np.float64), -1e300, 1e300).tolist()  # type: ignore[no-any-return]


def swept_methods(records: Sequence[dict[str, Any]]) -> list[str]:
    seen: dict[str, None] = {}
    for r in records:
        for m in r["gates"]:
            seen.setdefault(m, None)
    return list(seen)


def sweep_markdown(fronts: Sequence[dict[str, Any]], metric: str = "em") -> str:
    """The frontier table in ``metric`` (em, f1 or acc, in %): Never, Always, the default point, the best point
    of that metric over every threshold, and the points at budgets 0.2, 0.5 and 0.8."""
    if metric not in ("em", "f1", "acc"):
        raise RagateError(f"unknown metric {metric!r}: use em, f1 or acc")
    name = {"em": "EM", "f1": "F1", "acc": "acc"}[metric]
    head = (
        f"| gate method | n | Never {name} | Always {name} | default: rate / {name} | best {name} (rate, tau) "
        f"| {name} at budget 0.2 / 0.5 / 0.8 |"
    )
    lines = [head, "|---|---|---|---|---|---|---|"]
    for f in fronts:
        d = f["default"]
        b = max(f["points"], key=lambda p: (p[metric], -p["retrieval_rate"]))
        at = {p["budget"]: p for p in f["budgets"]}
        at_budgets = " / ".join(f"{100 * at[r][metric]:.1f}" for r in (0.2, 0.5, 0.8))
        lines.append(
            f"| {f['method']} | {f['n']} | {100 * f['never'][metric]:.1f} | {100 * f['always'][metric]:.1f} "
            f"| {d['retrieval_rate']:.2f} / {100 * d[metric]:.1f} "
            f"| {100 * b[metric]:.1f} ({b['retrieval_rate']:.2f}, {b['tau']:.4g}) "
            f"| {at_budgets} |"
        )
    return "\n".join(lines) + "\n"


def write_sweep(out_dir: Path, records: Sequence[dict[str, Any]], metric: str = "em") -> list[dict[str, Any]]:
    """Pass 2: every swept method's frontier into ``sweep.json`` (all metrics) and ``sweep.md`` (``metric``), and
    ``results.json``: what the records came from (the run's ``config.json``: configuration, dataset files with
    sha256, the last computing part's provenance with commit and model sha256), as an eval run has it."""
    out_dir = Path(out_dir)
    if not records:
        raise RagateError(
            f"{out_dir / 'sweep.jsonl'} holds no records: run pass 1 (`ragate sweep --dataset D --methods M "
            f"--out {out_dir}`), or --resume it"
        )
    fronts = [frontier(records, m) for m in swept_methods(records)]
    with atomic_writer(out_dir / "sweep.json") as f:
        f.write(json.dumps(fronts, indent=2).encode())
    with atomic_writer(out_dir / "sweep.md") as f:
        f.write(sweep_markdown(fronts, metric).encode())
    if (out_dir / "config.json").exists():
        saved = read_run_config(out_dir)
        results = {
            "kind": "sweep",
            "questions": len({r["id"] for r in records}),
            "records": len(records),
            "families": sorted({r["family"] for r in records}),
            "methods": [f["method"] for f in fronts],
        } | {
            k: saved[k]
            for k in ("dataset_files", "provenance", "provenance_history", "index_identity")
            if k in saved
        }
        results["config"] = {k: v for k, v in saved.items() if k not in results}
        with atomic_writer(out_dir / "results.json") as f:
            f.write(json.dumps(results, indent=2).encode())
    return fronts


def default_records(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per-question answers that a sweep already holds, in the shape of ``ragate eval`` records: each swept gate
    at its own default decision, and each registered method that never or always retrieves with a swept
    family's prompts, selector and lengths (``no-retrieval`` is the closed-book answer of the question family,
    ``standard-rag`` its retrieval answer, ``dtr-no-ugt`` the retrieval answer of DTR's family).

    Never/always rows are the very calls a direct ``ragate eval`` makes (pass 1 runs the method with that gate),
    so they equal it bit for bit; a gate's row equals it where its "no" answer is the closed-book one (UGT, the
    judge, random), and TARG's up to the rare token noted in the module docstring. Costs: ``seconds`` is the
    charged seconds of the answer (plus the gate's, for a gate: an upper bound where the draft starts the
    closed-book answer) and ``tokens`` its prompt + completion tokens; the sweep does not split them, so these
    records carry no prompt/completion split and are marked ``"from_sweep": True``."""
    from ragate.methods import METHODS

    families = dict.fromkeys(r["family"] for r in records)
    fixed = {
        name: (family_key(spec), spec.gate.kind == "always")
        for name, spec in METHODS.items()
        if unswept(spec) and spec.dynamic is None and spec.crag is None and spec.route is None
    }
    out: list[dict[str, Any]] = []
    for name, (family, retrieve) in fixed.items():
        if family in families:
            out += [_default_record(r, name, retrieve, None) for r in records if r["family"] == family]
    for m in swept_methods(records):
        out += [
            _default_record(r, m, bool(r["gates"][m]["retrieve"]), r["gates"][m])
            for r in method_records(records, m)
            if m in r["gates"]
        ]
    return out


def _default_record(
    row: dict[str, Any], method: str, retrieve: bool, gate: dict[str, Any] | None
) -> dict[str, Any]:
    answer = row["open"] if retrieve else row["closed"]
    return {
        "id": row["id"],
        "method": method,
        "prediction": answer["prediction"],
        "scores": answer["scores"],
        "retrieved": retrieve,
        "retrievals": int(retrieve),
        "gate_score": None if gate is None else gate["score"],
        "threshold": None if gate is None else gate["threshold"],
        "seconds": answer["seconds"] + (0.0 if gate is None else gate["seconds"]),
        "tokens": answer["tokens"],
        "from_sweep": True,
    }
