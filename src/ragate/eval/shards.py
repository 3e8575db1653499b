"""A run split across machines: ``--shard i/n`` answers every n-th question from the i-th, and :func:`fold_runs`
merges the shards' directories into one run directory, as if one machine had run them all.

A shard is a whole run directory of its own (``config.json`` with ``"shard": "i/n"``, resumable). Question j keeps
its place in the whole run, so its seed is ``seed + j`` on any machine and the folded answers are those of the
unsharded run. Folding refuses shards that are not one run: another configuration (any setting but the shard and
the servers), another dataset file (by sha256), another index (by its files' digest), another model (a local
model file's sha256, or a server's model name), a missing or doubled shard, or one that has not finished.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ragate.errors import RagateError
from ragate.eval.config import parse_shard
from ragate.fileio import atomic_writer

# settings that may differ between shards: where each machine keeps its files, which servers it asked, and what
# the run computed them with (recorded per shard in "folded_from")
_LOCAL = frozenset(
    {
        "shard", "base_url", "index", "skr_labels", "cross_encoder", "provenance", "provenance_history",
        "index_rebuilds", "extra", "dataset_files", "index_identity", "skr_label_set", "gate_weights",
        "gate_weights_file",
    }
)  # fmt: skip


def _identity(config: dict[str, Any]) -> dict[str, Any]:
    """What must be the same in every shard beyond the settings: the files and the model the answers came from."""
    model = (config.get("provenance") or {}).get("model") or {}
    index = config.get("index_identity") or {}
    return {
        "dataset sha256": [f.get("sha256") for f in config.get("dataset_files") or []],
        "index": index.get("files_sha256") or index.get("passages_sha256"),
        "model": model.get("sha256") or model.get("model"),
        "skr labels": (config.get("skr_label_set") or {}).get("content_sha256"),
        "gate weights": (config.get("gate_weights_file") or {}).get("sha256"),
    }


def fold_runs(dirs: Sequence[Path], out: Path) -> str:
    """Fold the shard directories ``dirs`` (every shard of one run, each finished) into the run directory ``out``;
    returns the run's kind ("eval" or "sweep"). ``out`` then reads, reports and resumes as an unsharded run."""
    from ragate.eval.rundir import LOCK_FILE, read_run_config
    from ragate.fileio import exclusive_lock

    if len(dirs) < 2:
        raise RagateError("--fold needs the directories of every shard of a run (at least two)")
    out = Path(out)
    if (out / "config.json").exists():
        raise RagateError(f"{out} already holds a run: fold into a new --out directory")
    configs = []
    for d in dirs:
        if not (Path(d) / "config.json").is_file():
            raise RagateError(
                f"{d} is not a run directory (no config.json): give the shards' --out directories"
            )
        configs.append(read_run_config(Path(d)))
    shards: dict[int, Path] = {}
    total = None
    for d, config in zip(dirs, configs, strict=True):
        if not config.get("shard"):
            raise RagateError(
                f"{d} is not a shard (its config.json has no shard): fold only --shard I/N runs"
            )
        i, n = parse_shard(config["shard"])
        if total is not None and n != total:
            raise RagateError(
                f"{d} is shard {i}/{n}, but another is of {total}: fold the shards of one split"
            )
        if i in shards:
            raise RagateError(f"{shards[i]} and {d} are both shard {i}/{n}: give each shard once")
        total, shards[i] = n, Path(d)
    assert total is not None
    if missing := [f"{i}/{total}" for i in range(total) if i not in shards]:
        raise RagateError(f"shard {', '.join(missing)} missing: give every shard's directory to --fold")
    first = configs[0]
    for d, config in zip(dirs[1:], configs[1:], strict=True):
        for key in sorted((set(first) | set(config)) - _LOCAL):
            if first.get(key) != config.get(key):
                raise RagateError(
                    f"{d} was run with {key}={config.get(key)!r} but {dirs[0]} with {key}={first.get(key)!r}: "
                    "the shards are not one run, so their answers cannot be folded"
                )
        for what, value in _identity(config).items():
            if value != (was := _identity(first)[what]):
                raise RagateError(
                    f"{d} read another {what} than {dirs[0]} ({short_id(value)} vs {short_id(was)}): the shards' "
                    "answers come from different files or models, so they cannot be folded into one run"
                )
    kind = "sweep" if first.get("kind") == "sweep" else "eval"
    name = "sweep.jsonl" if kind == "sweep" else "questions.jsonl"
    merged = _merged(dirs, configs, name, kind)
    out.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(out / LOCK_FILE, f"run directory {out}"):
        folded = {k: v for k, v in first.items() if k != "shard"} | {
            "folded_from": [
                {"dir": str(Path(d).resolve()), "shard": c["shard"], "provenance": c.get("provenance")}
                for d, c in zip(dirs, configs, strict=True)
            ]
        }
        from ragate.eval.records import write_records

        write_records(out / name, merged)
        if kind == "sweep":
            from ragate.eval.sweep import compact, write_sweep

            with atomic_writer(out / "config.json") as f:
                f.write(json.dumps(folded, indent=2).encode())
            write_sweep(out, compact(out / name))
        else:
            _write_results(out, dirs, folded, merged)
    return kind


