"""``ragate eval``: run methods over a dataset, one JSON line per (question, method) as it finishes, resumable.

A run directory holds
- ``config.json``: what was asked (dataset, methods, model, engine, index, thresholds, limit, seed) and the dataset
  *file* read (path, bytes, sha256); a resumed run must ask the same and read the same file, or it is refused with
  the difference named;
- ``questions.jsonl``: one record per (question, method): the prediction, its scores, whether and how often it
  retrieved, the documents' ids, recall@k where gold passages are known, tokens, seconds (charged), CPU seconds,
  what its LM calls were charged and what computing them paid, and the full Trace;
- ``results.json`` and ``results.md``, written (atomically) when the run completes: the summary table with
  bootstrap 95% intervals, package versions, model, dataset file and index identity, the git commit, and the
  run's charged and paid LM cost.

Every question runs every method back to back in rotated order (machine drift hits all methods alike). A
single-shot method's LM calls go through a :class:`~ragate.eval.calls.CallCache`: each call is computed from a
cleared engine cache (so no method is timed on another's prompt and an answer never depends on what ran before
it), and each distinct call is computed once and charged, at its measured cost, to every method that makes it.
``--workers N`` shards the questions over N pinned one-thread processes (:mod:`ragate.eval.workers`).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ragate.backends.base import Backend
from ragate.errors import CallCacheError, RagateError, RunFormatError
from ragate.eval.calls import CallCache, CallStore, Cost, Tally, check_call_cache
from ragate.eval.datasets import Example, dataset_files, load_dataset
from ragate.eval.metrics import recall_at_k, score
from ragate.eval.provenance import provenance
from ragate.eval.records import RecordWriter, is_count, is_number, is_real, latest, read_records, short
from ragate.eval.summary import summarize, summary_markdown
from ragate.eval.workers import fold_parts, part_path, run_workers
from ragate.fileio import atomic_writer, exclusive_lock, lone_surrogate, parse_json, sha256_file, utf8_text
from ragate.gates.registry import get_gate
from ragate.methods import MethodSpec, get_method, run_method
from ragate.methods.needs import require, require_index
from ragate.methods.spec import RERANK_SELECTORS
from ragate.models import model_identity
from ragate.retrieval.types import Retriever
from ragate.text import extract_answer

RECALL_K = 3
LOCK_FILE = ".ragate.lock"  # held by the one process writing a run directory (ragate.fileio.exclusive_lock)


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
    base_url: str | tuple[str, ...] | None = None  # an OpenAI-compatible server, or a fleet serving one model
    fallback: str | None = None  # the gate that replaces one the backend cannot serve (ragate.methods.needs)
    offset: int = 0  # skip the dataset's first N questions (a training split before, a test split after)
    skr_labels: str | None = None  # the SKR label set (`ragate skr fit`) that the skr gate reads
    cross_encoder: str | None = None  # the CrossEncoder folder that rerank and dpr-ais-rerank read K from
    shard: str | None = None  # "i/n": this run answers question j when j % n == i (ragate.eval.shards)
    extra_body: dict[str, Any] | None = None  # server-specific request fields (e.g. {"repeat_penalty": 1.0})
    extra: dict[str, Any] = field(default_factory=dict)  # free-form notes (not compared on resume)
    # `ragate tune` files whose trigger thresholds this run uses (ragate.eval.tune.apply_tuned): none of their
    # validation questions may be scored; not compared on resume (the thresholds they set are)
    tuned: tuple[str, ...] = ()
    gate_weights: str | None = None  # a trained gate's weights (`ragate gate fit`) that no-model-lr reads
    # TARG's entropy and margin gates stop their draft once "retrieve" is settled (same decisions and answers,
    # fewer tokens; ragate.gates.targ); compared on resume, so that a run's costs are of one kind
    early_exit: bool = True

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["methods"] = list(self.methods)
        data["thresholds"] = dict(self.thresholds)
        data.pop("tuned")  # recorded only where set: a finished run reread keeps its config.json as it was
        if self.tuned:
            data["tuned"] = [str(p) for p in self.tuned]
        if data["gate_weights"] is None:
            data.pop("gate_weights")  # recorded only where set, as tuned
        if data.pop("early_exit"):  # recorded only where on: runs before issue 51 had none
            data["early_exit"] = True
        if targ_mean_methods(self.methods):
            data["targ_mean"] = TARG_MEAN  # how these scores divide a short draft (absent: before issue 51)
        if isinstance(self.base_url, tuple):
            data["base_url"] = list(self.base_url)
        return data

    def examples(self) -> list[Example]:
        """The questions this run reads: ``limit`` of them after the first ``offset``."""
        if self.offset < 0:
            raise RagateError(f"--offset must be >= 0, not {self.offset}")
        if self.limit is not None and self.limit < 0:
            raise RagateError(f"--limit must be >= 0, not {self.limit}")
        examples = load_dataset(self.dataset)[self.offset :]
        return examples if self.limit is None else examples[: self.limit]

    def mine(self, examples: Sequence[Example]) -> list[tuple[int, Example]]:
        """The questions this run answers, each with its place in the whole run (its seed is ``seed + place``, so
        a shard's answers are those of the unsharded run): every one, or with ``shard`` "i/n" every n-th from i."""
        from ragate.eval.shards import parse_shard

        i, n = parse_shard(self.shard) if self.shard else (0, 1)
        return [(j, ex) for j, ex in enumerate(examples) if j % n == i]

    def spec(self, method: str) -> MethodSpec:
        spec = get_method(method)
        if spec.gate.kind == "skr" and spec.dynamic is None and spec.crag is None:
            spec = spec.with_(gate=replace(spec.gate, labels=self.skr_labels))
        if spec.dynamic is None and spec.crag is None and get_gate(spec.gate.kind).reads_weights:
            spec = spec.with_(gate=replace(spec.gate, weights=self.gate_weights))
        if self.cross_encoder and spec.selector.kind in RERANK_SELECTORS:
            spec = spec.with_(selector=replace(spec.selector, cross_encoder=self.cross_encoder))
        return spec.with_threshold(dict(self.thresholds).get(method))


def check_config(
    config: EvalConfig,
    out_dir: Path,
    *,
    resume: bool,
    dataset_files: list[dict[str, Any]] | None = None,
    index_identity: dict[str, Any] | None = None,
    add_methods: bool = False,
    accept_rebuilt_index: bool = False,
) -> list[dict[str, Any]]:
    """Refuse to mix runs: an existing run directory needs ``resume``, and then the same configuration and, where
    both name it, the same dataset file (by sha256: another file of the same name is another dataset) and the
    same index (by path, however spelled, and by its files' digest: a rebuilt index is another index). With
    ``add_methods`` (sweeps) the methods may grow: the stored answers stay, the new gates are scored on them.
    ``limit`` may grow (or become None, every question): question i keeps its place, so its stored answers and
    seed (``seed + i``) are those of the longer run, and only the new questions are computed.

    A rebuilt index whose passages, encoder and settings are the same but whose vectors differ at the bit level
    (a rebuild on another CPU) is refused too, unless ``accept_rebuilt_index``; returns the run's list of such
    accepted rebuilds (to record in ``config.json``)."""
    saved_path = out_dir / "config.json"
    if not saved_path.exists():
        return []
    if not resume:
        raise RagateError(
            f"{out_dir} already holds a run: pass --resume to continue it, or choose another --out directory"
        )
    saved = read_run_config(out_dir)
    now = config.to_json()
    for key in (
        "dataset", "methods", "model", "engine", "index", "limit", "seed", "thresholds", "base_url", "fallback",
        "offset", "skr_labels", "cross_encoder", "shard", "extra_body", "gate_weights", "early_exit", "targ_mean",
    ):  # fmt: skip
        if key == "methods" and add_methods and set(saved.get(key) or ()) <= set(now[key]):
            continue  # a sweep may gain gates: their scores join the stored answers
        if key == "limit" and _grows(saved.get(key), now.get(key)):
            continue  # more questions: the first ones are the same questions with the same seeds
        if key == "skr_labels" and add_methods and "skr" not in (saved.get("methods") or ()):
            continue  # no skr gate was swept before: no label set to keep
        if key == "gate_weights" and add_methods and not reads_weights(saved.get("methods") or ()):
            continue  # no trained gate was swept before: no weights to keep
        if key == "targ_mean" and not targ_mean_methods(saved.get("methods") or ()):
            continue  # no TARG entropy or margin score stored: nothing to mix
        if key in ("early_exit", "targ_mean") and saved.get(key) != now.get(key):
            raise RagateError(f"cannot resume {out_dir}: {_resume_hint(key, saved.get(key))}")
        same = _index_path(saved.get(key)) == _index_path(now.get(key)) if key == "index" else None
        if key == "base_url" and saved.get("model") and saved.get(key) and now.get(key):
            continue  # servers come and go: the named model (checked above) is what the answers depend on
        if key == "base_url" and saved.get(key) and now.get(key) and not same and saved[key] != now[key]:
            raise RagateError(
                f"cannot resume {out_dir} on other servers ({_urls(now[key])} instead of {_urls(saved[key])}): "
                "it was run without --model, so nothing says the new servers serve the model it was run with; "
                "resume on the same servers, or start a new run with --model naming the served model"
            )
        if not same and saved.get(key, _ADDED.get(key)) != now.get(key):
            raise RagateError(
                f"cannot resume {out_dir}: it was run with {key}={saved.get(key)!r}, now {key}={now.get(key)!r}; "
                "rerun with the same settings or use another --out directory"
            )
    rebuilds: list[dict[str, Any]] = list(saved.get("index_rebuilds") or [])
    before, after = saved.get("index_identity") or {}, index_identity or {}
    was, is_now = before.get("files_sha256"), after.get("files_sha256")
    if was and is_now and was != is_now:
        digests = before.get("passages_sha256"), after.get("passages_sha256")
        verified = None not in digests
        same_content = all(
            before.get(k) == after.get(k) for k in ("kind", "passages", "encoder", "params")
        ) and (not verified or digests[0] == digests[1])
        if not (same_content and accept_rebuilt_index):
            said = (
                "Its passages (by sha256), encoder and settings are the same, so only the vectors' bits differ"
                if verified
                else "This run did not record its passages' sha256, so only their count, the encoder and the "
                "settings could be compared, and they are the same; the texts are unverified"
            )
            hint = (
                f" {said} (e.g. a rebuild on another CPU); if its searches return what they did (compare a few with "
                "`ragate search`), resume with --accept-rebuilt-index, which config.json records"
                if same_content
                else ""
            )
            raise RagateError(
                f"cannot resume {out_dir}: the index at {_index_path(config.index)} was rebuilt since (its files' "
                f"digest was {was[:12]}, now {is_now[:12]}), so its answers would mix two indexes; use another "
                f"--out directory.{hint}"
            )
        rebuilds.append(
            {"was": was, "now": is_now, "created_at": after.get("created_at"), "passages_verified": verified}
        )
    saved_files = [f.get("sha256") for f in saved.get("dataset_files") or []]
    now_files = [f.get("sha256") for f in dataset_files or []]
    if saved_files and now_files and saved_files != now_files:
        where = ", ".join(f["path"] for f in saved["dataset_files"])
        raise RagateError(
            f"cannot resume {out_dir}: it read {where} with sha256 {saved_files}, but the dataset file now has "
            f"sha256 {now_files}: another file under the same name; use another --out directory"
        )
    return rebuilds


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


def _urls(value: Any) -> str:
    return " ".join(value) if isinstance(value, list | tuple) else str(value)


def _grows(before: int | None, now: int | None) -> bool:
    """Whether ``--limit now`` extends a run of ``--limit before`` (None: every question of the file)."""
    return before is not None and (now is None or now >= before)


TARG_MEAN = "k"  # TARG's entropy and margin divide a draft shorter than k by k (Eqs. 1-2; issue 51)


def targ_mean_methods(methods: Sequence[str]) -> list[str]:
    """The methods whose gate is TARG's entropy or margin as Eqs. 1-2 write it (a short draft divided by k)."""
    out = []
    for name in methods:
        try:
            spec = get_method(name)
        except RagateError:
            continue
        if spec.dynamic is None and getattr(get_gate(spec.gate.kind), "divide_by", None) == TARG_MEAN:
            out.append(name)
    return out


def _resume_hint(key: str, saved: Any) -> str:
    if key == "early_exit":
        return (
            "it was run without TARG's early exit (every gate draft decoded whole), and this run would stop drafts "
            "early: its costs would be of two kinds. Resume with --no-early-exit"
            if not saved
            else "it was run with TARG's early exit; resume without --no-early-exit"
        )
    return (
        "its TARG entropy/margin scores average a draft shorter than k over its tokens (ragate before issue 51), "
        "and this ragate divides by k as TARG's Eqs. 1-2 do: the scores would be of two kinds. Start a new run "
        "(the old form is the method targ-entropy-present / targ-margin-present)"
    )


# keys added after runs were saved without them: their value then
_ADDED: dict[str, Any] = {
    "offset": 0, "cross_encoder": None, "shard": None, "extra_body": None, "gate_weights": None,
}  # fmt: skip


def open_run(
    config: EvalConfig,
    out_dir: Path,
    *,
    resume: bool,
    examples: Sequence[Example] | None,
    accept_rebuilt_index: bool,
    add_methods: bool = False,
) -> tuple[dict[str, Any], list[Example]]:
    """The checks every run directory (eval or sweep) passes before work: the files it reads, the resume
    (:func:`check_config`), its questions and SKR's no-leak rule. Returns what ``config.json`` records beside the
    configuration, and the questions. The demo index, when the run reads it, is built here, once: two workers that
    each found it missing would both start building it, and the second would fail."""
    if config.index is None and any(config.spec(m).retrieves for m in config.methods):
        from ragate.retrieval.demo import demo_index

        demo_index()
    identity = run_identity(config)
    rebuilds = check_config(
        config,
        out_dir,
        resume=resume,
        dataset_files=identity["dataset_files"],
        index_identity=identity["index_identity"],
        add_methods=add_methods,
        accept_rebuilt_index=accept_rebuilt_index,
    )
    examples = list(examples) if examples is not None else config.examples()
    skr_identity = check_no_leak(config, examples)
    tuned: list[dict[str, Any]] = []
    if config.tuned:  # no validation question of a tuned threshold is scored with it
        from ragate.eval.tune import check_tuned

        tuned = check_tuned(config, examples, identity["dataset_files"])
    saved_path = out_dir / "config.json"
    if resume and skr_identity and saved_path.exists():
        before = (read_run_config(out_dir).get("skr_label_set") or {}).get("content_sha256")
        if before and before != skr_identity["content_sha256"]:
            raise RagateError(
                f"cannot resume {out_dir}: the SKR label set {config.skr_labels} was refit since this run began "
                "(its labels or embeddings differ), so skr's stored decisions came from other labels; restore that "
                "label set, or run skr into another --out directory"
            )
    weights_identity = check_weights_leak(config, examples)
    if resume and weights_identity and saved_path.exists():
        before = (read_run_config(out_dir).get("gate_weights_file") or {}).get("sha256")
        if before and before != weights_identity["sha256"]:
            raise RagateError(
                f"cannot resume {out_dir}: the gate weights {config.gate_weights} were refit since this run began, "
                "so the trained gate's stored decisions came from other weights; restore that file, or run it into "
                "another --out directory"
            )
    recorded = identity | ({"skr_label_set": skr_identity} if skr_identity else {})
    recorded |= {"gate_weights_file": weights_identity} if weights_identity else {}
    recorded |= {"tune_files": tuned} if tuned else {}
    return recorded | ({"index_rebuilds": rebuilds} if rebuilds else {}), examples


def check_no_leak(config: EvalConfig, examples: Sequence[Example]) -> dict[str, Any] | None:
    """SKR must never vote with its own test questions' labels: a run whose questions overlap the label set's
    training questions is refused, naming them and the fix. Returns what the run records of the label set."""
    if not any(config.spec(m).gate.kind == "skr" for m in config.methods):
        return None
    from ragate.gates import skr

    if config.skr_labels is None:
        raise RagateError(
            "skr needs --skr-labels FILE: run `ragate sweep` on a training split (e.g. --offset 300), then "
            "`ragate skr fit --sweep DIR --out FILE`"
        )
    labels = skr.load_labels(config.skr_labels)
    shared = labels.overlap([ex.question for ex in examples])
    if shared:
        raise RagateError(
            f"{len(shared)} of this run's {len(examples)} questions are training questions of the SKR label set "
            f"{config.skr_labels} (e.g. {shared[0][:60]!r}): SKR would vote with their own labels. Fit the "
            "labels on another split (`ragate sweep --offset N` then `ragate skr fit`) or evaluate other questions"
        )
    return {
        "path": str(Path(config.skr_labels).expanduser().resolve()),
        "sha256": sha256_file(Path(config.skr_labels).expanduser()),
        "content_sha256": labels.content_sha256,
        "questions": len(labels.ids),
        "retrieve_share": float(labels.retrieve.mean()),
    }


def reads_weights(methods: Sequence[str]) -> bool:
    """Whether any of ``methods`` (names) has a gate that reads a fitted weights file."""
    from ragate.methods import all_methods

    known = all_methods()
    return any(
        m in known and known[m].dynamic is None and get_gate(known[m].gate.kind).reads_weights for m in methods
    )


def check_weights_leak(config: EvalConfig, examples: Sequence[Example]) -> dict[str, Any] | None:
    """A trained gate must not score the questions it was fitted on: a run whose questions overlap the weights
    file's training questions is refused, naming them and the fix. Returns what the run records of the file."""
    if not reads_weights(config.methods):
        return None
    from ragate.gates import nomodel

    if config.gate_weights is None:
        raise RagateError(
            "no-model-lr needs --gate-weights FILE: run `ragate sweep` on a training split (e.g. --offset 300), "
            "then `ragate gate fit --sweep DIR --out FILE.json`"
        )
    weights = nomodel.load_weights(config.gate_weights)
    shared = nomodel.overlap(weights, [ex.question for ex in examples])
    if shared:
        raise RagateError(
            f"{len(shared)} of this run's {len(examples)} questions trained the gate weights {config.gate_weights} "
            f"(e.g. {shared[0][:60]!r}): their scores would be fitted, not predicted. Fit the weights on another "
            "split (`ragate sweep --offset N` then `ragate gate fit`) or evaluate other questions"
        )
    path = Path(config.gate_weights).expanduser()
    return {
        "path": str(path.resolve()),
        "sha256": sha256_file(path),
        "questions": int(weights.meta.get("n") or 0),
        "label": weights.meta.get("label"),
        "features": list(weights.features),
    }


def _index_path(index: str | None) -> str:
    """Where an index setting points, resolved (None: the demo index), so that spellings of one path compare equal."""
    if index is None:
        from ragate.models import ragate_home

        return str((ragate_home() / "indexes" / "demo").resolve())
    return str(Path(index).expanduser().resolve())


def run_identity(config: EvalConfig) -> dict[str, Any]:
    """What a run directory records of the files it reads: the dataset file(s) and the index's identity."""
    from ragate.eval.provenance import index_identity

    try:
        index = index_identity(config.index)
    except RagateError:
        index = {"path": _index_path(config.index)}  # not built yet (or damaged): opening it will say so
    return {"dataset_files": _dataset_files(config.dataset), "index_identity": index}


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


def record_for(
    example: Example,
    trace: Any,
    seconds: float,
    *,
    cpu_seconds: float | None = None,
    tally: Tally | None = None,
) -> dict[str, Any]:
    """The JSON line of one (question, method): scores on the extracted answer, retrieval facts and costs.

    With a call-cache ``tally``, ``seconds`` and ``cpu_seconds`` are *charged*: what was measured, with each LM
    call at the cost measured when it was computed (a call answered from the store is charged its original cost);
    ``charged`` and ``paid`` give the LM calls' share of both."""
    if tally is not None:
        seconds = seconds - tally.paid.seconds + tally.charged.seconds
        if cpu_seconds is not None:
            cpu_seconds = cpu_seconds - tally.paid.cpu_seconds + tally.charged.cpu_seconds
        charged, paid, hits, reused = tally.charged, tally.paid, tally.hits, tally.reused_tokens
    else:  # every call computed here (dynamic methods): charged is paid
        lm_stages = [s for s in trace.stages if s.prompt_tokens or s.completion_tokens]
        charged = paid = Cost(
            sum(s.seconds for s in lm_stages),
            cpu_seconds or 0.0,  # the method's CPU time: its LM calls are nearly all of it
            sum(s.prompt_tokens for s in lm_stages),
            sum(s.completion_tokens for s in lm_stages),
            len(lm_stages),
        )
        hits = reused = 0
    paid_json = paid.to_json() | {"cached_calls": hits, "reused_prompt_tokens": reused}
    costs: dict[str, Any] = {"charged": charged.to_json(), "paid": paid_json}
    if cpu_seconds is not None:
        costs["cpu_seconds"] = cpu_seconds
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
        **costs,
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
    workers: int = 1,
    call_cache: Path | None = None,
    cache: bool = True,
    accept_rebuilt_index: bool = False,
) -> dict[str, Any]:
    """Run (or finish) ``config`` into ``out_dir``; returns the results dict also written to ``results.json``.

    ``lm`` / ``retriever`` / ``examples`` replace the configured model, index and dataset (tests, services; the
    caller keeps ownership and closes them); ``concurrency`` > 1 sends that many questions at once, for a remote
    (OpenAI-compatible) backend. ``workers`` > 1 shards the questions over that many processes, each pinned to
    its own core with a one-thread engine (:mod:`ragate.eval.workers`). Single-shot methods' LM calls go through
    a :class:`~ragate.eval.calls.CallCache`: each distinct call is computed once, in the store at ``call_cache``
    (default :func:`default_call_cache`), and charged to every method that makes it; ``cache=False`` computes
    every call (same predictions, every call paid). ``accept_rebuilt_index``: see :func:`check_config`.
    ``config.tuned`` (``ragate tune`` files) sets those methods' trigger thresholds and refuses to score any of
    their validation questions (:func:`ragate.eval.tune.check_tuned`).
    """
    out_dir = Path(out_dir)
    if config.tuned:  # each tune file sets its method's trigger threshold, as --threshold METHOD=TAU does
        from ragate.eval.tune import apply_tuned

        config = apply_tuned(config)
    out_dir.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(out_dir / LOCK_FILE, f"run directory {out_dir}"):  # one writer at a time
        recorded, examples = open_run(
            config, out_dir, resume=resume, examples=examples, accept_rebuilt_index=accept_rebuilt_index
        )
        if not examples:
            raise RagateError(f"dataset {config.dataset!r} has no questions to evaluate")
        for m in config.methods:
            config.spec(m)  # unknown names fail here, before any work
        if workers < 1:
            raise RagateError(f"--workers must be >= 1, not {workers}")
        if workers > 1 and (lm is not None or retriever is not None or concurrency > 1):
            raise RagateError(
                "--workers above 1 opens a model per worker: not with a backend handed in or --concurrency"
            )
        _save_config(out_dir, config.to_json() | recorded)
        path = out_dir / "questions.jsonl"
        fold_parts(path)  # a multi-worker run killed before it could fold
        stored = latest(read_records(path))
        check_asked(stored, examples, path, config.methods)
        # failures are retried: a resumed run answers them again
        done = {(r["id"], r["method"]) for r in stored if "error" not in r}
        jobs = [
            (i, ex, m)
            for i, ex in config.mine(examples)
            for m in _rotated(config.methods, i)
            if (ex.id, m) not in done
        ]
        started = time.time()
        # taken before the work: the commit and build the answers are computed with, not whatever the checkout
        # holds when a long run ends; a resume that computes nothing keeps the recorded one
        prov = _kept_provenance(out_dir / "results.json", computed=bool(jobs)) or provenance(config)
        store = None if not cache else (call_cache or default_call_cache())
        if store is not None and jobs:  # a damaged or misplaced cache: refused before any model loads
            check_call_cache(store)
        if workers > 1 and jobs:
            shares = [[j for j in jobs if j[0] % workers == w] for w in range(workers)]
            try:
                run_workers(
                    _answer_jobs,
                    [(config, share, part_path(path, w), store) for w, share in enumerate(shares)],
                    [part_path(path, w) for w in range(workers)],
                    total=len(jobs),
                    desc=f"eval {config.dataset} ({workers} workers)",
                    progress=progress,
                )
            finally:  # what the workers wrote is kept, even when one of them was killed
                fold_parts(path)
        elif jobs:
            _answer_jobs(
                config,
                jobs,
                path,
                store,
                lm=lm,
                retriever=retriever,
                progress=progress,
                concurrency=concurrency,
            )
        records = latest(read_records(path))
        times = _kept_times(out_dir / "results.json", computed=bool(jobs)) or {
            "started": started,
            "finished": time.time(),
        }
        results = {
            "config": config.to_json(),
            "questions": len(config.mine(examples)),
            "dataset_files": recorded["dataset_files"],
            "provenance": prov,
            **times,
            "calls": {"cache": None if store is None else str(store), "workers": workers}
            | cost_totals(records),
            "summary": summarize(records, [m for m in config.methods]),
        }
        with atomic_writer(out_dir / "results.json") as f:
            f.write(json.dumps(results, indent=2).encode())
        with atomic_writer(out_dir / "results.md") as f:
            f.write(summary_markdown(results).encode())
        return results


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


