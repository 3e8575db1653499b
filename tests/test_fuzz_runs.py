"""Fuzz: what ``ragate eval --resume`` reads of a run directory (issue N): ``questions.jsonl``, a killed
multi-worker run's part files, ``config.json`` and ``results.json``. The run is a real one (five demo questions,
answered through a scripted backend, the fifth failed so that a resume retries it). A mutated file either resumes
into results with one well-formed record per question (nothing lost, nothing foreign, every score a finite number
in [0, 1]) or is refused with a RagateError naming the file (``config.json``: naming the run, whose folder it is)."""

from __future__ import annotations

import itertools
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
from fuzzing import byte_mutation, dumps, fuzz_settings, json_mutation, refused_or_accepted
from hypothesis import given
from hypothesis import strategies as st

from ragate.backends.scripted import ScriptedBackend, make_generation
from ragate.errors import RunFormatError
from ragate.eval.datasets import Example, load_dataset
from ragate.eval.records import latest, read_records
from ragate.eval.run import EvalConfig, read_run_config, run_eval
from ragate.retrieval.corpus import demo_dir
from ragate.types import GenerationRequest

CONFIG = EvalConfig("demo", ("no-retrieval",), limit=5)
COSTS = ("seconds", "cpu_seconds", "prompt_tokens", "completion_tokens", "calls")
_names = itertools.count()


def _examples() -> list[Example]:
    return load_dataset(demo_dir() / "questions.jsonl", limit=5)


def _answer(request: GenerationRequest) -> Any:
    return make_generation(["Wilhelm", " Conrad", " Röntgen"], [-0.01, -0.2, -0.3])


