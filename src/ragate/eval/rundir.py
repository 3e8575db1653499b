"""A run directory's files (an eval's or a sweep's): ``config.json`` checked, read and rewritten on resume,
``results.json`` read back, the stored answers checked against the questions asked, the writer's lock."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ragate.errors import RunFormatError
from ragate.eval.datasets import Example
from ragate.eval.records import is_count, is_number, is_real, short
from ragate.fileio import atomic_writer, lone_surrogate, parse_json, utf8_text

LOCK_FILE = ".ragate.lock"  # held by the one process writing a run directory (ragate.fileio.exclusive_lock)


def read_run_config(run_dir: Path) -> dict[str, Any]:
    """A run's (or a sweep's) ``config.json``, checked for what its readers use (resume, sweep pass 2, ``skr fit``,
    calibration from a sweep): a JSON object, each setting (where present) of its type, no lone surrogate in its
    text. A damaged one is a :class:`RunFormatError` naming it and the fix."""
    path = Path(run_dir) / "config.json"
    fix = f"restore it from a copy, or run again into another --out directory than {run_dir}"
    try:
        text = utf8_text(path, RunFormatError, fix)
    except OSError as err:
        raise RunFormatError(f"{path} cannot be read ({err.strerror}); {fix}") from None
    saved = parse_json(text, str(path), RunFormatError, fix)
    fault = _config_fault(saved)
    if fault is not None:
        raise RunFormatError(f"{path}: {fault}; {fix}")
    return saved  # type: ignore[no-any-return]


def _text_or_none(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _names(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(m, str) and m for m in value)


def _provenance(value: Any) -> bool:
    """A recorded provenance as the results' readers use it: its git, model, index, packages and machine objects,
    the commit and the model file's sha256 strings (or null)."""
    if not isinstance(value, dict):
        return False
    parts = {k: value.get(k, {}) for k in ("git", "model", "index", "packages", "machine")}
    return (
        all(isinstance(part, dict) for part in parts.values())
        and _text_or_none(parts["git"].get("commit"))
        and _text_or_none(parts["model"].get("sha256"))
    )


def _files(value: Any) -> bool:
    """A run's dataset files: each with its path and sha256."""
    return isinstance(value, list) and all(
        isinstance(f, dict) and isinstance(f.get("path"), str) and isinstance(f.get("sha256"), str)
        for f in value
    )


# what each setting of config.json must be, where it is present
_CONFIG: dict[str, tuple[Callable[[Any], bool], str]] = {
    "dataset": (lambda v: isinstance(v, str) and bool(v), "a dataset name or path"),
    "methods": (_names, "a list of method names"),
    **dict.fromkeys(
        ("model", "engine", "index", "fallback", "skr_labels", "cross_encoder", "kind", "shard", "gate_weights"),
        (_text_or_none, "a string or null"),
    ),
    "base_url": (
        lambda v: _text_or_none(v) or (_names(v) and len(v) > 1),
        "a server URL, a list of them, or null",
    ),
    "limit": (lambda v: v is None or is_count(v), "a count or null"),
    "offset": (is_count, "a count"),
    "early_exit": (lambda v: isinstance(v, bool), "true or false"),
    "targ_mean": (lambda v: v in ("k", "present"), '"k" or "present"'),
    "seed": (lambda v: isinstance(v, int) and not isinstance(v, bool) and abs(v) <= 2**53, "an integer"),
    "thresholds": (
        lambda v: isinstance(v, dict) and all(is_real(t) for t in v.values()),
        "an object of method thresholds (numbers)",
    ),
    "dataset_files": (_files, 'a list of {"path", "sha256"} objects'),
    "index_identity": (
        lambda v: isinstance(v, dict) and _text_or_none(v.get("files_sha256")),
        "an object (its files_sha256 a string)",
    ),
    **dict.fromkeys(("extra", "skr_label_set", "gate_weights_file"), (lambda v: isinstance(v, dict), "an object")),
    "tuned": (lambda v: isinstance(v, list) and all(isinstance(p, str) and p for p in v), "a list of paths"),
    "tune_files": (
        lambda v: isinstance(v, list) and all(isinstance(t, dict) for t in v),
        "a list of tune files' identities",
    ),
    "extra_body": (lambda v: v is None or isinstance(v, dict), "an object of request fields or null"),
    "provenance": (_provenance, "a provenance (git, model, index, packages, machine)"),
    "provenance_history": (
        lambda v: isinstance(v, list) and all(map(_provenance, v)),
        "a list of provenances",
    ),
    "index_rebuilds": (lambda v: isinstance(v, list), "a list"),
}


