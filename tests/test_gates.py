"""Each gate pinned to hand-computed values (DTR Eq. 3, TARG Eqs. 1-3, PAIRS agreement, LLM judge, random)."""

from __future__ import annotations

import math

import pytest

from ragate.backends.scripted import make_generation, text_generation
from ragate.gates.basic import always, never, random_gate
from ragate.gates.judge import llm_judge, p_yes
from ragate.gates.pairs import pairs_agreement, pairs_embedding_agreement
from ragate.gates.targ import targ_entropy, targ_margin, targ_variance
from ragate.gates.ugt import ugt
from ragate.methods import get_method
from ragate.text import extract_tagged_answer, normalize_answer


def test_ugt_hand_computed_and_comparison_modes() -> None:
    draft = make_generation(["Jane", " Austen"], [math.log(0.9), math.log(0.8)])
    decision = ugt(draft, tau=0.1)
    assert decision.score == pytest.approx((0.105361 + 0.223144) / 2, abs=1e-6)  # u = 0.164252
    assert decision.retrieve and decision.threshold == 0.1
    assert not ugt(draft, tau=0.2).retrieve
    at_tau = ugt(draft, tau=decision.score)
    assert not at_tau.retrieve  # the paper: u no greater than tau answers directly
    assert ugt(draft, tau=decision.score, compare="ge").retrieve  # the authors' code
    sure = make_generation(["Paris"], [0.0])
    assert not ugt(sure, tau=0.001).retrieve
    assert ugt(make_generation([], []), tau=0.001).retrieve


def test_targ_margin_hand_computed() -> None:
    # gaps g = (0, 3), beta = 3: U = (e^0 + e^-1) / 2 = 0.683940 with k = 2
    draft = make_generation(
        ["a", "b"], [-0.7, -0.1], [[("a", -0.7), ("x", -0.7)], [("b", -0.1), ("y", -3.1)]]
    )
    d = targ_margin(draft, tau=0.5, k=2)
    assert d.score == pytest.approx(0.683940, abs=1e-6) and d.retrieve
    assert not targ_margin(draft, tau=0.7, k=2).retrieve
    assert targ_margin(draft, tau=0.5, k=1).score == pytest.approx(1.0)  # only the tied first step
    # the draft ended after 2 of k = 20 steps: Eq. 2 divides by k (issue 51); the old form by the 2 present
    assert targ_margin(draft, tau=0.5).score == pytest.approx(0.0683940, abs=1e-7)
    assert targ_margin(draft, tau=0.5, divide_by="present").score == pytest.approx(0.683940, abs=1e-6)


def test_targ_entropy_hand_computed_exact_and_approximate() -> None:
    exact = make_generation(["a", "b"], [-1.0, -1.0], entropies=[math.log(4), 0.0])
    assert targ_entropy(exact, tau=0.5, k=2).score == pytest.approx(math.log(4) / 2)
    assert targ_entropy(exact, tau=0.5).score == pytest.approx(math.log(4) / 20)  # Eq. 1: divided by k = 20
    # no exact entropies: the top-k approximation, and the reason says so
    approx = make_generation(["a"], [math.log(0.5)], [[("a", math.log(0.5)), ("b", math.log(0.5))]])
    d = targ_entropy(approx, tau=0.5, k=1)
    assert d.score == pytest.approx(math.log(2)) and "approximation" in d.reason


def test_targ_variance_hand_computed() -> None:
    def sample(tokens: list[str]) -> object:
        return make_generation(tokens, [-0.1] * len(tokens))

    samples = [sample(["x", t]) for t in ["a", "a", "a", "b", "c"]]
    d = targ_variance(samples, tau=0.1)  # type: ignore[arg-type]
    assert d.score == pytest.approx((0.0 + 0.4) / 2)  # step 1 unanimous, step 2: 1 - 3/5
    assert targ_variance(samples, tau=0.1, k=1).score == 0.0  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sampled prefixes"):
        targ_variance([], tau=0.1)


