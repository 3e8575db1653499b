"""The papers' analyses over hand-built run records (they are pure functions of the records), and the report a run
directory gets: AUROC against hand values and a brute-force pair count, deciles and quadrants that account for
every question, threshold transfer, recall and PAIRS tables, and real PNGs from matplotlib."""

from __future__ import annotations

import itertools
import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragate.errors import RagateError
from ragate.eval.records import read_records, write_records
from ragate.eval.summary import summarize
from ragate.eval.sweep import frontier, sweep_markdown
from ragate.report.analysis import (
    accuracy_by_decile,
    decile_bins,
    frontier_points,
    gate_auroc,
    pairs_breakdown,
    quadrant_table,
    recall_comparison,
    threshold_transfer,
)
from ragate.report.tables import operating_points, write_report
from ragate.uncertainty import auroc

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
GATES = ("targ-margin", "targ-entropy")
THRESHOLD = 0.5


def _answer(em: float, *, recall: float | None = None) -> dict[str, Any]:
    return {
        "prediction": "x",
        "scores": {"em": em, "f1": em, "acc": em},
        "doc_ids": ["d1", "d2", "d3"] if recall is not None else [],
        "recall@3": recall,
        "seconds": 0.1,
        "tokens": 10,
    }


def _sweep_record(qid: str, closed: float, opened: float, scores: dict[str, float]) -> dict[str, Any]:
    gates = {
        m: {"score": s, "threshold": THRESHOLD, "retrieve": s > THRESHOLD, "seconds": 0.01}
        for m, s in scores.items()
    }
    return {
        "id": qid,
        "family": "targ",
        "methods": list(scores),
        "closed": _answer(closed),
        "open": _answer(opened, recall=0.5),
        "gates": gates,
    }


def _synthetic_sweep(n: int = 40, seed: int = 0) -> list[dict[str, Any]]:
    """Closed-book right mostly at low margin scores; entropy's score is noise."""
    rng = random.Random(seed)
    records = []
    for i in range(n):
        margin = (i + 0.5) / n
        closed = float(rng.random() > margin)
        opened = float(rng.random() < 0.6)
        records.append(
            _sweep_record(f"q{i}", closed, opened, {"targ-margin": margin, "targ-entropy": rng.random()})
        )
    return records


def _eval_record(qid: str, method: str, em: float, retrieved: bool, recall: float | None) -> dict[str, Any]:
    return {
        "id": qid,
        "dataset": "synthetic",
        "method": method,
        "question": f"question {qid}?",
        "answers": ["x"],
        "prediction": "x" if em else "y",
        "scores": {"em": em, "f1": em, "acc": em},
        "retrieved": retrieved,
        "retrievals": int(retrieved),
        "gate_score": None,
        "threshold": None,
        "doc_ids": ["d1", "d2", "d3"] if retrieved else [],
        "recall@3": recall if retrieved else None,
        "prompt_tokens": 50,
        "completion_tokens": 5,
        "overhead_tokens": 0,
        "seconds": 0.2 + 0.1 * retrieved,
        "trace": {},
    }


def _synthetic_eval(n: int = 12) -> list[dict[str, Any]]:
    records = []
    for i in range(n):
        q = f"q{i}"
        records.append(_eval_record(q, "no-retrieval", float(i % 2 == 0), False, None))
        records.append(_eval_record(q, "standard-rag", float(i % 3 != 0), True, 1.0 if i % 2 else 0.0))
        if i:
            records.append(_eval_record(q, "hyde", float(i % 3 == 0), True, 0.5))
        records.append(_eval_record(q, "dpr-ais", 1.0, True, 1.0))
        records.append(_eval_record(q, "pairs", float(i < 8), i >= 4, 1.0))  # q0-q3 answered directly
    records.append({"id": "q0", "dataset": "synthetic", "method": "hyde", "error": "ValueError: boom"})
    return records


# --- AUROC ----------------------------------------------------------------------------------------------------


