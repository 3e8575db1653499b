"""QA datasets: the question files of ../shared/data as :class:`Example` lists, by registry name or by path.

Every split described in ../shared/data/README.md has one name in :data:`DATASETS` (file, format, count,
licence). The formats (:attr:`DatasetInfo.format`):

- ``jsonl`` -- the common form, one JSON object a line: ``{"id", "question", "answers": [...], "gold_ids"?,
  "label"?, "kind"?, "contexts"?}``. ``golden_answers`` (FlashRAG) or ``answer`` (NQ-open, EfficientQA,
  SQuAD-open, WebQuestions, CuratedTREC) may stand for ``answers``, ``gold_doc_ids`` for ``gold_ids``; a
  string answer is a 1-tuple; a line with a ``label`` and no answers gets ``(label,)``. Also read gzipped
  (``.gz``).
- ``dpr-tsv`` -- DPR topic files (NQ, TriviaQA): ``question<TAB>['a', 'b']``, tab-separated CSV whose second
  column is a Python list literal (read with :func:`ast.literal_eval`). About 6% of the TriviaQA questions and
  about 50 answers are CSV-quoted twice in the file (``"Who was ... ""Bomb Plot"" of 1944?"``); the second
  quoting is undone too.
- ``nq-oracle`` -- lost-in-the-middle's ``{"question", "answers", "ctxs": [{"title", "text", "isgold"}]}``;
  ``ctxs[0]`` is the gold passage.
- ``squad`` -- SQuAD JSON (``data[].paragraphs[].qas[]``); the gold is the question's paragraph. SQuAD v2.0's
  unanswerable questions (``is_impossible``) are kept with ``answers=()``.
- ``hotpot-ircot`` -- IRCoT's HotpotQA: ``question_id``, ``question_text``, ``answers_objects[].spans``,
  ``contexts[]`` (``title``, ``paragraph_text``, ``is_supporting``); gold = the supporting paragraphs.
- ``hotpot-raw`` -- HippoRAG's raw HotpotQA (``_id``, ``question``, ``answer``, ``supporting_facts``); the
  gold paragraphs are the supporting titles' entries of the ``*_corpus.json`` beside it (title -> sentences,
  joined).
- ``sagekg-gold`` / ``sagekg-merged`` -- SAGE-KG's MuSiQue / 2WikiMultihopQA samples: ``{"idx", "question",
  "answer", "context_paragraphs"}``. MuSiQue's paragraphs are its gold (pooled.py pools them); 2Wiki's one
  merged block per question has no paragraph boundaries and is not in the pooled corpus, so it is only a
  context.
- ``strategyqa`` -- ``{"id", "question", "answer": true|false, ...}``: kind ``yesno``, answers ``("yes",)`` or
  ``("no",)``.
- ``pubmedqa`` -- ``ori_pqal.json``: PMID -> ``{"QUESTION", "CONTEXTS", "final_decision", ...}``: kind
  ``yesno`` with the yes/no/maybe label; ``pubmedqa-test`` keeps the 500 PMIDs of ``test_ground_truth.json``.

Gold ids are :func:`ragate.retrieval.pooled.pooled_id` of the same paragraph text the pooled corpus keys on,
so they equal the ``gold_ids`` of its ``gold/*.jsonl`` files. Ids are the file's own (SQuAD ids, HotpotQA
``question_id`` / ``_id``, SAGE-KG ``idx``, StrategyQA ids, PMIDs), else ``f"{dataset}-{index}"`` with the
0-based index in file order; a repeated id gets ``-2``, ``-3``, ... appended, in file order.

Counts: every file holds the number of questions the README gives. Notes: ``strategyqa/train.jsonl`` has 1,290
records on 1,289 newlines (no final newline); ``strategyqa/test.jsonl`` (2,290 records; 1,764 of its questions
appear verbatim in train or dev) is not registered, as the README asks.
"""

from __future__ import annotations

import ast
import csv
import difflib
import io
import os
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
Format = Literal[
    "jsonl",
    "dpr-tsv",
    "nq-oracle",
    "squad",
    "hotpot-ircot",
    "hotpot-raw",
    "sagekg-gold",
    "sagekg-merged",
    "strategyqa",
    "pubmedqa",
]
KINDS: tuple[Kind, ...] = get_args(Kind)
DATA_DIR_ENV = "RAGATE_DATA_DIR"
DEFAULT_DATA_DIR = Path("..") / "shared" / "data"


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


