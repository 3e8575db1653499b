"""The routes' frontier (ragate.report.routes): a cascade replayed from the records of every route takes the route
the live cascade takes and pays what it pays; the oracle takes the cheapest right route; stop thresholds are tuned
on the other half of the questions; ``ragate report RUN --routes`` prints the frontier of a committed run."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path
from typing import Any

import pytest

from ragate.errors import RagateError
from ragate.eval.records import read_records
from ragate.gates.base import GateDecision
from ragate.methods import get_method
from ragate.methods.configure import configure_method
from ragate.methods.route import run_route
from ragate.methods.trace import Stage, Trace
from ragate.report.route_frontier import frontier
from ragate.report.route_report import routes_report
from ragate.report.routes import (
    cascade,
    cross_fitted,
    halves,
    oracle,
    outcome,
    route_table,
    tune_stops,
)
from ragate.retrieval.types import Hit, Passage
from ragate.text import extract_answer, supported

ROUTES = ["no-retrieval", "standard-rag", "standard-rag-pairs-prompts"]
RUN = Path(__file__).parent.parent / "docs" / "results" / "runs" / "dynamic-hotpotqa-qwen2.5-coder-1.5b-300"


def _trace(
    method: str, answer: str, nll: float | None, retrievals: int, tokens: int = 10, passage: str = ""
) -> Trace:
    logprob = None if nll is None else -nll * tokens
    stages = (Stage("answer", 100 * (retrievals + 1), tokens, 0.5 + retrievals, logprob=logprob),)
    decision = GateDecision(retrievals > 0, 0.0, 0.0, "")
    documents = (Hit(Passage(f"p{retrievals}", "A title", passage), 1.0, 1),) if retrievals else ()
    return Trace(method, "q", answer, retrievals > 0, decision, (), documents, stages)


def _record(qid: str, trace: Trace, right: bool, retrievals: int) -> dict[str, Any]:
    """An eval record of ``trace``, ``supported`` as eval writes it (the extracted answer in a passage read)."""
    passages = [f"{h.passage.title} {h.passage.text}" for h in trace.documents]
    return {
        "id": qid, "method": trace.method, "prediction": trace.answer,
        "scores": {"em": float(right), "f1": float(right), "acc": float(right)},
        "retrievals": retrievals, "prompt_tokens": trace.stages[0].prompt_tokens,
        "completion_tokens": trace.stages[0].completion_tokens, "seconds": trace.seconds, "trace": trace.to_json(),
        "supported": supported(extract_answer(trace.answer), passages) if passages else None,
    }  # fmt: skip


def _scenario(n: int, seed: int) -> tuple[dict[str, list[Trace]], list[dict[str, Any]]]:
    """Every route's answer to ``n`` questions: answers from a few words (so that routes agree, and disagree),
    NLLs in [0, 2] or none, and a retrieving route's passage that holds its answer, or not."""
    rng = random.Random(seed)
    traces: dict[str, list[Trace]] = {}
    records = []
    for i in range(n):
        qid = f"q{i}"
        traces[qid] = []
        for j, method in enumerate(ROUTES):
            nll = None if rng.random() < 0.1 else rng.uniform(0.0, 2.0)
            passage = rng.choice(["Paris is on the Seine.", "Lyon and Nice are cities.", "Nothing here."])
            t = _trace(method, rng.choice(["Paris", "Lyon", "the city of Paris", "Nice", ""]), nll, j, passage=passage)
            traces[qid].append(t)
            records.append(_record(qid, t, rng.random() < 0.2 + 0.2 * j, j))
    return traces, records