def _resume(run_dir: Path) -> dict[str, Any]:
    return run_eval(
        CONFIG,
        run_dir,
        resume=True,
        lm=ScriptedBackend(_answer),
        examples=_examples(),
        progress=False,
        cache=False,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``failed``: a run whose fifth question failed (a resume retries it); ``complete``: that run resumed, so that
    a further resume computes nothing and keeps what results.json recorded."""
    root = tmp_path_factory.mktemp("runs")
    fifth = _examples()[4].question

    def flaky(request: GenerationRequest) -> Any:
        if fifth in str(request.prompt):
            raise ValueError("the scripted backend failed on this question")
        return _answer(request)

    run_eval(
        CONFIG, root / "failed", lm=ScriptedBackend(flaky), examples=_examples(), progress=False, cache=False
    )
    shutil.copytree(root / "failed", root / "complete")
    _resume(root / "complete")
    return {"failed": root / "failed", "complete": root / "complete"}


def _copy(runs: dict[str, Path], which: str, tmp_path: Path) -> Path:
    run_dir = tmp_path / f"run-{next(_names)}"
    shutil.copytree(runs[which], run_dir)
    return run_dir


def _well_formed(results: dict[str, Any] | None, run_dir: Path) -> None:
    """One record per (question, method), none foreign, and a summary of finite scores over all five questions."""
    if results is None:
        return
    ids = [ex.id for ex in _examples()]
    records = latest(read_records(run_dir / "questions.jsonl"))
    assert sorted(r["id"] for r in records) == sorted(ids)
    assert results["questions"] == len(ids)
    [row] = results["summary"]
    assert row["n"] + row["errors"] == len(ids)
    for key in ("em", "f1", "acc", "retrieval_rate"):
        assert math.isfinite(row[key]) and 0 <= row[key] <= 1
    assert all(math.isfinite(v) for v in results["calls"]["charged"].values())


def _records_file(runs: dict[str, Path], tmp_path: Path, data: bytes, name: str = "questions.jsonl") -> None:
    run_dir = _copy(runs, "failed", tmp_path)
    (run_dir / name).write_bytes(data)
    _well_formed(refused_or_accepted(lambda: _resume(run_dir), run_dir / name), run_dir)


def _lines(path: Path) -> list[Any]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _jsonl(rows: Any) -> bytes:
    if not isinstance(rows, list):
        return dumps(rows) + b"\n"
    return b"".join(dumps(row) + b"\n" for row in rows)


# ------------------------------------------------------------------------------------------------ the properties


@fuzz_settings
@given(st.data())
def test_fuzz_records_values(runs: dict[str, Path], tmp_path: Path, data: st.DataObject) -> None:
    records = _lines(runs["failed"] / "questions.jsonl")
    _records_file(runs, tmp_path, _jsonl(data.draw(json_mutation(records))))


@fuzz_settings
@given(st.data())
def test_fuzz_records_bytes(runs: dict[str, Path], tmp_path: Path, data: st.DataObject) -> None:
    original = (runs["failed"] / "questions.jsonl").read_bytes()
    _records_file(runs, tmp_path, data.draw(byte_mutation(original)))


@fuzz_settings
@given(st.data())
def test_fuzz_part_files(runs: dict[str, Path], tmp_path: Path, data: st.DataObject) -> None:
    """A two-worker run killed before it folded: the last three records sit in ``questions.part1.jsonl``."""
    lines = (runs["failed"] / "questions.jsonl").read_bytes().splitlines(keepends=True)
    run_dir = _copy(runs, "failed", tmp_path)
    (run_dir / "questions.jsonl").write_bytes(b"".join(lines[:2]))
    part = run_dir / "questions.part1.jsonl"
    if data.draw(st.booleans()):
        part.write_bytes(data.draw(byte_mutation(b"".join(lines[2:]))))
    else:
        part.write_bytes(_jsonl(data.draw(json_mutation([json.loads(line) for line in lines[2:]]))))
    # folded first: a refusal may name questions.jsonl, which then holds the part's records
    _well_formed(refused_or_accepted(lambda: _resume(run_dir), run_dir), run_dir)


@fuzz_settings
@given(st.data())
def test_fuzz_config_json(runs: dict[str, Path], tmp_path: Path, data: st.DataObject) -> None:
    run_dir = _copy(runs, "complete", tmp_path)
    config = json.loads((run_dir / "config.json").read_text())
    if data.draw(st.booleans()):
        mutated = data.draw(byte_mutation((run_dir / "config.json").read_bytes()))
    else:
        mutated = dumps(data.draw(json_mutation(config)))
    (run_dir / "config.json").write_bytes(mutated)
    # a refusal names config.json, or the run directory ("cannot resume RUN: it was run with ...")
    _well_formed(refused_or_accepted(lambda: _resume(run_dir), run_dir), run_dir)


@fuzz_settings
@given(st.data())
def test_fuzz_results_json(runs: dict[str, Path], tmp_path: Path, data: st.DataObject) -> None:
    """A resume that computes nothing keeps the provenance and times results.json recorded."""
    run_dir = _copy(runs, "complete", tmp_path)
    results = json.loads((run_dir / "results.json").read_text())
    if data.draw(st.booleans()):
        mutated = data.draw(byte_mutation((run_dir / "results.json").read_bytes()))
    else:
        mutated = dumps(
            data.draw(json_mutation({k: results[k] for k in ("provenance", "started", "finished")}))
        )
    (run_dir / "results.json").write_bytes(mutated)
    again = refused_or_accepted(lambda: _resume(run_dir), run_dir / "results.json")
    _well_formed(again, run_dir)
    if again is not None:
        assert isinstance(again["provenance"], dict)
        assert all(
            math.isfinite(again[k]) and not isinstance(again[k], bool) for k in ("started", "finished")
        )


# ------------------------------------------------------------------------------------- faults the fuzzing found


def _record(runs: dict[str, Path]) -> dict[str, Any]:
    return dict(_lines(runs["complete"] / "questions.jsonl")[0])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"scores": {"em": math.nan, "f1": 0.0, "acc": 0.0}}, r'"scores" must be .* not \{.em.: nan'),
        ({"scores": "abc"}, r'"scores" must be'),
        ({"retrieved": "abc"}, r'"retrieved" must be true or false'),
        ({"seconds": math.inf}, r'"seconds" must be a finite number'),
        ({"prompt_tokens": True}, r'"prompt_tokens" must be a count'),
        ({"id": 7}, r"no question id"),
        ({"question": "q\ud800"}, r"the text .q.*holds a lone surrogate"),
        ({"trace": []}, r'"trace" must be an object'),
        ({"paid": {**dict.fromkeys(COSTS, 0.0), "reused_prompt_tokens": None}}, r'"paid" must be an object'),
    ],
)
def test_a_record_the_summary_cannot_read_is_refused_naming_its_line(
    runs: dict[str, Path], tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    """Each of these used to resume into a traceback (TypeError, KeyError, statistics on a string, a
    UnicodeEncodeError when the file was rewritten) or a NaN in the results table."""
    run_dir = _copy(runs, "complete", tmp_path)
    records = _lines(run_dir / "questions.jsonl")
    records[1] |= change
    (run_dir / "questions.jsonl").write_bytes(_jsonl(records))
    with pytest.raises(RunFormatError, match=r"questions\.jsonl, line 2: " + message):
        _resume(run_dir)


def test_an_answer_without_its_scores_is_refused(runs: dict[str, Path], tmp_path: Path) -> None:
    """A record with a prediction but no "scores" used to stop the summary with KeyError."""
    run_dir = _copy(runs, "complete", tmp_path)
    records = _lines(run_dir / "questions.jsonl")
    del records[0]["scores"]
    (run_dir / "questions.jsonl").write_bytes(_jsonl(records))
    with pytest.raises(RunFormatError, match=r"questions\.jsonl, line 1: no 'scores' in this record"):
        _resume(run_dir)


def test_an_eval_record_that_is_neither_an_error_nor_an_answer_is_refused(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    """A failed question's record without its "error" (id, dataset and method only) used to be counted as an
    answer, and the summary stopped with KeyError: 'seconds'."""
    run_dir = _copy(runs, "failed", tmp_path)
    records = _lines(run_dir / "questions.jsonl")
    del records[-1]["error"]
    (run_dir / "questions.jsonl").write_bytes(_jsonl(records))
    with pytest.raises(
        RunFormatError, match=r"questions\.jsonl, line 5: no 'scores', .*'seconds' in this record"
    ):
        _resume(run_dir)


def test_a_record_of_a_question_the_run_does_not_ask_is_refused(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    """A record whose id is none of the run's questions used to be counted in the summary (six answers over five
    questions) while the question whose id it replaced was answered again."""
    run_dir = _copy(runs, "complete", tmp_path)
    records = _lines(run_dir / "questions.jsonl")
    records[2]["id"] = "../../../../etc/passwd"
    (run_dir / "questions.jsonl").write_bytes(_jsonl(records))
    with pytest.raises(RunFormatError, match=r"questions\.jsonl holds an answer to question '\.\./\.\./"):
        _resume(run_dir)


def test_a_damaged_config_json_is_refused_naming_it(runs: dict[str, Path], tmp_path: Path) -> None:
    """config.json cut short used to raise JSONDecodeError, and "dataset_files": 3 a TypeError, on resume."""
    run_dir = _copy(runs, "complete", tmp_path)
    text = (run_dir / "config.json").read_text()
    (run_dir / "config.json").write_text(text[: len(text) // 2])
    with pytest.raises(RunFormatError, match=r"config\.json: not valid JSON .*restore it"):
        _resume(run_dir)
    (run_dir / "config.json").write_text(json.dumps(json.loads(text) | {"dataset_files": 3}))
    with pytest.raises(RunFormatError, match=r'config\.json: "dataset_files" must be a list'):
        _resume(run_dir)
    (run_dir / "config.json").write_text(json.dumps(json.loads(text) | {"limit": True}))
    with pytest.raises(RunFormatError, match=r'config\.json: "limit" must be a count or null, not True'):
        read_run_config(run_dir)


def test_a_damaged_results_json_is_refused_naming_it(runs: dict[str, Path], tmp_path: Path) -> None:
    """A resume that computes nothing rereads results.json; cut short it used to raise JSONDecodeError, and a
    list there AttributeError."""
    run_dir = _copy(runs, "complete", tmp_path)
    (run_dir / "results.json").write_text('{"provenance": {')
    with pytest.raises(RunFormatError, match=r"results\.json: not valid JSON .*delete it"):
        _resume(run_dir)
    (run_dir / "results.json").write_text("[]")
    with pytest.raises(RunFormatError, match=r"results\.json is not a run's results"):
        _resume(run_dir)
    kept = json.loads((runs["complete"] / "results.json").read_text())  # "git": null used to stop results.md
    (run_dir / "results.json").write_text(
        json.dumps(kept | {"provenance": kept["provenance"] | {"git": None}})
    )
    with pytest.raises(RunFormatError, match=r"results\.json is not a run's results"):
        _resume(run_dir)
