"""Re-read a sweep: a stale family's retrieval answers replaced by an eval run's, made with today's reader.

A sweep's pass 1 stores, per (question, family), the closed-book answer, the retrieval answer and each gate's
score. When only the *reading* side of a family has changed since (the reader prompt's ``with_context`` form, or
the pseudo-context cap that steers DPR-AIS's search), the closed-book answer and every gate score are still what
today's code computes: they come from the direct prompt, before anything is read. The retrieval answer is not,
and an eval run that answered the same questions with a method that always retrieves in the family's *today*
form (``targ-always`` for the TARG gates, ``dtr-no-ugt`` for DTR) holds exactly it. :func:`reread_sweep` writes
a new sweep directory from the two, checked: the same dataset file, questions, model file and indexed passages;
family keys that differ only on the reading side; a run answer for every question. ``config.json`` records which
family was re-read from which run and method, at which commit, and on how many questions the two retrievals
returned other passages (an index rebuilt between the runs can reorder ties). Pass 2 (``ragate sweep OUT``) then
gives every threshold and budget again. Nothing is computed, so nothing is computed twice.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ragate.errors import RagateError
from ragate.eval.records import latest, read_records, write_records
from ragate.eval.rundir import read_results, read_run_config
from ragate.eval.sweep import compact, family_key, unswept, write_sweep
from ragate.fileio import atomic_writer
from ragate.methods import METHODS, get_method
from ragate.methods.prompts import PROMPT_SETS

READING_SIDE = ("pseudo",)  # family key fields that steer only what is read (the pseudo-context cap)


def _fields(key: str) -> tuple[str, dict[str, str]]:
    prompts, *rest = key.split("|")
    return prompts, {part.partition("=")[0]: part.partition("=")[2] for part in rest}


def reading_side_only(was: str, now: str) -> str | None:
    """Why the two family keys differ on more than the reading side (None when they do not): the closed-book
    prompt (direct form and system message), the selector, k and the answer length must be the same."""
    (p_was, f_was), (p_now, f_now) = _fields(was), _fields(now)
    if p_was != p_now:
        a, b = PROMPT_SETS.get(p_was), PROMPT_SETS.get(p_now)
        if a is None or b is None:
            return f"the prompt set {p_was if a is None else p_now!r} is not known today"
        if (a.direct, a.system) != (b.direct, b.system):
            return f"the prompt sets {p_was!r} and {p_now!r} ask the closed-book question differently"
    other = {k for k in f_was.keys() | f_now.keys() if f_was.get(k) != f_now.get(k)} - set(READING_SIDE)
    return f"the families differ in {', '.join(sorted(other))}" if other else None


def _identity(saved: dict[str, Any], results: dict[str, Any]) -> dict[str, Any]:
    """What both sides must record and share. Stricter than :func:`ragate.report.tables.check_same_setup`, which
    skips a fact one side does not record and compares the index by encoder and size: answers are substituted here,
    so a fact one side records and the other does not refuses, and the index is compared by its passages' sha256."""
    prov = results.get("provenance") or saved.get("provenance") or {}
    index = results.get("index_identity") or saved.get("index_identity") or {}
    return {
        "dataset": [f.get("sha256") for f in saved.get("dataset_files") or []],
        "offset": saved.get("offset", 0),
        "model": (prov.get("model") or {}).get("sha256"),
        "passages": index.get("passages_sha256"),
    }


def _answer(record: dict[str, Any]) -> dict[str, Any]:
    charged = record.get("charged") or {}
    return {
        "prediction": record["prediction"],
        "scores": record["scores"],
        "doc_ids": record.get("doc_ids") or [],
        "recall@3": record.get("recall@3"),
        "seconds": charged.get("seconds", record["seconds"]),
        "tokens": int(record.get("prompt_tokens") or 0) + int(record.get("completion_tokens") or 0),
    }


def _reader_methods(family: str) -> list[str]:
    """Registered single-shot methods that always retrieve and answer with ``family``'s prompts and selector."""
    return [
        name
        for name, spec in METHODS.items()
        if unswept(spec) and spec.gate.kind == "always" and spec.dynamic is None and spec.crag is None
        and family_key(spec) == family
    ]  # fmt: skip


