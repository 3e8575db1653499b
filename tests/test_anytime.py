"""Anytime gates (issue 51, item 2): TARG's entropy and margin read after k = 5 or 10 draft tokens, each with its
own tau_k, and ``ragate calibrate --prefixes`` choosing k and tau together for a budget (TARG A.8).

Checked by hand on scripted drafts (the draft asked for is k tokens, Eqs. 1-2 divide by that k), on hand-made sweep
records (tau_k per k, EM at the budget, agreement with k = 20, ties to the shorter draft), and with SmolLM2 on
llama.cpp over demo questions: a short draft that says "no" is continued into the answer of the full draft, and
tau_k calibrated on a sweep holds its budget on those questions through ``Pipeline(calibration=)``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from ragate.backends.base import Capabilities
from ragate.backends.scripted import ScriptedBackend, make_generation
from ragate.errors import RagateError
from ragate.methods import get_method, run_method
from ragate.tuning.prefixes import choose_prefix, parse_prefixes, prefix_method
from ragate.types import GenerationRequest

CAPS = Capabilities(
    logprobs=True, top_k=5, attentions=False, sampling=True, chat_template=True, full_distribution=True,
    token_ids=False, prefix_cache=False,
)  # fmt: skip


def _backend(asked: list[int]) -> ScriptedBackend:
    """Drafts whose step t has top-1/top-2 gap t (margin term exp(-t/3)); records each request's max_tokens."""

    def script(request: GenerationRequest) -> object:
        asked.append(request.max_tokens)
        n = request.max_tokens
        tokens = [f" w{t}" for t in range(n)]
        tops = [[(tok, -0.1), ("x", -0.1 - t)] for t, tok in enumerate(tokens)]
        return make_generation(
            tokens, [-0.1] * n, tops, finish_reason="length", entropies=[float(t) for t in range(n)]
        )  # type: ignore[arg-type]

    return ScriptedBackend(script, capabilities=CAPS)


@pytest.mark.parametrize(("gate", "k"), [("margin", 5), ("margin", 10), ("entropy", 5), ("entropy", 10)])
def test_an_anytime_gate_drafts_k_tokens_and_divides_by_that_k(gate: str, k: int) -> None:
    asked: list[int] = []
    spec = get_method(f"targ-{gate}@k={k}").with_threshold(
        1e9
    )  # never retrieves: the score is the whole mean
    assert spec.gate.prefix == k
    trace = run_method(spec, "q?", _backend(asked), None, early_exit=False)
    assert asked[0] == k  # the draft asked for k tokens, not 20
    terms = [math.exp(-t / 3) for t in range(k)] if gate == "margin" else [float(t) for t in range(k)]
    assert trace.gate.score == pytest.approx(sum(terms) / k)
    assert not trace.retrieved and asked[1:] == [
        spec.max_tokens - k
    ]  # the short draft continued as the answer


def _record(qid: str, closed: float, opened: float, scores: dict[str, float]) -> dict[str, Any]:
    def answer(em: float) -> dict[str, Any]:
        return {"scores": {"em": em, "f1": em, "acc": em}}

    gates = {m: {"score": s, "threshold": 0.5, "retrieve": s > 0.5} for m, s in scores.items()}
    return {
        "id": qid,
        "methods": list(scores),
        "closed": answer(closed),
        "open": answer(opened),
        "gates": gates,
    }


def test_choose_prefix_sets_tau_per_k_and_picks_the_best_em_ties_to_the_shorter_draft() -> None:
    # retrieval fixes q0 and q1 only; k = 20 ranks them on top, k = 5 ranks q0 and q3, k = 10 ranks q1 and q0
    records = [
        _record("q0", 0.0, 1.0, {"targ-margin": 0.9, "targ-margin@k=5": 0.9, "targ-margin@k=10": 0.8}),
        _record("q1", 0.0, 1.0, {"targ-margin": 0.8, "targ-margin@k=5": 0.1, "targ-margin@k=10": 0.9}),
        _record("q2", 1.0, 1.0, {"targ-margin": 0.2, "targ-margin@k=5": 0.2, "targ-margin@k=10": 0.1}),
        _record("q3", 1.0, 0.0, {"targ-margin": 0.1, "targ-margin@k=5": 0.8, "targ-margin@k=10": 0.2}),
    ]
    found = choose_prefix(records, "targ-margin", (5, 10, 20), 0.5)
    rows = {row["k"]: row for row in found["prefixes"]}
    assert rows[5]["tau"] == 0.2 and rows[10]["tau"] == 0.2 and rows[20]["tau"] == 0.2  # F^-1(0.5) per k
    assert [rows[k]["retrieval_rate"] for k in (5, 10, 20)] == [0.5, 0.5, 0.5]
    assert rows[5]["em"] == 0.5 and rows[10]["em"] == rows[20]["em"] == 1.0
    assert rows[5]["agreement_with_k20"] == 0.5 and rows[10]["agreement_with_k20"] == 1.0
    assert found["chosen"]["k"] == 10  # ties with k = 20 at EM 1.0: the shorter draft
    with pytest.raises(RagateError, match="resume it with --methods targ-entropy"):
        choose_prefix(records, "targ-entropy", (5, 20), 0.5)


