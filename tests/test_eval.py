"""The evaluation harness: resumable runs (a real SIGKILL), config checks, the summary, and sweeps that equal
direct runs. Questions come from the demo sample that ships in the package (real NQ-open questions)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ragate.backends.scripted import ScriptedBackend, make_generation
from ragate.errors import RagateError
from ragate.eval.datasets import load_dataset
from ragate.eval.records import RecordWriter, latest, read_records
from ragate.eval.run import EvalConfig, run_eval
from ragate.retrieval.corpus import demo_dir

DEMO_QUESTIONS = demo_dir() / "questions.jsonl"


def _answer(record: dict[str, Any]) -> tuple[Any, ...]:
    """What two runs of the same question and method must agree on."""
    return record["prediction"], record["scores"], record["retrieved"]


def test_a_line_cut_by_a_kill_is_dropped_and_the_file_repaired(tmp_path: Path) -> None:
    path = tmp_path / "q.jsonl"
    with RecordWriter(path) as w:
        w.append({"id": "a", "method": "m"})
        w.append({"id": "b", "method": "m"})
    with path.open("a") as f:
        f.write('{"id": "c", "meth')  # the kill
    assert [r["id"] for r in read_records(path)] == ["a", "b"]
    assert path.read_text().endswith("}\n") and path.read_text().count("\n") == 2
    with RecordWriter(path) as w:
        w.append({"id": "c", "method": "m"})
    assert [r["id"] for r in read_records(path)] == ["a", "b", "c"]


def test_a_bad_line_in_the_middle_is_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text('{"id": "a"}\nnot json\n{"id": "b"}\n')
    with pytest.raises(ValueError, match="line 2"):
        read_records(path)


def _scripted_run(tmp_path: Path, methods: tuple[str, ...], **kw: Any) -> dict[str, Any]:
    examples = load_dataset(DEMO_QUESTIONS, limit=3)
    answers = [make_generation([ex.answers[0]], [-0.01]) for ex in examples] * len(methods)
    config = EvalConfig("demo", methods, limit=3)
    return run_eval(
        config, tmp_path / "run", lm=ScriptedBackend(answers), examples=examples, progress=False, **kw
    )


def test_summary_counts_scores_and_refuses_to_mix_runs(tmp_path: Path) -> None:
    results = _scripted_run(tmp_path, ("no-retrieval",))
    (row,) = results["summary"]
    assert (
        row["method"] == "no-retrieval" and row["n"] == 3 and row["em"] == 1.0 and row["retrieval_rate"] == 0
    )
    assert (tmp_path / "run" / "results.md").read_text().count("| no-retrieval | 3 |") == 1
    assert results["provenance"]["git"]["commit"]
    with pytest.raises(RagateError, match="--resume"):
        _scripted_run(tmp_path, ("no-retrieval",))
    with pytest.raises(RagateError, match="methods"):
        _scripted_run(tmp_path, ("no-retrieval", "random"), resume=True)
    again = _scripted_run(tmp_path, ("no-retrieval",), resume=True)  # nothing left to do: no LM call
    assert again["summary"] == results["summary"]


def _eval_cmd(out: Path, index: Path) -> list[str]:
    # each run directory has its own call store: with the shared one (RAGATE_HOME), a run after the first is
    # answered from stored calls, writes all its lines between two polls and cannot be killed mid-run
    return [
        sys.executable, "-m", "ragate.cli.main", "eval", "--dataset", str(DEMO_QUESTIONS), "--methods",
        "no-retrieval,random", "--limit", "6", "--out", str(out), "--quiet", "--index", str(index),
        "--call-cache", str(out.with_suffix(".calls.sqlite")),
    ]  # fmt: skip


def test_sigkill_mid_run_then_resume_equals_an_uninterrupted_run(
    smollm2_path: Path, demo_bm25: Path, tmp_path: Path
) -> None:
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    subprocess.run(_eval_cmd(tmp_path / "whole", demo_bm25), check=True, env=env, capture_output=True, timeout=600)
    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        _eval_cmd(killed, demo_bm25), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    lines = killed / "questions.jsonl"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if lines.exists() and lines.read_text().count("\n") >= 4:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (killed / "results.json").exists()
    cut = len(read_records(lines))
    assert 4 <= cut < 12
    resumed = subprocess.run(
        [*_eval_cmd(killed, demo_bm25), "--resume"], check=False, env=env, capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stderr
    whole = read_records(tmp_path / "whole" / "questions.jsonl")
    again = read_records(lines)
    keys = [(r["id"], r["method"]) for r in again]
    assert len(keys) == len(set(keys)) == 12
    assert sorted(keys) == sorted((r["id"], r["method"]) for r in whole)
    by_key = {(r["id"], r["method"]): r for r in whole}
    for r in again:
        twin = by_key[r["id"], r["method"]]
        assert _answer(r) == _answer(twin)
    assert json.loads((killed / "results.json").read_text())["questions"] == 6


def test_sweep_lookup_equals_a_direct_run_at_that_threshold(
    llama_backend: Any, minilm: Any, tmp_path: Path
) -> None:
    from ragate.eval.sweep import method_records, point, sweep_pass
    from ragate.retrieval.demo import demo_index
    from ragate.retrieval.index import open_index

    examples = load_dataset(DEMO_QUESTIONS, limit=4)
    config = EvalConfig("demo", ("dtr",), limit=4)
    with open_index(demo_index()) as index:
        records = sweep_pass(config, tmp_path / "sweep", examples=examples, lm=llama_backend, retriever=index,
                             progress=False)  # fmt: skip
        rows = method_records(records, "dtr")
        scores = sorted(r["gates"]["dtr"]["score"] for r in rows)
        tau = (scores[1] + scores[2]) / 2  # half retrieve, half answer from the draft
        swept = point(rows, [s > tau for s in (r["gates"]["dtr"]["score"] for r in rows)])
        direct = run_eval(
            EvalConfig("demo", ("dtr",), limit=4, thresholds=(("dtr", tau),)),
            tmp_path / "direct",
            lm=llama_backend,
            retriever=index,
            examples=examples,
            progress=False,
        )
    (row,) = direct["summary"]
    assert row["retrieval_rate"] == swept["retrieval_rate"] == 0.5
    assert (row["em"], row["f1"], row["acc"]) == (swept["em"], swept["f1"], swept["acc"])
    per_q = {r["id"]: r for r in read_records(tmp_path / "direct" / "questions.jsonl")}
    for r, retrieve in zip(rows, [s > tau for s in (r["gates"]["dtr"]["score"] for r in rows)], strict=True):
        expect = r["open"] if retrieve else r["closed"]
        assert per_q[r["id"]]["prediction"] == expect["prediction"]
        assert per_q[r["id"]]["gate_score"] == r["gates"]["dtr"]["score"]


def test_a_sweeps_default_records_equal_a_direct_eval_and_join_its_report(
    llama_backend: Any, minilm: Any, tmp_path: Path
) -> None:
    """Issue G: an eval run's report takes what a sweep on the same questions already answered (gates at their
    default thresholds, never/always with a swept family's prompts) instead of computing it again; those rows
    are the answers a direct eval gives."""
    from ragate.eval.sweep import default_records, sweep_pass
    from ragate.report.tables import write_report
    from ragate.retrieval.demo import demo_index
    from ragate.retrieval.index import open_index

    examples = load_dataset(DEMO_QUESTIONS, limit=4)
    derivable = ("no-retrieval", "standard-rag", "dtr-no-ugt", "dtr", "llm-judge", "random")
    with open_index(demo_index()) as index:
        records = sweep_pass(EvalConfig("demo", ("dtr", "llm-judge", "random"), limit=4), tmp_path / "sweep",
                             examples=examples, lm=llama_backend, retriever=index, progress=False)  # fmt: skip
        run_eval(EvalConfig("demo", derivable, limit=4), tmp_path / "direct", lm=llama_backend, retriever=index,
                 examples=examples, progress=False)  # fmt: skip
        run_eval(EvalConfig("demo", ("hyde",), limit=4), tmp_path / "eval", lm=llama_backend, retriever=index,
                 examples=examples, progress=False)  # fmt: skip
    direct = {(r["id"], r["method"]): r for r in read_records(tmp_path / "direct" / "questions.jsonl")}
    derived = default_records(records)
    assert sorted({r["method"] for r in derived}) == sorted(derivable)
    assert len(derived) == 4 * len(derivable)
    for r in derived:
        twin = direct[r["id"], r["method"]]
        assert _answer(r) == _answer(twin), r["method"]
        if r["method"] in ("no-retrieval", "standard-rag", "dtr-no-ugt"):  # the very call, with its cost
            assert r["tokens"] == twin["prompt_tokens"] + twin["completion_tokens"]
    (report,) = [
        p for p in write_report(tmp_path / "eval", sweep=tmp_path / "sweep") if p.name == "report.md"
    ]
    text = report.read_text()
    assert "## Methods answered by the sweep" in text
    assert "| hyde | no-retrieval | 4 |" in text and "| dtr | standard-rag | 4 |" in text
    with pytest.raises(RagateError, match="no sweep.jsonl"):
        write_report(tmp_path / "eval", sweep=tmp_path / "direct")
    with pytest.raises(RagateError, match="holds no eval records"):
        write_report(tmp_path / "sweep", sweep=tmp_path / "sweep")


def test_a_run_grows_to_more_questions_and_computes_only_the_new_ones(tmp_path: Path) -> None:
    """--limit may grow on --resume (question i keeps its place and seed), not shrink."""
    examples = load_dataset(DEMO_QUESTIONS, limit=5)

    def run(limit: int | None, answers: list[Any], resume: bool = True) -> dict[str, Any]:
        config = EvalConfig("demo", ("no-retrieval",), limit=limit)
        return run_eval(config, tmp_path / "run", lm=ScriptedBackend(answers), examples=examples[:limit],
                        progress=False, resume=resume)  # fmt: skip

    first = [make_generation([ex.answers[0]], [-0.01]) for ex in examples[:3]]
    run(3, first, resume=False)
    later = [make_generation(["wrong"], [-0.01]) for _ in examples[3:]]  # only two calls are left to make
    grown = run(5, later)
    records = read_records(tmp_path / "run" / "questions.jsonl")
    assert [r["id"] for r in records] == [ex.id for ex in examples]  # nothing computed twice
    assert grown["questions"] == 5 and grown["summary"][0]["em"] == 3 / 5
    with pytest.raises(RagateError, match="limit=5, now limit=4"):
        run(4, [])


def test_the_demo_questions_load_by_name() -> None:
    demo = load_dataset("demo")
    assert len(demo) == 80 and demo[0].question == "who got the first nobel prize in physics"
    assert all(ex.gold_ids and ex.answers for ex in demo)


def test_a_dynamic_method_that_retrieves_gets_the_configured_index(tmp_path: Path) -> None:
    """Dynamic methods carry no gate; the run must still open the index for them (it did not, once)."""
    examples = load_dataset(DEMO_QUESTIONS, limit=2)
    answers = [make_generation([f"So the answer is {ex.answers[0]}."], [-0.01]) for ex in examples]
    config = EvalConfig("demo", ("single-rag",), limit=2)
    results = run_eval(
        config, tmp_path / "run", lm=ScriptedBackend(answers), examples=examples, progress=False
    )
    records = read_records(tmp_path / "run" / "questions.jsonl")
    assert [r.get("error") for r in records] == [None, None]
    assert [r["retrievals"] for r in records] == [1, 1] and all(len(r["doc_ids"]) == 3 for r in records)
    assert all(isinstance(r["supported"], bool) for r in records)  # the answer found in what it read, or not
    assert results["summary"][0]["retrieval_rate"] == 1.0


def test_a_resumed_run_retries_the_answers_that_failed(tmp_path: Path) -> None:
    first = _scripted_run(tmp_path, ("no-retrieval",))
    path = tmp_path / "run" / "questions.jsonl"
    records = read_records(path)
    failed = {
        "id": records[1]["id"],
        "dataset": "demo",
        "method": "no-retrieval",
        "error": "ValueError: no index",
    }
    with RecordWriter(path) as writer:  # as if the second question had failed (e.g. a missing index)
        writer.append(failed)
    assert sum("error" in r for r in latest(read_records(path))) == 1
    examples = load_dataset(DEMO_QUESTIONS, limit=3)
    answer = make_generation([examples[1].answers[0]], [-0.01])
    again = run_eval(
        EvalConfig("demo", ("no-retrieval",), limit=3),
        tmp_path / "run",
        lm=ScriptedBackend([answer]),
        examples=examples,
        progress=False,
        resume=True,
    )
    assert again["summary"][0]["n"] == 3 and again["summary"][0]["errors"] == 0
    assert again["summary"][0]["em"] == first["summary"][0]["em"] == 1.0


def test_provenance_names_the_llama_cpp_build_that_answered() -> None:
    from ragate.eval.provenance import engine_build, package_versions

    build = engine_build("llama.cpp")
    import llama_cpp

    assert package_versions()["llama_cpp_python"] == llama_cpp.__version__  # the binding, once, in "packages"
    assert "CPU" in build["system_info"] or "AVX" in build["system_info"], build
    assert "system_info" not in engine_build("openai")  # a server's build is not ours to name


def test_a_run_is_dirty_only_when_the_package_code_changed(tmp_path: Path) -> None:
    from ragate.eval.provenance import git_commit

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    (tmp_path / "pkg").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "pkg" / "code.py").write_text("x = 1\n")
    (tmp_path / "docs" / "questions.jsonl").write_text("{}\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    (tmp_path / "docs" / "questions.jsonl").write_text("{}\n{}\n")  # a run's own records being written
    assert git_commit(tmp_path / "pkg")["dirty"] is False
    (tmp_path / "pkg" / "code.py").write_text("x = 2\n")
    assert git_commit(tmp_path / "pkg")["dirty"] is True


def test_a_resume_that_computes_nothing_keeps_the_provenance_it_had(tmp_path: Path) -> None:
    """Rerunning a finished run (a script's step that only rereads the answers) must not claim today's commit,
    nor replace when the answers were computed."""
    from ragate.eval.run import _kept_provenance, _save_config

    _scripted_run(tmp_path, ("no-retrieval",))
    path = tmp_path / "run" / "results.json"
    saved = json.loads(path.read_text())
    saved["provenance"]["git"] = {"commit": "earlier", "dirty": False}
    saved["started"], saved["finished"] = 1000.0, 2000.0  # when the answers were computed
    path.write_text(json.dumps(saved))
    again = _scripted_run(tmp_path, ("no-retrieval",), resume=True)
    assert again["provenance"]["git"]["commit"] == "earlier"
    assert (again["started"], again["finished"]) == (1000.0, 2000.0)
    assert json.loads(path.read_text())["provenance"]["git"]["commit"] == "earlier"
    # a sweep's config.json: what else changed is written, the provenance stays that of the last computing part
    _save_config(tmp_path / "sweep", {"provenance": {"git": {"commit": "a"}}})
    kept = _kept_provenance(tmp_path / "sweep" / "config.json", computed=False)  # as sweep_pass resolves it
    assert _kept_provenance(tmp_path / "sweep" / "config.json", computed=True) is None
    _save_config(tmp_path / "sweep", {"provenance": kept or {"git": {"commit": "b"}}, "index_rebuilds": [1]})
    config = json.loads((tmp_path / "sweep" / "config.json").read_text())
    assert config["provenance"]["git"]["commit"] == "a" and config["index_rebuilds"] == [1]
    assert "provenance_history" not in config


def test_a_resume_under_another_commit_keeps_the_earlier_provenance(tmp_path: Path) -> None:
    from ragate.eval.run import _save_config

    first = {"dataset": "demo", "provenance": {"git": {"commit": "a"}}}
    _save_config(tmp_path, first)
    _save_config(tmp_path, first)  # the same: nothing added
    assert "provenance_history" not in json.loads((tmp_path / "config.json").read_text())
    _save_config(tmp_path, first | {"provenance": {"git": {"commit": "b"}}})
    _save_config(tmp_path, first | {"provenance": {"git": {"commit": "c"}}})
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["provenance"]["git"]["commit"] == "c"
    assert [p["git"]["commit"] for p in saved["provenance_history"]] == ["a", "b"]


def test_a_summary_counts_the_questions_whose_lm_call_stopped_at_its_token_cap() -> None:
    """Issue M: 272 of 300 NQ pseudo-contexts were cut at 128 tokens and no report said so."""
    from ragate.eval.summary import cut_at_cap_lines, summarize

    def record(i: int, reason: str) -> dict[str, Any]:
        stages = [
            {"name": "pseudo-context", "finish_reason": reason},
            {"name": "answer", "finish_reason": "stop"},
        ]
        return {
            "id": f"q{i}", "method": "dpr-ais", "scores": {"em": 1.0, "f1": 1.0, "acc": 1.0}, "retrieved": True,
            "retrievals": 1, "prompt_tokens": 1, "completion_tokens": 1, "overhead_tokens": 0, "seconds": 1.0,
            "trace": {"stages": stages},
        }  # fmt: skip

    rows = summarize([record(0, "length"), record(1, "stop"), record(2, "length")])
    assert rows[0]["cut_at_cap"] == {"pseudo-context": 2}
    assert "- dpr-ais: pseudo-context 2 of 3" in cut_at_cap_lines(rows)


def test_a_fold_refuses_a_shard_that_lost_a_record(
    smollm2_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ragate.cli.main import main

    base = [
        "eval",
        "--dataset",
        "demo",
        "--limit",
        "6",
        "--methods",
        "no-retrieval",
        "--quiet",
        "--no-call-cache",
    ]
    shards = [str(tmp_path / f"s{i}") for i in (0, 1)]
    for i, out in enumerate(shards):
        assert main([*base, "--shard", f"{i}/2", "--out", out]) == 0
    path = Path(shards[1]) / "questions.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:1] + lines[2:]))  # a record deleted (a lost line)
    capsys.readouterr()
    assert main(["eval", "--fold", *shards, "--out", str(tmp_path / "folded")]) == 2
    said = capsys.readouterr().err
    assert "(shard 1/2) holds 2 answers for its 3 questions x 1 methods = 3" in said and "--resume" in said
    assert not (tmp_path / "folded" / "config.json").exists()
    assert main([*base, "--shard", "1/2", "--out", shards[1], "--resume"]) == 0  # answers the lost one again
    assert main(["eval", "--fold", *shards, "--out", str(tmp_path / "folded")]) == 0
    assert len(read_records(tmp_path / "folded" / "questions.jsonl")) == 6


def test_a_dataset_that_cannot_be_found_writes_no_run_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: `ragate eval --dataset MISSING --out DIR` made DIR, then refused the dataset."""
    from ragate.cli.main import main

    out = tmp_path / "run"
    argv = ["eval", "--dataset", str(tmp_path / "nope.jsonl"), "--methods", "no-retrieval", "--out", str(out)]
    assert main(argv) == 2
    assert "unknown dataset" in capsys.readouterr().err and not out.exists()
