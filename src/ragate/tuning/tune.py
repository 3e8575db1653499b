"""``ragate tune``: a dynamic method's trigger threshold (ETC alpha, DRAGIN theta, FLARE theta) set on a validation split.

ETC section 3.2 (after Eq. 12): "alpha is a predefined threshold and will be tuned on the validation set"; FLARE
and DRAGIN tune theirs per dataset too. A dynamic method's threshold changes what the model writes next, so it
is not a lookup over stored answers (``ragate sweep``): every value of the grid is its own ``ragate eval`` run
over the validation questions, each an ordinary resumable run directory under ``out``. The value is then picked
for a target, the best validation accuracy (ties: fewer retrievals) or the retrievals per question nearest a
target count, and saved as a calibration file (``ragate eval|ask --calibration``, ``Pipeline(calibration=)``,
``ragate reproduce --calibration``) that records the validation questions, so that no run scores them with it.

Leaks are refused on both sides, by id and by text (:func:`text_digest`: NFKC, case-folded, white space folded,
"?" dropped, the rule SKR's label sets use):

- the tuner refuses validation questions that are in the test split: by default the first
  :data:`DEFAULT_TEST_LIMIT` questions of the dataset (the split the project's runs score: ``scripts/results.sh``
  ``LIMIT=300``), else ``--test-dataset/--test-offset/--test-limit``;
- a run given the file refuses to score any of its validation questions
  (:func:`ragate.eval.tunefile.check_tuned`, beside the file's format and checks).

Ids are compared only where both sides read the same dataset file (by sha256): ids are unique within a file,
not across files (the demo questions and 2WikiMultihopQA both number theirs 0, 1, ...). Texts are compared always.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragate.errors import RagateError
from ragate.eval.tunefile import (  # noqa: F401 (the tune file's names stay importable here)
    FORMAT,
    FORMAT_VERSION,
    METRICS,
    Target,
    apply_tuned,
    check_tuned,
    overlapping,
    parse_target,
    questions_span,
    read_tune,
    same_file,
    save_tune,
    shared_example,
    text_digest,
    validation_block,
)

if TYPE_CHECKING:
    from ragate.backends.base import Backend
    from ragate.eval.config import EvalConfig
    from ragate.eval.datasets import Example
    from ragate.methods.spec import MethodSpec
    from ragate.retrieval.types import Retriever

DEFAULT_TEST_LIMIT = 300  # the default test split: a dataset's first 300 questions (scripts/results.sh LIMIT)

# trigger -> (the parameter's name in its paper, the default grid, the range a value must lie in)
_ETC = ("alpha", (0.8, 1.0, 1.3, 1.6, 2.0), (0.0, math.inf))  # around the authors' config (1.3)
PARAMETERS: dict[str, tuple[str, tuple[float, ...], tuple[float, float]]] = {
    "etc": _ETC,
    "etc-1st": _ETC,
    "etc-no-smoothing": _ETC,
    "etc-fixed": _ETC,
    "etc-code": _ETC,
    "dragin": ("theta", (0.8, 1.0, 1.2, 1.5, 2.0), (0.0, math.inf)),  # around the authors' HotpotQA 1.2
    "flare": ("theta", (0.2, 0.3, 0.4, 0.5, 0.6), (0.0, 1.0)),  # a probability; TARG's 0.3 and 0.5, ours 0.4
    "targ-recheck": ("tau", (0.4, 0.6, 0.8, 1.0, 1.2), (0.0, math.inf)),  # mean entropy; TARG's 0.8
}


@dataclass(frozen=True)
class GridRow:
    """One value of the grid over the validation questions answered at every value: ``n`` of them, the mean
    EM/F1/acc (shares), retrievals per question, the share that retrieved at all, charged seconds per question,
    the answers that failed and the run directory."""

    value: float
    n: int
    em: float
    f1: float
    acc: float
    retrievals: float
    retrieval_rate: float
    seconds: float
    errors: int = 0
    run: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# -- pure parts: what is tuned, the grid, the target, the choice ------------------------------------------------


def tunable(spec: MethodSpec) -> tuple[str, tuple[float, ...] | None, tuple[float, float]]:
    """The parameter a dynamic method's trigger is tuned by, its default grid (None: give one) and the range a
    value must lie in; a :class:`RagateError` for a method with no trigger threshold."""
    from ragate.methods.triggers import NO_TRIGGER, default_threshold

    if spec.dynamic is None:
        raise RagateError(
            f"method {spec.name!r} is single-shot: its gate threshold is a lookup over stored answers, so set it "
            f"with `ragate calibrate --gate {spec.name}` (or `ragate sweep`), not `ragate tune`"
        )
    trigger = spec.dynamic.trigger
    if trigger == NO_TRIGGER:
        raise RagateError(
            f"method {spec.name!r} has no trigger (it never decides while writing): nothing to tune"
        )
    if trigger in PARAMETERS:
        return PARAMETERS[trigger]
    if default_threshold(trigger) is None:
        raise RagateError(
            f"method {spec.name!r}: its trigger {trigger!r} has no threshold to tune (it retrieves on a fixed "
            "schedule); tune etc, dragin, flare or targ-recheck"
        )
    return "threshold", None, (-math.inf, math.inf)  # a registered trigger: its grid is the user's


def parse_grid(text: str) -> tuple[float, ...]:
    """``"0.8,1.0,1.3"`` as values (each finite, duplicates dropped, ascending)."""
    values: list[float] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            value = float(part)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise RagateError(
                f"--grid {text!r}: {part!r} is not a finite number (write e.g. --grid 0.8,1.0,1.3)"
            )
        values.append(value)
    if not values:
        raise RagateError(f"--grid {text!r} holds no value: write e.g. --grid 0.8,1.0,1.3")
    return tuple(sorted(set(values)))


def check_grid(method: str, parameter: str, grid: Sequence[float], bounds: tuple[float, float]) -> None:
    """Every value finite and in the parameter's range (ETC's alpha > 0, FLARE's theta a probability)."""
    low, high = bounds
    for value in grid:
        if not math.isfinite(value) or not low < value <= high:
            what = f"in (0, {high:g}]" if math.isfinite(high) else f"> {low:g}"
            raise RagateError(f"{method}'s {parameter} must be {what}: {value!r} in the grid is not")