@pytest.mark.parametrize("evidence", [False, True])
def test_the_replay_takes_the_route_the_live_cascade_takes_and_pays_what_it_pays(evidence: bool) -> None:
    traces, records = _scenario(150, seed=3)
    table = route_table(records, ROUTES)
    stops = (0.6, 0.9)
    spec = configure_method(get_method("route"), None, None, None, None, None, routes=ROUTES)
    spec = spec.with_(route=spec.route.__class__(**{**vars(spec.route), "stop_nll": stops, "evidence": evidence}))  # type: ignore[union-attr]
    replayed = cascade(table, stops, evidence=evidence)
    paid = outcome(table, "cascade", replayed, "em", pays="every")
    for i, qid in enumerate(table.ids):
        by_name = {t.method: t for t in traces[qid]}
        live = run_route(spec, "q", lambda s, by_name=by_name: by_name[s.name])  # type: ignore[misc]
        assert live.route is not None and ROUTES.index(live.route.taken) == replayed[i], qid
        assert paid.costs["tokens"][i] == live.tokens and paid.costs["lm_calls"][i] == live.lm_calls
    assert set(replayed.tolist()) == {0, 1, 2}  # every stage stopped some question (the test compares something)
    if evidence:  # the check changed the route of some question, and the replay agreed with the live cascade
        assert (replayed != cascade(table, stops)).any()


def test_the_oracle_takes_the_cheapest_right_route_and_the_first_where_none_is() -> None:
    records = []
    for qid, right in (("a", (0, 1, 1)), ("b", (0, 0, 1)), ("c", (1, 1, 1)), ("d", (0, 0, 0))):
        for j, method in enumerate(ROUTES):
            records.append(_record(qid, _trace(method, "x", 1.0, j), bool(right[j]), j))
    table = route_table(records, ROUTES)
    taken = oracle(table, "em")
    assert taken.tolist() == [1, 2, 0, 0]
    row = outcome(table, "oracle", taken, "em", pays="taken")
    assert row.score.tolist() == [1.0, 1.0, 1.0, 0.0] and row.costs["retrievals"].tolist() == [1, 2, 0, 0]
    ran = outcome(table, "cascade", taken, "em", pays="every")  # a cascade pays for every route before its own
    assert ran.costs["retrievals"].tolist() == [1, 3, 0, 0]


def test_stop_thresholds_are_tuned_on_the_other_half_within_the_target() -> None:
    _, records = _scenario(120, seed=5)
    table = route_table(records, ROUTES)
    target = 0.8
    stops = tune_stops(table, target, "em")
    tuned = outcome(table, "", cascade(table, stops), "em", pays="every")
    assert tuned.costs["retrievals"].mean() <= target
    taken = cross_fitted(table, target, "em", seed=0)
    (first, second), _ = halves(len(table), 0)
    assert taken[first].tolist() == cascade(table.take(first), tune_stops(table.take(second), target, "em")).tolist()
    assert taken[second].tolist() == cascade(table.take(second), tune_stops(table.take(first), target, "em")).tolist()


def test_a_record_without_log_probabilities_never_stops_on_nll() -> None:
    records = [_record("a", _trace(m, "same", None, j, passage="the same"), True, j) for j, m in enumerate(ROUTES)]
    table = route_table(records, ROUTES)
    assert math.isnan(table.nll[0, 0]) and not table.has_nll
    assert cascade(table, (math.inf, math.inf), evidence=True).tolist() == [1]  # the second route agrees with the first
    assert cascade(table, (math.inf, math.inf), agree=False).tolist() == [2]
    rows = {r.name: r for r in frontier(table, "em", targets=(0.5,))}
    assert list(rows)[-1] == "oracle (cheapest right route)" and "adaptive-rag: question classifier" in rows
    assert rows["cascade: NLL + agreement + evidence, ≤ 0.5 × standard-rag-pairs-prompts's retrievals"].note == (
        "no log-probabilities in the records"
    )


