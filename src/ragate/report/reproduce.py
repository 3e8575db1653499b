"""``ragate reproduce NAME``: rerun one table of a paper with ragate and print the paper's numbers beside ours.

A pack (``ragate/eval/packs/NAME.json``) holds the table's numbers, copied from the paper with its table and page,
the paper's setting (model, retriever, corpus, n, top-k) and, per row, the ragate method that implements it.
:func:`reproduce` runs the rows' methods on each of the table's datasets that ragate has (``ragate eval`` for a
method at its defaults, ``ragate sweep`` for a gate compared at the paper's retrieval rate, since a threshold is
not comparable across models), then puts each paper number beside ragate's with its bootstrap 95% interval over
the questions, and the setting differences in a second table. Every run is an ordinary resumable run directory
under ``out``, so a killed reproduction goes on where it stopped.
"""

from __future__ import annotations

import functools
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from ragate.errors import RagateError
from ragate.eval.metrics import DEFAULT_BOOT, Resampling, bootstrap_ci
from ragate.fileio import atomic_writer, parse_json

METRICS = ("em", "f1", "acc")


def pack_names() -> list[str]:
    """The packs that ship with ragate."""
    folder = resources.files("ragate.eval") / "packs"
    return sorted(p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json"))


def load_pack(name: str) -> dict[str, Any]:
    """The pack ``name``, checked for what :func:`reproduce` reads (a damaged data file names itself)."""
    names = pack_names()
    if name not in names:
        raise RagateError(f"no reproduction pack {name!r}: ragate has {', '.join(names)}")
    source = resources.files("ragate.eval") / "packs" / f"{name}.json"
    pack = parse_json(source.read_text(encoding="utf-8"), str(source), RagateError, "reinstall ragate")
    rows = pack.get("rows") if isinstance(pack, dict) else None
    ok = isinstance(rows, list) and all(
        isinstance(r, dict)
        and isinstance(r.get("dataset"), str)
        and isinstance(r.get("label"), str)
        and r.get("point") in ("default", "rate")
        and isinstance(r.get("paper"), dict)
        for r in rows
    )
    if not ok or pack.get("kind") not in ("eval", "sweep") or not isinstance(pack.get("datasets"), list):
        raise RagateError(f"{source} is not a reproduction pack (kind, datasets, rows); reinstall ragate")
    return pack  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Row:
    """One row of the side-by-side table: the paper's numbers and ragate's (None where not run)."""

    dataset: str
    label: str
    method: str | None
    paper: dict[str, float | None]
    ours: dict[str, float] = field(default_factory=dict)
    interval: tuple[float, float] | None = None  # the bootstrap 95% interval of ragate's first metric
    n: int = 0
    note: str = ""
    # at a paper's retrieval rate: the tau of each half of the questions (halves 0 and 1, each set on the other
    # half's scores) and each question's decision, by id, as the row's numbers were computed from them
    taus: tuple[float, float] | None = None
    decisions: dict[str, bool] = field(default_factory=dict)


def _rows(pack: dict[str, Any], model: str | None) -> list[dict[str, Any]]:
    """The pack's rows of one paper model (default: its first); rows name a model only in multi-model tables."""
    models = [r["model"] for r in pack["rows"] if r.get("model")]
    if not models:
        return list(pack["rows"])
    chosen = model or pack.get("default_model") or models[0]
    if chosen not in models:
        raise RagateError(
            f"{pack['name']} has no rows of model {chosen!r}: it reports {', '.join(dict.fromkeys(models))}"
        )
    return [r for r in pack["rows"] if r.get("model") == chosen]


def _side(row: dict[str, Any]) -> str | None:
    """In a sweep pack, the baselines are the swept family's own answers: never (closed) and always (open)."""
    return row.get("sweep_side")


def reproduce(
    name: str,
    out: Path,
    *,
    limit: int | None = None,
    datasets: Sequence[str] = (),
    methods: Sequence[str] = (),
    paper_model: str | None = None,
    model: str | None = None,
    engine: str = "llama.cpp",
    base_url: str | tuple[str, ...] | None = None,
    index: str | None = None,
    seed: int = 0,
    concurrency: int = 1,
    workers: int = 1,
    progress: bool = True,
    call_cache: Path | None = None,
    cache: bool = True,
    extra_body: dict[str, Any] | None = None,
    openai_timeout: float | None = None,
    calibration: Sequence[str | Path] = (),
) -> dict[str, Any]:
    """Run pack ``name``'s protocol into ``out`` (one run directory per dataset and kind) and return the table
    (also written to ``out/reproduce.json`` and ``out/reproduce.md``). ``calibration``: ``ragate tune`` files;
    each runs its dynamic method at the tuned trigger threshold on the dataset of the file's test split, in a run
    directory of its own (``DATASET-tuned-METHOD``) that refuses to score a validation question."""
    from ragate.eval.config import EvalConfig
    from ragate.eval.records import latest, read_records
    from ragate.eval.run import run_eval, timeout_note
    from ragate.eval.sweep import sweep_pass
    from ragate.methods import get_method

    pack = load_pack(name)
    rows = _rows(pack, paper_model)
    here = {d["paper"]: d for d in pack["datasets"]}
    known = {d.get("ragate") for d in pack["datasets"]} | {d["paper"] for d in pack["datasets"]}
    if unknown := [d for d in datasets if d not in known]:
        raise RagateError(f"{name} has no dataset {', '.join(unknown)}: it reports {', '.join(sorted(here))}")
    for m in methods:
        get_method(m)  # a typo fails before any work
    tuned = _tuned_files(calibration, pack, rows)
    out = Path(out)
    results: list[Row] = []
    running: dict[str, Any] = {  # how each dataset's runs go: resumed where they stopped
        "resume": True, "progress": progress, "workers": workers, "concurrency": concurrency,
        "call_cache": call_cache, "cache": cache,
    }  # fmt: skip
    for paper_ds, info in here.items():
        ds_rows = [r for r in rows if r["dataset"] == paper_ds]
        wanted = not datasets or paper_ds in datasets or info.get("ragate") in datasets
        if not ds_rows or not wanted:
            continue
        if info.get("ragate") is None:
            why = info.get("why_missing") or "not in the shared data"
            results += [
                Row(paper_ds, r["label"], r.get("method"), r["paper"], note=f"not run: {why}")
                for r in ds_rows
            ]
            continue
        dataset = info["ragate"]
        runnable = [r for r in ds_rows if r.get("method") and (not methods or r["method"] in methods)]
        swept = {
            r["method"]
            for r in runnable
            if r["point"] == "rate" or (pack["kind"] == "sweep" and not _side(r))
        }
        evaluated = {r["method"] for r in runnable if r["point"] == "default" and not _side(r)} - swept
        tuned_here = {m: t for (ds, m), t in tuned.items() if ds == dataset and m in evaluated}
        evaluated -= set(tuned_here)
        common: dict[str, Any] = {
            "model": model,
            "engine": engine,
            "index": index,
            "limit": limit,
            "seed": seed,
            "base_url": base_url,
            "extra_body": extra_body,
            "extra": timeout_note(openai_timeout),
        }
        sweep_records: list[dict[str, Any]] = []
        if swept or any(_side(r) for r in runnable):
            gates = sorted(swept) or [m for m in pack.get("sweep_methods", [])]
            config = EvalConfig(dataset, tuple(gates), **common)
            sweep_records = sweep_pass(config, out / f"{dataset}-sweep", **running)
        eval_records: list[dict[str, Any]] = []
        if evaluated:
            config = EvalConfig(dataset, tuple(sorted(evaluated)), **common)
            run_eval(config, out / f"{dataset}-eval", **running)
            eval_records = latest(read_records(out / f"{dataset}-eval" / "questions.jsonl"))
        notes: dict[str, str] = {}
        for method, (path, t) in sorted(tuned_here.items()):  # its own run: other thresholds, other answers
            config = EvalConfig(dataset, (method,), tuned=(str(path),), **common)
            run_eval(config, out / f"{dataset}-tuned-{method}", **running)
            eval_records += latest(read_records(out / f"{dataset}-tuned-{method}" / "questions.jsonl"))
            notes[method] = f"{t['parameter']} = {t['tau']:g} tuned on {t['dev']} ({Path(path).name})"
        for r in ds_rows:
            if not r.get("method"):
                results.append(
                    Row(paper_ds, r["label"], None, r["paper"], note="no ragate method for this row")
                )
            elif r not in runnable:
                results.append(
                    Row(paper_ds, r["label"], r["method"], r["paper"], note="not asked (--methods)")
                )
            else:
                row = _ours(r, paper_ds, sweep_records, eval_records, pack)
                if row.method in notes:
                    row = replace(row, note="; ".join(x for x in (notes[row.method], row.note) if x))
                results.append(row)
    table = {
        "pack": name,
        "paper": pack.get("paper"),
        "table": pack.get("table"),
        "page": pack.get("page"),
        "paper_model": paper_model or pack.get("default_model") or _first_model(pack),
        "rows": [
            r.__dict__
            | {"interval": list(r.interval) if r.interval else None, "taus": list(r.taus) if r.taus else None}
            for r in results
        ],
        "settings": settings_rows(pack, model=model, engine=engine, index=index, limit=limit, rows=results),
        "notes": pack.get("notes", []),
    }
    out.mkdir(parents=True, exist_ok=True)
    with atomic_writer(out / "reproduce.json") as f:
        f.write(json.dumps(table, indent=2).encode())
    with atomic_writer(out / "reproduce.md") as f:
        f.write(markdown(table).encode())
    return table


def _tuned_files(
    paths: Sequence[str | Path], pack: dict[str, Any], rows: Sequence[dict[str, Any]]
) -> dict[tuple[str, str], tuple[str | Path, dict[str, Any]]]:
    """The ``ragate tune`` files by (dataset, method): each for a method of the pack's rows on a dataset the pack
    runs (the file's test split names it), one per pair; anything else is refused before any work."""
    from ragate.eval.tunefile import read_tune

    datasets = [d["ragate"] for d in pack["datasets"] if d.get("ragate")]
    out: dict[tuple[str, str], tuple[str | Path, dict[str, Any]]] = {}
    for path in paths:
        t = read_tune(path)
        method, dataset = t["method"], t["test_split"]["dataset"]
        if method not in {r.get("method") for r in rows}:
            raise RagateError(
                f"{path} tunes {method!r}, which is no row of {pack['name']} (its methods: "
                f"{', '.join(sorted({r['method'] for r in rows if r.get('method')}))})"
            )
        if dataset not in datasets:
            raise RagateError(
                f"{path} was tuned for the test split of {dataset!r}, which {pack['name']} does not run (it runs "
                f"{', '.join(datasets)}): tune on a validation split of one of them (ragate tune --dataset D "
                "--offset N)"
            )
        if (dataset, method) in out:
            raise RagateError(
                f"two tune files for {method} on {dataset}: {out[dataset, method][0]} and {path}"
            )
        out[dataset, method] = (path, t)
    return out


def _first_model(pack: dict[str, Any]) -> Any:
    model = (pack.get("paper_setting") or {}).get("model")
    return model[0] if isinstance(model, list) else model


def _ours(
    row: dict[str, Any],
    paper_ds: str,
    sweep: Sequence[dict[str, Any]],
    evals: Sequence[dict[str, Any]],
    pack: dict[str, Any],
    boot: Resampling = DEFAULT_BOOT,
) -> Row:
    """ragate's numbers for one paper row: its method's answers (eval), the swept family's never/always answers,
    or the swept gate at the paper's retrieval rate (tau = F^-1(1 - rate), cross-fitted: each half of the questions
    at the tau of the other half's scores, so no question sets its own threshold)."""
    from ragate.eval.sweep import finite_scores
    from ragate.eval.thresholds import cross_fitted_taus, halves

    method, side = row["method"], _side(row)
    note = ""
    tau_of: tuple[float, float] | None = None
    decided: dict[str, bool] = {}
    swept = any(method in r["gates"] for r in sweep)
    evaluated = any(r.get("method") == method for r in evals)
    if side or row["point"] == "rate" or pack["kind"] == "sweep" or (swept and not evaluated):
        family = [r for r in sweep if method in r["gates"]] if not side else _family(sweep, method)
        if not family:
            return Row(paper_ds, row["label"], method, row["paper"], note="the sweep holds no answer for it")
        if side:
            method = (
                f"{'never' if side == 'closed' else 'always'}@{family[0]['family'].split('|')[0]}"  # prompts
            )
            chosen = [r[side] for r in family]
            retrieved = [side == "open"] * len(family)
        else:
            rate = row["paper"].get("retrieval_rate")
            scores = finite_scores([r["gates"][method]["score"] for r in family])
            if rate is None or row["point"] == "default":
                retrieved = [bool(r["gates"][method]["retrieve"]) for r in family]
                note = "ragate's default threshold" + (" (the paper gives no rate)" if rate is None else "")
            elif len(scores) < 2:
                return Row(
                    paper_ds, row["label"], method, row["paper"],
                    note="too few questions to set tau apart from the scored ones (needs 2)",
                )  # fmt: skip
            else:
                half = halves([r["id"] for r in family])
                taus = cross_fitted_taus(scores, float(rate), half)
                retrieved = [s > tau for s, tau in zip(scores, taus, strict=True)]
                tau_of = (taus[half.index(0)], taus[half.index(1)])
                decided = {str(r["id"]): x for r, x in zip(family, retrieved, strict=True)}
                note = (
                    f"at the paper's rate {rate:g} (tau {tau_of[0]:.4g} / {tau_of[1]:.4g}: each half of the "
                    "questions decided at the tau of the other half's scores)"
                )
            chosen = [r["open"] if x else r["closed"] for r, x in zip(family, retrieved, strict=True)]
        values = {k: [c["scores"][k] for c in chosen] for k in METRICS}
    else:
        answers = [r for r in evals if r.get("method") == method and "error" not in r]
        if not answers:
            return Row(paper_ds, row["label"], method, row["paper"], note="every answer failed: see its run")
        values = {k: [r["scores"][k] for r in answers] for k in METRICS}
        retrieved = [bool(r["retrieved"]) for r in answers]
    ours = {k: 100 * statistics.fmean(v) for k, v in values.items()}
    ours["retrieval_rate"] = statistics.fmean(float(x) for x in retrieved)
    first = next(m for m in pack.get("metrics", ["em"]) if m in METRICS)
    low, high = bootstrap_ci(values[first], samples=boot.samples, seed=boot.seed)
    return Row(
        paper_ds, row["label"], method, row["paper"], ours, (100 * low, 100 * high), len(retrieved), note,
        tau_of, decided,
    )  # fmt: skip


def rescored(out: Path, boot: Resampling) -> dict[str, Any]:
    """``out/reproduce.json`` with each measured row computed again from the records the run keeps under ``out``
    (its sweeps' and evals' answers: nothing is run or asked of a model), its interval drawn as ``boot`` says: the
    row as ``ragate reproduce`` would write it today from the same answers (a row written by an older ragate, e.g.
    before its threshold was cross-fitted, is brought up to date whole, never given an interval of other answers).
    A tuned row keeps its note (the tune file it names is not in the run)."""
    from ragate.eval.records import latest, read_records
    from ragate.eval.sweep import compact

    table = json.loads((out / "reproduce.json").read_text(encoding="utf-8"))
    pack = load_pack(table["pack"])
    pack_rows = _rows(pack, table["paper_model"])
    rows = {(r["dataset"], r["label"]): r for r in pack_rows}
    if len(rows) < len(pack_rows):
        raise RagateError(f"pack {table['pack']} names a (dataset, row label) twice: its rows cannot be matched")
    ragate_name = {d["paper"]: d.get("ragate") for d in pack["datasets"]}

    @functools.cache
    def answers(dataset: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """A dataset's sweep and eval records under ``out``, read once for all its rows."""
        sweep = out / f"{dataset}-sweep" / "sweep.jsonl"
        evals = [
            r for d in (out / f"{dataset}-eval", *sorted(out.glob(f"{dataset}-tuned-*")))
            if (d / "questions.jsonl").is_file() for r in latest(read_records(d / "questions.jsonl"))
        ]  # fmt: skip
        return (compact(sweep) if sweep.is_file() else []), evals

    for row in table["rows"]:
        if row["interval"] is None:
            continue
        if (row["dataset"], row["label"]) not in rows:
            raise RagateError(
                f"{out}: pack {table['pack']} has no row {row['label']!r} of {row['dataset']} any more: run "
                f"`ragate reproduce {table['pack']}` again with --out {out}"
            )
        sweep, evals = answers(ragate_name[row["dataset"]])
        again = _ours(rows[row["dataset"], row["label"]], row["dataset"], sweep, evals, pack, boot)
        if again.interval is None:
            raise RagateError(
                f"{out}: its records give no answers for the row {row['label']!r} of {row['dataset']} "
                f"({again.note or 'none found'}): run `ragate reproduce {table['pack']}` again with --out {out}"
            )
        note = row["note"] if "tuned on" in row["note"] else again.note
        row |= {
            "method": again.method, "ours": again.ours, "interval": list(again.interval), "n": again.n, "note": note,
            "taus": list(again.taus) if again.taus else None,
        }  # fmt: skip
    return table


def _family(sweep: Sequence[dict[str, Any]], method: str) -> list[dict[str, Any]]:
    """The records of the first swept family (a sweep pack's baselines come from its gates' family)."""
    families = sorted({r["family"] for r in sweep})
    return [r for r in sweep if r["family"] == families[0]] if families else []


def settings_rows(
    pack: dict[str, Any],
    *,
    model: str | None,
    engine: str,
    index: str | None,
    limit: int | None,
    rows: Sequence[Row],
) -> list[dict[str, Any]]:
    """The paper's setting against this run's: model, retriever, corpus, questions, documents read."""
    from ragate.eval.provenance import index_identity

    paper = pack.get("paper_setting") or {}
    try:
        ix = index_identity(index)
    except RagateError:
        ix = {}
    encoder = ix.get("encoder") or {}
    encoder_name = encoder.get("name") if isinstance(encoder, dict) else encoder
    corpus = ix.get("corpus") or {}
    corpus_text = corpus.get("name") if isinstance(corpus, dict) else corpus
    ns = sorted({r.n for r in rows if r.n})
    return [
        {"setting": "model", "paper": paper.get("model"), "here": f"{model or 'smollm2-135m'} ({engine})"},
        {
            "setting": "retriever",
            "paper": paper.get("retriever"),
            "here": f"{ix.get('kind')} index, {encoder_name}",
        },
        {
            "setting": "corpus",
            "paper": paper.get("corpus"),
            "here": f"{corpus_text or ix.get('path')} ({ix.get('passages')} passages)",
        },
        {
            "setting": "questions per dataset",
            "paper": paper.get("n"),
            "here": ", ".join(map(str, ns)) + (f" (--limit {limit})" if limit else "") if ns else None,
        },
        {
            "setting": "documents read",
            "paper": paper.get("top_k"),
            "here": "each method's default (docs/methods.md)",
        },
        {
            "setting": "decoding",
            "paper": paper.get("decoding"),
            "here": "greedy; each method's paper defaults",
        },
    ]


def _num(value: Any, scale: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if scale == "rate" else f"{value:.1f}"


def markdown(table: dict[str, Any]) -> str:
    """The side-by-side table, then the setting differences and the pack's notes."""
    lines = [
        f"# {table['pack']}: {table['paper']}, {table['table']}"
        + (f" (page {table['page']})" if table["page"] else ""),
        "",
        (
            f"Paper rows of {table['paper_model']}. ragate's interval is the bootstrap 95% interval over its questions; "
            "'in' means the paper's number lies inside it."
        ),
        "",
        (
            "| dataset | paper row | ragate method | n | paper EM | ragate EM [95%] | | paper F1 | ragate F1 "
            "| paper rate | ragate rate | note |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table["rows"]:
        paper, ours, ci = r["paper"], r["ours"], r["interval"]
        metric = "em" if paper.get("em") is not None else "acc"
        where = ""
        if ci and paper.get(metric) is not None:
            where = (
                "in" if ci[0] <= paper[metric] <= ci[1] else ("above" if paper[metric] > ci[1] else "below")
            )
        ours_metric = f"{ours[metric]:.1f} [{ci[0]:.1f}, {ci[1]:.1f}]" if ours and ci else "-"
        lines.append(
            f"| {r['dataset']} | {r['label']} | {r['method'] or '-'} | {r['n'] or '-'} | {_num(paper.get(metric))} "
            f"| {ours_metric} | {where} | {_num(paper.get('f1'))} | {_num(ours.get('f1'))} "
            f"| {_num(paper.get('retrieval_rate'), 'rate')} | {_num(ours.get('retrieval_rate'), 'rate')} | {r['note']} |"
        )
    lines += ["", "## Setting differences", "", "| setting | paper | here |", "|---|---|---|"]
    for s in table["settings"]:
        paper = ", ".join(map(str, s["paper"])) if isinstance(s["paper"], list) else s["paper"]
        lines.append(f"| {s['setting']} | {paper if paper is not None else '-'} | {s['here'] or '-'} |")
    if table["notes"]:
        lines += ["", "## Notes from the pack", ""] + [f"- {n}" for n in table["notes"]]
    return "\n".join(lines) + "\n"