def grid_rows(
    runs: Mapping[float, Sequence[dict[str, Any]]], method: str, where: Mapping[float, str] | None = None
) -> list[GridRow]:
    """Each value's row over the questions answered without error at *every* value (a paired comparison: a
    question that failed at one value leaves all of them); ``runs`` maps a value to its run's records."""
    answered = {
        value: {r["id"]: r for r in records if r.get("method") == method and "error" not in r}
        for value, records in runs.items()
    }
    common = set.intersection(*(set(a) for a in answered.values())) if answered else set()
    if not common:
        raise RagateError(
            f"no validation question was answered by {method} at every value of the grid: see the errors in "
            + ", ".join(f"{d}/questions.jsonl" for d in (where or {}).values())
        )
    rows = []
    for value in sorted(runs):
        chosen = [answered[value][i] for i in sorted(common)]
        n = len(chosen)
        errors = sum(1 for r in runs[value] if r.get("method") == method and "error" in r)
        rows.append(
            GridRow(
                value=value,
                n=n,
                **{k: sum(float(r["scores"][k]) for r in chosen) / n for k in METRICS},
                retrievals=sum(int(r["retrievals"]) for r in chosen) / n,
                retrieval_rate=sum(1 for r in chosen if r["retrieved"]) / n,
                seconds=sum(float(r["seconds"]) for r in chosen) / n,
                errors=errors,
                run=(where or {}).get(value, ""),
            )
        )
    return rows


def _near(x: float) -> float:
    return round(x, 12)  # means over the same questions: equal up to float noise is a tie