def test_answer_normalisation_and_extraction() -> None:
    assert extract_tagged_answer("Sure. <answer> The Beatles </answer> done") == "The Beatles"
    assert extract_tagged_answer("<answer>Paris") == "Paris"
    assert extract_tagged_answer("  Paris  ") == "Paris"
    assert normalize_answer("The  Beatles!") == "beatles"
    assert normalize_answer("Don't stop") == "dont stop"  # punctuation deleted, as SQuAD's script does


def test_pairs_lenient_agreement_takes_one_answer_inside_the_other_as_whole_words() -> None:
    """ragate's reading of PAIRS's "semantically consistent": containment by whole words (issue M: exact match
    counted "new york" vs "new york city" and "1948" vs "november 29 1948" as disagreement)."""
    from ragate.gates.pairs import contains_words

    for a, b in (("New York", "New York City"), ("1948", "November 29, 1948")):
        assert pairs_agreement(f"<answer>{a}</answer>", f"<answer>{b}</answer>").retrieve
        lenient = pairs_agreement(f"<answer>{a}</answer>", f"<answer>{b}</answer>", lenient=True)
        assert not lenient.retrieve and lenient.score == 0.0
    assert pairs_agreement("<answer>Paris</answer>", "<answer>Lyon</answer>", lenient=True).retrieve
    assert not contains_words("york", "yorkshire pudding")  # words, not characters
    assert not contains_words("", "anything")
    assert get_method("pairs-lenient").gate.kind == "pairs-lenient"


def test_pairs_agreement_after_normalisation() -> None:
    d = pairs_agreement("<answer>The Beatles</answer>", "<answer>beatles.</answer>")
    assert not d.retrieve and d.score == 0.0
    assert pairs_agreement("<answer>Paris</answer>", "<answer>Lyon</answer>").retrieve
    assert pairs_agreement("<answer></answer>", "<answer></answer>").retrieve  # empty answers never agree
    years = ("<answer>1998</answer>", "<answer>1998</answer>")
    assert not pairs_agreement(*years).retrieve
    assert pairs_agreement(*years, exclude_numbers=True).retrieve


def test_pairs_embedding_agreement() -> None:
    assert not pairs_embedding_agreement("a", "b", similarity=0.95).retrieve
    d = pairs_embedding_agreement("a", "b", similarity=0.5)
    assert d.retrieve and d.score == pytest.approx(0.5) and d.threshold == pytest.approx(0.1)
    assert pairs_embedding_agreement(
        "<answer>42</answer>", "x", similarity=1.0, exclude_numbers=True
    ).retrieve


def test_llm_judge_reads_reply_and_p_yes() -> None:
    top = [("Yes", math.log(0.6)), (" no", math.log(0.2)), ("yes", math.log(0.1))]
    reply = make_generation(["Yes", "."], [math.log(0.6), -0.1], [top, [(".", -0.1)]])
    assert p_yes(reply) == pytest.approx(0.7 / 0.9)
    assert llm_judge(reply).retrieve
    no = make_generation(["No"], [math.log(0.8)], [[("No", math.log(0.8)), ("Yes", math.log(0.2))]])
    d = llm_judge(no)
    assert not d.retrieve and d.score == pytest.approx(0.2)
    unclear = make_generation(["Maybe"], [-0.5])
    assert llm_judge(unclear).retrieve and p_yes(unclear) == 0.5
    for text, retrieve, score in (("Yes.", True, 1.0), ("No", False, 0.0), ("Maybe", True, 0.5)):
        d = llm_judge(
            text_generation(text)
        )  # a text-only API: no alternatives, the score comes from the words
        assert p_yes(text_generation(text)) is None
        assert (d.retrieve, d.score) == (retrieve, score) and "no logprobs" in d.reason


def test_never_always_random() -> None:
    assert not never().retrieve and always().retrieve
    decisions = [random_gate(f"q{i}", 0.3, seed=1) for i in range(4000)]
    rate = sum(d.retrieve for d in decisions) / len(decisions)
    assert rate == pytest.approx(0.3, abs=0.03)
    assert random_gate("q7", 0.3, seed=1) == decisions[7]  # reproducible
    assert all(d.retrieve == (d.score > d.threshold) for d in decisions)
    assert not random_gate("q", 0.0).retrieve and random_gate("q", 1.0).retrieve