def test_auroc_hand_values() -> None:
    assert auroc([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1]) == 1.0
    assert auroc([0.9, 0.8, 0.2, 0.1], [0, 0, 1, 1]) == 0.0
    assert auroc([0.3, 0.3, 0.3, 0.3], [0, 1, 0, 1]) == 0.5
    # positives 0.35, 0.8 vs negatives 0.1, 0.4: 3 of the 4 pairs ordered right
    assert auroc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == 0.75
    # a tie between a positive and a negative counts one half: (1 + 0.5 + 2) / 4
    assert auroc([0.2, 0.5, 0.5, 0.9], [False, True, False, True]) == 0.875
    assert auroc([0.1, 0.2], [1, 1]) is None
    assert auroc([], []) is None
    with pytest.raises(ValueError, match="one label per score"):
        auroc([0.1, 0.2], [1])


def _pairwise_auroc(scores: list[float], labels: list[bool]) -> float | None:
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    if not pos or not neg:
        return None
    wins = sum(1.0 if p > q else 0.5 if p == q else 0.0 for p in pos for q in neg)
    return wins / (len(pos) * len(neg))


@given(st.lists(st.tuples(st.integers(0, 6), st.booleans()), max_size=40))
def test_auroc_equals_the_pairwise_count(data: list[tuple[int, bool]]) -> None:
    scores = [s / 3 for s, _ in data]  # few distinct values: many ties
    labels = [y for _, y in data]
    expected = _pairwise_auroc(scores, labels)
    got = auroc(scores, labels)
    assert got == expected if expected is None else got == pytest.approx(expected, abs=1e-12)


def test_gate_auroc_ranks_the_informative_gate_higher() -> None:
    records = _synthetic_sweep(200)
    result = gate_auroc(records)
    assert set(result) == set(GATES)
    margin, entropy = result["targ-margin"], result["targ-entropy"]
    assert margin is not None and entropy is not None
    assert margin > 0.75 and abs(entropy - 0.5) < 0.15
    labels = [r["closed"]["scores"]["em"] == 0 for r in records]
    assert margin == pytest.approx(
        _pairwise_auroc([r["gates"]["targ-margin"]["score"] for r in records], labels)
    )


# --- deciles, quadrants, frontier -----------------------------------------------------------------------------


def test_decile_bins_cover_every_question_once_and_keep_ties_together() -> None:
    records = _synthetic_sweep(40)
    rows = accuracy_by_decile(records, "targ-margin")
    assert [r["decile"] for r in rows] == list(range(1, 11))
    assert [r["n"] for r in rows] == [4] * 10
    assert all(a["hi"] < b["lo"] for a, b in itertools.pairwise(rows))
    closed = [r["closed"]["scores"]["em"] for r in records]  # scores rise with the index
    assert rows[0]["closed_acc"] == pytest.approx(sum(closed[:4]) / 4)

    scores = [0.2] * 7 + [0.5] * 2 + [0.9, 0.1, 0.7, 0.7]  # 13 questions, ties across bin edges
    bins = decile_bins(scores)
    assert len(bins) == len(scores)
    for s in set(scores):
        assert len({b for b, x in zip(bins, scores, strict=True) if x == s}) == 1
    shuffled = list(zip(scores, bins, strict=True))
    random.Random(1).shuffle(shuffled)
    assert decile_bins([s for s, _ in shuffled]) == [b for _, b in shuffled]  # order does not matter
    tied = [_sweep_record(f"q{i}", 1.0, 0.0, {"targ-margin": s}) for i, s in enumerate(scores)]
    tied_rows = accuracy_by_decile(tied, "targ-margin")
    assert sum(r["n"] for r in tied_rows) == len(scores)
    # bin = floor(10 * #below / 13): 0.1 and the seven 0.2s -> 0, 0.5 -> 6, 0.7 -> 7, 0.9 -> 9
    assert [(r["decile"], r["lo"], r["hi"], r["n"]) for r in tied_rows] == [
        (1, 0.1, 0.2, 8),
        (7, 0.5, 0.5, 2),
        (8, 0.7, 0.7, 2),
        (10, 0.9, 0.9, 1),
    ]


