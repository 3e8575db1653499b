"""What a gate saved against always retrieving (ragate.answers.savings): the measured and estimated costs, the answer log
and its report. Traces are built by hand here, to know every number exactly; tests/test_service.py checks the same
figures on a real service's answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragate.answers.savings import AlwaysRetrieveCost, AnswerLog, Cost, log_entry, read_log, savings_report
from ragate.cli.main import main
from ragate.errors import RunFormatError
from ragate.gates.base import GateDecision
from ragate.methods.trace import Stage, Trace

DRAFT = Stage("draft", 30, 20, 1.0)
PSEUDO = Stage("pseudo-context", 30, 100, 4.0)
RETRIEVE = Stage("retrieve", 0, 0, 0.5)
READ = Stage("answer", 800, 10, 20.0)


def _trace(method: str, retrieved: bool, stages: tuple[Stage, ...], gate_stages: int | None = 1) -> Trace:
    decision = GateDecision(retrieved, 0.7 if retrieved else 0.2, 0.5, "margin")
    return Trace(method, "q", "a", retrieved, decision, (), (), stages, gate_stages=gate_stages)


def test_retrieved_answers_are_measured_and_skipped_ones_estimated_from_them() -> None:
    costs = AlwaysRetrieveCost(window=2)
    skipped = _trace("targ-margin", False, (DRAFT,))
    first = costs.savings(skipped)
    assert (first.how, first.always, first.saved) == ("unknown", None, None)
    assert first.spent == Cost(50, 1.0) and first.gate == Cost(50, 1.0)

    read = costs.savings(_trace("targ-margin", True, (DRAFT, RETRIEVE, READ)))
    assert read.how == "measured" and read.always == Cost(810, 20.5)  # retrieval and reading, not the draft
    assert read.saved == Cost(-50, -1.0)  # the draft was the gate's extra cost

    longer = Stage("answer", 1200, 10, 30.0)
    costs.savings(_trace("targ-margin", True, (DRAFT, RETRIEVE, longer)))
    later = costs.savings(skipped)
    assert later.how == "estimated" and later.always == Cost(1010, 25.5)  # the mean of the two that retrieved
    assert later.saved == Cost(960, 24.5) and "last 2 answers of targ-margin" in later.estimator
    other = costs.savings(_trace("dtr", False, (DRAFT,)))
    assert other.how == "unknown"  # estimates are per method

    third = Stage("answer", 400, 10, 10.0)
    costs.savings(_trace("targ-margin", True, (DRAFT, RETRIEVE, third)))  # the window keeps the last two
    assert costs.savings(skipped).always == Cost(810, 20.5)


def test_a_pseudo_context_the_gate_wrote_and_the_selector_reused_belongs_to_always_retrieving() -> None:
    pairs = _trace("pairs", True, (DRAFT, PSEUDO, Stage("answer", 30, 5, 0.5), RETRIEVE, READ), gate_stages=3)
    s = AlwaysRetrieveCost().savings(pairs)
    assert s.always == Cost(130 + 810, 4.0 + 20.5) and s.gate == Cost(50 + 130 + 35, 5.5)


def test_methods_that_decide_while_answering_have_no_gate_to_remove() -> None:
    s = AlwaysRetrieveCost().savings(_trace("etc", True, (Stage("generate", 100, 50, 3.0), RETRIEVE), None))
    assert s.how == "n/a" and s.saved is None and s.gate == Cost(0, 0.0)


def _log(path: Path) -> None:
    costs = AlwaysRetrieveCost()
    log = AnswerLog(path)
    plan = [(True, 100.0), (False, 130.0), (False, 170.0), (True, 220.0), (False, 290.0)]
    for retrieved, at in plan:
        stages = (DRAFT, RETRIEVE, READ) if retrieved else (DRAFT,)
        trace = _trace("targ-margin", retrieved, stages)
        log.write(log_entry(trace, costs.savings(trace), model="m", at=at))
    log.close()


def test_the_report_adds_up_the_savings_and_the_rate_over_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "answers.jsonl"
    _log(path)
    entries = list(read_log(path))
    assert len(entries) == 5 and all("question" not in e and "answer" not in e for e in entries)  # no text
    text = savings_report(entries, periods=2)
    # spent: 2 x 860 + 3 x 50 = 1870; always: 5 x 810 = 4050; saved 3 x 760 - 2 x 50 = 2180 (+53.8%)
    assert "| targ-margin | 5 | 40.0% | 1870 | 4050 | +2180 | +53.8% |" in text
    assert "| 1970-01-01 00:01:40 | 3 | 33.3% | 960 | +1470 |" in text  # t = 100..195
    assert "| 1970-01-01 00:03:15 | 2 | 50.0% | 910 | +710 |" in text
    assert main(["report", str(path), "--out", str(tmp_path / "savings.md")]) == 0
    full = savings_report(entries)
    assert capsys.readouterr().out == f"{full}wrote {tmp_path / 'savings.md'}\n"
    assert (tmp_path / "savings.md").read_text() == full


def test_a_damaged_log_is_named_and_a_cut_last_line_skipped(tmp_path: Path) -> None:
    path = tmp_path / "answers.jsonl"
    _log(path)
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines) + "\n" + lines[0][:40])  # killed mid-write
    assert len(list(read_log(path))) == 5
    path.write_text("\n".join([lines[0], "{not json", *lines[1:]]) + "\n")
    with pytest.raises(RunFormatError, match=r"answers.jsonl, line 2: not an answer-log entry"):
        list(read_log(path))
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"question": "q"}) + "\n" + json.dumps({"question": "r"}) + "\n")
    with pytest.raises(RunFormatError, match="line 1"):
        list(read_log(other))
    assert main(["report", str(other)]) == 2
