"""The readers of the QA file formats (:mod:`ragate.eval.datasets` describes them), each turning one file into a
list of :class:`Example`: checked text, gold passage ids, unique ids."""

from __future__ import annotations

import ast
import csv
import io
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import IO, Any, Literal, get_args

from ragate.errors import DataNotFoundError, DatasetFormatError
from ragate.fileio import json_lines, lone_surrogate, parse_json, utf8_text
from ragate.retrieval.pooled import pooled_id

Kind = Literal["span", "yesno", "regex"]
KINDS: tuple[Kind, ...] = get_args(Kind)


@dataclass(frozen=True)
class Example:
    """One question with its gold answers; ``kind`` says how to score it (EM/F1, label accuracy, regex)."""

    id: str
    question: str
    answers: tuple[str, ...]  # gold aliases; ("yes",) etc. for yes/no sets; regex patterns for CuratedTREC
    dataset: str
    kind: Kind = "span"
    gold_ids: tuple[str, ...] = ()  # pooled-corpus ids of the gold paragraphs, where the file names them
    label: str | None = None  # yes / no / maybe
    contexts: tuple[str, ...] = ()  # the gold or given passages' texts, where the file carries them


@contextmanager
def _located(where: str) -> Iterator[None]:
    """Report a problem with one record as a :class:`DatasetFormatError` that names where the record is."""
    try:
        yield
    except KeyError as err:
        raise DatasetFormatError(
            f"{where}: missing field {err.args[0]!r}; fix or remove that record"
        ) from None
    except (TypeError, ValueError, IndexError, AttributeError) as err:
        raise DatasetFormatError(f"{where}: {err}; fix or remove that record") from None


def _open_text(path: Path) -> IO[str]:
    return io.StringIO(utf8_text(path, DatasetFormatError, "fix or restore the file"), newline="")


def _json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    for line_no, row in json_lines(path, DatasetFormatError, "fix or remove that line"):
        check_text(row, f"{path}:{line_no}")
        yield line_no, row


def json_file(path: Path) -> Any:
    fix = "restore the file"
    document = parse_json(utf8_text(path, DatasetFormatError, fix), str(path), DatasetFormatError, fix)
    check_text(document, str(path))
    return document


def check_text(value: Any, where: str) -> None:
    """Refuse a record whose text holds a lone surrogate (a JSON ``\\ud800`` escape without its pair): Python
    reads it, but no tokenizer or UTF-8 writer can take it, so the run would fail at its first model call."""
    fault = lone_surrogate(value)
    if fault is not None:
        raise DatasetFormatError(
            f"{where}: {fault} (a \\ud800-style escape without its pair), which is not text a model can read; "
            "write the character itself or remove it"
        )


