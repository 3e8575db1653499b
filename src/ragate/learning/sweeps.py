"""Labelled questions read from a sweep's pass-1 records: what every fit on a sweep reads (:func:`sweep_questions`,
:func:`sweep_model`: the learned gate's rows, the no-model gate's fit) and SKR's label set (``ragate skr fit``,
:func:`fit_labels`; the gate is gates/skr.py).

SKR's labels are read from one method family's records (default: the family the ``skr`` method answers with, so
that a label says what *its* closed-book and retrieval answers scored), the questions from the dataset file the
sweep read (checked by sha256), and their embeddings from the index's encoder. The sweep's model is recorded,
by file sha256, so that a label set is refused with another model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ragate.errors import RagateError
from ragate.eval.config import EvalConfig
from ragate.eval.datasets import dataset_files
from ragate.eval.records import read_records
from ragate.eval.rundir import read_run_config
from ragate.eval.sweep import canonical_family, family_key, sweep_fault
from ragate.gates.skr import LabelSet, needs_retrieval
from ragate.methods import get_method
from ragate.models import DEFAULT_MODEL, model_identity


def _records(sweep_dir: Path) -> list[dict[str, Any]]:
    """The sweep's pass-1 records, those still in a worker's part file included, each (id, family) once: the
    last written (a sweep that gained gates appends fuller copies)."""
    files = [sweep_dir / "sweep.jsonl", *sorted(sweep_dir.glob("sweep.part*.jsonl"))]
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for path in files:
        for r in read_records(path, repair=False, check=sweep_fault):
            r["family"] = canonical_family(r["family"])
            seen[r["id"], r["family"]] = r
    return list(seen.values())


@dataclass(frozen=True)
class SweepQuestions:
    """What a fit reads from a sweep: its ``config.json`` (``saved``), the run's :class:`EvalConfig`, the dataset
    files (checked by sha256; as the sweep recorded them where its records hold their questions), ``family``'s
    records (each (id, family) once) and the question of each record id (from the records where each holds its
    own, else from the dataset file)."""

    saved: dict[str, Any]
    config: EvalConfig
    files: list[dict[str, Any]]
    family: str
    records: list[dict[str, Any]]
    questions: dict[str, str]


def sweep_questions(
    sweep_dir: Path, *, family: str | None, metric: str, method: str, what: str = "SKR's labels"
) -> SweepQuestions:
    """The records of ``family`` (default: ``method``'s) in the sweep ``sweep_dir`` and their questions, checked:
    a sweep (not an eval run), records of that family scored by ``metric``, the dataset file the sweep read."""
    config_path = sweep_dir / "config.json"
    if not config_path.is_file():
        raise RagateError(
            f"{sweep_dir} holds no sweep (no config.json): run `ragate sweep ... --out {sweep_dir}`"
        )
    saved = read_run_config(sweep_dir)
    if "dataset" not in saved or "methods" not in saved:
        raise RagateError(f"{config_path} names no dataset or methods: restore it, or sweep again")
    if saved.get("kind") != "sweep":
        raise RagateError(f"{sweep_dir} is an eval run, not a sweep: {what} come from `ragate sweep` records")
    family = family or family_key(get_method(method))
    records = _records(sweep_dir)
    mine = [r for r in records if r["family"] == family]
    if not mine:
        present = sorted({r["family"] for r in records}) or ["none"]
        raise RagateError(
            f"{sweep_dir} has no records of the family {family!r} that {method} answers with; sweep a gate of "
            f"that family (e.g. --methods targ-margin) or pass --family, one of: {'; '.join(present)}"
        )
    if any(metric not in r["closed"]["scores"] for r in mine):
        raise RagateError(f"the sweep's records have no {metric!r} score: use --metric em, f1 or acc")
    config = EvalConfig(
        dataset=saved["dataset"], methods=tuple(saved["methods"]), limit=saved.get("limit"),
        offset=saved.get("offset", 0),
    )  # fmt: skip
    if all(isinstance(r.get("question"), str) for r in mine):  # the records hold their questions: no dataset read
        recorded = list(saved.get("dataset_files") or [])
        return SweepQuestions(saved, config, recorded, family, mine, {r["id"]: r["question"] for r in mine})
    files = dataset_files(config.dataset)
    was = [f.get("sha256") for f in saved.get("dataset_files") or []]
    if was and was != [f["sha256"] for f in files]:
        raise RagateError(
            f"{sweep_dir} read {config.dataset!r} with sha256 {was}, but that dataset's file now has "
            f"{[f['sha256'] for f in files]}: the questions behind the labels are gone; sweep again"
        )
    questions = {ex.id: ex.question for ex in config.examples()}
    missing = [r["id"] for r in mine if r["id"] not in questions]
    if missing:
        raise RagateError(f"{len(missing)} record ids are not in {config.dataset!r} (e.g. {missing[0]!r})")
    return SweepQuestions(saved, config, files, family, mine, questions)


def sweep_model(saved: dict[str, Any], sweep_dir: Path) -> dict[str, Any]:
    """The model the sweep answered with (engine, name, file sha256, server), checked against the file now under
    that name: labels say what the swept file knew."""
    engine = saved.get("engine", "llama.cpp")
    # a local engine run without --model loaded the default, under that name (ragate.backends.load_backend)
    name = saved.get("model") or (DEFAULT_MODEL if engine != "openai" else None)
    model = model_identity(name, engine, saved.get("base_url"))
    swept = ((saved.get("provenance") or {}).get("model") or {}).get("sha256")
    if swept and model.get("sha256") and swept != model["sha256"]:
        raise RagateError(
            f"the sweep {sweep_dir} ran model file sha256 {swept[:12]}…, but {saved.get('model')!r} is now "
            f"{model['sha256'][:12]}…: its labels say what the other file knew; reinstall that model or sweep again"
        )
    return {k: model.get(k) for k in ("engine", "model", "sha256", "base_url") if model.get(k)}


def fit_labels(
    sweep_dir: str | Path,
    *,
    index: str | None = None,
    family: str | None = None,
    metric: str = "em",
    method: str = "skr",
) -> LabelSet:
    """The label set of ``sweep_dir``'s questions for ``family`` (default: ``method``'s family)."""
    from ragate.methods.question import encoder_identity
    from ragate.retrieval.demo import demo_index
    from ragate.retrieval.index import open_index

    sweep_dir = Path(sweep_dir)
    found = sweep_questions(sweep_dir, family=family, metric=metric, method=method)
    saved, config, mine = found.saved, found.config, found.records
    index = index if index is not None else saved.get("index")
    with open_index(index or demo_index()) as retriever:
        encoder = encoder_identity(retriever)
        if encoder is None:
            raise RagateError(
                "SKR embeds questions with the index's encoder: use a dense or hybrid index (--index)"
            )
        texts = [found.questions[r["id"]] for r in mine]
        embeddings = np.asarray(retriever.embed_queries(texts), dtype=np.float32)
    meta = {
        "encoder": encoder,
        "index": str(Path(index).expanduser().resolve()) if index else "demo",
        "model": sweep_model(saved, sweep_dir),
        "dataset": config.dataset,
        "dataset_files": found.files,
        "offset": config.offset,
        "limit": config.limit,
        "family": found.family,
        "metric": metric,
        "label": f"retrieve iff open {metric} > closed {metric}",
        "sweep": str(sweep_dir.resolve()),
    }
    return LabelSet(
        tuple(r["id"] for r in mine),
        tuple(texts),
        np.array([needs_retrieval(r, metric) for r in mine], dtype=bool),
        embeddings,
        meta,
    )