def test_adaptive_rag_learns_the_cheapest_right_route_from_the_question_on_the_other_half() -> None:
    """Adaptive-RAG's labels: the cheapest right route, else the dataset's kind (multi-step for a multi-hop
    dataset, one retrieval otherwise); its classifier, trained on one half, routes the other half's questions."""
    from ragate.report.routes import adaptive_rag, route_labels

    records = []
    for i in range(80):
        who = i % 2 == 0  # "who" questions: the closed-book route is right; "when ... in 1999": only the last
        question = f"Who wrote book {i}?" if who else f"When did event {i} happen in 1999 and where?"
        for j, method in enumerate(ROUTES):
            r = _record(f"q{i}", _trace(method, "x", 1.0, j), (j == 0) if who else (j == 2), j)
            records.append(r | {"question": question, "dataset": "hotpotqa"})
    table = route_table(records, ROUTES)
    assert route_labels(table, "em").tolist() == [0, 2] * 40
    assert adaptive_rag(table, "em").tolist() == [0, 2] * 40
    wrong = route_table([r | {"scores": {"em": 0.0, "f1": 0.0, "acc": 0.0}} for r in records], ROUTES)
    assert set(route_labels(wrong, "em").tolist()) == {2}  # none right, a multi-hop dataset: the last route
    squad = route_table([r | {"scores": {"em": 0.0, "f1": 0.0, "acc": 0.0}, "dataset": "squad-v1"} for r in records], ROUTES)
    assert set(route_labels(squad, "em").tolist()) == {1}  # a single-hop one: one retrieval


def test_the_learned_policy_reads_the_first_answer_and_keeps_to_its_target() -> None:
    """The first route is right where its answer is not empty, the last always: fitted on the other half, the
    policy answers closed-book where the first answer says something and pays for the last route where it is
    empty, within a target that allows it; a target below the last route's cost keeps it to the first route."""
    from ragate.report.routes import learned

    records = []
    for i in range(120):
        said = "" if i % 3 == 0 else f"answer {i}"
        for j, method in enumerate(ROUTES):
            r = _record(f"q{i}", _trace(method, said if j == 0 else "x", 1.0, j), (j == 0 and bool(said)) or j == 2, j)
            records.append(r | {"question": f"Which thing is number {i}?", "dataset": "hotpotqa"})
    table = route_table(records, ROUTES)
    empty = [not a[0] for a in table.answers]
    taken = learned(table, "em", target=1.0)  # the empty third at 2 retrievals each: 0.67 a question
    assert taken.tolist() == [2 if e else 0 for e in empty]
    row = outcome(table, "learned", taken, "em", pays="first")
    assert row.score.mean() == 1.0 and abs(row.costs["retrievals"].mean() - 2 / 3) < 1e-9
    assert set(learned(table, "em", target=0.1).tolist()) == {0}


def test_routes_a_run_does_not_hold_are_named() -> None:
    _, records = _scenario(3, seed=0)
    with pytest.raises(RagateError, match=r"no answered records of route 'ircot'.*--methods no-retrieval,ircot"):
        route_table(records, ["no-retrieval", "ircot"])
    with pytest.raises(RagateError, match="each once"):
        routes_report([RUN], ["wo-rag", "wo-rag"])
    with pytest.raises(RagateError, match="holds no questions.jsonl"):
        routes_report([RUN.parent], ["wo-rag", "ircot"])


