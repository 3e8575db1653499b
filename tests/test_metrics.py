"""Answer metrics pinned to the official SQuAD v1.1 script's behaviour, FlashRAG's ``acc``, DPR's regex match on
real CuratedTREC patterns, answer extraction, recall@k with chunk ids, and the bootstrap intervals."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragate.eval.metrics import (
    SCORE_KEYS,
    bootstrap_ci,
    has_nested_repeat,
    hit_at_k,
    label_accuracy,
    paired_bootstrap_diff,
    read_label,
    recall_at_k,
    regex_match,
    score,
    squad_v2_empty,
)
from ragate.text import contains, exact_match, extract_answer, f1, normalize_answer, supported

CURATEDTREC = Path("/work/shared/data/curatedtrec/topics.dpr.curated.test.txt")

# --- SQuAD v1.1 exact match and F1 ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prediction", "gold", "expected"),
    [
        ("The Beatles", "beatles", 1.0),  # articles
        ("an apple a day", "apple day", 1.0),
        ("theatre", "atre", 0.0),  # "the" only as a whole word
        ("U.S.", "US", 1.0),  # ASCII punctuation deleted, not replaced by a space
        ("rock-and-roll", "rockandroll", 1.0),
        ("Émile Zola", "emile zola", 0.0),  # accents kept
        ("ÉMILE ZOLA", "émile zola", 1.0),  # but lower-cased
        ("rock—paper", "rockpaper", 0.0),  # em dash is not ASCII punctuation: kept
        ("rock—paper", "rock—paper", 1.0),
        ("Ender’s Game", "Enders Game", 0.0),  # right single quote kept
        ("Ender's Game", "Enders Game", 1.0),  # ASCII apostrophe deleted
        ("1,000", "1000", 1.0),  # numbers: the comma is punctuation
        ("3.5", "35", 1.0),
        ("1 000", "1000", 0.0),
        ("  Paris\n", "paris", 1.0),  # white space folded
    ],
)
def test_exact_match_follows_the_official_normalisation(prediction: str, gold: str, expected: float) -> None:
    assert exact_match(prediction, [gold]) == expected


def test_exact_match_and_f1_take_the_max_over_aliases() -> None:
    aliases = ["Barack Obama", "Obama", "President Obama"]
    assert exact_match("obama", aliases) == 1.0
    assert f1("barack hussein obama", aliases) == pytest.approx(0.8)  # p = 2/3, r = 1 against "Barack Obama"
    assert f1("Michelle Obama", aliases) == pytest.approx(2 / 3)  # p = 1/2, r = 1 against "Obama"


def test_f1_on_partial_overlap_hand_computed() -> None:
    # "the big red dog" -> [big, red, dog]; "red dog barks" -> [red, dog, barks]: 2 common, p = r = 2/3.
    assert f1("the big red dog", ["red dog barks"]) == pytest.approx(2 / 3)
    # [red, dog] vs [big, red, dog, barks, loudly]: p = 2/2, r = 2/5, F1 = 2 * 1 * 0.4 / 1.4 = 4/7.
    assert f1("a red dog", ["big red dog barks loudly"]) == pytest.approx(4 / 7)
    # Bag overlap: three "dog"s against one share only one token: p = 1/3, r = 1, F1 = 0.5.
    assert f1("dog dog dog", ["dog"]) == pytest.approx(0.5)
    assert f1("1,000 people", ["1000"]) == pytest.approx(2 / 3)


def test_empty_predictions_and_answers() -> None:
    assert exact_match("", ["Paris"]) == 0.0 and f1("", ["Paris"]) == 0.0
    assert exact_match("Paris", []) == 0.0 and f1("Paris", []) == 0.0
    # v1.1's quirk, kept: both sides normalise to empty, so EM is 1 but F1 (no common token) is 0.
    assert exact_match("", ["The"]) == 1.0
    assert f1("", ["The"]) == 0.0
    assert exact_match("...", [""]) == 1.0 and f1("...", [""]) == 0.0


def test_squad_v2_rule_for_unanswerable_questions() -> None:
    assert squad_v2_empty("", []) == 1.0
    assert squad_v2_empty("the.", []) == 1.0  # normalises to empty
    assert squad_v2_empty("Paris", []) == 0.0
    assert squad_v2_empty("Paris", ["", "an"]) == 0.0  # aliases that normalise to empty are dropped
    assert squad_v2_empty("the Paris", ["Paris"]) == 1.0  # answerable: v1.1 EM
    assert squad_v2_empty("", ["Paris"]) == 0.0


# --- FlashRAG's acc -------------------------------------------------------------------------------------------


def test_contains_is_flashrags_substring_of_normalised_strings() -> None:
    assert contains("I think it was The Beatles, in 1962.", ["beatles"]) == 1.0
    assert contains("It is Paris", ["London", "paris"]) == 1.0
    assert contains("concatenate", ["cat"]) == 1.0  # raw substring, FlashRAG's form
    assert contains("concatenate", ["cat"], mode="tokens") == 0.0
    assert contains("a black cat sat", ["black cat"], mode="tokens") == 1.0
    assert contains("U.S. Army", ["us army"]) == 1.0
    assert contains("anything", ["", "The", "!"]) == 0.0  # an alias normalising to empty never counts
    assert contains("Paris", []) == 0.0


def test_an_answer_is_supported_when_its_words_appear_whole_in_a_passage_it_read() -> None:
    passages = ["Brewing green tea: let the water cool to 80 °C.", "The Beatles formed in Liverpool in 1960."]
    assert supported("the Beatles", passages)  # normalised: articles, case
    assert supported("Liverpool.", passages)
    assert not supported("Beat", passages)  # whole words, not a substring
    assert not supported("Liverpool 1960", passages)  # in order, contiguous
    assert not supported("", passages) and not supported("The", passages)  # empty once normalised
    assert not supported("Liverpool", [])


# --- labels ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prediction", "read"),
    [
        ("Yes, because no trial showed harm.", "yes"),  # the earliest label wins
        ("no.", "no"),
        ("Maybe", "maybe"),
        ("The evidence says: NO", "no"),
        ("yesterday I knew", None),  # whole words only
        ("I cannot tell", None),
    ],
)
def test_read_label(prediction: str, read: str | None) -> None:
    assert read_label(prediction) == read


def test_label_accuracy() -> None:
    assert label_accuracy("Yes, because ...", "yes") == 1.0
    assert label_accuracy("no.", "No") == 1.0
    assert label_accuracy("Maybe", "yes") == 0.0
    assert label_accuracy("unclear", "maybe") == 0.0
    assert label_accuracy("true", "true", labels=("true", "false")) == 1.0


# --- CuratedTREC regexes --------------------------------------------------------------------------------------


def _curatedtrec_pattern(question: str) -> list[str]:
    for line in CURATEDTREC.read_text().splitlines():
        row = json.loads(line)
        if row["question"] == question:
            return list(row["answer"])
    raise AssertionError(f"question not in {CURATEDTREC}: {question}")


@pytest.mark.skipif(not CURATEDTREC.exists(), reason="CuratedTREC test file not present")
def test_regex_match_on_real_curatedtrec_patterns() -> None:
    height = _curatedtrec_pattern("How tall is Mount McKinley?")
    assert regex_match("It is 20,320 feet high.", height) == 1.0
    assert regex_match("about 6,194-meter", height) == 1.0
    assert regex_match("20320 ft", height) == 0.0
    quebec = _curatedtrec_pattern("In what Canadian province are most people of French descent?")
    assert regex_match("québec", quebec) == 1.0  # case-insensitive on non-ASCII too
    assert regex_match("Quebec City", quebec) == 1.0  # re.search: anywhere in the text
    assert regex_match("Ontario", quebec) == 0.0


@pytest.mark.skipif(not CURATEDTREC.exists(), reason="CuratedTREC test file not present")
def test_every_curatedtrec_pattern_compiles_and_none_is_defused() -> None:
    patterns = [p for line in CURATEDTREC.read_text().splitlines() for p in json.loads(line)["answer"]]
    assert patterns and not any(has_nested_repeat(p) for p in patterns)


def test_regex_match_treats_a_broken_pattern_as_literal() -> None:
    assert regex_match("the answer is C++ (the language", ["C++ (the"]) == 1.0
    assert regex_match("something else", ["C++ (the"]) == 0.0
    assert regex_match("Kuwait", ["[unclosed", "kuwait"]) == 1.0


def test_regex_match_defuses_catastrophic_patterns() -> None:
    assert has_nested_repeat(r"(a+)+b") and has_nested_repeat(r"(\w+\s?)*$")
    assert not has_nested_repeat(r"((9|1[0-5])\s*(-|to)?\s*)+h(our)?")  # each round must match a digit
    assert not has_nested_repeat(r"[(a+)]+") and not has_nested_repeat(r"\(a+\)+")
    start = time.perf_counter()
    assert regex_match("a" * 5000 + "!", [r"(a+)+b"]) == 0.0
    assert regex_match("x (a+)+b y", [r"(a+)+b"]) == 1.0  # matched as literal text
    assert time.perf_counter() - start < 1.0


# --- answer extraction ----------------------------------------------------------------------------------------


def test_extract_answer_styles() -> None:
    tagged = "Let me think.\n<answer> Paris </answer> is it."
    assert extract_answer(tagged, "tagged") == "Paris"
    assert extract_answer(tagged) == "Paris"
    assert extract_answer("thinking <answer>Lyon", "tagged") == "Lyon"  # unclosed tag
    cot = "Paris is in France.\nThe capital is Paris. So the answer is Paris. Done."
    assert extract_answer(cot, "answer-is") == "Paris"
    assert extract_answer(cot) == "Paris"
    assert extract_answer("The answer is: 3.5 million.", "answer-is") == "3.5 million"
    assert extract_answer("So the answer is U.S. Army.") == "U.S. Army"
    assert extract_answer("the answer is yes\nmore text") == "yes"
    assert extract_answer("no marker here ", "answer-is") == "no marker here"
    assert extract_answer("\n\n  Berlin \nBecause it is the capital.", "first-line") == "Berlin"
    assert extract_answer("\n\n  Berlin \nBecause it is the capital.") == "Berlin"
    assert extract_answer(" raw\ntext ", "none") == " raw\ntext "
    assert extract_answer("") == ""


# --- score ----------------------------------------------------------------------------------------------------


def test_score_keys_are_stable_for_every_kind() -> None:
    span = score("the Beatles!", ["Beatles"], "span")
    assert span == {"em": 1.0, "f1": 1.0, "acc": 1.0}
    assert score("big red dog", ["red dog"], "span") == {"em": 0.0, "f1": pytest.approx(0.8), "acc": 1.0}
    assert score("Yes, it does.", ["yes"], "yesno") == dict.fromkeys(SCORE_KEYS, 1.0)
    assert score("no", [], "yesno", label="maybe") == dict.fromkeys(SCORE_KEYS, 0.0)
    assert score("Kuwait, in 1990", ["Kuwait"], "regex") == dict.fromkeys(SCORE_KEYS, 1.0)
    with pytest.raises(ValueError):
        score("x", ["x"], "multiple-choice")
    with pytest.raises(ValueError):
        score("yes", [], "yesno")


# --- retrieval ------------------------------------------------------------------------------------------------


def test_recall_and_hit_at_k_count_chunks_for_their_document() -> None:
    retrieved = ["d9#0", "d1#3", "d1#4", "d2#0", "d3"]
    assert recall_at_k(retrieved, ["d1", "d2"], 2) == 0.5
    assert recall_at_k(retrieved, ["d1", "d2"], 4) == 1.0
    assert recall_at_k(retrieved, ["d1#7", "d3"], 5) == 1.0  # gold chunk ids also compare by document
    assert recall_at_k(retrieved, ["d1", "d1#2"], 2) == 1.0  # gold documents count once
    assert recall_at_k(retrieved, ["d8"], 5) == 0.0
    assert recall_at_k(retrieved, [], 5) is None and hit_at_k(retrieved, [], 5) is None
    assert hit_at_k(retrieved, ["d2", "d8"], 3) == 0.0
    assert hit_at_k(retrieved, ["d2", "d8"], 4) == 1.0
    assert recall_at_k([], ["d1"], 3) == 0.0
    with pytest.raises(ValueError):
        recall_at_k(retrieved, ["d1"], 0)


# --- bootstrap ------------------------------------------------------------------------------------------------


def _scores(n: int) -> list[float]:
    return [float((i * 7) % 10 < 4) for i in range(n)]  # 40% correct, deterministic


def test_bootstrap_ci_contains_the_mean_and_is_deterministic() -> None:
    values = _scores(200)
    low, high = bootstrap_ci(values)
    assert low < statistics.fmean(values) < high
    assert bootstrap_ci(values, seed=3) == bootstrap_ci(values, seed=3)
    assert bootstrap_ci(values, seed=3) != bootstrap_ci(values, seed=4)
    assert bootstrap_ci(values, confidence=0.5) != (low, high)
    wide = bootstrap_ci(values, confidence=0.99)
    assert wide[0] <= low and high <= wide[1]


def test_bootstrap_ci_narrows_with_more_data() -> None:
    small, large = bootstrap_ci(_scores(50)), bootstrap_ci(_scores(2000))
    assert large[1] - large[0] < (small[1] - small[0]) / 3


def test_bootstrap_ci_edge_cases() -> None:
    assert bootstrap_ci([0.7]) == (0.7, 0.7)
    assert bootstrap_ci([1.0, 1.0, 1.0]) == (1.0, 1.0)
    with pytest.raises(ValueError):
        bootstrap_ci([])
    with pytest.raises(ValueError):
        bootstrap_ci([1.0, 0.0], confidence=1.0)


def test_paired_bootstrap_diff() -> None:
    b = [float(i % 5) for i in range(300)]
    a = [x + 0.5 + 0.1 * ((i * 3) % 7 - 3) for i, x in enumerate(b)]
    low, high = paired_bootstrap_diff(a, b)
    mean_diff = statistics.fmean(x - y for x, y in zip(a, b, strict=True))
    assert low <= mean_diff <= high and 0.4 < low and high < 0.6
    # Pairing removes the between-question spread that an unpaired interval would carry.
    assert high - low < 0.05
    assert paired_bootstrap_diff(a, b, seed=1) == paired_bootstrap_diff(a, b, seed=1)
    with pytest.raises(ValueError):
        paired_bootstrap_diff([1.0], [1.0, 2.0])


# --- properties -----------------------------------------------------------------------------------------------

_words = st.sampled_from(["the", "a", "Paris", "paris", "U.S.", "dog", "red", "Émile", "—", "1,000", "!", ""])
_texts = st.lists(_words, max_size=6).map(" ".join) | st.text(max_size=20)
_answer_lists = st.lists(_texts, min_size=1, max_size=3)


@given(_texts, _answer_lists)
def test_f1_is_a_share_and_em_is_binary(prediction: str, answers: list[str]) -> None:
    assert 0.0 <= f1(prediction, answers) <= 1.0
    assert exact_match(prediction, answers) in (0.0, 1.0)
    assert contains(prediction, answers) in (0.0, 1.0)


@given(_texts, _answer_lists)
def test_em_implies_full_f1_and_contains_unless_empty(prediction: str, answers: list[str]) -> None:
    # v1.1 scores EM = 1, F1 = 0 when both sides normalise to empty, so the implication needs a non-empty side.
    if normalize_answer(prediction):
        assert exact_match(prediction, answers) <= f1(prediction, answers)
        if exact_match(prediction, answers) == 1.0:
            assert f1(prediction, answers) == 1.0
        assert contains(prediction, answers) >= exact_match(prediction, answers)
        assert contains(prediction, answers) >= contains(prediction, answers, mode="tokens")


@given(_texts)
def test_a_prediction_matches_itself(text: str) -> None:
    assert exact_match(text, [text]) == 1.0
    if normalize_answer(text):
        assert f1(text, [text]) == 1.0 and contains(text, [text], mode="tokens") == 1.0


@given(st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=40))
def test_bootstrap_interval_is_ordered_and_within_the_data(values: list[float]) -> None:
    low, high = bootstrap_ci(values, samples=200)
    assert min(values) - 1e-12 <= low <= high <= max(values) + 1e-12
