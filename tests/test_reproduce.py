"""``ragate reproduce`` sets its thresholds apart from the questions it scores, and runs a method at a tuned value.

The first test reads reproduce's own record of a paper-rate row (each half's tau and each question's decision) and
checks it against thresholds computed here from the other half's scores alone, on scores where one tau from all
the questions decides differently: putting that leak back into :func:`ragate.report.reproduce._ours` fails it. The
second runs ETC at a tuned alpha through :func:`ragate.report.reproduce.reproduce` with SmolLM2 on one HotpotQA
question and checks the value the run decided with.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_tune import _tune_file, validation_block

from ragate.errors import RagateError
from ragate.report.reproduce import _ours
from ragate.tuning.calibrate import halves, threshold_for_budget

RATE = 0.3


def _sweep() -> list[dict]:  # type: ignore[type-arg]
    """Twelve swept questions: retrieval answers right where the closed book is wrong, scores spread so that the
    two halves' thresholds differ from each other and from the one of all twelve."""
    scores = [0.6, 0.95, 0.8, 0.2, 0.5, 0.02, 0.1, 0.9, 0.05, 0.7, 0.85, 0.15]
    rows = []
    for i, s in enumerate(scores):
        right = {"em": 1.0, "f1": 1.0, "acc": 1.0}
        wrong = {"em": 0.0, "f1": 0.0, "acc": 0.0}
        rows.append({
            "id": f"q{i:02d}", "gates": {"targ-margin": {"score": s, "retrieve": s > 0.5}},
            "open": {"scores": right if i % 2 else wrong}, "closed": {"scores": wrong if i % 2 else right},
        })  # fmt: skip
    return rows


def test_a_paper_rate_row_decides_each_half_at_the_tau_of_the_other_half() -> None:
    sweep = _sweep()
    row = {"method": "targ-margin", "label": "MARGIN", "point": "rate",
           "paper": {"em": 39.6, "retrieval_rate": RATE}}  # fmt: skip
    got = _ours(row, "NQ-Open", sweep, [], {"kind": "table", "metrics": ["em"]})
    ids = [r["id"] for r in sweep]
    scores = {r["id"]: r["gates"]["targ-margin"]["score"] for r in sweep}
    half = dict(zip(ids, halves(ids), strict=True))
    # each half's tau from the other half's scores only, computed here (not by reproduce's helper)
    tau = {k: threshold_for_budget([scores[i] for i in ids if half[i] != k], RATE) for k in (0, 1)}
    assert got.taus == (tau[0], tau[1]) and tau[0] != tau[1]
    expected = {i: scores[i] > tau[half[i]] for i in ids}
    assert got.decisions == expected
    # the test can tell: one tau from all twelve scores (the leak) decides at least one question otherwise
    leak = threshold_for_budget(list(scores.values()), RATE)
    assert {i: scores[i] > leak for i in ids} != expected and leak not in got.taus
    # and the row's numbers are those decisions' answers
    assert got.n == len(ids) and got.ours["retrieval_rate"] == sum(expected.values()) / len(ids)
    em = [(r["open"] if expected[r["id"]] else r["closed"])["scores"]["em"] for r in sweep]
    assert got.ours["em"] == pytest.approx(100 * sum(em) / len(em))


def test_reproduce_runs_a_method_at_its_tuned_value(tmp_path: Path, smollm2_path: Path) -> None:
    from ragate.eval.datasets import dataset_files, load_dataset
    from ragate.report.reproduce import reproduce
    from ragate.retrieval.demo import demo_index

    try:
        hotpot = load_dataset("hotpotqa")
    except RagateError as err:
        pytest.skip(f"HotpotQA is not here ({err}): ../shared/data is absent")
    tuned = _tune_file(
        tmp_path, "hotpot.json", dataset="hotpotqa", offset=300, dataset_files=dataset_files("hotpotqa"),
        dev="hotpotqa[300:302]", validation=validation_block(hotpot[300:302]), tau=2.0, default=1.3,
        test_split={"dataset": "hotpotqa", "offset": 0, "limit": 300},
    )  # fmt: skip
    table = reproduce(
        "etc-table2", tmp_path / "r", datasets=["hotpotqa"], methods=["etc"], calibration=[tuned], limit=1,
        index=str(demo_index()), progress=False,
    )  # fmt: skip
    etc = next(r for r in table["rows"] if r["method"] == "etc")
    assert etc["n"] == 1 and etc["note"].startswith("alpha = 2 tuned on hotpotqa[300:302]")
    run = tmp_path / "r" / "hotpotqa-tuned-etc"
    assert json.loads((run / "results.json").read_text())["config"]["thresholds"] == {"etc": 2.0}
    (record,) = [json.loads(line) for line in (run / "questions.jsonl").read_text().splitlines()]
    # the question was decided at the tuned alpha, not ETC's default 1.3
    assert record["threshold"] == 2.0 and record["trace"]["gate"]["threshold"] == 2.0