def choose(rows: Sequence[GridRow], target: Target, metric: str, default: float | None = None) -> GridRow:
    """The row for ``target``. "best": the highest ``metric``; ties go to fewer retrievals per question, then to
    the value nearest the method's ``default``, then the smaller value. "retrievals": the retrievals per question
    nearest the target; ties go to the higher ``metric``, then fewer retrievals, then the smaller value."""
    if metric not in METRICS:
        raise RagateError(f"--metric must be one of {', '.join(METRICS)}, not {metric!r}")
    if not rows:
        raise RagateError("no grid value to choose from")

    def near_default(row: GridRow) -> float:
        return abs(row.value - default) if default is not None else 0.0

    if target.kind == "best":
        return min(
            rows, key=lambda r: (-_near(getattr(r, metric)), _near(r.retrievals), near_default(r), r.value)
        )
    assert target.retrievals is not None
    goal = target.retrievals
    return min(
        rows,
        key=lambda r: (
            _near(abs(r.retrievals - goal)),
            -_near(getattr(r, metric)),
            _near(r.retrievals),
            r.value,
        ),
    )


def table(rows: Sequence[GridRow], parameter: str, metric: str, chosen: float | None = None) -> str:
    """The grid as a Markdown table: value, n, the metric, retrieval rate, retrievals/q, s/q (chosen marked)."""
    lines = [
        f"| {parameter} | n | {metric.upper() if metric != 'acc' else 'acc'} | retrieval rate | retrievals/q | s/q | |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mark = "chosen" if chosen is not None and r.value == chosen else ""
        errors = f" ({r.errors} failed)" if r.errors else ""
        lines.append(
            f"| {r.value:g} | {r.n}{errors} | {100 * getattr(r, metric):.1f} | {r.retrieval_rate:.2f} "
            f"| {r.retrievals:.2f} | {r.seconds:.2f} | {mark} |"
        )
    return "\n".join(lines)


# -- the tuner --------------------------------------------------------------------------------------------------


def run_name(parameter: str, value: float) -> str:
    """A grid value's run directory under ``out``: ``alpha-1.3``."""
    return f"{parameter}-{value!r}"


def tune(
    *,
    method: str,
    dataset: str,
    out: str | Path,
    offset: int = 0,
    limit: int | None = None,
    grid: Sequence[float] | None = None,
    target: str | Target = "best",
    metric: str = "em",
    test_dataset: str | None = None,
    test_offset: int = 0,
    test_limit: int | None = DEFAULT_TEST_LIMIT,
    model: str | None = None,
    engine: str = "llama.cpp",
    base_url: str | tuple[str, ...] | None = None,
    index: str | None = None,
    seed: int = 0,
    progress: bool = True,
    workers: int = 1,
    concurrency: int = 1,
    call_cache: Path | None = None,
    cache: bool = True,
    extra_body: dict[str, Any] | None = None,
    openai_timeout: float | None = None,
    lm: Backend | None = None,
    retriever: Retriever | None = None,
    run_engine: str = "local",
    ray_address: str | None = None,
    ray_workers: int | None = None,
    ray_start_timeout: float = 30.0,
) -> dict[str, Any]:
    """Run ``method`` over the validation questions (``dataset`` after ``offset``, ``limit`` of them) once per
    value of ``grid`` (default: the trigger's, :data:`PARAMETERS`), each into ``out/<parameter>-<value>`` (an
    ordinary resumable ``ragate eval`` run: a rerun computes only what is missing), and pick the value for
    ``target`` ("best" on ``metric``, or "retrievals=R"). Refused before any model loads: validation questions
    in the test split (``test_dataset``, default ``dataset``, ``test_offset``/``test_limit``, default its first
    :data:`DEFAULT_TEST_LIMIT`). Returns the tune file's content (:func:`save_tune` writes it). ``lm`` /
    ``retriever``: ready-made ones (tests), which stay the caller's. ``run_engine="ray"`` answers each value's
    run on Ray actors (``ray_address``, ``ray_workers``, ``ray_start_timeout``; :mod:`ragate.eval.ray_engine`)."""
    from ragate.eval.config import EvalConfig
    from ragate.eval.datasets import dataset_files, load_dataset
    from ragate.eval.provenance import index_identity
    from ragate.eval.records import latest, read_records
    from ragate.eval.run import run_eval, timeout_note
    from ragate.methods import get_method
    from ragate.models import model_identity

    spec = get_method(method)
    parameter, default_grid, bounds = tunable(spec)
    if grid is None:
        if default_grid is None:
            raise RagateError(f"{method}'s trigger is not one of ragate's: give its values with --grid")
        grid = default_grid
    grid = tuple(sorted({float(g) for g in grid}))
    check_grid(method, parameter, grid, bounds)
    goal = parse_target(target) if isinstance(target, str) else target
    if metric not in METRICS:
        raise RagateError(f"--metric must be one of {', '.join(METRICS)}, not {metric!r}")
    common: dict[str, Any] = {
        "model": model, "engine": engine, "index": index, "limit": limit, "seed": seed, "base_url": base_url,
        "offset": offset, "extra_body": extra_body, "extra": timeout_note(openai_timeout),
    }  # fmt: skip
    examples = EvalConfig(dataset, (method,), **common).examples()
    if not examples:
        raise RagateError(f"no validation questions: {dataset!r} has none after --offset {offset}")
    validation = validation_block(examples)
    files = dataset_files(dataset)
    test_name = test_dataset or dataset
    test = EvalConfig(test_name, (method,), offset=test_offset, limit=test_limit).examples()
    by_id = same_file(files, dataset_files(test_name), dataset, test_name)
    if shared := overlapping(test, validation, by_id=by_id):
        default_split = test_dataset is None and test_offset == 0 and test_limit == DEFAULT_TEST_LIMIT
        which = f" (the default test split: the first {DEFAULT_TEST_LIMIT})" if default_split else ""
        after = test_offset + len(test)
        name = "name the test split you will evaluate on with --test-offset/--test-limit (and --test-dataset)"
        if after < len(load_dataset(test_name)):
            fix = (
                f"Tune on questions after the test split (--dataset {test_name} --offset {after}), or {name}"
            )
        else:
            fix = f"No question of {test_name} follows this test split: {name}"
        raise RagateError(
            f"{len(shared)} of the {len(examples)} validation questions ({questions_span(dataset, offset, len(examples))}) "
            f"are in the test split ({questions_span(test_name, test_offset, len(test))}{which}), {shared_example(shared)}: a "
            f"value tuned on test questions flatters the method on them. {fix}"
        )
    default = _default_value(spec)
    out = Path(out)
    runs: dict[float, list[dict[str, Any]]] = {}
    where: dict[float, str] = {}
    opened: list[
        Any
    ] = []  # the model and index this call opened: once for every value with answers to compute
    from contextlib import nullcontext

    from ragate.eval.ray_engine import check_engine, cluster

    check_engine(
        run_engine, ray_address=ray_address, ray_workers=ray_workers, workers=workers, handed_in=lm is not None,
        concurrency=concurrency, ray_start_timeout=ray_start_timeout,
    )  # fmt: skip
    todo = run_engine == "ray" and any(_missing(out / run_name(parameter, v), examples, method) for v in grid)
    try:
        with cluster(ray_address, ray_start_timeout) if todo else nullcontext():  # one cluster for every value with answers to compute
            for k, value in enumerate(grid, 1):
                run_dir = out / run_name(parameter, value)
                if progress:
                    print(f"[{k}/{len(grid)}] {method} {parameter} = {value:g}: {run_dir}", file=sys.stderr)
                config = EvalConfig(dataset, (method,), thresholds=((method, value),), **common)
                local = run_engine == "local"  # on Ray, each worker opens its own model
                if local and lm is None and workers == 1 and not opened and _missing(run_dir, examples, method):
                    mine = retriever is None  # a retriever handed in stays the caller's
                    lm, retriever = _open(config, spec, concurrency, retriever, examples[0].question)
                    opened += [lm] + ([retriever] if mine and retriever is not None else [])
                run_eval(
                    config, run_dir, resume=True, progress=progress, concurrency=concurrency, lm=lm,
                    retriever=retriever, workers=workers, call_cache=call_cache, cache=cache, engine=run_engine,
                    ray_address=ray_address, ray_workers=ray_workers, ray_start_timeout=ray_start_timeout,
                )  # fmt: skip
                runs[value] = latest(read_records(run_dir / "questions.jsonl"))
                where[value] = str(run_dir)
    finally:
        for thing in opened:
            thing.close()
    rows = grid_rows(runs, method, where)
    chosen = choose(rows, goal, metric, default)
    try:
        index_id = index_identity(index)
    except RagateError:
        index_id = {"path": index}
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "method": method,
        "trigger": spec.dynamic.trigger if spec.dynamic else None,
        "parameter": parameter,
        "tau": chosen.value,
        "objective": "tune",
        "target": str(goal),
        "metric": metric,
        "default": default,
        "grid": list(grid),
        "table": [r.to_json() for r in rows],
        "n": chosen.n,
        "dev": f"{dataset}[{offset}:{offset + len(examples)}]",
        "dev_em": chosen.em,
        "dev_retrieval_rate": chosen.retrieval_rate,
        "dev_retrievals_per_question": chosen.retrievals,
        "dev_metric": getattr(chosen, metric),
        "dataset": dataset,
        "offset": offset,
        "limit": limit,
        "dataset_files": files,
        "validation": validation,
        "test_split": {
            "dataset": test_name,
            "offset": test_offset,
            "limit": test_limit,
            "n": len(test),
            "rule": "given"
            if test_dataset is not None or test_offset or test_limit != DEFAULT_TEST_LIMIT
            else f"default: the first {DEFAULT_TEST_LIMIT} questions of the dataset",
        },
        "model": model,
        "engine": engine,
        "model_identity": model_identity(model, engine, base_url),
        "index": index,
        "index_identity": index_id,
        "seed": seed,
        "runs": str(out),
    }