@dataclass(frozen=True)
class DatasetInfo:
    """One registered split: its file under the data directory, how to read it, and what the README says."""

    path: str
    format: Format
    count: int
    description: str
    license: str
    kind: Kind = "span"
    only_ids: str | None = (
        None  # a JSON object file (under the data directory) whose keys are the ids to keep
    )


_NQ_LICENSE = "CC BY-SA 3.0"
_SQUAD_LICENSE = "CC BY-SA 4.0"
DATASETS: Mapping[str, DatasetInfo] = MappingProxyType(
    {
        "nq-open": DatasetInfo(
            "nq_open/NQ-open.dev.jsonl", "jsonl", 2705, "NQ-open (the 'test' of papers)", _NQ_LICENSE
        ),
        "nq-open-efficientqa-dev": DatasetInfo(
            "nq_open/NQ-open.efficientqa.dev.1.1.jsonl", "jsonl", 1800, "EfficientQA dev", _NQ_LICENSE
        ),
        "nq-open-efficientqa-test": DatasetInfo(
            "nq_open/NQ-open.efficientqa.test.1.1.jsonl", "jsonl", 1769, "EfficientQA test", _NQ_LICENSE
        ),
        "nq-dpr-dev": DatasetInfo(
            "nq_open/topics.dpr.nq.dev.txt", "dpr-tsv", 8757, "NQ dev (DPR topics)", _NQ_LICENSE
        ),
        "nq-dpr-test": DatasetInfo(
            "nq_open/topics.dpr.nq.test.txt", "dpr-tsv", 2782, "NQ test (DPR topics)", _NQ_LICENSE
        ),
        "nq-open-oracle": DatasetInfo(
            "nq_open_oracle/nq-open-oracle.jsonl.gz",
            "nq-oracle",
            1750,
            "NQ-open with its gold Wikipedia passage",
            "MIT (repo), Wikipedia CC BY-SA",
        ),
        "squad-v1": DatasetInfo(
            "squad/dev-v1.1.reconstructed.json",
            "squad",
            10570,
            "SQuAD v1.1 dev (2,067 paragraphs)",
            _SQUAD_LICENSE,
        ),
        "squad-v2": DatasetInfo(
            "squad/dev-v2.0.reconstructed.json",
            "squad",
            11873,
            "SQuAD v2.0 dev (1,204 paragraphs; 5,945 unanswerable)",
            _SQUAD_LICENSE,
        ),
        "squad-open": DatasetInfo(
            "squad/topics.dpr.squad.test.txt", "jsonl", 10570, "SQuAD-open (DPR topics)", _SQUAD_LICENSE
        ),
        "hotpotqa": DatasetInfo(
            "hotpotqa/dev_subsampled.jsonl",
            "hotpot-ircot",
            350,
            "HotpotQA dev distractor sample (IRCoT)",
            _SQUAD_LICENSE,
        ),
        "hotpotqa-train-raw": DatasetInfo(
            "hipporag_subsets/hotpotqa_train.json",
            "hotpot-raw",
            100,
            "HippoRAG's 100 HotpotQA train questions (994-passage corpus)",
            "MIT (repo), CC BY-SA",
        ),
        "2wikimultihopqa": DatasetInfo(
            "2wikimultihopqa/sagekg_2wiki_500.parsed.jsonl",
            "sagekg-merged",
            500,
            "2WikiMultihopQA sample, one merged evidence block each",
            "sample of Apache-2.0 data, provenance unstated",
        ),
        "musique": DatasetInfo(
            "musique/sagekg_musique_500.parsed.jsonl",
            "sagekg-gold",
            500,
            "MuSiQue sample, 2-4 gold paragraphs each (880 distinct)",
            "sample of CC BY 4.0 data, provenance unstated",
        ),
        "triviaqa-dev": DatasetInfo(
            "triviaqa/topics.dpr.trivia.dev.txt", "dpr-tsv", 8837, "TriviaQA dev", "Apache-2.0"
        ),
        "triviaqa-test": DatasetInfo(
            "triviaqa/topics.dpr.trivia.test.txt", "dpr-tsv", 11313, "TriviaQA test", "Apache-2.0"
        ),
        "webquestions": DatasetInfo(
            "webquestions/topics.dpr.wq.test.txt", "jsonl", 2032, "WebQuestions test", "CC BY 4.0"
        ),
        "curatedtrec": DatasetInfo(
            "curatedtrec/topics.dpr.curated.test.txt",
            "jsonl",
            694,
            "CuratedTREC test; answers are regular expressions",
            "see TREC",
            kind="regex",
        ),
        "strategyqa-train": DatasetInfo(
            "strategyqa/train.jsonl",
            "strategyqa",
            1290,
            "StrategyQA train (yes/no)",
            "MIT (repo)",
            kind="yesno",
        ),
        "strategyqa-dev": DatasetInfo(
            "strategyqa/dev.jsonl", "strategyqa", 500, "StrategyQA dev (yes/no)", "MIT (repo)", kind="yesno"
        ),
        "pubmedqa": DatasetInfo(
            "pubmedqa/ori_pqal.json",
            "pubmedqa",
            1000,
            "PubMedQA labelled (yes/no/maybe; 3,358 abstract sections)",
            "MIT",
            kind="yesno",
        ),
        "pubmedqa-test": DatasetInfo(
            "pubmedqa/ori_pqal.json",
            "pubmedqa",
            500,
            "PubMedQA labelled, the 500 test PMIDs",
            "MIT",
            kind="yesno",
            only_ids="pubmedqa/test_ground_truth.json",
        ),
    }
)


