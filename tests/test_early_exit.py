"""TARG's exact early exit (issue 51, item 1) and Eqs. 1-2's division by k for a draft shorter than k.

The entropy and margin scores are a fixed-k mean of terms >= 0 (TARG Eqs. 1-2), so once (1/k) sum_{t<=j} u_t
exceeds tau the decision "retrieve" is settled and the draft may stop; a draft that decides "no" goes on as the
answer exactly as before. Checked by hand on scripted drafts, through the call cache's store, and with SmolLM2 on
llama.cpp over demo questions: the same decisions, answers and documents as the full draft, fewer decoded tokens
on the retrieved questions.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from ragate.backends.base import Capabilities
from ragate.backends.scripted import ScriptedBackend, make_generation
from ragate.eval.calls import CallCache, CallStore
from ragate.gates.targ import Settled, targ_entropy, targ_margin
from ragate.methods import get_method, run_method
from ragate.methods.runner import decide
from ragate.types import Generation, GenerationRequest, Message
from ragate.uncertainty import mean_entropy, mean_margin_uncertainty, prefix_bound

CAPS = Capabilities(
    logprobs=True, top_k=5, attentions=False, sampling=True, chat_template=True, full_distribution=True,
    token_ids=False, prefix_cache=False,
)  # fmt: skip


def _draft(gaps: list[float], entropies: list[float] | None = None, *, finish: str = "length") -> Generation:
    """A draft whose step t has top-1/top-2 gap gaps[t] (margin term exp(-g/3)) and entropy entropies[t]
    (default: gaps[t])."""
    tokens = [f" w{i}" for i in range(len(gaps))]
    tops = [[(tok, -0.1), ("x", -0.1 - g)] for tok, g in zip(tokens, gaps, strict=True)]
    return make_generation(
        tokens, [-0.1] * len(tokens), tops, finish_reason=finish,  # type: ignore[arg-type]
        entropies=gaps if entropies is None else entropies,
    )  # fmt: skip


def test_a_short_draft_is_divided_by_k_as_eqs_1_and_2_write_it_and_present_is_the_old_form() -> None:
    assert mean_entropy([1.0, 2.0], k=20) == pytest.approx(3 / 20)  # Eq. 1: the missing steps add nothing
    assert mean_entropy([1.0, 2.0], k=20, divide_by="present") == pytest.approx(1.5)  # ragate before issue 51
    assert mean_entropy([1.0, 2.0, 3.0], k=2) == mean_entropy([1.0, 2.0, 3.0], k=2, divide_by="present") == 1.5
    assert mean_entropy([1.0, 2.0]) == 1.5  # no k: the mean of every step, either way
    expected = (1 + math.exp(-1)) / 20
    assert mean_margin_uncertainty([0.0, 3.0], k=20) == pytest.approx(expected)
    assert mean_margin_uncertainty([0.0, 3.0], k=20, divide_by="present") == pytest.approx(expected * 10)
    with pytest.raises(ValueError, match="divide_by"):
        mean_entropy([1.0], k=2, divide_by="steps")  # type: ignore[arg-type]


def test_the_gates_follow_the_equations_and_the_present_gates_keep_the_old_form() -> None:
    draft = _draft([0.0, 3.0], finish="stop")  # ended after 2 of k = 20 tokens
    assert targ_margin(draft, 0.5).score == pytest.approx((1 + math.exp(-1)) / 20)
    assert targ_margin(draft, 0.5, divide_by="present").score == pytest.approx((1 + math.exp(-1)) / 2)
    assert targ_entropy(draft, 0.5).score == pytest.approx(3 / 20)
    assert targ_entropy(draft, 0.5, divide_by="present").score == pytest.approx(1.5)
    assert get_method("targ-margin-present").gate.kind == "targ-margin-present"
    assert get_method("targ-entropy-present").gate.kind == "targ-entropy-present"


def test_prefix_bound_is_a_lower_bound_that_only_grows() -> None:
    terms = [0.3, 0.0, 0.9, 0.2, 0.5]
    bounds = [prefix_bound(terms[:j], 5) for j in range(1, 6)]
    assert bounds == sorted(bounds)
    assert bounds[-1] == mean_entropy(terms, 5) == mean_entropy(terms, 5, divide_by="present")
    assert all(b <= mean_entropy(terms[:j], 10, divide_by="present") for j, b in enumerate(bounds, 1))


def test_settled_fires_once_the_bound_passes_tau_and_never_on_a_whole_draft() -> None:
    margin = Settled(lambda g: [math.exp(-x / 3) for x in g.top1_top2_gaps], 4, 0.4)
    assert not margin(_draft([0.0]))  # 1/4 = 0.25
    assert margin(_draft([0.0, 0.0]))  # 2/4 = 0.5 > 0.4
    assert margin.at == 2 and margin.stopped(_draft([0.0, 0.0])) and not margin.stopped(_draft([0.0]))
    whole = Settled(lambda g: [1.0] * len(g), 2, 0.1)
    assert not whole(_draft([0.0, 0.0]))  # k tokens: nothing left to save, the draft is whole
    early = targ_margin(_draft([0.0, 0.0]), 0.4, k=4, early=True)
    assert early.retrieve and early.score == pytest.approx(0.5) and "early exit" in early.reason
    assert "U >= 0.5" in early.reason and "first 2 of k = 4" in early.reason


def _lm(answer_tokens: int = 3) -> ScriptedBackend:
    """A scripted model: a confident 20-token draft for questions about Paris (gap 9: margin term 0.05; entropy
    0.1), an unsure one otherwise (gap 0: term 1; entropy 3); the reading answer and the continuation are short."""

    def script(request: GenerationRequest) -> Generation:
        prompt = request.prompt if isinstance(request.prompt, str) else request.prompt[-1].content
        if request.assistant_prefix:  # a draft continued as the answer
            return make_generation([" rest"] * answer_tokens, [-0.1] * answer_tokens)
        if request.max_tokens != 20:  # the reading answer
            return make_generation(["Read", " answer"], [-0.1, -0.1])
        sure = "Paris" in prompt
        return _draft([9.0 if sure else 0.0] * 20, [0.1 if sure else 3.0] * 20)

    return ScriptedBackend(script, capabilities=CAPS)


class _Index:
    """A retriever stand-in: the same two passages for every query."""

    kind = "dense"
    score_kind = "cosine"

    def search(self, queries: list[str], k: int) -> list[list[Any]]:
        from ragate.retrieval.types import Hit, Passage

        hits = [Hit(Passage(f"d{i}", f"T{i}", f"text {i}"), 1.0 - i / 10, i + 1) for i in range(k)]
        return [hits for _ in queries]


@pytest.mark.parametrize("method", ["targ-margin", "targ-entropy", "targ-margin-present"])
def test_run_method_early_exit_keeps_decisions_and_answers_with_a_shorter_draft(method: str) -> None:
    spec = get_method(method).with_threshold(0.5 if "margin" in method else 1.0)
    for question, retrieves in (("Who founded Rome?", True), ("What is the capital of France, Paris?", False)):
        full = run_method(spec, question, _lm(), _Index(), early_exit=False)  # type: ignore[arg-type]
        early = run_method(spec, question, _lm(), _Index(), early_exit=True)  # type: ignore[arg-type]
        assert full.retrieved is early.retrieved is retrieves
        assert (full.answer, [d.id for d in full.documents]) == (early.answer, [d.id for d in early.documents])
        drafted = [s.completion_tokens for s in early.stages if s.name == "draft"]
        if retrieves:  # margin: 1/20 per token, > 0.5 after 11 tokens; entropy: 3/20 per token, > 1 after 7
            assert drafted[0] < 20 and "early exit" in early.gate.reason
            assert full.gate.score >= early.gate.score > spec.gate.tau
        else:
            assert drafted == [20] and early.gate == full.gate and early.stages == full.stages


def test_decide_never_stops_a_draft_early_its_scores_are_ranked() -> None:
    spec = get_method("targ-margin").with_threshold(0.1)
    lm = _lm()
    d = decide(spec, "Who founded Rome?", lm)
    assert d.score == pytest.approx(1.0) and "early exit" not in d.reason
    assert lm.calls[0].max_tokens == 20


def test_a_draft_a_user_gate_cut_and_then_answered_no_is_continued() -> None:
    """A gate that stops its draft and still says "no" gets the draft continued, not a cut answer."""
    from ragate.gates.base import Gate, GateDecision
    from ragate.methods.runner import QuestionRun

    class Odd(Gate):
        def decide(self, ctx: Any, tau: float) -> GateDecision:
            ctx.draft(20, settled=lambda g: len(g) >= 3)
            return GateDecision(False, 0.0, tau, "no")

    spec = get_method("targ-margin")
    run = QuestionRun(spec, "Who founded Rome?", _lm(), None)
    Odd().decide(run, 0.5)
    assert len(run.drafted) == 3  # type: ignore[arg-type]
    assert run.closed_book_answer().endswith(" rest rest rest")


def test_the_call_cache_stores_whole_drafts_and_recomputes_those_that_settle(tmp_path: Path) -> None:
    lm = _lm()
    store = CallStore(tmp_path / "calls.sqlite")
    cache = CallCache(lm, store, "scripted")
    request = GenerationRequest((Message("user", "Who founded Rome?"),), max_tokens=20)
    never = Settled(lambda g: [0.0] * len(g), 20, 0.5)
    whole = cache.generate_settled(request, never)
    assert len(whole) == 20 and len(store) == 1  # ran to its end: the whole call's, stored
    again = cache.generate_settled(request, Settled(lambda g: [0.0] * len(g), 20, 0.5))
    assert again == whole and cache.hits == 1 and len(lm.calls) == 1
    settles = Settled(lambda g: [1.0] * len(g), 20, 0.2)
    cut = cache.generate_settled(request, settles)
    assert len(cut) == 5 and settles.stopped(cut)  # 5/20 > 0.2: recomputed, to charge what it costs
    assert len(lm.calls) == 2 and len(store) == 1  # and not stored
    assert cache.generate([request])[0] == whole  # the stored entry is still the whole call
    store.close()


# -- SmolLM2 on llama.cpp, demo questions ----------------------------------------------------------------------

DEMO = (  # demo questions that both gates send to retrieval (settled early) and ones they answer without
    "who is the owner of reading football club",
    "how many episodes are there in dragon ball z",
    "where do the greasers live in the outsiders",
    "who died in the plane crash greys anatomy",  # its draft ends (EOS) at 16 tokens, settled at 15
    "who got the first nobel prize in physics",  # margin: retrieved, settled only at k; entropy: not retrieved
    "what is the main mineral in lithium batteries",
    "who wrote the first declaration of human rights",
)
TAUS = {"targ-margin": 0.5765362224957512, "targ-entropy": 2.1}  # the demo's 50% tau (margin); entropy near it


@pytest.fixture(scope="module")
def demo_retriever() -> Any:
    pytest.importorskip("sentence_transformers")
    from ragate.retrieval.demo import demo_index
    from ragate.retrieval.index import open_index

    return open_index(demo_index(progress=False))


@pytest.mark.parametrize("method", ["targ-margin", "targ-entropy"])
def test_smollm2_early_exit_gives_the_full_drafts_decisions_and_answers_with_fewer_tokens(
    method: str, llama_backend: Any, demo_retriever: Any, tmp_path: Path
) -> None:
    from ragate.eval.datasets import load_dataset

    questions = {ex.question for ex in load_dataset("demo")}
    assert set(DEMO) <= questions
    spec = get_method(method).with_threshold(TAUS[method])
    # every call from a cleared cache and kept prompt states, as Pipeline and eval compute them; the store lets
    # the second pass reuse the reading answers (the draft that settles is recomputed, never read from it)
    store = CallStore(tmp_path / "calls.sqlite")
    lm = CallCache(llama_backend, store, "smollm2", exact_prefixes=True)
    saved, retrieved, skipped = 0, 0, 0
    for q in DEMO:
        full = run_method(spec, q, lm, demo_retriever, early_exit=False)
        early = run_method(spec, q, lm, demo_retriever, early_exit=True)
        assert early.retrieved == full.retrieved, q
        assert early.answer == full.answer, q
        assert [d.id for d in early.documents] == [d.id for d in full.documents], q
        draft_full = full.stages[0].completion_tokens
        draft_early = early.stages[0].completion_tokens
        if full.retrieved:
            retrieved += 1
            assert draft_early <= draft_full and early.gate.score <= full.gate.score
            assert early.gate.score > spec.gate.tau
            saved += draft_full - draft_early
        else:
            skipped += 1
            assert early.gate == full.gate and draft_early == draft_full
    store.close()
    assert retrieved >= 2 and skipped >= 2  # both cases are exercised
    assert saved > 0  # fewer decoded tokens on the retrieved questions


def test_a_run_resumes_only_with_the_same_early_exit_and_the_same_targ_form(tmp_path: Path) -> None:
    """Early exit changes a run's costs, the division by k its TARG scores: a run from before issue 51 (neither
    recorded) resumes with --no-early-exit, and not at all when it scored TARG's entropy or margin."""
    import json

    from ragate.errors import RagateError
    from ragate.eval.run import EvalConfig, check_config

    def saved(config: EvalConfig, *drop: str) -> Path:
        out = tmp_path / "-".join(config.methods)
        out.mkdir(exist_ok=True)
        data = {k: v for k, v in config.to_json().items() if k not in drop}
        (out / "config.json").write_text(json.dumps(data))
        return out

    old = saved(EvalConfig("demo", ("dtr",), early_exit=False))  # a run before issue 51 recorded neither key
    assert "early_exit" not in json.loads((old / "config.json").read_text())
    check_config(EvalConfig("demo", ("dtr",), early_exit=False), old, resume=True)
    with pytest.raises(RagateError, match="Resume with --no-early-exit"):
        check_config(EvalConfig("demo", ("dtr",)), old, resume=True)
    new = saved(EvalConfig("demo", ("no-retrieval",)))
    with pytest.raises(RagateError, match="resume without --no-early-exit"):
        check_config(EvalConfig("demo", ("no-retrieval",), early_exit=False), new, resume=True)
    targ = EvalConfig("demo", ("targ-margin",), early_exit=False)
    assert targ.to_json()["targ_mean"] == "k"
    before = saved(targ, "targ_mean")
    with pytest.raises(RagateError, match="averages? a draft shorter than k"):
        check_config(targ, before, resume=True)
    check_config(targ, saved(targ), resume=True)
    present = EvalConfig("demo", ("targ-margin-present",), early_exit=False)
    assert "targ_mean" not in present.to_json()
    check_config(present, saved(present), resume=True)