def test_quadrant_counts_hand_case_and_sum_to_n() -> None:
    records = [
        _sweep_record("a", 0.0, 1.0, {"targ-margin": 0.1}),  # low U, retrieval helps: (a)
        _sweep_record("b", 1.0, 0.0, {"targ-margin": 0.9}),  # high U, hurts: (b)
        _sweep_record("c", 0.0, 1.0, {"targ-margin": 0.8}),  # high U, helps: (c)
        _sweep_record("d1", 1.0, 1.0, {"targ-margin": 0.2}),  # low U, neutral
        _sweep_record("d2", 1.0, 0.0, {"targ-margin": 0.3}),  # low U, hurts
        _sweep_record("e", 0.0, 0.0, {"targ-margin": 0.6}),  # high U, neutral
    ]
    q = quadrant_table(records, "targ-margin")
    assert q["tau"] == THRESHOLD and q["n"] == 6
    cells = ("low_helps", "low_neutral", "low_hurts", "high_helps", "high_neutral", "high_hurts")
    assert {c: q[c] for c in cells} == dict.fromkeys(cells, 1)  # type: ignore[literal-required]
    everything = quadrant_table(records, "targ-margin", tau=0.0)  # every question is "high U"
    assert (everything["high_helps"], everything["high_neutral"], everything["high_hurts"]) == (2, 2, 2)
    for method in GATES:
        for tau in (None, 0.25, 0.75):
            t = quadrant_table(_synthetic_sweep(37), method, tau=tau)
            assert sum(t[c] for c in cells) == t["n"] == 37  # type: ignore[literal-required]


def test_frontier_points_run_from_never_to_always() -> None:
    records = _synthetic_sweep(30)
    p = frontier_points(records, "targ-margin")
    never = sum(r["closed"]["scores"]["em"] for r in records) / 30
    always = sum(r["open"]["scores"]["em"] for r in records) / 30
    assert p["never"] == (0.0, pytest.approx(never)) and p["always"] == (1.0, pytest.approx(always))
    assert p["curve"][0] == (0.0, pytest.approx(never)) and p["curve"][-1] == (1.0, pytest.approx(always))
    assert [x for x, _ in p["curve"]] == sorted(x for x, _ in p["curve"]) and len(p["curve"]) == 31
    assert p["random"][5] == (0.5, pytest.approx((never + always) / 2))
    assert p["default"][0] == pytest.approx(sum(r["gates"]["targ-margin"]["retrieve"] for r in records) / 30)
    with pytest.raises(RagateError, match="no records for method 'dtr'"):
        frontier_points(records, "dtr")


# --- threshold transfer ---------------------------------------------------------------------------------------


def test_threshold_transfer_between_two_sweeps() -> None:
    # source scores 0.05 .. 0.95: a budget of 0.5 gives tau = 0.45; the target scores are all higher
    source = [_sweep_record(f"s{i}", 1.0, 1.0, {"targ-margin": 0.05 + 0.1 * i}) for i in range(10)]
    target = [
        _sweep_record(f"t{i}", float(i < 5), float(i >= 5), {"targ-margin": 0.5 + 0.05 * i})
        for i in range(10)
    ]
    t = threshold_transfer(source, target, "targ-margin", 0.5)
    assert t["transferred"]["tau"] == pytest.approx(0.45)
    assert t["transferred"]["retrieval_rate"] == 1.0  # every target score is above the source's tau
    assert t["transferred"]["em"] == 0.5
    assert t["retuned"]["tau"] == pytest.approx(0.7) and t["retuned"]["retrieval_rate"] == 0.5
    assert t["retuned"]["em"] == 1.0 and t["delta_em"] == -0.5
    best = threshold_transfer(source, target, "targ-margin", None)  # TARG S8: the best-EM tau
    assert best["retuned"]["em"] == 1.0 and best["transferred"]["em"] == 0.5
    same = threshold_transfer(target, target, "targ-margin", 0.3)
    assert same["delta_em"] == 0.0 and same["transferred"] == same["retuned"]


