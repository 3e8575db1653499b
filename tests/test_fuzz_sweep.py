"""Fuzz: what reads a sweep directory (issue N): ``ragate sweep`` pass 2 (``compact`` then ``write_sweep``, and the
eval records a report derives from it), ``ragate sweep --resume``, ``ragate calibrate --from-sweep`` and the record
reader of ``ragate skr fit``, over ``sweep.jsonl``, a killed run's part file and ``config.json``. The sweep is a
real one: five demo questions, two TARG gates and two fixed methods, over a BM25 index of demo passages, answered
by a scripted backend. A mutated file either gives frontiers of finite rates in [0, 1] over the sweep's questions,
or is refused with a RagateError naming the file (or the sweep directory, for config.json)."""

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
from ragate.errors import RagateError, RunFormatError
from ragate.eval.datasets import Example, load_dataset
from ragate.eval.run import EvalConfig
from ragate.eval.sweep import compact, default_records, frontier, sweep_pass, write_sweep
from ragate.gates.skr import needs_retrieval
from ragate.learning.sweeps import _records as skr_records
from ragate.retrieval.corpus import demo_dir, read_passages
from ragate.retrieval.index import build_index, open_index
from ragate.tuning.calibrate import calibrate_from_sweep
from ragate.types import GenerationRequest

METHODS = ("targ-margin", "targ-entropy", "no-retrieval", "standard-rag")
_names = itertools.count()


def _examples() -> list[Example]:
    return load_dataset(demo_dir() / "questions.jsonl", limit=5)


def _answer(request: GenerationRequest) -> Any:
    """A two-token answer whose top-2 gap depends on the prompt, so that the gates' scores differ by question."""
    gap = 0.2 + (len(str(request.prompt)) % 7) * 0.3
    tops = [[("Wilhelm", -1.0), ("The", -1.0 - gap)], [(" Conrad", -1.0), (" X", -1.0 - gap / 2)]]
    return make_generation(["Wilhelm", " Conrad"], [-1.0, -1.0], tops)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sweep")
    build_index(
        list(read_passages(demo_dir() / "passages.jsonl"))[:50], root / "bm25", "bm25", progress=False
    )
    with open_index(root / "bm25") as retriever:
        sweep_pass(
            _config(root / "sweep"),
            root / "sweep",
            lm=ScriptedBackend(_answer),
            retriever=retriever,
            examples=_examples(),
            progress=False,
            cache=False,
        )
    return root / "sweep"


def _copy(sweep: Path, tmp_path: Path) -> Path:
    out = tmp_path / f"sweep-{next(_names)}"
    shutil.copytree(sweep, out)
    return out


def _pass_two(out: Path) -> list[dict[str, Any]]:
    """What `ragate sweep RUN_DIR` and `ragate report` read, and what each returns, checked."""
    records = compact(out / "sweep.jsonl")
    for front in write_sweep(out, records):  # no records: refused
        assert front["n"] >= 1
        for p in [front["never"], front["always"], front["default"], front["best_em"], *front["budgets"]]:
            assert all(math.isfinite(p[k]) and 0 <= p[k] <= 1 for k in ("em", "f1", "acc", "retrieval_rate"))
        assert all(math.isfinite(b["tau"]) for b in front["budgets"])
    for r in default_records(records):
        assert all(0 <= r["scores"][k] <= 1 for k in ("em", "f1", "acc")) and math.isfinite(r["seconds"])
    json.loads(
        (out / "sweep.json").read_text(), parse_constant=lambda c: pytest.fail(f"sweep.json holds {c}")
    )
    return records


def _config(sweep: Path) -> EvalConfig:
    return EvalConfig("demo", METHODS, limit=5, index=str(sweep.parent / "bm25"))


def _resume(out: Path, sweep: Path) -> list[dict[str, Any]]:
    """`ragate sweep --resume` with the settings the sweep was run with."""
    config = _config(sweep)
    with open_index(sweep.parent / "bm25") as retriever:
        return sweep_pass(
            config,
            out,
            resume=True,
            lm=ScriptedBackend(_answer),
            retriever=retriever,
            examples=_examples(),
            progress=False,
            cache=False,
        )