def _missing(run_dir: Path, examples: Sequence[Example], method: str) -> bool:
    """Whether a grid value's run still has questions to answer (a finished one is only reread: no model)."""
    from ragate.eval.records import latest, read_records

    path = run_dir / "questions.jsonl"
    records = latest(read_records(path, repair=False)) if path.exists() else []
    done = {r["id"] for r in records if r.get("method") == method and "error" not in r}
    return any(ex.id not in done for ex in examples)


def _open(
    config: EvalConfig, spec: MethodSpec, concurrency: int, retriever: Retriever | None, question: str
) -> tuple[Backend, Retriever | None]:
    """The model (and the index, unless handed in) for every value of the grid, loaded once and warmed up as
    ``ragate eval`` warms up its own, so that no value's first answer pays for loading."""
    from ragate.eval.run import _open_lm, _open_retriever, _warm_up

    lm = _open_lm(config, concurrency)
    own = None
    try:
        if retriever is None and spec.retrieves:
            retriever = own = _open_retriever(config)
        _warm_up(lm, retriever, question)
    except BaseException:
        for thing in (lm, own):
            if thing is not None:
                thing.close()
        raise
    return lm, retriever


def _default_value(spec: MethodSpec) -> float | None:
    """The method's trigger threshold when none is set (ETC: the authors' alpha)."""
    from ragate.methods.triggers import default_threshold

    assert spec.dynamic is not None
    if spec.dynamic.threshold is not None:
        return spec.dynamic.threshold
    if PARAMETERS.get(spec.dynamic.trigger) is _ETC:  # EtcWatch keeps its own default (no default_threshold)
        from ragate.dynamic.etc import DEFAULT_ALPHA

        return DEFAULT_ALPHA
    return default_threshold(spec.dynamic.trigger)
