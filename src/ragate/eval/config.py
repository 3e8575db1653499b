"""What a run asks (:class:`EvalConfig`, saved as ``config.json``) and the checks every run passes before any
work: the resume rules, the files it reads, its shard, and the label sets, weights and tune files that must not
have seen its questions."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ragate.errors import RagateError
from ragate.eval.datasets import Example, dataset_files, load_dataset
from ragate.eval.rundir import read_run_config
from ragate.fileio import sha256_file
from ragate.gates.registry import get_gate
from ragate.methods import MethodSpec, get_method
from ragate.methods.spec import RERANK_SELECTORS


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
    # `ragate tune` files whose trigger thresholds this run uses (ragate.eval.tunefile.apply_tuned): none of their
    # validation questions may be scored; not compared on resume (the thresholds they set are)
    tuned: tuple[str, ...] = ()
    gate_weights: str | None = None  # a trained gate's file: no-model-lr's weights or a learned gate's
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
        if data.pop("early_exit"):  # recorded only where on: runs before 2026-11-28 had none
            data["early_exit"] = True
        if targ_mean_methods(self.methods):
            data["targ_mean"] = TARG_MEAN  # how these scores divide a short draft (absent: before 2026-11-28)
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


def _urls(value: Any) -> str:
    return " ".join(value) if isinstance(value, list | tuple) else str(value)


def _grows(before: int | None, now: int | None) -> bool:
    """Whether ``--limit now`` extends a run of ``--limit before`` (None: every question of the file)."""
    return before is not None and (now is None or now >= before)


TARG_MEAN = "k"  # TARG's entropy and margin divide a draft shorter than k by k (Eqs. 1-2)


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
        "its TARG entropy/margin scores average a draft shorter than k over its tokens (ragate before 2026-11-28), "
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
        from ragate.eval.tunefile import check_tuned

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


def weights_gates(methods: Sequence[str]) -> list[str]:
    """The gates of ``methods`` (names) that read a fitted file (``--gate-weights``), each once, in run order."""
    from ragate.methods import all_methods

    known = all_methods()
    kinds = [known[m].gate.kind for m in methods if m in known and known[m].dynamic is None]
    return [kind for kind in dict.fromkeys(kinds) if get_gate(kind).reads_weights]


def reads_weights(methods: Sequence[str]) -> bool:
    """Whether any of ``methods`` (names) has a gate that reads a fitted weights file."""
    return bool(weights_gates(methods))


def check_weights_leak(config: EvalConfig, examples: Sequence[Example]) -> dict[str, Any] | None:
    """A trained gate must not score the questions it was fitted on: the file is read with its gate's own loader
    (no-model-lr's weights, a learned gate's file) and a run whose questions overlap the file's training questions
    is refused, naming them and the fix. Returns what the run records of the file."""
    kinds = weights_gates(config.methods)
    if not kinds:
        return None
    if len(kinds) > 1:
        raise RagateError(
            f"--gate-weights is one file, read by one trained gate, and this run has {len(kinds)} ("
            f"{', '.join(kinds)}): run each in its own run with its own file"
        )
    gate = get_gate(kinds[0])
    if config.gate_weights is None:
        raise RagateError(f"{gate.name} needs --gate-weights FILE: {gate.weights_source}")
    fitted = gate.fitted_file(config.gate_weights)
    shared = fitted.overlap([ex.question for ex in examples])
    if shared:
        raise RagateError(
            f"{len(shared)} of this run's {len(examples)} questions trained the gate weights {config.gate_weights} "
            f"(e.g. {shared[0][:60]!r}): their scores would be fitted, not predicted. Fit {gate.name}'s file on "
            f"other questions ({gate.weights_source}) or evaluate other questions"
        )
    path = Path(config.gate_weights).expanduser()
    return {"path": str(path.resolve()), "sha256": sha256_file(path), "gate": gate.name, **fitted.record}


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


def _dataset_files(dataset: str) -> list[dict[str, Any]]:
    try:
        return dataset_files(dataset)
    except RagateError:
        return []  # examples handed in for a name with no file (tests): nothing to identify


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/n"`` as (i, n), 0 <= i < n; anything else is an error naming the form."""
    found = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
    if not found or not 0 <= int(found[1]) < int(found[2]):
        raise RagateError(
            f"--shard {text!r}: write I/N with 0 <= I < N, e.g. --shard 0/2 on one machine and --shard 1/2 on "
            "another (every N-th question from the I-th)"
        )
    return int(found[1]), int(found[2])