def test_pipeline_stops_drafts_early_unless_told_not_to_or_a_budget_ranks_its_scores(tmp_path: Path) -> None:
    from ragate.pipeline import Pipeline

    def draft_tokens(**options: Any) -> tuple[int, bool]:
        with Pipeline("targ-margin", lm=_lm(), retriever=_Index(), threshold=0.5, **options) as rag:  # type: ignore[arg-type]
            answer = rag.answer("Who founded Rome?")
            return next(s for s in answer.stages if s.name == "draft").completion_tokens, answer.retrieved

    assert draft_tokens() == (11, True)  # 11/20 > 0.5
    assert draft_tokens(early_exit=False) == (20, True)
    assert draft_tokens(budget=0.5, budget_state=str(tmp_path / "b.json")) == (20, True)  # the controller ranks


@pytest.mark.parametrize("engine", ["llama_backend", "hf_backend"])
def test_local_engines_stop_decoding_where_the_draft_settles(engine: str, request: pytest.FixtureRequest) -> None:
    """llama.cpp and transformers decode token by token and stop there: the tokens are the whole generation's
    first ones, and the engine decoded no more (llama.cpp's own count of evaluated tokens)."""
    lm = request.getfixturevalue(engine)
    req = GenerationRequest((Message("user", "Who wrote the novel Pride and Prejudice?"),), max_tokens=12)
    lm.clear_cache()
    whole = lm.generate([req])[0]
    assert len(whole) > 4
    lm.clear_cache()
    before = getattr(lm, "evaluated_tokens", None)
    cut = lm.generate_settled(req, lambda g: len(g) >= 4)
    assert cut.token_ids == whole.token_ids[:4] and cut.logprobs == whole.logprobs[:4]
    if before is not None:  # llama.cpp: the prompt and the 3 tokens fed back, not 11
        assert lm.evaluated_tokens - before == whole.prompt_tokens + 3