# --- eval-record tables ---------------------------------------------------------------------------------------


def test_recall_comparison_counts_only_retrieved_questions_with_gold() -> None:
    records = _synthetic_eval(12)
    records.append(_eval_record("q99", "standard-rag", 1.0, True, None))  # no gold passages: left out
    rows = {r["method"]: r for r in recall_comparison(records, k=3)}
    assert set(rows) == {"standard-rag", "hyde", "dpr-ais", "pairs"}  # no-retrieval never retrieved
    assert rows["standard-rag"]["n"] == 12 and rows["standard-rag"]["recall"] == 0.5
    assert rows["hyde"]["n"] == 11 and rows["hyde"]["recall"] == 0.5  # the error record is skipped
    assert rows["pairs"]["n"] == 8 and rows["dpr-ais"]["recall"] == 1.0
    assert recall_comparison(records, k=5) == []


def test_pairs_breakdown() -> None:
    b = pairs_breakdown(_synthetic_eval(12))
    assert (b["n"], b["direct_n"], b["retrieved_n"], b["reference_n"]) == (12, 4, 8, 4)
    assert b["direct_acc"] == 1.0 and b["retrieved_acc"] == 0.5 and b["reference_acc"] == 1.0
    none = pairs_breakdown(_synthetic_eval(12), reference="dtr-no-ugt")
    assert none["reference_n"] == 0 and none["reference_acc"] is None
    with pytest.raises(RagateError, match="no answers from method 'pairs-exclude-num'"):
        pairs_breakdown(_synthetic_eval(4), "pairs-exclude-num")


# --- write_report ---------------------------------------------------------------------------------------------


def _run_dir(path: Path, *, sweep: bool = True, results: bool = True) -> Path:
    records = _synthetic_eval(12)
    methods = ["no-retrieval", "standard-rag", "hyde", "dpr-ais", "pairs"]
    path.mkdir(parents=True)
    write_records(path / "questions.jsonl", records)
    if results:
        config = {
            "dataset": "synthetic",
            "methods": methods,
            "model": None,
            "engine": "scripted",
            "index": None,
        }
        result = {"config": config, "questions": 12, "provenance": {}, "summary": summarize(records, methods)}
        (path / "results.json").write_text(json.dumps(result))
    if sweep:
        write_records(path / "sweep.jsonl", _synthetic_sweep(40))
    return path