def _config_fault(saved: Any) -> str | None:
    if not isinstance(saved, dict):
        return f"a run's configuration is a JSON object, not {type(saved).__name__}"
    if (fault := lone_surrogate(saved)) is not None:
        return f"{fault}, which is not text"
    for key, value in saved.items():
        ok, what = _CONFIG.get(key, (None, ""))
        if ok is not None and not ok(value):
            return f'"{key}" must be {what}, not {short(value)}'
    return None


def check_asked(
    records: Sequence[dict[str, Any]],
    examples: Sequence[Example],
    path: Path,
    methods: Sequence[str] | None = None,
) -> None:
    """Every stored record answers one of the run's questions (with one of its ``methods``, where given): a
    record of another (a damaged id or method) would be counted in the results while its own question is
    answered again."""
    asked = {ex.id for ex in examples}
    for r in records:
        if r["id"] not in asked or (methods is not None and r.get("method") not in methods):
            what = f"question {r['id']!r}" if r["id"] not in asked else f"method {r.get('method')!r}"
            raise RunFormatError(
                f"{path} holds an answer to {what}, which this run ({len(asked)} questions"
                + (f", methods {', '.join(methods)}" if methods is not None else "")
                + ") does not ask: move the file aside, or delete that line, and rerun with --resume"
            )


def _recorded(path: Path, *, computed: bool) -> dict[str, Any]:
    """What ``path`` (results.json or a sweep's config.json) recorded, when this resume computed nothing (a rerun
    that only rereads the answers, to re-report them, keeps what the computing parts recorded); else ``{}``."""
    if computed or not path.exists():
        return {}
    if path.name == "config.json":
        return read_run_config(path.parent)
    fix = (
        "restore it, or delete it: the resume writes it again from questions.jsonl (recording this checkout's "
        "commit and times)"
    )
    saved = parse_json(utf8_text(path, RunFormatError, fix), str(path), RunFormatError, fix)
    if not isinstance(saved, dict) or not _provenance(saved.get("provenance", {})):
        raise RunFormatError(f"{path} is not a run's results (a JSON object with its provenance); {fix}")
    if (fault := lone_surrogate(saved)) is not None:
        raise RunFormatError(f"{path}: {fault}, which is not text; {fix}")
    return saved


def read_results(run_dir: Path) -> dict[str, Any]:
    """A finished run's ``results.json``, checked as a resume checks it (``{}`` when there is none yet)."""
    return _recorded(Path(run_dir) / "results.json", computed=False)


def _kept_provenance(path: Path, *, computed: bool) -> dict[str, Any] | None:
    """The recorded provenance (:func:`_recorded`): rereading must not claim today's commit or build."""
    kept = _recorded(path, computed=computed).get("provenance")
    return kept if isinstance(kept, dict) else None


def _kept_times(path: Path, *, computed: bool) -> dict[str, float] | None:
    """The recorded ``started`` and ``finished`` (:func:`_recorded`): rereading must not replace when the answers
    were computed with a run of a tenth of a second."""
    saved = _recorded(path, computed=computed)
    times = {k: saved[k] for k in ("started", "finished") if is_number(saved.get(k))}
    return times if len(times) == 2 else None


def _save_config(out_dir: Path, data: dict[str, Any]) -> None:
    """Write ``config.json``, or rewrite it when a resume (checked by :func:`ragate.eval.config.check_config`)
    changed what it says: a sweep's added gates, an accepted index rebuild, a label set. A resume under another
    commit, packages or model file keeps the earlier provenance in ``provenance_history`` (a resume that computes
    nothing passes the saved one: :func:`_kept_provenance`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "config.json"
    saved = read_run_config(out_dir) if path.exists() else {}
    history = list(saved.get("provenance_history") or [])
    if saved.get("provenance") and saved["provenance"] != json.loads(json.dumps(data.get("provenance"))):
        history.append(saved["provenance"])  # what earlier parts ran with (commit, packages, model file)
    data = data | ({"provenance_history": history} if history else {})
    if saved == json.loads(json.dumps(data)):
        return
    with atomic_writer(path) as f:
        f.write(json.dumps(data, indent=2).encode())


def cost_totals(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What the run's answers were charged and what computing them really paid (LM calls, tokens, seconds)."""
    keys = ("seconds", "cpu_seconds", "prompt_tokens", "completion_tokens", "calls")
    charged = dict.fromkeys(keys, 0.0)
    paid = dict.fromkeys(keys, 0.0) | {"reused_prompt_tokens": 0}
    for r in records:
        if "error" in r or "paid" not in r:
            continue
        for k in keys:
            charged[k] += r["charged"][k]
            paid[k] += r["paid"][k]
        paid["reused_prompt_tokens"] += r["paid"].get("reused_prompt_tokens", 0)  # absent before 2026-11-26
    return {"charged": charged, "paid": paid}