def test_prefix_names_and_the_grid_are_checked() -> None:
    assert prefix_method("targ-margin", 20) == "targ-margin"
    assert prefix_method("targ-entropy", 5) == "targ-entropy@k=5"
    with pytest.raises(RagateError, match="choose k from 5, 10, 20"):
        prefix_method("targ-margin", 30)
    with pytest.raises(RagateError, match="not 'dtr'"):
        prefix_method("dtr", 5)
    assert parse_prefixes("5, 10,20") == (5, 10, 20)
    for bad in ("5,x", "", "5,5"):
        with pytest.raises(RagateError, match="--prefixes takes"):
            parse_prefixes(bad)


DEMO = ("who got the first nobel prize in physics", "when is the next deadpool movie being released")


def test_smollm2_a_short_draft_that_says_no_is_continued_into_the_full_drafts_answer(
    llama_backend: Any,
) -> None:
    for q in DEMO:
        short = run_method(get_method("targ-margin@k=5").with_threshold(1e9), q, llama_backend, None)
        full = run_method(get_method("targ-margin").with_threshold(1e9), q, llama_backend, None)
        assert short.stages[0].completion_tokens == 5 < full.stages[0].completion_tokens  # cut, then continued
        assert not short.retrieved and short.answer == full.answer, q


@pytest.fixture(scope="module")
def demo_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ragate.cli.main import main

    out = tmp_path_factory.mktemp("anytime") / "sweep"
    methods = "targ-margin,targ-margin@k=5,targ-margin@k=10"
    assert (
        main(
            ["sweep", "--dataset", "demo", "--limit", "6", "--methods", methods, "--out", str(out), "--quiet"]
        )
        == 0
    )
    return out


def test_calibrate_prefixes_from_a_sweep_saves_the_chosen_gates_calibration(
    demo_sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ragate.cli.main import main
    from ragate.eval.thresholds import read_calibration

    out = tmp_path / "cal.json"
    args = ["calibrate", "--gate", "targ-margin", "--prefixes", "5,10,20", "--budget", "0.5"]
    assert main([*args, "--seed", "7", "--from-sweep", str(demo_sweep), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| 5 | targ-margin@k=5 |" in printed and "agrees with k = 20" in printed
    cal = read_calibration(out)
    assert cal["method"] == prefix_method("targ-margin", cal["prefix"]) and cal["n"] == 6
    assert [row["k"] for row in cal["prefixes"]] == [5, 10, 20]
    assert cal["seed"] == json.loads((demo_sweep / "config.json").read_text())["seed"] == 0  # the sweep's, not 7
    assert all(row["retrieval_rate"] <= 0.5 for row in cal["prefixes"])
    assert next(r for r in cal["prefixes"] if r["k"] == 20)["agreement_with_k20"] == 1.0
    records = [json.loads(line) for line in (demo_sweep / "sweep.jsonl").read_text().splitlines()]
    for gates in (r["gates"] for r in records):  # what deciding took, recorded per gate (one draft of k tokens)
        assert [gates[m]["lm_calls"] for m in ("targ-margin@k=5", "targ-margin@k=10", "targ-margin")] == [1, 1, 1]
        assert 0 < gates["targ-margin@k=5"]["decoded_tokens"] <= 5 and gates["targ-margin"]["searches"] == 0
    assert main([*args, "--questions", str(out)]) == 2  # --prefixes needs answers: refused, named
    assert "--prefixes picks k by dev EM" in capsys.readouterr().err


def test_a_tau_k_set_on_a_sweep_holds_its_budget_on_those_questions_live(
    demo_sweep: Path, tmp_path: Path
) -> None:
    from ragate.eval.datasets import load_dataset
    from ragate.pipeline import Pipeline
    from ragate.tuning.calibrate import calibrate_from_sweep

    cal = calibrate_from_sweep(demo_sweep, "targ-margin@k=5", 0.34)
    assert cal["seed"] == 0  # the sweep's seed, recorded with its model and engine
    path = tmp_path / "k5.json"
    path.write_text(json.dumps(cal))
    questions = [ex.question for ex in load_dataset("demo", limit=6)]
    with Pipeline("targ-margin@k=5", calibration=path) as rag:  # the live path: early exit, answers written
        retrieved = [rag.answer(q).retrieved for q in questions]
    assert sum(retrieved) / len(questions) == cal["dev_retrieval_rate"] <= 0.34