def _strings(value: object, field: str) -> tuple[str, ...]:
    """A string or a list of strings as a tuple, empty strings and repeats dropped (order kept)."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
        raise ValueError(f"{field!r} must be a string or a list of strings, not {value!r}")
    if (fault := lone_surrogate(items)) is not None:  # a Python literal's escape (DPR TSV answers)
        raise ValueError(f"{field!r}: {fault}, which is not text")
    return tuple(dict.fromkeys(x for x in items if x.strip()))


def _gold_ids(texts: Iterable[str]) -> tuple[str, ...]:
    """Pooled-corpus ids of paragraphs (empty ones skipped, repeats dropped), as pooled.py assigns them."""
    return tuple(dict.fromkeys(pooled_id(t) for t in texts if t.strip()))


def _example(dataset: str, qid: object, question: object, answers: tuple[str, ...], **fields: Any) -> Example:
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"empty question ({question!r})")
    if isinstance(qid, bool) or not isinstance(qid, str | int) or not str(qid).strip():
        raise ValueError(f"the question's id must be a non-empty string or an integer, not {qid!r}")
    return Example(str(qid), question.strip(), answers, dataset, **fields)


def unique_ids(examples: list[Example]) -> list[Example]:
    """The examples with each repeat of an id renamed ``{id}-2``, ``{id}-3``, ... (the first free one), in
    file order."""
    taken = {e.id for e in examples}
    if len(taken) == len(examples):
        return examples
    out: list[Example] = []
    seen: set[str] = set()
    for e in examples:
        if e.id in seen:
            n = 2
            while f"{e.id}-{n}" in taken:
                n += 1
            taken.add(f"{e.id}-{n}")
            e = replace(e, id=f"{e.id}-{n}")
        seen.add(e.id)
        out.append(e)
    return out


def read_jsonl_examples(
    path: str | Path, dataset: str | None = None, *, kind: Kind = "span"
) -> list[Example]:
    """Questions of a JSONL file in the common form (see the module docstring); ``dataset`` defaults to the
    file name without ``.jsonl`` / ``.jsonl.gz``; ``kind`` applies to lines without a ``kind`` field."""
    path = Path(path)
    name = dataset or path.name.removesuffix(".gz").removesuffix(".jsonl")
    out = []
    for index, (line_no, row) in enumerate(_json_lines(path)):
        with _located(f"{path}:{line_no}"):
            out.append(_common_row(row, name, index, kind))
    if not out:
        raise DatasetFormatError(
            f'{path} holds no questions (no non-blank line); write one JSON object a line: {{"id", "question", '
            '"answers"}'
        )
    return unique_ids(out)


def _common_row(row: Any, dataset: str, index: int, kind: Kind) -> Example:
    if not isinstance(row, dict):
        raise TypeError(f"expected a JSON object with 'question' and 'answers', not {type(row).__name__}")
    label = row.get("label")
    if isinstance(label, bool):
        label = "yes" if label else "no"
    elif label is not None and not isinstance(label, str):
        raise TypeError(f"'label' must be a string, not {label!r}")
    key = next((k for k in ("answers", "golden_answers", "answer") if k in row), None)
    if key is not None:
        answers = _strings(row[key], key)
    elif label is not None:
        answers = (label,)
    else:
        raise ValueError("no 'answers' (or 'golden_answers' / 'answer') field")
    row_kind = row.get("kind", kind)
    if row_kind not in KINDS:
        raise ValueError(f"'kind' must be one of {', '.join(KINDS)}, not {row_kind!r}")
    qid = row.get("id")
    if qid is not None and (isinstance(qid, bool) or not isinstance(qid, str | int)):
        raise TypeError(f"'id' must be a string or an integer, not {qid!r}")
    return _example(
        dataset,
        f"{dataset}-{index}" if qid is None else qid,
        row.get("question"),
        answers,
        kind=row_kind,
        gold_ids=_strings(row.get("gold_ids", row.get("gold_doc_ids", [])), "gold_ids"),
        label=label,
        contexts=_strings(row.get("contexts", []), "contexts"),
    )


def _read_common(path: Path, dataset: str, kind: Kind) -> list[Example]:
    return read_jsonl_examples(path, dataset, kind=kind)


_CSV_QUOTED = re.compile(r'"((?:[^"]|"")*)"')


def _unquote(text: str) -> str:
    """Undo a second layer of CSV quoting: a field in quotes whose inner quotes are doubled (at least one)."""
    m = _CSV_QUOTED.fullmatch(text)
    return m.group(1).replace('""', '"') if m and '""' in m.group(1) else text


def _read_dpr_tsv(path: Path, dataset: str, kind: Kind) -> list[Example]:
    out: list[Example] = []
    with _open_text(path) as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            with _located(f"{path}:{line_no}"):
                fields = next(csv.reader([line.rstrip("\r\n")], delimiter="\t"))
                if len(fields) != 2:
                    raise ValueError(
                        f"expected 2 tab-separated columns (question, answers), found {len(fields)}"
                    )
                try:
                    answers = ast.literal_eval(fields[1])
                except (SyntaxError, MemoryError, RecursionError) as err:
                    raise ValueError(f"the answers are not a Python list literal ({err})") from None
                answers = tuple(dict.fromkeys(_unquote(a) for a in _strings(answers, "answers")))
                out.append(
                    _example(dataset, f"{dataset}-{len(out)}", _unquote(fields[0]), answers, kind=kind)
                )
    return out


def _read_nq_oracle(path: Path, dataset: str, kind: Kind) -> list[Example]:
    out = []
    for index, (line_no, row) in enumerate(_json_lines(path)):
        with _located(f"{path}:{line_no}"):
            gold = row["ctxs"][0]["text"]
            answers = _strings(row["answers"], "answers")
            ex = _example(dataset, f"{dataset}-{index}", row["question"], answers, kind=kind)
            out.append(replace(ex, gold_ids=_gold_ids([gold]), contexts=(gold,)))
    return out


def _read_squad(path: Path, dataset: str, kind: Kind) -> list[Example]:
    out = []
    with _located(str(path)):
        for a, article in enumerate(json_file(path)["data"]):
            for p, paragraph in enumerate(article["paragraphs"]):
                context = paragraph["context"]
                gold = _gold_ids([context])
                for q, qa in enumerate(paragraph["qas"]):
                    with _located(f"{path}: data[{a}].paragraphs[{p}].qas[{q}]"):
                        texts = [] if qa.get("is_impossible") else [x["text"] for x in qa["answers"]]
                        ex = _example(
                            dataset, qa["id"], qa["question"], _strings(texts, "answers"), kind=kind
                        )
                        out.append(replace(ex, gold_ids=gold, contexts=(context,)))
    return out


def _read_hotpot_ircot(path: Path, dataset: str, kind: Kind) -> list[Example]:
    out = []
    for line_no, row in _json_lines(path):
        with _located(f"{path}:{line_no}"):
            supporting = [c["paragraph_text"] for c in row["contexts"] if c["is_supporting"]]
            answers = _strings([s for obj in row["answers_objects"] for s in obj["spans"]], "answers")
            ex = _example(dataset, row["question_id"], row["question_text"], answers, kind=kind)
            out.append(replace(ex, gold_ids=_gold_ids(supporting), contexts=tuple(supporting)))
    return out


def _read_hotpot_raw(path: Path, dataset: str, kind: Kind) -> list[Example]:
    """Gold paragraphs come from ``<stem>_corpus.json``, joined as pooled.py joins them (``"".join``)."""
    corpus_path = path.with_name(f"{path.stem}_corpus.json")
    if not corpus_path.is_file():
        raise DataNotFoundError(f"{path} needs its passage file {corpus_path}, which is missing; restore it")
    with _located(str(corpus_path)):
        corpus = {title: "".join(sentences) for title, sentences in json_file(corpus_path).items()}
    out = []
    with _located(str(path)):
        for i, q in enumerate(json_file(path)):
            with _located(f"{path}: [{i}]"):
                titles = dict.fromkeys(title for title, _ in q["supporting_facts"])
                texts = [corpus[t] for t in titles if t in corpus]
                ex = _example(dataset, q["_id"], q["question"], _strings(q["answer"], "answer"), kind=kind)
                out.append(replace(ex, gold_ids=_gold_ids(texts), contexts=tuple(texts)))
    return out


def _read_sagekg(path: Path, dataset: str, kind: Kind, *, gold: bool) -> list[Example]:
    out = []
    for line_no, row in _json_lines(path):
        with _located(f"{path}:{line_no}"):
            paragraphs = _strings(row["context_paragraphs"], "context_paragraphs")
            ex = _example(dataset, row["idx"], row["question"], _strings(row["answer"], "answer"), kind=kind)
            out.append(replace(ex, gold_ids=_gold_ids(paragraphs) if gold else (), contexts=paragraphs))
    return out


def _read_strategyqa(path: Path, dataset: str, kind: Kind) -> list[Example]:
    out = []
    for line_no, row in _json_lines(path):
        with _located(f"{path}:{line_no}"):
            if not isinstance(row["answer"], bool):
                raise TypeError(f"'answer' must be true or false, not {row['answer']!r}")
            label = "yes" if row["answer"] else "no"
            out.append(_example(dataset, row["id"], row["question"], (label,), kind=kind, label=label))
    return out


def _read_pubmedqa(path: Path, dataset: str, kind: Kind) -> list[Example]:
    out = []
    with _located(str(path)):
        for pmid, row in json_file(path).items():
            with _located(f"{path}: {pmid}"):
                label = row["final_decision"]
                if label not in ("yes", "no", "maybe"):
                    raise ValueError(f"'final_decision' must be yes, no or maybe, not {label!r}")
                contexts = _strings(row["CONTEXTS"], "CONTEXTS")
                ex = _example(dataset, pmid, row["QUESTION"], (label,), kind=kind, label=label)
                out.append(replace(ex, contexts=contexts))
    return out


Reader = Callable[[Path, str, Kind], list[Example]]


_READERS: Mapping[str, Reader] = MappingProxyType(
    {
        "jsonl": _read_common,
        "dpr-tsv": _read_dpr_tsv,
        "nq-oracle": _read_nq_oracle,
        "squad": _read_squad,
        "hotpot-ircot": _read_hotpot_ircot,
        "hotpot-raw": _read_hotpot_raw,
        "sagekg-gold": partial(_read_sagekg, gold=True),
        "sagekg-merged": partial(_read_sagekg, gold=False),
        "strategyqa": _read_strategyqa,
        "pubmedqa": _read_pubmedqa,
    }
)
