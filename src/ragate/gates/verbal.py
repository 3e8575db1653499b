"""Verbalised confidence: the model states the probability that its own answer is right, and a low stated
probability retrieves. A gate that needs no logprobs at all, for APIs that return text only.

The prompt is the "verbalised, one stage, top-1" form of Tian et al. 2023, "Just Ask for Calibration" (EMNLP,
section 2): one reply with a short guess and a probability in [0, 1]. The score is U = 1 - p and the gate
retrieves iff U > tau. ``tau = 0.5`` (retrieve when the model gives its guess less than even odds) is ragate's
default, not a paper's: stated probabilities are overconfident (Xiong et al. 2024, "Can LLMs Express Their
Uncertainty?", section 4), so calibrate tau to a budget (``ragate calibrate``) as for any other gate.

Replies are parsed leniently: "Probability: 0.8", "Confidence: 80%", "80/100", "4 out of 5", or a word
("very high" ... "very low", mapped to fixed values). A reply with no stated probability retrieves.
"""

from __future__ import annotations

import math
import re

from ragate.gates.base import Gate, GateContext, GateDecision

VERBAL_PROMPT = (  # Tian et al. 2023, Verb. 1S top-1 (the instruction in ragate's words)
    "Give your best guess for the question below and the probability that your guess is correct.\n"
    "Reply in exactly two lines and nothing else:\n"
    "Guess: <the shortest possible answer, not a sentence>\n"
    "Probability: <a number between 0.0 and 1.0>\n\n"
    "Question: {question}"
)
DEFAULT_VERBAL_TAU = 0.5
MAX_TOKENS = 32

_WORDS = (  # longest first: "very high" before "high"
    ("almost certain", 0.95), ("very high", 0.9), ("certain", 0.95), ("very low", 0.1), ("high", 0.75),
    ("medium", 0.5), ("moderate", 0.5), ("low", 0.25), ("unsure", 0.3), ("uncertain", 0.3),
)  # fmt: skip
_LABEL = re.compile(
    r"(?:probability|confidence|certainty|likelihood)\s*(?:\([^)]*\))?\s*[:=is]*\s*", re.IGNORECASE
)
_NUMBER = re.compile(
    r"(?P<num>\d+(?:\.\d+)?|\.\d+)\s*(?:(?P<pct>%|percent)|(?:/|out of)\s*(?P<den>\d+(?:\.\d+)?))?",
    re.IGNORECASE,
)


def _number(text: str) -> float | None:
    m = _NUMBER.search(text)
    if m is None:
        return None
    value = float(m["num"])
    if m["den"]:
        den = float(m["den"])
        value = value / den if den > 0 else math.nan
    elif m["pct"] or value > 1:
        value /= 100  # "80%" or a bare "80" on a 0-100 scale
    return value if 0 <= value <= 1 else None


def parse_probability(reply: str) -> float | None:
    """The probability a reply states (after a "Probability:"/"Confidence:" label if there is one), or None."""
    label = _LABEL.search(reply)
    rest = reply[label.end() :] if label else reply.split("\n", 1)[-1] if "\n" in reply else reply
    value = _number(rest[:40])
    if value is not None:
        return value
    lowered = rest.lower()
    for word, p in _WORDS:
        if re.search(rf"\b{word}\b", lowered):
            return p
    return None


def parse_guess(reply: str) -> str:
    """The guess line's answer ("Guess: X" -> "X"), else the reply's first line without a probability label."""
    m = re.search(r"(?:guess|answer)\s*:\s*(?P<g>[^\n]*)", reply, re.IGNORECASE)
    line = m["g"] if m else reply.strip().split("\n", 1)[0]
    label = _LABEL.search(line)
    return (line[: label.start()] if label else line).strip().rstrip(",;").strip()


def verbal_confidence(reply: str, tau: float = DEFAULT_VERBAL_TAU) -> GateDecision:
    """Retrieve iff U = 1 - p > tau, p the stated probability; a reply without one retrieves (U = 1)."""
    p = parse_probability(reply)
    if p is None:
        return GateDecision(
            True, 1.0, tau, f"no stated probability in {reply.strip()[:40]!r}: retrieve to be safe"
        )
    u = 1.0 - p
    retrieve = u > tau
    return GateDecision(
        retrieve, u, tau, f"stated probability {p:.3g}: U = {u:.3g} {'>' if retrieve else '<='} tau = {tau:g}"
    )


class VerbalConfidence(Gate):
    """The model's stated probability; when it does not retrieve, its guess is the answer."""

    description = "the model states P(its answer is right); retrieve below 0.5 (Tian et al. 2023)"
    default_tau = DEFAULT_VERBAL_TAU
    tau_source = "ragate's choice (retrieve below even odds); stated probabilities are overconfident: calibrate"
    budget_control = False

    def decide(self, ctx: GateContext, tau: float) -> GateDecision:
        reply = ctx.one("verbal", VERBAL_PROMPT, max_tokens=MAX_TOKENS, top_logprobs=0)
        ctx.set_answer(parse_guess(reply.text))
        return verbal_confidence(reply.text, tau)