# ----------------------------------------------------------------------------------------------- locating


def data_dir(path: str | Path | None = None) -> Path:
    """The QA data folder: ``path``, else ``$RAGATE_DATA_DIR``, else ``../shared/data`` relative to the
    current directory. Raises :class:`DataNotFoundError` when that folder does not exist."""
    if path is not None:
        where, how = Path(path), "as given"
    elif os.environ.get(DATA_DIR_ENV):
        where, how = Path(os.environ[DATA_DIR_ENV]), f"from ${DATA_DIR_ENV}"
    else:
        where, how = DEFAULT_DATA_DIR, "the default ../shared/data, relative to the current directory"
    if not where.is_dir():
        raise DataNotFoundError(
            f"no QA data folder at {where.resolve()} ({how}); pass --data-dir DIR or set {DATA_DIR_ENV} "
            "to the folder holding the QA files (nq_open/, squad/, hotpotqa/, ... as in ../shared/data)"
        )
    return where.resolve()


_data_dir = data_dir  # load_dataset's keyword argument shadows the function's name


DEMO = "demo"


def load_dataset(
    name_or_path: str | Path, *, data_dir: str | Path | None = None, limit: int | None = None
) -> list[Example]:
    """The questions of a registered split (a name in :data:`DATASETS`, its file found under :func:`data_dir`),
    of ``"demo"`` (the 80 NQ-open questions that ship in the package, answerable from the demo index) or of a
    common-form JSONL file (``.jsonl`` or ``.jsonl.gz``); the first ``limit`` in file order."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, not {limit}")
    if name_or_path == DEMO:
        from ragate.retrieval.corpus import demo_dir

        examples = read_jsonl_examples(demo_dir() / "questions.jsonl", DEMO)
    elif isinstance(name_or_path, str) and name_or_path in DATASETS:
        examples = _load_registered(name_or_path, DATASETS[name_or_path], _data_dir(data_dir))
    elif Path(name_or_path).is_file():
        examples = read_jsonl_examples(name_or_path)
    else:
        raise _unknown(str(name_or_path))
    return examples if limit is None else examples[:limit]


def read_questions(source: str | Path) -> list[str]:
    """Questions without answers, for calibration: a text file with one question a line (blank lines skipped), a
    JSONL file of objects with "question" (``.jsonl``/``.jsonl.gz``; "answers" and other fields are ignored), or a
    dataset name (its questions). Each problem names the file and line."""
    path = Path(source)
    if not path.is_file():
        if isinstance(source, str) and (source == DEMO or source in DATASETS):
            return [ex.question for ex in load_dataset(source)]
        raise DataNotFoundError(
            f"no questions file at {source}: give a text file (one question a line), a JSONL file with "
            f'"question" fields, or a dataset name ({", ".join(DATASETS)})'
        )
    name = path.name.lower().removesuffix(".gz")
    questions: list[str] = []
    if name.endswith((".jsonl", ".json")):
        fix = 'each line is a JSON object with a "question" string'
        for line_no, row in json_lines(path, DatasetFormatError, fix):
            question = row.get("question") if isinstance(row, dict) else None
            _check_text(question, f"{path}:{line_no}")
            if not isinstance(question, str) or not question.strip():
                raise DatasetFormatError(f"{path}:{line_no}: no \"question\" string; {fix}")
            questions.append(question.strip())
    else:
        text = utf8_text(path, DatasetFormatError, "save the file as UTF-8 text, one question a line")
        questions = [line.strip() for line in text.splitlines() if line.strip()]
    if not questions:
        raise DatasetFormatError(f"{path} holds no questions: one question a line, or JSONL with \"question\"")
    return questions


def dataset_files(name_or_path: str | Path, *, data_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """The file(s) a dataset is read from, each with its resolved path, size and sha256, so that a run records
    *which* file it read: two files of the same name (another copy of ../shared/data, an edited JSONL) differ
    here. Raises like :func:`load_dataset` when the dataset cannot be found."""
    if name_or_path == DEMO:
        from ragate.retrieval.corpus import demo_dir

        paths = [demo_dir() / "questions.jsonl"]
    elif isinstance(name_or_path, str) and name_or_path in DATASETS:
        info, root = DATASETS[name_or_path], _data_dir(data_dir)
        paths = [root / info.path] + ([root / info.only_ids] if info.only_ids else [])
        if info.format == "hotpot-raw":
            paths.append(paths[0].with_name(f"{paths[0].stem}_corpus.json"))
    elif Path(name_or_path).is_file():
        paths = [Path(name_or_path)]
    else:
        raise _unknown(str(name_or_path))
    from ragate.fileio import sha256_file

    return [
        {"path": str(p.resolve()), "bytes": p.stat().st_size, "sha256": sha256_file(p)}
        for p in paths
        if p.is_file()
    ]


def _unknown(name: str) -> DataNotFoundError:
    close = difflib.get_close_matches(name, DATASETS, n=3)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    return DataNotFoundError(
        f"unknown dataset {name!r}: no registered name and no file at {Path(name).resolve()}; {hint}"
        f"registered: {', '.join(sorted(DATASETS))}; or pass the path of a JSONL file of "
        '{"id", "question", "answers"} lines'
    )


def _load_registered(name: str, info: DatasetInfo, root: Path) -> list[Example]:
    path = root / info.path
    if not path.is_file():
        raise DataNotFoundError(
            f"dataset {name!r} is read from {info.path} under {root}, but that file is missing; "
            f"pass --data-dir DIR or set {DATA_DIR_ENV} to a complete copy of ../shared/data"
        )
    examples = _READERS[info.format](path, name, info.kind)
    if not examples:
        raise DatasetFormatError(f"{path} holds no questions; restore it from ../shared/data")
    if info.only_ids is not None:
        keep = set(_json_file(root / info.only_ids))
        examples = [e for e in examples if e.id in keep]
        if len(examples) != len(keep):
            raise DatasetFormatError(
                f"{root / info.only_ids} names {len(keep)} ids but only {len(examples)} are in {path}; "
                "restore both files from ../shared/data"
            )
    return _unique_ids(examples)


# ------------------------------------------------------------------------------------------- common pieces


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
        _check_text(row, f"{path}:{line_no}")
        yield line_no, row


def _json_file(path: Path) -> Any:
    fix = "restore the file"
    document = parse_json(utf8_text(path, DatasetFormatError, fix), str(path), DatasetFormatError, fix)
    _check_text(document, str(path))
    return document


def _check_text(value: Any, where: str) -> None:
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


def _unique_ids(examples: list[Example]) -> list[Example]:
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


# ----------------------------------------------------------------------------------------------- readers


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
    return _unique_ids(out)


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
        for a, article in enumerate(_json_file(path)["data"]):
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
        corpus = {title: "".join(sentences) for title, sentences in _json_file(corpus_path).items()}
    out = []
    with _located(str(path)):
        for i, q in enumerate(_json_file(path)):
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
        for pmid, row in _json_file(path).items():
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