def reread_sweep(sweep_dir: Path, run_dir: Path, out_dir: Path, metric: str = "acc") -> list[dict[str, Any]]:
    """Write ``out_dir`` (a sweep directory) from ``sweep_dir`` with each stale family's retrieval answers taken
    from ``run_dir``; returns what was re-read, one entry per family (also in ``out_dir/config.json``)."""
    sweep_dir, run_dir, out_dir = Path(sweep_dir), Path(run_dir), Path(out_dir)
    if out_dir.resolve() in (sweep_dir.resolve(), run_dir.resolve()):
        raise RagateError(
            f"--out {out_dir}: write the re-read sweep to a new directory, not over its sources"
        )
    if (out_dir / "sweep.jsonl").exists():
        raise RagateError(f"{out_dir} already holds a sweep: remove it or choose another --out")
    saved, run_saved = read_run_config(sweep_dir), read_run_config(run_dir)
    if saved.get("kind") != "sweep" or run_saved.get("kind") == "sweep":
        raise RagateError(f"give a sweep ({sweep_dir}) and then an eval run ({run_dir}), in that order")
    run_results = read_results(run_dir)
    mine, theirs = _identity(saved, read_results(sweep_dir)), _identity(run_saved, run_results)
    if differ := [k for k in mine if mine[k] != theirs[k]]:
        raise RagateError(
            f"{run_dir} did not answer the sweep's questions with the same {', '.join(differ)} as {sweep_dir}: "
            "re-read only from a run over the same dataset file, offset, model file and indexed passages"
        )
    records = compact(sweep_dir / "sweep.jsonl")
    answers: dict[tuple[str, str], dict[str, Any]] = {
        (r["method"], r["id"]): r for r in latest(read_records(run_dir / "questions.jsonl", repair=False))
    }
    run_methods = {m for m, _ in answers}
    reread: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    for family in dict.fromkeys(r["family"] for r in records):
        rows = [r for r in records if r["family"] == family]
        today = {family_key(get_method(m)) for r in rows for m in r["methods"]}
        if today == {family}:
            out += rows
            continue
        if len(today) != 1:
            raise RagateError(
                f"the methods of the family {family!r} no longer share one family: {sorted(today)}"
            )
        (now,) = today
        if (why := reading_side_only(family, now)) is not None:
            raise RagateError(f"{family!r} -> {now!r}: {why}; sweep these gates again instead of re-reading")
        readers = [m for m in _reader_methods(now) if m in run_methods]
        if not readers:
            raise RagateError(
                f"{run_dir} has no method that answers the family {now!r} with retrieval "
                f"(one of: {', '.join(_reader_methods(now)) or 'none registered'}): run it with `ragate eval`"
            )
        reader = readers[0]
        if missing := [r["id"] for r in rows if (reader, r["id"]) not in answers]:
            raise RagateError(
                f"{run_dir}: {reader} has no answer for {len(missing)} questions (e.g. {missing[0]!r})"
            )
        moved = 0
        for r in rows:
            answer = _answer(answers[reader, r["id"]])
            moved += answer["doc_ids"] != r["open"]["doc_ids"]
            out.append(r | {"family": now, "open": answer})
        commit = (run_results.get("provenance") or {}).get("git", {}).get("commit")
        reread.append(
            {
                "family_was": family, "family": now, "run": str(run_dir), "method": reader, "run_commit": commit,
                "questions": len(rows), "other_passages": moved,
            }
        )  # fmt: skip
    if not reread:
        raise RagateError(f"every family of {sweep_dir} is already in today's form: nothing to re-read")
    out_dir.mkdir(parents=True, exist_ok=True)
    write_records(out_dir / "sweep.jsonl", out)
    with atomic_writer(out_dir / "config.json") as f:
        f.write(json.dumps(saved | {"reread_from": str(sweep_dir), "reread": reread}, indent=2).encode())
    write_sweep(out_dir, out, metric)  # the records just written: one per (question, family), canonical keys
    return reread
