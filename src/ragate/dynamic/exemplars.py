"""The authors' few-shot exemplars of DRAGIN and ETC, shipped as data (``ragate/data/exemplars/<set>.json``).

ETC section 4.2 keeps FLARE's and DRAGIN's setting and their prompt templates (Trivedi et al. 2022 for the
multi-hop sets, Wei et al. 2022 for StrategyQA); the authors' code (DRAGIN's ``src/data.py``, copied into ETC's
``data.py``, which adds BioASQ and PubMedQA) holds a pool of exemplars per dataset and uses the first
``fewshot`` of them, ``fewshot`` being 8 for HotpotQA and IIRC and 6 for 2WikiMultihopQA and StrategyQA in every
one of DRAGIN's configs. Each file keeps the pool in the authors' order, the number they use, and where it came
from (repository, commit, path, licence; the licence texts lie beside the files). The folder's README lists them.

Each exemplar is rendered as the authors' templates write it: ``Question: {question}\\nAnswer: {cot} So the
answer is {answer}.`` A damaged file (not UTF-8, not JSON, a missing or empty field, fewer exemplars than
``fewshot``) raises :class:`~ragate.errors.RagateError` naming the file.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragate.errors import RagateError
from ragate.fileio import lone_surrogate, parse_json, utf8_text

FORMAT = "ragate-exemplars/1"
FIX = "reinstall ragate (the exemplar files ship with it; see ragate/data/exemplars/README.md)"

# dataset-name prefix -> exemplar file (first match wins; anything else reads HotpotQA's, as the open-domain
# factoid sets NQ and TriviaQA did before). MuSiQue, which neither DRAGIN nor ETC ran, reads 2WikiMultihopQA's
# compositional questions, as ragate's own three did.
AUTHOR_SETS: dict[str, str] = {
    "hotpotqa": "hotpotqa",
    "2wikimultihopqa": "2wikimultihopqa",
    "musique": "2wikimultihopqa",
    "iirc": "iirc",
    "strategyqa": "strategyqa",
    "pubmedqa": "pubmedqa",
    "bioasq": "bioasq",
}
DEFAULT_SET = "hotpotqa"


@dataclass(frozen=True)
class ExemplarSet:
    """One file: the pool in the authors' order, how many of them the authors use, and where they came from."""

    name: str
    fewshot: int
    examples: tuple[tuple[str, str, str], ...]  # (question, chain of thought, answer)
    sources: tuple[dict[str, str], ...]

    def pairs(self) -> tuple[tuple[str, str], ...]:
        """The first ``fewshot`` exemplars as (question, answer text), the answer text as the authors render it."""
        return tuple((q, f"{cot} So the answer is {a}.") for q, cot, a in self.examples[: self.fewshot])


def exemplar_dir() -> Path:
    """The folder of the shipped exemplar files."""
    return Path(__file__).resolve().parents[1] / "data" / "exemplars"


def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def parse_exemplars(text: str, where: str) -> ExemplarSet:
    """An exemplar file's text, checked; ``where`` (the file) is named in every error."""
    doc = parse_json(text, where, RagateError, FIX)

    def bad(why: str) -> RagateError:
        return RagateError(f"{where}: not an exemplar file ({why}); {FIX}")

    if not isinstance(doc, dict):
        raise bad("expected a JSON object")
    if doc.get("format") != FORMAT:
        raise bad(f"format is {doc.get('format')!r}, expected {FORMAT!r}")
    if not _text(doc.get("set")):
        raise bad("no set name")
    fewshot = doc.get("fewshot")
    if not isinstance(fewshot, int) or isinstance(fewshot, bool) or fewshot < 1:
        raise bad(f"fewshot is {fewshot!r}, expected a whole number of at least 1")
    rows = doc.get("examples")
    if not isinstance(rows, list):
        raise bad("no examples list")
    examples = []
    for i, row in enumerate(rows, start=1):
        if not isinstance(row, dict) or not all(_text(row.get(k)) for k in ("question", "cot", "answer")):
            raise bad(f"example {i} lacks a non-empty question, cot or answer")
        examples.append((row["question"], row["cot"], row["answer"]))
    if len(examples) < fewshot:
        raise bad(f"{len(examples)} examples, fewer than its fewshot of {fewshot}")
    sources = doc.get("sources")
    keys = ("repo", "commit", "path", "licence")
    if (
        not isinstance(sources, list)
        or not sources
        or not all(isinstance(s, dict) and all(_text(s.get(k)) for k in keys) for s in sources)
    ):
        raise bad(f"sources must name each source's {', '.join(keys)}")
    if (found := lone_surrogate(doc)) is not None:
        raise bad(found)
    return ExemplarSet(doc["set"], fewshot, tuple(examples), tuple(sources))


def load_exemplar_file(path: Path | str) -> ExemplarSet:
    """One exemplar file, read and checked (:func:`parse_exemplars`)."""
    path = Path(path)
    try:
        text = utf8_text(path, RagateError, FIX)
    except OSError as err:
        raise RagateError(f"{path}: cannot read the exemplar file ({err.strerror or err}); {FIX}") from None
    return parse_exemplars(text, str(path))


@functools.cache
def author_set(name: str) -> ExemplarSet:
    """The shipped set ``name`` (a value of :data:`AUTHOR_SETS`), read once per process."""
    if name not in set(AUTHOR_SETS.values()):
        raise RagateError(
            f"no exemplar set {name!r}: ragate has {', '.join(sorted(set(AUTHOR_SETS.values())))}"
        )
    found = load_exemplar_file(exemplar_dir() / f"{name}.json")
    if found.name != name:
        raise RagateError(
            f"{exemplar_dir() / f'{name}.json'}: holds the set {found.name!r}, not {name!r}; {FIX}"
        )
    return found


def author_set_for(dataset: str | None) -> str:
    """The exemplar set a dataset reads, by its name's prefix (``strategyqa-train`` -> ``strategyqa``)."""
    name = (dataset or "").lower()
    return next((file for key, file in AUTHOR_SETS.items() if name.startswith(key)), DEFAULT_SET)