def short_id(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _merged(
    dirs: Sequence[Path], configs: Sequence[dict[str, Any]], name: str, kind: str
) -> list[dict[str, Any]]:
    """Every shard's records, refusing an unfinished shard and a record two shards both hold."""
    from ragate.eval.records import latest, read_records
    from ragate.eval.sweep import compact
    from ragate.eval.workers import unfolded

    merged: list[dict[str, Any]] = []
    seen: dict[tuple[str, str], Path] = {}
    for d, config in zip(dirs, configs, strict=True):
        path = Path(d) / name
        finished = (Path(d) / ("sweep.json" if kind == "sweep" else "results.json")).is_file()
        if not finished or unfolded(path):
            raise RagateError(
                f"{d} (shard {config['shard']}) has not finished: rerun its command with --resume there, then fold"
            )
        records = compact(path) if kind == "sweep" else latest(read_records(path, repair=False))
        if kind == "eval":
            _check_complete(Path(d), config, records)
        for r in records:
            key = (r["id"], r["family"] if kind == "sweep" else r["method"])
            if key in seen:
                raise RagateError(
                    f"{seen[key]} and {d} both answer question {key[0]!r} ({key[1]}): they are not shards of one "
                    "split; fold each shard once"
                )
            seen[key] = Path(d)
            merged.append(r)
    return merged


def _check_complete(d: Path, config: dict[str, Any], records: Sequence[dict[str, Any]]) -> None:
    """An eval shard holds one record for each of its questions and methods (``results.json`` counts its
    questions): a record lost from ``questions.jsonl`` (a deleted or cut line) refuses the fold."""
    from ragate.eval.rundir import read_results

    methods = list(config.get("methods") or [])
    questions = int(read_results(d).get("questions") or 0)
    have = {(r["id"], r["method"]) for r in records}
    if len(have) >= questions * len(methods):
        return
    ids = {r["id"] for r in records}
    lacking = sorted(f"{i} ({m})" for i in ids for m in methods if (i, m) not in have)
    named = f", e.g. {', '.join(lacking[:3])}" if lacking else ""
    raise RagateError(
        f"{d} (shard {config['shard']}) holds {len(have)} answers for its {questions} questions x {len(methods)} "
        f"methods = {questions * len(methods)}{named}: records are missing from {d / 'questions.jsonl'}; rerun "
        "its command with --resume there (it answers what is missing), then fold"
    )


def _write_results(
    out: Path, dirs: Sequence[Path], config: dict[str, Any], records: list[dict[str, Any]]
) -> None:
    """An eval run's ``config.json``, ``results.json`` and ``results.md`` from the shards' own results: the first
    shard's provenance (the others' in ``folded_from``), the earliest start and the latest finish."""
    from ragate.eval.rundir import cost_totals, read_results
    from ragate.eval.summary import summarize, summary_markdown

    results = [read_results(Path(d)) for d in dirs]
    with atomic_writer(out / "config.json") as f:
        f.write(json.dumps(config, indent=2).encode())
    saved = {k: v for k, v in config.items() if k in results[0].get("config", {})}
    folded = {
        "config": saved,
        "questions": sum(int(r.get("questions") or 0) for r in results),
        "dataset_files": config.get("dataset_files"),
        "provenance": results[0]["provenance"],
        "started": min(float(r.get("started") or 0) for r in results),
        "finished": max(float(r.get("finished") or 0) for r in results),
        "calls": {"cache": None, "workers": None, "shards": len(results)} | cost_totals(records),
        "summary": summarize(records, list(config["methods"])),
        "folded_from": config["folded_from"],
    }
    with atomic_writer(out / "results.json") as f:
        f.write(json.dumps(folded, indent=2).encode())
    with atomic_writer(out / "results.md") as f:
        f.write(summary_markdown(folded).encode())
