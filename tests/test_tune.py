"""``ragate tune`` (issue 50): a dynamic method's trigger threshold from a validation split, never from the
questions it is scored on. Refusals are checked before any model loads; the choice on records; one tiny real
run (SmolLM2 + the demo index, ETC, 2 questions x 2 values of alpha) checks the whole path into ``ragate eval``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ragate.cli.main import main
from ragate.errors import RagateError
from ragate.eval.datasets import load_dataset
from ragate.eval.records import read_records
from ragate.eval.run import EvalConfig, run_eval
from ragate.tuning.tune import (
    FORMAT,
    FORMAT_VERSION,
    GridRow,
    Target,
    choose,
    grid_rows,
    overlapping,
    parse_grid,
    parse_target,
    read_tune,
    save_tune,
    tune,
    validation_block,
)


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# -- the tuner refuses validation questions that are test questions ---------------------------------------------


def test_the_tuner_refuses_validation_questions_in_the_default_test_split_by_id() -> None:
    # the default test split is the first 300 questions: the demo's 80 are all in it
    with pytest.raises(RagateError, match=r"3 of the 3 validation questions .* default test split.*same id"):
        tune(method="etc", dataset="demo", offset=40, limit=3, out=Path("unused"), grid=(1.3,))
    # a named test split that covers one of them
    with pytest.raises(RagateError, match=r"1 of the 3 validation questions \(demo questions 41-43\) .*"
                       r"test split \(demo questions 1-41\).*id '40'"):  # fmt: skip
        tune(method="etc", dataset="demo", offset=40, limit=3, test_limit=41, out=Path("unused"), grid=(1.3,))


def test_the_tuner_refuses_the_same_question_text_under_other_ids(tmp_path: Path) -> None:
    demo = load_dataset("demo")
    # validation questions copied into another file, under new ids, in other case and spacing, with a "?"
    rows = [
        {
            "id": f"val-{i}",
            "question": "  " + demo[i].question.upper() + " ?",
            "answers": list(demo[i].answers),
        }
        for i in (3, 60)
    ]
    val = _jsonl(tmp_path / "val.jsonl", rows)
    with pytest.raises(RagateError, match=r"1 of the 2 validation questions .*test split \(demo questions 1-10\)"
                       r".*id '3'.*same text"):  # fmt: skip
        tune(
            method="etc",
            dataset=str(val),
            test_dataset="demo",
            test_limit=10,
            out=tmp_path / "r",
            grid=(1.3,),
        )
    assert not (tmp_path / "r").exists()  # refused before any run


def test_ids_are_compared_within_one_dataset_file_and_texts_always() -> None:
    demo = load_dataset("demo")
    validation = validation_block(demo[:2])
    assert [ex.id for ex, how in overlapping(demo[:5], validation, by_id=True)] == ["0", "1"]
    other = load_dataset("demo")[10:12]  # other questions that happen to carry the validation ids
    renamed = [replace(ex, id=v) for ex, v in zip(other, ("0", "1"), strict=True)]
    assert overlapping(renamed, validation, by_id=False) == []  # another file: ids name other questions
    assert [how for _, how in overlapping(renamed, validation, by_id=True)] == ["id", "id"]


# -- grid, target and the choice (on records: exact control) ----------------------------------------------------


def test_grid_and_target_parse_and_refuse_what_is_not_a_value() -> None:
    assert parse_grid("1.3, 0.8,1.0,1.3") == (0.8, 1.0, 1.3)
    assert parse_target("best") == Target("best") and parse_target("retrievals=1.5") == Target(
        "retrievals", 1.5
    )
    for bad in ("0.8,x", "inf", ","):
        with pytest.raises(RagateError, match="--grid"):
            parse_grid(bad)
    for bad in ("retrievals=-1", "retrievals=nan", "fewest", "retrievals"):
        with pytest.raises(RagateError, match="--target"):
            parse_target(bad)


def _records(rows: list[tuple[str, float, int]], method: str = "etc") -> list[dict[str, Any]]:
    return [
        {"id": i, "method": method, "scores": {"em": em, "f1": em, "acc": em}, "retrievals": n,
         "retrieved": n > 0, "seconds": 1.0}
        for i, em, n in rows
    ]  # fmt: skip


def test_the_choice_follows_the_target_with_its_tie_rules() -> None:
    runs = {
        0.8: _records([("a", 1, 3), ("b", 1, 2), ("c", 0, 2)]),  # EM 2/3, 2.33 retrievals/q
        1.3: _records([("a", 1, 1), ("b", 0, 1), ("c", 1, 0)]),  # EM 2/3, 0.67 retrievals/q: the tie's winner
        2.0: _records([("a", 0, 0), ("b", 0, 0), ("c", 1, 0)]),  # EM 1/3, no retrieval
    }
    rows = grid_rows(runs, "etc")
    assert [r.n for r in rows] == [3, 3, 3]
    assert choose(rows, Target("best"), "em").value == 1.3  # best EM, ties to fewer retrievals
    assert choose(rows, Target("retrievals", 0.0), "em").value == 2.0
    assert choose(rows, Target("retrievals", 2.0), "em").value == 0.8  # 2.33 is nearer 2 than 0.67
    # 2.33 and 0.67 are both 0.83 from 1.5 and score the same EM: the tie goes to fewer retrievals
    assert choose(rows, Target("retrievals", 1.5), "em").value == 1.3
    # equally near the target: the higher metric first
    tie = [GridRow(1.0, 3, 0.2, 0.2, 0.2, 1.0, 1.0, 1.0), GridRow(2.0, 3, 0.5, 0.5, 0.5, 2.0, 1.0, 1.0)]
    assert choose(tie, Target("retrievals", 1.5), "em").value == 2.0
    # equal metric and retrievals: the value nearer the method's default
    same = [GridRow(v, 3, 0.5, 0.5, 0.5, 1.0, 1.0, 1.0) for v in (0.8, 1.6)]
    assert choose(same, Target("best"), "em", default=1.3).value == 1.6


def test_a_question_that_failed_at_one_value_leaves_every_value() -> None:
    runs = {
        1.0: _records([("a", 1, 1), ("b", 1, 1)]),
        2.0: _records([("a", 0, 0)]) + [{"id": "b", "method": "etc", "error": "ValueError: boom"}],
    }
    rows = grid_rows(runs, "etc")
    assert [(r.n, r.em, r.errors) for r in rows] == [(1, 1.0, 0), (1, 0.0, 1)]
    with pytest.raises(RagateError, match="no validation question was answered"):
        grid_rows({1.0: _records([("a", 1, 1)]), 2.0: _records([("b", 1, 1)])}, "etc")


def test_methods_without_a_trigger_threshold_are_refused() -> None:
    for method, why in (("dtr", "ragate calibrate"), ("wo-rag", "no trigger"), ("ircot", "no threshold")):
        with pytest.raises(RagateError, match=why):
            tune(method=method, dataset="demo", offset=40, limit=1, test_limit=40, out=Path("unused"))
    with pytest.raises(RagateError, match=r"theta must be in \(0, 1\]"):
        tune(
            method="flare", dataset="demo", offset=40, limit=1, test_limit=40, out=Path("unused"), grid=(2.0,)
        )


def test_tune_is_a_listed_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "tune" in capsys.readouterr().out


# -- the file: damaged, another method, another model -----------------------------------------------------------


def _tune_file(tmp_path: Path, name: str = "etc-tune.json", **changes: Any) -> Path:
    """A tune file as ragate tune writes it, for ETC tuned on demo questions 41-42 (no model run)."""
    from ragate.eval.datasets import dataset_files
    from ragate.eval.provenance import model_identity

    data = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "method": "etc", "trigger": "etc",
        "parameter": "alpha", "tau": 2.0, "objective": "tune", "target": "best", "metric": "em", "default": 1.3,
        "grid": [1.3, 2.0], "table": [], "n": 2, "dev": "demo[40:42]", "dev_em": 0.5, "dev_retrieval_rate": 0.5,
        "dataset": "demo", "offset": 40, "limit": 2, "dataset_files": dataset_files("demo"),
        "validation": validation_block(load_dataset("demo")[40:42]),
        "test_split": {"dataset": "demo", "offset": 0, "limit": 40, "n": 40},
        "model": None, "engine": "llama.cpp", "model_identity": model_identity(None, "llama.cpp"),
    } | changes  # fmt: skip
    return save_tune(data, tmp_path / name)


def test_a_damaged_or_edited_tune_file_is_refused_naming_it(tmp_path: Path, smollm2_path: Path) -> None:
    good = _tune_file(tmp_path)
    assert read_tune(good)["tau"] == 2.0
    edited = read_tune(good)
    edited["validation"]["ids"] = edited["validation"]["ids"][:1]
    cases: list[tuple[Any, str]] = [
        ("{not json", "not a `ragate calibrate` file"),
        ({"format": FORMAT, "method": "etc", "tau": float("nan")}, "'tau' must be a finite number"),
        ({**read_tune(good), "format": None}, "'format' must be 'ragate-tune'"),
        ({**read_tune(good), "method": "dtr"}, "'dtr' is not a dynamic method"),
        ({**read_tune(good), "tau": 1.7}, "not one of its grid's values"),
        (edited, "one sha256 .* per validation id"),
        (
            {
                **read_tune(good),
                "validation": {**read_tune(good)["validation"], "text_sha256": ["0" * 64] * 2},
            },
            "does not match its text digests",
        ),
        ({**read_tune(good), "target": "most"}, "'target' cannot be"),
    ]
    for content, message in cases:
        path = tmp_path / "bad.json"
        path.write_text(content if isinstance(content, str) else json.dumps(content))
        with pytest.raises(RagateError, match=f"bad.json.*{message}"):
            read_tune(path)
    # the command line says so, before any model loads (exit 2)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**read_tune(good), "format_version": 9}))
    assert main(["eval", "--dataset", "demo", "--methods", "etc", "--calibration", str(path)]) == 2


def test_a_tune_file_of_another_method_or_model_is_refused(tmp_path: Path, smollm2_path: Path) -> None:
    path = _tune_file(tmp_path)
    with pytest.raises(RagateError, match="tunes 'etc', which this run does not evaluate"):
        run_eval(EvalConfig("demo", ("flare",), limit=1, tuned=(str(path),)), tmp_path / "r1", progress=False)
    other = _tune_file(tmp_path, model_identity={"engine": "llama.cpp", "model": "qwen", "sha256": "ab" * 32})
    with pytest.raises(RagateError, match="tuned with the model file of sha256 abababababab.*another model"):
        run_eval(EvalConfig("demo", ("etc",), limit=1, tuned=(str(other),)), tmp_path / "r2", progress=False)
    path = _tune_file(tmp_path)
    with pytest.raises(RagateError, match="tuned on the llama.cpp engine, this run uses transformers"):
        run_eval(EvalConfig("demo", ("etc",), engine="transformers", limit=1, tuned=(str(path),)),
                 tmp_path / "r3", progress=False)  # fmt: skip
    with pytest.raises(RagateError, match="threshold is set twice: 1.5 .* and 2"):
        run_eval(EvalConfig("demo", ("etc",), limit=1, thresholds=(("etc", 1.5),), tuned=(str(path),)),
                 tmp_path / "r4", progress=False)  # fmt: skip


def test_a_run_refuses_to_score_a_validation_question_by_id_or_text(
    tmp_path: Path, smollm2_path: Path
) -> None:
    path = _tune_file(tmp_path)
    with pytest.raises(RagateError, match=r"1 of this run's 2 questions \(demo questions 40-41\) are validation "
                       r"questions that .*etc-tune.json tuned etc's alpha on \(demo questions 41-42\).*id '40'"):  # fmt: skip
        run_eval(
            EvalConfig("demo", ("etc",), offset=39, limit=2, tuned=(str(path),)),
            tmp_path / "a",
            progress=False,
        )
    q = load_dataset("demo")[41]
    test = _jsonl(tmp_path / "test.jsonl", [{"id": "t-1", "question": q.question + "?", "answers": ["x"]}])
    with pytest.raises(RagateError, match=r"id 't-1'.*same text"):
        run_eval(EvalConfig(str(test), ("etc",), tuned=(str(path),)), tmp_path / "b", progress=False)
    # the command line too, naming both sides and the fix
    argv = ["eval", "--dataset", "demo", "--methods", "etc", "--offset", "40", "--limit", "1", "--calibration",
            str(path), "--out", str(tmp_path / "c")]  # fmt: skip
    assert main(argv) == 2


def test_reproduce_takes_a_tune_file_for_a_dataset_it_runs(tmp_path: Path, smollm2_path: Path) -> None:
    from ragate.eval.datasets import dataset_files
    from ragate.report.reproduce import reproduce

    try:
        hotpot = load_dataset("hotpotqa")
    except RagateError as err:
        pytest.skip(f"HotpotQA is not here ({err}): ../shared/data is absent")
    tuned = _tune_file(
        tmp_path, "hotpot.json", dataset="hotpotqa", offset=300, dataset_files=dataset_files("hotpotqa"),
        dev="hotpotqa[300:302]",
        validation=validation_block(hotpot[300:302]), test_split={"dataset": "hotpotqa", "offset": 0, "limit": 300},
    )  # fmt: skip
    demo_file = _tune_file(tmp_path, "demo.json")
    with pytest.raises(
        RagateError, match="tuned for the test split of 'demo', which etc-table2 does not run"
    ):
        reproduce(
            "etc-table2", tmp_path / "r", datasets=["hotpotqa"], methods=["etc"], calibration=[demo_file]
        )
    # every HotpotQA question (no --limit) includes the validation split: refused before the model loads
    with pytest.raises(RagateError, match=r"2 of this run's 350 questions .*validation questions"):
        reproduce("etc-table2", tmp_path / "r", datasets=["hotpotqa"], methods=["etc"], calibration=[tuned],
                  progress=False)  # fmt: skip


# -- one tiny real run: SmolLM2, the demo index, ETC at two values of alpha --------------------------------------


@pytest.fixture(scope="module")
def demo_retriever(minilm: Any) -> Iterator[Any]:
    from ragate.retrieval.demo import demo_index
    from ragate.retrieval.index import open_index

    with open_index(demo_index()) as retriever:
        yield retriever


def test_a_real_tune_picks_by_its_target_and_eval_runs_at_the_tuned_value(
    llama_backend: Any, demo_retriever: Any, tmp_path: Path
) -> None:
    kw: dict[str, Any] = {
        "method": "etc", "dataset": "demo", "offset": 41, "limit": 2, "test_limit": 41, "grid": (1.3, 2.5),
        "out": tmp_path / "runs", "lm": llama_backend, "retriever": demo_retriever, "progress": False,
        "call_cache": tmp_path / "calls.sqlite",
    }  # fmt: skip
    one = tune(target="retrievals=1", **kw)
    rows = [GridRow(**r) for r in one["table"]]
    assert [r.value for r in rows] == [1.3, 2.5] and all(r.n == 2 for r in rows)
    # a higher alpha never fires earlier: at most as many retrievals (greedy, same text until the first hit)
    assert rows[1].retrievals <= rows[0].retrievals
    assert one["tau"] == min(rows, key=lambda r: (abs(r.retrievals - 1), -r.em, r.retrievals, r.value)).value
    best = tune(target="best", **kw)  # the runs are resumed: nothing computed again
    assert best["table"] == one["table"]
    assert best["tau"] == max(rows, key=lambda r: (r.em, -r.retrievals, -abs(r.value - 1.3))).value
    assert len(read_records(tmp_path / "runs" / "alpha-1.3" / "questions.jsonl")) == 2
    # the file round-trips and records what the brief asks
    path = save_tune(best, tmp_path / "etc.json")
    saved = read_tune(path)
    assert saved == json.loads(json.dumps(best))
    assert saved["validation"]["ids"] == ["41", "42"] and saved["model_identity"]["sha256"]
    assert saved["dataset_files"][0]["sha256"] and saved["parameter"] == "alpha"
    # ragate eval takes the tuned alpha (config.json and each record show it) on other questions
    run = tmp_path / "eval"
    run_eval(EvalConfig("demo", ("etc",), limit=1, tuned=(str(path),)), run, lm=llama_backend,
             retriever=demo_retriever, progress=False, call_cache=tmp_path / "calls.sqlite")  # fmt: skip
    config = json.loads((run / "config.json").read_text())
    assert config["thresholds"] == {"etc": best["tau"]} and config["tune_files"][0]["tau"] == best["tau"]
    (record,) = read_records(run / "questions.jsonl")
    assert record["threshold"] == best["tau"] and "error" not in record