def test_the_report_refuses_what_a_route_method_refuses_and_damaged_records_naming_the_line(tmp_path: Path) -> None:
    """Routes out of cost order or in two answer formats would replay a cascade no route method runs; a record
    whose stage or scores the table cannot read is refused naming its line, through the command too (no
    traceback); a seed or resample count numpy cannot take is refused by name."""
    from test_route_budget import _records  # records as ragate eval writes them

    from ragate.cli.main import main

    with pytest.raises(RagateError, match="routes go cheapest first: 'single-rag'"):
        routes_report([RUN], ["wo-rag", "ircot", "single-rag"])
    with pytest.raises(RagateError, match="routes answer in one format"):
        routes_report([RUN], ["no-retrieval", "ircot"])
    with pytest.raises(RagateError, match=r"the seed \(--seed\) is a whole number, 0 or more, not -1"):
        routes_report([RUN], ["wo-rag", "ircot"], seed=-1)
    with pytest.raises(RagateError, match=r"resamples \(--resamples\) are a whole number, 1 or more, not 0"):
        routes_report([RUN], ["wo-rag", "ircot"], samples=0)
    records = _records(6)
    stage = records[4]["trace"]["stages"][0]
    damaged = [
        ({"stages": [{"name": "answer", "prompt_tokens": 3}]}, "trace"),
        ({"stages": [stage | {"completion_tokens": "5"}]}, "trace"),
        ({"stages": [stage | {"logprob": "x"}]}, "trace"),
    ]
    for trace, field in damaged:
        run = tmp_path / f"run-{len(list(tmp_path.iterdir()))}"
        run.mkdir()
        bad = [r if k != 4 else r | {"trace": r["trace"] | trace} for k, r in enumerate(records)]
        (run / "questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bad))
        with pytest.raises(RagateError, match=rf"questions.jsonl, line 5: \"{field}\" must be an object"):
            routes_report([run], ROUTES)
    run = tmp_path / "no-scores"
    run.mkdir()
    bare = [r if k != 4 else {"id": r["id"], "method": r["method"]} for k, r in enumerate(records)]
    (run / "questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bare))
    with pytest.raises(RagateError, match='line 5: no "scores" in this answer'):
        routes_report([run], ROUTES)
    assert main(["report", str(run), "--routes", ",".join(ROUTES)]) == 2


def test_report_prints_the_frontier_of_a_committed_run(capsys: pytest.CaptureFixture[str]) -> None:
    """The run of HotpotQA's first 300 questions (no log-probabilities in its records): the oracle is the one the
    routes issue quotes, 37.7 EM at 0.24 retrievals per question; the cascade on agreement alone pays for more
    than always taking IRCoT."""
    from ragate.cli.main import main

    assert main(["report", str(RUN), "--routes", "wo-rag,single-rag,ircot"]) == 0
    out = capsys.readouterr().out
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in out.splitlines() if line.startswith("| ")}
    assert rows["oracle (cheapest right route)"][1] == "37.7" and rows["oracle (cheapest right route)"][4] == "0.24"
    assert rows["always ircot"][1] == "30.0" and rows["always wo-rag"][1] == "18.3"
    assert float(rows["cascade: agreement"][4]) > float(rows["always ircot"][4])
    assert float(rows["adaptive-rag: question classifier"][4]) < float(rows["always ircot"][4])
    frontier_lines = out.split("The targets")[0].splitlines()
    assert all(line.count("|") == 9 for line in frontier_lines if line.startswith("|"))  # no cell breaks the table
    assert "| single-rag | disagrees with wo-rag |" in out and "| wo-rag | NLL | no log-probabilities" in out
    assert "no log-probabilities in the records of wo-rag, single-rag, ircot" in out
    assert not (RUN / "report" / "routes.md").exists()  # printed, nothing written


def test_the_replay_reads_what_the_live_cascade_reads() -> None:
    """The answers compared are the traces' (not the extracted predictions), the tokens are counted once (a
    record's overhead tokens are inside its prompt and completion tokens), and a draft whose continuation wrote
    nothing keeps the draft's NLL."""
    from ragate.methods.trace import answer_nll
    from ragate.report.routes import route_table

    records = []
    for j, method in enumerate(ROUTES):
        t = _trace(method, f"Paris\nline {j} of a longer answer", 0.9, j)
        records.append(_record("a", t, True, j) | {"prediction": "Paris", "overhead_tokens": 7})
    table = route_table(records, ROUTES)
    assert table.answers[0][1].startswith("Paris\nline 1")
    assert cascade(table, (0.5, 0.5)).tolist() == [2]  # the traces' answers differ past their first line
    assert table.costs["tokens"][0, 0] == records[0]["prompt_tokens"] + records[0]["completion_tokens"]
    draft = Stage("draft", 40, 20, 0.1, finish_reason="length", logprob=-4.0)
    assert answer_nll([draft, Stage("continue", 60, 0, 0.01)], dynamic=False) == 0.2


def test_each_stop_check_is_set_beside_the_question_classifier() -> None:
    """The checks' table: per route but the last, the NLL's AUROC for a wrong answer (with a paired difference from
    a classifier of the question alone), and from the second route on, disagreement's; a record set without
    log-probabilities says so rather than scoring nothing."""
    from ragate.report.routes import checks_markdown

    rng = random.Random(7)
    records = []
    for i in range(120):
        for j, method in enumerate(ROUTES):
            nll = rng.uniform(0.0, 2.0)
            right = nll < 1.0 if j < 2 else True  # the NLL ranks the first two routes' wrong answers perfectly
            t = _trace(method, rng.choice(["Paris", "Lyon"]), nll, j)
            records.append(_record(f"q{i}", t, right, j) | {"question": f"Which city is number {i}?"})
    lines = checks_markdown(route_table(records, ROUTES), "em").splitlines()
    nll = [line for line in lines if "| NLL |" in line]
    assert len(nll) == 2 and all(line.split(" | ")[2].startswith("1.000") for line in nll)
    assert all("(higher)" in line for line in nll)  # above the question classifier, which reads no answer
    assert any("disagrees with no-retrieval" in line for line in lines)
    bare = [r | {"trace": {**r["trace"], "stages": [{**r["trace"]["stages"][0], "logprob": None}]}} for r in records]
    assert "no log-probabilities in the records" in checks_markdown(route_table(bare, ROUTES), "em")


def test_the_evidence_check_is_scored_where_the_records_say_whether_the_answer_is_in_its_passages() -> None:
    """A route whose records hold ``supported`` (eval runs since 2026-12-05) gets the "answer not in its passages"
    check: here a retrieval route whose unsupported answers are exactly its wrong ones ranks them perfectly; records
    without the field (older runs) leave the check out rather than scoring nothing."""
    from ragate.report.routes import checks_markdown

    rng = random.Random(3)
    records = []
    for i in range(120):
        for j, method in enumerate(ROUTES):
            right = rng.random() < 0.5
            record = _record(f"q{i}", _trace(method, "Paris", rng.uniform(0.0, 2.0), j), right, j)
            if j > 0:
                record["supported"] = right
            records.append(record | {"question": f"Which city is number {i}?"})
    lines = [line for line in checks_markdown(route_table(records, ROUTES), "em").splitlines() if "passages" in line]
    assert len(lines) == 1 and lines[0].startswith(f"| {ROUTES[1]} | answer not in its passages | 1.000 ")
    older = [{k: v for k, v in r.items() if k != "supported"} for r in records]
    assert "passages" not in checks_markdown(route_table(older, ROUTES), "em")


def test_runs_over_two_datasets_get_the_pooled_table_one_per_dataset_and_a_figure(tmp_path: Path) -> None:
    """Two runs (two datasets) read together: the pooled frontier, then each dataset's rows, which are the pooled
    policies' choices on its questions (so each dataset's always-route rows add up to the pooled one); ``plot``
    writes the figure and the report says the data it plots."""
    _, records = _scenario(80, seed=11)
    runs = []
    for k, name in enumerate(("nq-open", "hotpotqa")):
        run = tmp_path / name
        run.mkdir()
        part = [r | {"id": f"{name}-{r['id']}", "dataset": name, "question": f"question {r['id']}?", "answers": ["x"],
                     "retrieved": r["retrievals"] > 0, "overhead_tokens": 0}
                for r in records if int(r["id"][1:]) % 2 == k]  # fmt: skip
        (run / "questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
        runs.append(run)
    png = tmp_path / "routes.png"
    text = routes_report(runs, ROUTES, targets=(0.5,), plot=png)
    assert png.read_bytes().startswith(b"\x89PNG")
    assert "80 questions answered by every route" in text and "Pooled over the datasets:" in text
    assert "hotpotqa (40 questions; the pooled policies' choices):" in text and "nq-open (40 questions" in text
    assert re.search(r"The figure's data: \d+ series, \d+ values; sha256 [0-9a-f]{16}\.", text)
    tables = [block for block in text.split("\n\n") if block.startswith("| policy")]
    assert len(tables) == 3
    em = [float(next(line for line in t.splitlines() if line.startswith("| always no-retrieval")).split(" | ")[1])
          for t in tables]  # fmt: skip
    assert em[0] == pytest.approx((em[1] + em[2]) / 2, abs=0.06)  # the pooled mean of two halves of 40
    patterns = text.split("Which routes are right (EM > 0), question by question, pooled and per dataset:\n\n")[1]
    lines = patterns.split("\n\n")[0].splitlines()
    assert lines[0] == f"| {' | '.join(ROUTES)} | questions | share | hotpotqa | nq-open |"
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    counts = [(int(c[3]), int(c[5]), int(c[6])) for c in cells]  # pooled, hotpotqa, nq-open
    assert sum(c[0] for c in counts) == 80 and all(c[0] == c[1] + c[2] for c in counts)


def test_each_question_has_one_pattern_of_routes_right() -> None:
    """The patterns of routes right partition the questions, each row holding exactly the questions whose routes
    are right and wrong as it says."""
    from ragate.report.route_report import right_patterns

    _, records = _scenario(60, seed=3)
    table = route_table(records, ROUTES)
    patterns = right_patterns(table, "em")
    assert sorted(i for rows in patterns.values() for i in rows) == list(range(60))
    right = table.scores["em"] > 0
    for pattern, rows in patterns.items():
        assert len(rows) and all(tuple(right[i]) == pattern for i in rows)
    assert list(patterns) == sorted(patterns, reverse=True)  # the cheapest route right first


def test_the_targets_are_computed_from_the_rows_with_their_intervals() -> None:
    """The share of the gap closed is 1 for the oracle itself and 0 for the fixed route itself; on the committed
    HotpotQA run (no log-probabilities) the targets table says which can be computed and which cannot, and why."""
    from ragate.report.route_targets import closed_share, targets_markdown

    _, records = _scenario(60, seed=2)
    table = route_table(records, ROUTES)
    rows = frontier(table, "em", targets=(0.4,))
    by_name = {r.name: r for r in rows}
    fixed, oracle_row = by_name["always standard-rag-pairs-prompts"], by_name["oracle (cheapest right route)"]
    assert closed_share(oracle_row, fixed, oracle_row, samples=200, seed=0)[0] == pytest.approx(1.0)
    assert closed_share(fixed, fixed, oracle_row, samples=200, seed=0)[0] == pytest.approx(0.0)
    text = targets_markdown(table, rows, "em", samples=200)
    assert text.count("\n| ") == 5 and "cascade (calibrated checks) above adaptive-rag at matched retrievals" in text
    committed = route_table(read_records(RUN / "questions.jsonl", repair=False), ["wo-rag", "single-rag", "ircot"])
    text = targets_markdown(committed, frontier(committed, "em"), "em", samples=200)
    assert "no log-probabilities in the records: no cascade to tune | not computed |" in text
    assert "cascade above adaptive-rag" not in text and "learned above adaptive-rag" in text


def test_the_calibrated_cascade_learns_which_answers_to_stop_on() -> None:
    """Where the closed-book answer is right exactly when its NLL is low, the stage's fit learns it: cross-fitted,
    the cascade with calibrated checks stops there on the right answers and pays one retrieval for the others, as
    the oracle would; its rows are in the frontier."""
    import numpy as np

    from ragate.report.route_fit import calibrated_cascade, checked, stage_x

    rng = random.Random(4)
    records = []
    for i in range(200):
        nll = rng.uniform(0, 2)
        for j, method in enumerate(ROUTES):
            trace = _trace(method, rng.choice(["Paris", "Lyon"]), nll if j == 0 else 1.0, j, passage="Paris")
            records.append(_record(f"q{i}", trace, nll < 0.6 if j == 0 else True, j))
    table = route_table(records, ROUTES)
    assert stage_x(table, 1).shape == (200, 7)
    assert checked(np.array([[0.9, 0.1], [0.1, 0.9], [0.1, 0.1]]), (0.5, 0.5), 2).tolist() == [0, 1, 2]
    low = float(np.mean(table.nll[:, 0] >= 0.6))  # the oracle's retrievals: one where the closed-book answer fails
    taken = calibrated_cascade(table, "em", low + 0.05, seed=0)
    row = outcome(table, "", taken, "em", pays="every")
    assert row.score.mean() >= 0.95 and row.costs["retrievals"].mean() <= low + 0.1
    rows = frontier(table, "em", targets=(0.4,))
    assert "cascade: calibrated checks, ≤ 0.4 × standard-rag-pairs-prompts's retrievals" in [r.name for r in rows]
    from ragate.report.route_targets import targets_markdown

    first = targets_markdown(table, rows, "em", samples=200).splitlines()[2]  # within 40%: as right as the last route
    assert first.startswith("| best policy at ≤ 40%") and first.endswith("| yes |"), first