def _check_png(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000


def test_compare_adds_named_pairs_and_refuses_a_method_the_run_lacks() -> None:
    from ragate.eval.summary import paired_differences, parse_pair

    ids = [f"q{i}" for i in range(40)]
    records = [_scored("no-retrieval", q, 0.0) for q in ids]
    records += [_scored("dpr-ais", q, 1.0) for q in ids]
    records += [_scored("dtr-no-ugt", q, float(i < 10)) for i, q in enumerate(ids)]  # 10 of 40 right
    rows = paired_differences(records, "acc", compare=[parse_pair("dpr-ais:dtr-no-ugt")])
    assert [(r["method"], r["against"]) for r in rows] == [
        ("dpr-ais", "no-retrieval"),
        ("dtr-no-ugt", "no-retrieval"),
        ("dpr-ais", "dtr-no-ugt"),
    ]
    assert rows[-1]["delta"] == pytest.approx(0.75) and rows[-1]["verdict"] == "higher"
    # a pair the default rows already hold is not repeated
    assert len(paired_differences(records, "acc", compare=[("dpr-ais", "no-retrieval")])) == 2
    with pytest.raises(
        RagateError, match="no answers from pairs in this run; its methods are no-retrieval, dpr-ais"
    ):
        paired_differences(records, "acc", compare=[("pairs", "dpr-ais")])
    for bad in ("dpr-ais", "dpr-ais:", ":x", "a:b:c"):
        with pytest.raises(RagateError, match="METHOD:AGAINST"):
            parse_pair(bad)
    with pytest.raises(RagateError, match="with itself"):
        parse_pair("pairs:pairs")


def test_report_compare_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ragate.cli.main import main

    run = _run_dir(tmp_path / "run", sweep=False)
    assert main(["report", str(run), "--metric", "acc", "--compare", "pairs:hyde"]) == 0
    md = (run / "report" / "report.md").read_text()
    assert (
        "then the pairs asked for with --compare" in md and "| pairs | hyde | 11 |" in md
    )  # hyde failed once
    assert main(["report", str(run), "--compare", "pairs:nope"]) != 0
    assert "no answers from nope" in capsys.readouterr().err


def test_write_report_writes_tables_and_plots(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "run")
    written = write_report(run)
    out = run / "report"
    assert written == [out / n for n in ("report.md", "frontier.png", "deciles.png", "report.html")]
    md = (out / "report.md").read_text()
    for expected in (
        "| method | n | EM | F1 |",  # the eval summary
        "| gate method | n | Never EM | Always EM |",  # the sweep
        "| targ-margin | 40 |",
        "## Gate AUROC",
        "gate-score decile (TARG A.6)",
        "| (a) low U, Δ>0 |",
        "| standard-rag | 12 | 50.0 |",  # recall@3
        "| pairs | 12 | 4 / 100.0 | 8 / 50.0 | 4 / 100.0 (dpr-ais) |",
        "![frontier](frontier.png)",
    ):
        assert expected in md
    _check_png(out / "frontier.png")
    _check_png(out / "deciles.png")
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 2 and "<th>gate method</th>" in page
    assert "<td>targ-margin</td>" in page and "|---" not in page


def test_the_report_metric_names_the_tables_it_fills(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "run")
    path = run / "questions.jsonl"
    records = read_records(path)
    for r in records:  # acc the opposite of EM for PAIRS, so the two tables cannot coincide
        if r.get("method") == "pairs":
            r["scores"]["acc"] = 1.0 - r["scores"]["em"]
    write_records(path, records)
    md = write_report(run, metric="acc")[0].read_text()
    assert "DQ (answered directly): n / acc (contains)" in md
    assert "| pairs | 12 | 4 / 0.0 | 8 / 50.0 |" in md  # q0-q3 direct: EM 100, acc 0
    assert "Closed-book / retrieval acc (contains) (%)" in md and "keeps the acc (contains) (Δ)" in md
    assert "| gate method | n | Never acc | Always acc |" in md and "Never EM" not in md


def test_the_sweep_table_reads_the_metric_it_names() -> None:
    """Closed-book answers right by acc and wrong by EM; retrieval answers the reverse: the two tables disagree
    in every column, and each column is the chosen metric's."""
    records = []
    for i in range(4):
        r = _sweep_record(f"q{i}", 0.0, 1.0, {"targ-margin": (i + 0.5) / 4})
        r["closed"]["scores"]["acc"] = 1.0
        r["open"]["scores"]["acc"] = 0.0
        records.append(r)
    fronts = [frontier(records, "targ-margin")]
    em_row = sweep_markdown(fronts).splitlines()[2]
    acc_row = sweep_markdown(fronts, "acc").splitlines()[2]
    # default tau 0.5 retrieves q2, q3; best EM retrieves all, best acc none; budgets retrieve 0, 2, 3 (tau = F^-1(1 - rho))
    assert (
        em_row == "| targ-margin | 4 | 0.0 | 100.0 | 0.50 / 50.0 | 100.0 (1.00, 0.125) | 0.0 / 50.0 / 75.0 |"
    )
    assert (
        acc_row
        == "| targ-margin | 4 | 100.0 | 0.0 | 0.50 / 50.0 | 100.0 (0.00, 0.875) | 100.0 / 50.0 / 25.0 |"
    )
    with pytest.raises(RagateError, match="unknown metric 'bleu'"):
        sweep_markdown(fronts, "bleu")


def test_methods_that_share_an_operating_point_share_one_label() -> None:
    rows = [
        {"method": "dpr-ais", "n": 30, "retrieval_rate": 1.0, "acc": 0.5},
        {"method": "dpr-ais-rerank", "n": 30, "retrieval_rate": 1.0, "acc": 0.5},
        {"method": "standard-rag", "n": 30, "retrieval_rate": 1.0, "acc": 1 / 3},
        {"method": "pairs", "n": 30, "retrieval_rate": 0.8, "acc": 0.5},
        {"method": "unanswered", "n": 0, "retrieval_rate": 0.0, "acc": 0.0},
    ]
    assert operating_points(rows, "acc") == [
        (1.0, 50.0, "dpr-ais, dpr-ais-rerank"),
        (1.0, 33.333333, "standard-rag"),
        (0.8, 50.0, "pairs"),
    ]


def _sentence_answers(records: list[dict[str, Any]]) -> None:
    """Answers in sentences: EM 0 everywhere, accuracy (the gold answer contained) as EM was."""
    for r in records:
        for scores in [r.get("scores"), *(r[side]["scores"] for side in ("closed", "open") if side in r)]:
            if scores is not None:
                scores["acc"], scores["em"], scores["f1"] = scores["em"], 0.0, 0.2 * scores["em"]


def test_the_report_plots_accuracy_when_em_is_near_zero_for_sentence_answers(tmp_path: Path) -> None:
    from ragate.report.tables import report_metric

    run = _run_dir(tmp_path / "run")
    for name in ("questions.jsonl", "sweep.jsonl"):
        records = read_records(run / name)
        _sentence_answers(records)
        write_records(run / name, records)
    (run / "results.json").unlink()
    md = write_report(run)[0].read_text()
    assert md.splitlines()[2].startswith(
        "**Metric: acc (contains).** EM is at most 0.0% here while accuracy reaches"
    )
    assert (
        "| gate method | n | Never acc | Always acc |" in md
        and "Closed-book / retrieval acc (contains)" in md
    )
    assert "## Paired differences in acc (contains)" in md
    assert "Metric:" not in write_report(run, metric="em")[0].read_text()  # asked for: kept
    # EM that is not near zero, or accuracy no higher: EM, as before
    assert report_metric(_synthetic_eval(12), _synthetic_sweep(40)) == ("em", None)
    flat = _synthetic_eval(12)
    for r in flat:
        if "scores" in r:
            r["scores"] = {"em": 0.0, "f1": 0.0, "acc": 0.04}
    assert report_metric(flat, []) == ("em", None)


def test_the_plots_carry_bootstrap_intervals() -> None:
    from ragate.eval.metrics import bootstrap_ci
    from ragate.report.tables import operating_intervals, plot_operating_points

    records = _synthetic_sweep(40)
    plot = frontier_points(records, "targ-margin", "acc")
    closed = [r["closed"]["scores"]["acc"] for r in records]
    assert plot["intervals"]["never"] == bootstrap_ci(closed)
    for name in ("default", "never", "always"):
        lo, hi = plot["intervals"][name]
        y = {"default": plot["default"], "never": plot["never"], "always": plot["always"]}[name][1]
        assert 0.0 <= lo <= y <= hi <= 1.0 and hi > lo
    for row in accuracy_by_decile(records, "targ-margin", "acc"):
        assert row["closed_ci"][0] <= row["closed_acc"] <= row["closed_ci"][1]
    rows = summarize(_synthetic_eval(12))
    intervals = operating_intervals(rows, "em")
    by_method = {r["method"]: r for r in rows}
    std = by_method["standard-rag"]
    assert intervals[(1.0, round(100 * std["em"], 6))] == tuple(std["em_ci"])
    assert plot_operating_points(rows, "em").startswith(PNG_MAGIC)


def test_write_report_without_sweep_or_results(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "run", sweep=False, results=False)
    written = write_report(run, out=tmp_path / "elsewhere")
    assert [p.name for p in written] == ["report.md", "frontier.png", "report.html"]
    md = written[0].read_text()
    assert "no results.json" in md and "| hyde | 11 (1 errors) |" in md and "Never EM" not in md
    _check_png(written[1])


def test_write_report_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(RagateError, match="neither questions.jsonl .* nor sweep.jsonl"):
        write_report(tmp_path)
    run = _run_dir(tmp_path / "run", sweep=False)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    with pytest.raises(RagateError, match=r"pip install 'ragate\[eval\]'"):
        write_report(run)
    assert not (run / "report").exists()


def test_dynamic_runs_measure_latency_against_wo_rag() -> None:
    def rec(q: str, method: str, seconds: float) -> dict[str, Any]:
        return {
            "id": q, "method": method, "scores": {"em": 0.0, "f1": 0.0, "acc": 0.0}, "retrieved": False,
            "retrievals": 0, "prompt_tokens": 1, "completion_tokens": 1, "overhead_tokens": 0,
            "seconds": seconds, "generated_tokens": 1,
        }  # fmt: skip

    records = [rec("a", "wo-rag", 1.0), rec("b", "wo-rag", 2.0), rec("a", "etc", 4.0), rec("b", "etc", 3.0)]
    etc = summarize(records, ["etc", "wo-rag"])[0]
    assert etc["baseline"] == "wo-rag" and etc["delta_latency"] == pytest.approx(2.0)
    with_closed_book = [*records, rec("a", "no-retrieval", 0.5), rec("b", "no-retrieval", 0.5)]
    assert summarize(with_closed_book, ["etc"])[0]["delta_latency"] == pytest.approx(3.0)


def _scored(method: str, qid: str, acc: float) -> dict[str, Any]:
    return {"id": qid, "method": method, "scores": {"em": acc, "f1": acc, "acc": acc}}


def test_paired_differences_pair_by_question_and_call_a_crossing_interval_not_established() -> None:
    from ragate.eval.summary import differences_table, paired_differences

    ids = [f"q{i}" for i in range(40)]
    records = [_scored("no-retrieval", q, 0.0) for q in ids]
    records += [_scored("standard-rag", q, 1.0) for q in ids]  # +100 on every question: certain
    records += [_scored("coin", q, float(i % 2)) for i, q in enumerate(ids)]  # half better, half equal
    records += [_scored("late", q, 1.0) for q in ids[:10]]  # answered 10 questions only: paired on those 10
    records.append({"id": "q0", "method": "broken", "error": "x"})
    rows = {(r["method"], r["against"]): r for r in paired_differences(records, "acc")}
    sure = rows["standard-rag", "no-retrieval"]
    assert (sure["delta"], sure["ci"], sure["verdict"]) == (1.0, (1.0, 1.0), "higher")
    assert rows["no-retrieval", "standard-rag"]["verdict"] == "lower"
    assert rows["late", "no-retrieval"]["n"] == 10
    coin = rows["coin", "standard-rag"]
    assert coin["delta"] == -0.5 and coin["verdict"] == "lower"
    # a method scoring like its baseline on all but one question: the interval reaches 0
    records += [_scored("near", q, 1.0 if q == "q0" else 0.0) for q in ids]
    again = {(r["method"], r["against"]): r for r in paired_differences(records, "acc")}
    near = again["near", "no-retrieval"]
    assert near["delta"] > 0 and near["ci"][0] <= 0 and near["verdict"] == "not established"
    assert ("broken", "no-retrieval") not in rows
    assert "| near | no-retrieval | 40 | +2.5 |" in differences_table([near])
