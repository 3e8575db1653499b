"""A ``ragate tune`` file: its format and target, reading and checking it, and what a run does with one: take its
threshold (:func:`apply_tuned`) and refuse to score its validation questions (:func:`check_tuned`)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ragate.errors import RagateError
from ragate.eval.records import is_count, is_number, short
from ragate.fileio import atomic_writer

if TYPE_CHECKING:
    from ragate.eval.config import EvalConfig
    from ragate.eval.datasets import Example

FORMAT = "ragate-tune"
FORMAT_VERSION = 1
METRICS = ("em", "f1", "acc")


@dataclass(frozen=True)
class Target:
    """What the tuned value is for: the best validation ``metric`` ("best"), or the retrievals per question
    nearest ``retrievals`` ("retrievals")."""

    kind: Literal["best", "retrievals"]
    retrievals: float | None = None

    def __str__(self) -> str:
        return "best" if self.kind == "best" else f"retrievals={self.retrievals:g}"


def parse_target(text: str) -> Target:
    """``best`` or ``retrievals=R`` (R >= 0 retrievals per question)."""
    if text == "best":
        return Target("best")
    key, sep, value = text.partition("=")
    if key.strip() == "retrievals" and sep:
        try:
            r = float(value)
        except ValueError:
            r = math.nan
        if math.isfinite(r) and r >= 0:
            return Target("retrievals", r)
    raise RagateError(
        f"--target {text!r}: write best (the best validation metric) or retrievals=R (the retrievals per "
        "question nearest R, e.g. retrievals=1)"
    )


# -- the validation questions, and leaks between them and a test split -----------------------------------------


def text_digest(question: str) -> str:
    """The sha256 of a question's normalised text (:func:`ragate.gates.skr.question_key`): the same question
    under another id, in other case or spacing, gives the same digest."""
    from ragate.gates.skr import question_key

    return hashlib.sha256(question_key(question).encode("utf-8")).hexdigest()


def validation_block(examples: Sequence[Example]) -> dict[str, Any]:
    """What a tune file keeps of its validation questions: their ids, the digest of each normalised text, and a
    digest of the set (the texts themselves are not copied)."""
    digests = [text_digest(ex.question) for ex in examples]
    return {
        "ids": [ex.id for ex in examples],
        "text_sha256": digests,
        "sha256": hashlib.sha256("\n".join(sorted(digests)).encode()).hexdigest(),
    }


def same_file(
    a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]], name_a: str, name_b: str
) -> bool:
    """Whether two question sets come from one dataset file (their files' sha256; with no file on either side,
    the same dataset name), which is when their ids name the same questions."""
    sha_a, sha_b = {f.get("sha256") for f in a}, {f.get("sha256") for f in b}
    if sha_a and sha_b:
        return sha_a == sha_b
    return name_a == name_b


def overlapping(
    examples: Sequence[Example], validation: Mapping[str, Any], *, by_id: bool
) -> list[tuple[Example, str]]:
    """The ``examples`` that are validation questions: by id (where ``by_id``: one dataset file) or by normalised
    text, each with how it was found ("id" or "text")."""
    ids = set(validation["ids"]) if by_id else set()
    texts = set(validation["text_sha256"])
    found = []
    for ex in examples:
        if ex.id in ids:
            found.append((ex, "id"))
        elif text_digest(ex.question) in texts:
            found.append((ex, "text"))
    return found


def questions_span(dataset: str, offset: int, n: int) -> str:
    return f"{dataset} questions {offset + 1}-{offset + n}" if n else f"{dataset} (no question)"


def shared_example(shared: Sequence[tuple[Example, str]]) -> str:
    ex, how = shared[0]
    return f"e.g. id {ex.id!r}, {ex.question[:60]!r} (same {how})"


# -- the tune file ----------------------------------------------------------------------------------------------


def read_tune(path: str | Path) -> dict[str, Any]:
    """A ``ragate tune`` file, checked: a calibration file (:func:`ragate.eval.thresholds.read_calibration`) whose
    method is a dynamic one, with the format, parameter, target, dataset files, model identity and validation
    questions it records, each of its type. Anything else is a :class:`RagateError` naming the file and the fix."""
    from ragate.eval.thresholds import read_calibration

    data = read_calibration(path)
    fault = _tune_fault(data)
    if fault is not None:
        raise RagateError(f"{path} is not a usable `ragate tune` file: {fault}; rerun ragate tune")
    return data


def _digests(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(d, str) and len(d) == 64 and all(c in "0123456789abcdef" for c in d) for d in value
    )


def _tune_fault(data: dict[str, Any]) -> str | None:
    from ragate.methods import get_method

    if data.get("format") != FORMAT:
        return f"'format' must be {FORMAT!r}, not {short(data.get('format'))} (a dynamic method's threshold comes from ragate tune)"
    if data.get("format_version") != FORMAT_VERSION:
        return f"'format_version' {short(data.get('format_version'))} is not {FORMAT_VERSION}"
    try:
        spec = get_method(data["method"])
    except RagateError as err:
        return str(err)
    if spec.dynamic is None:
        return f"{data['method']!r} is not a dynamic method"
    for key in ("parameter", "target", "metric", "dataset", "engine"):
        if not isinstance(data.get(key), str) or not data[key]:
            return f"{key!r} must be text, not {short(data.get(key))}"
    try:
        parse_target(data["target"])
    except RagateError:
        return f"'target' cannot be {short(data['target'])}"
    if data["metric"] not in METRICS:
        return f"'metric' cannot be {short(data['metric'])}"
    if not is_count(data.get("offset")):
        return f"'offset' must be a count, not {short(data.get('offset'))}"
    files = data.get("dataset_files")
    if not isinstance(files, list) or not all(
        isinstance(f, dict) and isinstance(f.get("path"), str) and _digests([f.get("sha256")]) for f in files
    ):
        return f"'dataset_files' must be a list of {{path, sha256}}, not {short(files)}"
    if not isinstance(data.get("model_identity"), dict):
        return f"'model_identity' must be an object, not {short(data.get('model_identity'))}"
    v = data.get("validation")
    if not isinstance(v, dict):
        return f"'validation' must be an object, not {short(v)}"
    ids, digests = v.get("ids"), v.get("text_sha256")
    digests = digests if isinstance(digests, list) else []
    if not (isinstance(ids, list) and ids and all(isinstance(i, str) for i in ids)):
        return f"'validation.ids' must be a non-empty list of question ids, not {short(ids)}"
    if not digests or not _digests(digests) or len(digests) != len(ids):
        return "'validation.text_sha256' must hold one sha256 (64 hex digits) per validation id"
    if v.get("sha256") != hashlib.sha256("\n".join(sorted(digests)).encode()).hexdigest():
        return "'validation.sha256' does not match its text digests (the file was edited)"
    split = data.get("test_split")
    if not isinstance(split, dict) or not isinstance(split.get("dataset"), str) or not split["dataset"]:
        return f"'test_split' must be an object naming its dataset, not {short(split)}"
    grid = data.get("grid")
    if not isinstance(grid, list) or not grid or not all(is_number(g) for g in grid):
        return f"'grid' must be a list of numbers, not {short(grid)}"
    if data["tau"] not in grid:
        return f"'tau' {data['tau']!r} is not one of its grid's values {grid}"
    return None


def save_tune(result: Mapping[str, Any], path: str | Path) -> Path:
    """Write a tune file atomically (as every calibration file); returns its path."""
    import json

    path = Path(path)
    with atomic_writer(path) as f:
        f.write(json.dumps(dict(result), indent=2).encode())
    return path


def check_model(
    tuned: Mapping[str, Any], path: str | Path, model: str | None, engine: str, base_url: Any
) -> None:
    """A tuned threshold belongs to one model: the same engine, and the same model file (by sha256, where both
    sides have one: a model named two ways is one model) or else the same model name."""
    from ragate.models import model_identity

    fix = "rerun ragate tune with this run's --model and --backend"
    if tuned["engine"] != engine:
        raise RagateError(
            f"{path} was tuned on the {tuned['engine']} engine, this run uses {engine}: a trigger's threshold "
            f"belongs to one model and engine; {fix}"
        )
    was = tuned["model_identity"].get("sha256")
    now = model_identity(model, engine, base_url).get("sha256") if was else None
    if was and now:
        if was != now:
            raise RagateError(
                f"{path} was tuned with the model file of sha256 {was[:12]} ({tuned.get('model') or 'the default'}), "
                f"this run's model ({model or 'the default'}) has sha256 {now[:12]}: another model; {fix}"
            )
    elif tuned.get("model") != model:
        raise RagateError(
            f"{path} was tuned with model {tuned.get('model')!r}, this run uses {model!r}; {fix}"
        )


def apply_tuned(config: EvalConfig) -> EvalConfig:
    """``config`` with each tune file of ``config.tuned`` setting its method's trigger threshold, the path
    ``--threshold METHOD=TAU`` takes (:meth:`MethodSpec.with_threshold`); a threshold set otherwise for that
    method is refused (two values for one trigger)."""
    if not config.tuned:
        return config
    thresholds = dict(config.thresholds)
    for path in config.tuned:
        tuned = read_tune(path)
        method, tau = tuned["method"], float(tuned["tau"])
        if method not in config.methods:
            raise RagateError(
                f"{path} tunes {method!r}, which this run does not evaluate ({', '.join(config.methods)}): "
                "pass the tune file of a method in --methods"
            )
        if method in thresholds and thresholds[method] != tau:
            raise RagateError(
                f"{method}'s threshold is set twice: {thresholds[method]:g} (--threshold) and {tau:g} (tuned in "
                f"{path}); drop one of them"
            )
        thresholds[method] = tau
    return replace(config, thresholds=tuple(sorted(thresholds.items())))


def check_tuned(
    config: EvalConfig, examples: Sequence[Example], dataset_files: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """A run that uses tuned thresholds (``config.tuned``) must not score a validation question of any of them:
    refused, by id (same dataset file) or by normalised text, naming both sides and the fix; so is a file of
    another method or model, or a threshold the file does not set. Returns what ``config.json`` records of each
    file."""
    from ragate.fileio import sha256_file

    recorded = []
    thresholds = dict(config.thresholds)
    for path in config.tuned:
        tuned = read_tune(path)
        method = tuned["method"]
        if method not in config.methods:
            raise RagateError(
                f"{path} tunes {method!r}, which this run does not evaluate ({', '.join(config.methods)})"
            )
        if thresholds.get(method) != float(tuned["tau"]):
            raise RagateError(
                f"{path} tunes {method}'s {tuned['parameter']} to {tuned['tau']:g}, but this run sets "
                f"{thresholds.get(method)!r}: build the configuration with ragate.eval.tunefile.apply_tuned"
            )
        check_model(tuned, path, config.model, config.engine, config.base_url)
        v = tuned["validation"]
        by_id = same_file(tuned["dataset_files"], dataset_files, tuned["dataset"], config.dataset)
        shared = overlapping(examples, v, by_id=by_id)
        if shared:
            split = questions_span(tuned["dataset"], tuned["offset"], len(v["ids"]))
            before = tuned["offset"] - config.offset
            clear = f"; here --limit {before} ends before it" if by_id and before > 0 else ""
            raise RagateError(
                f"{len(shared)} of this run's {len(examples)} questions ({questions_span(config.dataset, config.offset, len(examples))}) "
                f"are validation questions that {path} tuned {method}'s {tuned['parameter']} on ({split}), "
                f"{shared_example(shared)}: a value chosen on the questions it is scored on flatters the method. "
                f"Evaluate other questions (--offset/--limit clear of the validation split{clear}), or tune on "
                "another split (ragate tune --offset N)"
            )
        recorded.append(
            {
                "path": str(Path(path).expanduser().resolve()),
                "sha256": sha256_file(Path(path).expanduser()),
                "method": method,
                "parameter": tuned["parameter"],
                "tau": tuned["tau"],
                "target": tuned["target"],
                "validation_sha256": v["sha256"],
                "validation_questions": len(v["ids"]),
            }
        )
    return recorded