def _read_all(out: Path, name: str) -> None:
    """Every reader of the directory: each either accepts it or refuses, naming ``name``."""
    where = out / name if name != "config.json" else out
    refused_or_accepted(lambda: _pass_two(out), where)
    cal = refused_or_accepted(lambda: calibrate_from_sweep(out, "targ-margin", 0.5), where)
    if cal is not None:
        assert math.isfinite(cal["tau"]) and 0 <= cal["dev_retrieval_rate"] <= 1
    labelled = refused_or_accepted(lambda: skr_records(out), where)
    if labelled is not None:
        assert all(isinstance(needs_retrieval(r), bool) for r in labelled)


def _jsonl(rows: Any) -> bytes:
    if not isinstance(rows, list):
        return dumps(rows) + b"\n"
    return b"".join(dumps(row) + b"\n" for row in rows)


def _records(sweep: Path) -> list[Any]:
    return [json.loads(line) for line in (sweep / "sweep.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------------------------------ the properties


@fuzz_settings
@given(st.data())
def test_fuzz_sweep_records(sweep: Path, tmp_path: Path, data: st.DataObject) -> None:
    out = _copy(sweep, tmp_path)
    if data.draw(st.booleans()):
        mutated = data.draw(byte_mutation((sweep / "sweep.jsonl").read_bytes()))
    else:
        mutated = _jsonl(data.draw(json_mutation(_records(sweep))))
    (out / "sweep.jsonl").write_bytes(mutated)
    _read_all(out, "sweep.jsonl")


@fuzz_settings
@given(st.data())
def test_fuzz_sweep_part_file(sweep: Path, tmp_path: Path, data: st.DataObject) -> None:
    """A two-worker sweep killed before it folded: the last records sit in ``sweep.part1.jsonl``; `skr fit` reads
    the part as it is, a resume folds it in."""
    out = _copy(sweep, tmp_path)
    lines = (sweep / "sweep.jsonl").read_bytes().splitlines(keepends=True)
    (out / "sweep.jsonl").write_bytes(b"".join(lines[:6]))
    part = out / "sweep.part1.jsonl"
    if data.draw(st.booleans()):
        part.write_bytes(data.draw(byte_mutation(b"".join(lines[6:]))))
    else:
        part.write_bytes(_jsonl(data.draw(json_mutation([json.loads(line) for line in lines[6:]]))))
    labelled = refused_or_accepted(lambda: skr_records(out), part)
    if labelled is not None:
        assert all(isinstance(needs_retrieval(r), bool) for r in labelled)
    records = refused_or_accepted(lambda: _resume(out, sweep), out)  # folded first: may name sweep.jsonl
    if records is not None:
        assert {r["id"] for r in records} == {ex.id for ex in _examples()}
        refused_or_accepted(lambda: _pass_two(out), out)


@fuzz_settings
@given(st.data())
def test_fuzz_sweep_config_json(sweep: Path, tmp_path: Path, data: st.DataObject) -> None:
    out = _copy(sweep, tmp_path)
    if data.draw(st.booleans()):
        mutated = data.draw(byte_mutation((sweep / "config.json").read_bytes()))
    else:
        mutated = dumps(data.draw(json_mutation(json.loads((sweep / "config.json").read_text()))))
    (out / "config.json").write_bytes(mutated)
    _read_all(out, "config.json")
    refused_or_accepted(lambda: _resume(out, sweep), out)


# ------------------------------------------------------------------------------------- faults the fuzzing found


def test_a_gate_that_scored_infinity_still_gives_a_frontier(sweep: Path, tmp_path: Path) -> None:
    """TARG scores an empty draft +inf, and the sweep writes it as Infinity; pass 2 used to stop with
    "ValueError: dev scores contain NaN or infinity" at the first budget, and calibrate --from-sweep likewise."""
    out = _copy(sweep, tmp_path)
    records = _records(sweep)
    records[0]["gates"]["targ-margin"]["score"] = math.inf
    (out / "sweep.jsonl").write_bytes(_jsonl(records))
    fronts = {f["method"]: f for f in write_sweep(out, compact(out / "sweep.jsonl"))}
    at = {b["budget"]: b for b in fronts["targ-margin"]["budgets"]}
    assert at[0.2]["retrieval_rate"] == 0.2 and math.isfinite(at[0.2]["tau"])  # the +inf question retrieves
    assert at[0.1]["retrieval_rate"] == 0.0  # half a question of five: none
    assert math.isfinite(calibrate_from_sweep(out, "targ-margin", 0.2)["tau"])


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("gates", "targ-margin", "score"), math.nan, r'"gates"\."targ-margin" must be'),
        (("gates", "targ-margin", "score"), "0.7", r'"gates"\."targ-margin" must be'),
        (("gates", "targ-margin", "threshold"), math.inf, r'"gates"\."targ-margin" must be'),
        (("closed", "scores", "em"), True, r'"closed\.scores" must be'),
        (("open",), None, r'"open" must be an answer'),
        (("methods",), "abc", r'"methods" must be a list'),
        (("methods",), ["targ-entropy"], r'"gates" scores .targ-margin., which is not one of the record.s'),
    ],
)
def test_a_sweep_record_pass_two_cannot_read_is_refused_naming_its_line(
    sweep: Path, tmp_path: Path, path: tuple[str, ...], value: Any, message: str
) -> None:
    """Each used to reach pass 2 and stop it with a TypeError or KeyError, give a NaN frontier, or write
    Infinity into sweep.json (not JSON); "methods": "abc" made the record count for methods "a", "b" and "c"."""
    out = _copy(sweep, tmp_path)
    records = _records(sweep)
    target = records[2]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    (out / "sweep.jsonl").write_bytes(_jsonl(records))
    with pytest.raises(RunFormatError, match=r"sweep\.jsonl, line 3: " + message):
        compact(out / "sweep.jsonl")