def default_call_cache() -> Path:
    """Where LM calls are stored unless told otherwise: ``<ragate home>/calls.sqlite`` (shared by every run, so a
    sweep over the questions of an earlier eval pays almost nothing)."""
    from ragate.models import ragate_home

    return ragate_home() / "calls.sqlite"


def _dataset_files(dataset: str) -> list[dict[str, Any]]:
    try:
        return dataset_files(dataset)
    except RagateError:
        return []  # examples handed in for a name with no file (tests): nothing to identify


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
    """Write ``config.json``, or rewrite it when a resume (checked by :func:`check_config`) changed what it says:
    a sweep's added gates, an accepted index rebuild, a label set. A resume under another commit, packages or
    model file keeps the earlier provenance in ``provenance_history`` (a resume that computes nothing passes the
    saved one: :func:`_kept_provenance`)."""
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


def open_call_cache(
    lm: Backend, store: Path | None, config: EvalConfig, *, own: bool
) -> tuple[CallCache, CallStore | None]:
    """``lm`` wrapped so that each distinct call is computed once (into ``store``; None: every call computed in
    full, as before the store existed), keyed by the model file's sha256 when the run opened the model itself. With
    the store on, a computed prompt also starts from an earlier prompt's state where that is exact
    (:mod:`ragate.backends.prompt_states`)."""
    identity = f"{lm.engine}:{lm.model}"
    if own:
        info = model_identity(config.model, config.engine, config.base_url)
        where = info.get("path") or _urls(info.get("base_url"))
        identity = info.get("sha256") or f"{where}:{config.model}"
    opened = CallStore(store, check=False) if store is not None else None  # checked by check_call_cache
    return CallCache(lm, opened, identity, exact_prefixes=opened is not None), opened


