"""Few-shot chain-of-thought prompts for the dynamic methods, one set per dataset family.

ETC (section 4.2) keeps the setting of FLARE and DRAGIN: chain of thought as Wang et al. (2022), with the prompt
templates of Trivedi et al. (2022, IRCoT) for the multi-hop sets and Wei et al. (2022) for StrategyQA: a
question, a short chain of reasoning, and "So the answer is X." By default (``exemplars="authors"``) the
exemplars are the authors' own, in the number their configs use (DRAGIN's and ETC's code; 8 for HotpotQA, 6 for
2WikiMultihopQA and StrategyQA, 8 for PubMedQA; :mod:`ragate.dynamic.exemplars`, shipped in
``ragate/data/exemplars/`` with their licences). ``exemplars="ragate-3"`` is ragate's own three per set
(:data:`FEWSHOT`, written in that format to keep prompts short on a CPU), the default before 2026-11-27.

The retrieved passages go between the exemplars and the question, so that the exemplars' key/value cache is
reused across retrievals; DRAGIN's "Answer in the same format as before." follows them.
"""

from __future__ import annotations

from collections.abc import Sequence

from ragate.dynamic.exemplars import author_set, author_set_for
from ragate.errors import RagateError
from ragate.retrieval.types import Hit
from ragate.types import Message

INSTRUCTION = (
    'Answer the question. Reason step by step in a few short sentences, then end with "So the answer is X."'
)

HOTPOTQA = (
    (
        'Which city was the director of the film "Jaws" born in?',
        (
            "The film Jaws was directed by Steven Spielberg. Steven Spielberg was born in Cincinnati, Ohio. "
            "So the answer is Cincinnati."
        ),
    ),
    (
        "Are the Eiffel Tower and the Statue of Liberty in the same country?",
        (
            "The Eiffel Tower is in Paris, France. The Statue of Liberty is in New York, in the United States. "
            "France and the United States are different countries. So the answer is no."
        ),
    ),
    (
        "Which band released its first album earlier, Radiohead or Coldplay?",
        (
            "Radiohead's first album, Pablo Honey, came out in 1993. Coldplay's first album, Parachutes, came out in "
            "2000. 1993 is earlier than 2000. So the answer is Radiohead."
        ),
    ),
)

TWOWIKI = (
    (
        "Who was born first, Charles Dickens or Mark Twain?",
        (
            "Charles Dickens was born on 7 February 1812. Mark Twain was born on 30 November 1835. "
            "So the answer is Charles Dickens."
        ),
    ),
    (
        'Who is the father of the director of the film "Lost in Translation"?',
        (
            "Lost in Translation was directed by Sofia Coppola. The father of Sofia Coppola is Francis Ford Coppola. "
            "So the answer is Francis Ford Coppola."
        ),
    ),
    (
        "Are Lake Baikal and Lake Titicaca on the same continent?",
        (
            "Lake Baikal is in Russia, in Asia. Lake Titicaca is on the border of Peru and Bolivia, in South "
            "America. So the answer is no."
        ),
    ),
)

STRATEGYQA = (
    (
        "Could a penguin survive a summer afternoon in the Sahara without help?",
        (
            "Penguins are adapted to cold water and cold air. Summer afternoons in the Sahara often pass 40 degrees "
            "Celsius. So the answer is no."
        ),
    ),
    (
        "Would a standard chess board fit on a dinner plate?",
        (
            "A standard chess board is about 50 cm wide. A dinner plate is about 27 cm across. "
            "So the answer is no."
        ),
    ),
    (
        "Did the Roman Empire exist when paper was invented in China?",
        (
            "Paper was invented in China around 105 AD. The Roman Empire lasted from 27 BC to 476 AD in the west. "
            "So the answer is yes."
        ),
    ),
)

PUBMEDQA = (
    (
        "Does regular aerobic exercise lower resting blood pressure in adults with hypertension?",
        (
            "Randomised trials in adults with hypertension report lower resting systolic and diastolic pressure "
            "after regular aerobic training. So the answer is yes."
        ),
    ),
    (
        "Does taking vitamin C every day prevent the common cold in the general population?",
        (
            "Large trials find that daily vitamin C does not reduce how often people in the general population catch "
            "a cold, although colds may be slightly shorter. So the answer is no."
        ),
    ),
    (
        "Is drinking a lot of coffee linked to a lower risk of type 2 diabetes?",
        (
            "Cohort studies link coffee with a lower risk, but they are observational and confounding cannot be "
            "ruled out. So the answer is maybe."
        ),
    ),
)

# ragate's own three per set ("ragate-3"), by dataset-name prefix
FEWSHOT: dict[str, tuple[tuple[str, str], ...]] = {
    "hotpotqa": HOTPOTQA,
    "2wikimultihopqa": TWOWIKI,
    "musique": TWOWIKI,
    "strategyqa": STRATEGYQA,
    "pubmedqa": PUBMEDQA,
}


EXEMPLAR_SETS: tuple[str, ...] = ("authors", "ragate-3")  # DynamicSpec.exemplars


def exemplars_for(dataset: str | None, exemplars: str = "authors") -> tuple[tuple[str, str], ...]:
    """The (question, answer text) exemplars for a dataset name, by its prefix (``strategyqa-train`` ->
    StrategyQA); HotpotQA's for anything else (open-domain factoid questions). ``exemplars``: "authors" (the
    default) the authors' set and number (:func:`ragate.dynamic.exemplars.author_set_for`), "ragate-3" ragate's
    own three (:data:`FEWSHOT`)."""
    if exemplars == "authors":
        return author_set(author_set_for(dataset)).pairs()
    if exemplars != "ragate-3":
        raise RagateError(f"unknown exemplar set {exemplars!r}; choose one of {', '.join(EXEMPLAR_SETS)}")
    name = (dataset or "").lower()
    for key, shots in FEWSHOT.items():
        if name.startswith(key):
            return shots
    return HOTPOTQA


def format_documents(hits: Sequence[Hit]) -> str:
    """DRAGIN's context block: ``[i] title: text`` per passage."""
    lines = [
        f"[{i}] {h.passage.title}: {h.passage.text}" if h.passage.title else f"[{i}] {h.passage.text}"
        for i, h in enumerate(hits, start=1)
    ]
    return "Context:\n" + "\n".join(lines) + "\nAnswer in the same format as before."


def messages(
    question: str, documents: Sequence[Hit], dataset: str | None, exemplars: str = "authors"
) -> tuple[Message, ...]:
    """One user message: instruction, exemplars (:func:`exemplars_for`), then the passages (if any), then the
    question."""
    shots = "\n\n".join(f"Question: {q}\nAnswer: {a}" for q, a in exemplars_for(dataset, exemplars))
    parts = [INSTRUCTION, shots]
    if documents:
        parts.append(format_documents(documents))
    parts.append(f"Question: {question}\nAnswer:")
    return (Message("user", "\n\n".join(parts)),)