def test_a_gate_missing_from_one_record_leaves_that_question_out_of_its_frontier(
    sweep: Path, tmp_path: Path
) -> None:
    """A record that lists a method but has not scored its gate (a sweep that gained gates, stopped) used to stop
    pass 2 with KeyError; calibrate --from-sweep already skipped such records."""
    out = _copy(sweep, tmp_path)
    records = _records(sweep)
    del records[0]["gates"]["targ-margin"]
    (out / "sweep.jsonl").write_bytes(_jsonl(records))
    assert frontier(compact(out / "sweep.jsonl"), "targ-margin")["n"] == 4


def test_an_empty_sweep_is_refused_not_reported_as_an_empty_table(sweep: Path, tmp_path: Path) -> None:
    """An empty sweep.jsonl used to give `ragate sweep RUN_DIR` an empty sweep.json and table, exit 0."""
    out = _copy(sweep, tmp_path)
    (out / "sweep.jsonl").write_bytes(b"")
    with pytest.raises(RagateError, match=r"sweep\.jsonl holds no records: run pass 1"):
        write_sweep(out, compact(out / "sweep.jsonl"))
    with pytest.raises(RagateError, match=r"sweep\.jsonl holds no score of 'targ-margin'"):
        calibrate_from_sweep(out, "targ-margin", 0.5)


def test_a_damaged_sweep_config_is_refused_naming_it(sweep: Path, tmp_path: Path) -> None:
    """A cut config.json used to raise JSONDecodeError in pass 2 and in `skr fit`."""
    out = _copy(sweep, tmp_path)
    text = (out / "config.json").read_text()
    (out / "config.json").write_text(text[:100])
    with pytest.raises(RunFormatError, match=r"config\.json: not valid JSON"):
        write_sweep(out, compact(out / "sweep.jsonl"))