def _answer_jobs(
    config: EvalConfig,
    jobs: Sequence[tuple[int, Example, str]],
    path: Path,
    store: Path | None,
    *,
    lm: Backend | None = None,
    retriever: Retriever | None = None,
    progress: bool = False,
    concurrency: int = 1,
) -> None:
    """Answer ``jobs`` (question index, example, method) and append one record each to ``path``."""
    specs = {m: config.spec(m) for m in config.methods}
    own_lm, own_retriever = lm is None, retriever is None
    lm = lm or _open_lm(config, concurrency)
    try:  # a method the backend cannot serve is refused before any answer, or runs with the fallback gate
        specs = {
            m: require(s, lm.capabilities, engine=lm.engine, fallback=config.fallback, rename=False)
            for m, s in specs.items()
        }
    except RagateError:
        if own_lm:
            lm.close()
        raise
    needs_index = any(specs[m].retrieves for _, _, m in jobs)
    if retriever is None and needs_index:
        retriever = _open_retriever(config)
    if retriever is not None:
        owned = [x for x, own in ((retriever, own_retriever), (lm, own_lm)) if own]
        check_index(specs.values(), retriever, close=owned)
    if jobs and own_lm:  # a backend handed in is the caller's, warm or scripted
        _warm_up(lm, retriever, jobs[0][1].question)
    calls, opened = open_call_cache(lm, store, config, own=own_lm)
    lock = threading.Lock()
    # questions in flight share the process: each record is charged its own thread's CPU (the model computes on
    # the server); one at a time, the process's (a local engine computes in its own threads)
    clock = time.thread_time if concurrency > 1 else time.process_time
    try:
        with (
            RecordWriter(path) as writer,
            tqdm(total=len(jobs), desc=f"eval {config.dataset}", unit="answer", disable=not progress) as bar,
        ):

            def work(job: tuple[int, Example, str]) -> None:
                i, ex, method = job
                spec = specs[method]
                # single-shot calls are computed once each; the dynamic loop keeps the engine's prefix reuse
                target: Backend = calls if spec.dynamic is None else lm
                lm.clear_cache()
                try:
                    with calls.tally() as tally:
                        start, cpu = time.perf_counter(), clock()
                        trace = run_method(
                            spec, ex.question, target, retriever, seed=config.seed + i, dataset=ex.dataset,
                            early_exit=config.early_exit,
                        )  # fmt: skip
                        wall, cpu = time.perf_counter() - start, clock() - cpu
                    counted = tally if target is calls else None
                    record = record_for(ex, trace, wall, cpu_seconds=cpu, tally=counted)
                except CallCacheError:
                    raise  # the run's store, not this question: stop (answers so far are kept; --resume)
                except (RagateError, ValueError) as err:
                    record = error_record(ex, method, err)
                with lock:  # one writer and one bar, whichever thread finishes
                    writer.append(record)
                    bar.update(1)

            run_concurrently(work, jobs, concurrency)
    finally:
        if opened is not None:
            opened.close()
        if own_retriever and retriever is not None:
            retriever.close()
        if own_lm:
            lm.close()


def run_concurrently(work: Callable[[Any], None], jobs: Sequence[Any], concurrency: int) -> None:
    """``work(job)`` for every job, ``concurrency`` at a time (each job's own calls stay in order in its thread);
    one at a time in this thread when ``concurrency`` is 1. The first failure is raised once the pool stops."""
    if concurrency <= 1:
        for job in jobs:
            work(job)
        return
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(work, jobs))


def check_index(specs: Iterable[MethodSpec], retriever: Retriever, *, close: Sequence[Any] = ()) -> None:
    """Every method's needs of the index (DPR-AIS over a BM25 index is refused before any answer, not once per
    answer); on a refusal, ``close`` what the caller opened."""
    try:
        for spec in specs:
            require_index(spec, retriever)
    except RagateError:
        for opened in close:
            opened.close()
        raise


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


def timeout_note(seconds: float | None) -> dict[str, Any]:
    """``EvalConfig.extra`` for a client timeout of ``seconds`` per server call (none: the backend's default). A
    slow server (a CPU one under load) needs a longer one; it changes no answer, so a resume may change it."""
    return {"openai_timeout": float(seconds)} if seconds else {}


def server_options(
    concurrency: int, extra_body: dict[str, Any] | None, timeout: float | None
) -> dict[str, Any]:
    """An OpenAI-compatible backend's options for ``concurrency`` calls in flight (a connection each, at least
    4), with the server-specific request fields and the client timeout where given."""
    options: dict[str, Any] = {"max_concurrency": max(4, concurrency)}
    if extra_body:
        options["extra_body"] = extra_body
    if timeout:
        options["timeout"] = float(timeout)
    return options


def _open_lm(config: EvalConfig, concurrency: int = 1) -> Backend:
    """The run's model; a server backend with a connection for each of ``concurrency`` calls in flight."""
    from ragate.backends import load_backend
    from ragate.backends.threads import thread_options

    options: dict[str, Any] = {}
    if config.engine == "openai":
        timeout = config.extra.get("openai_timeout")
        options = {"base_url": config.base_url, **server_options(concurrency, config.extra_body, timeout)}
    else:  # threads change no computation (ragate.backends.threads): a note in extra, not compared on resume
        options = thread_options(config.engine, config.extra.get("threads"), config.extra.get("batch_threads"))
    return load_backend(config.model, config.engine, **options)


def _open_retriever(config: EvalConfig) -> Retriever:
    from ragate.retrieval.demo import demo_index
    from ragate.retrieval.index import open_index

    return open_index(config.index or demo_index())
