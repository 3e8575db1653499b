"""QA datasets: the question files of ../shared/data as :class:`Example` lists, by registry name or by path
(their readers: :mod:`ragate.eval.readers`).

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

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from ragate.errors import DataNotFoundError, DatasetFormatError
from ragate.eval.readers import (  # noqa: F401 (KINDS and _read_dpr_tsv stay importable here)
    _READERS,
    KINDS,
    Example,
    Kind,
    _read_dpr_tsv,
    check_text,
    json_file,
    read_jsonl_examples,
    unique_ids,
)
from ragate.fileio import json_lines, utf8_text

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
DATA_DIR_ENV = "RAGATE_DATA_DIR"
DEFAULT_DATA_DIR = Path("..") / "shared" / "data"


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
            check_text(question, f"{path}:{line_no}")
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
    from ragate.fileio import sha256_file

    return [
        {"path": str(p.resolve()), "bytes": p.stat().st_size, "sha256": sha256_file(p)}
        for p in dataset_paths(name_or_path, data_dir=data_dir)
        if p.is_file()
    ]


def dataset_paths(name_or_path: str | Path, *, data_dir: str | Path | None = None) -> list[Path]:
    """The file(s) a dataset is read from (not read); raises like :func:`load_dataset` when it cannot be found."""
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
    return paths


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
        keep = set(json_file(root / info.only_ids))
        examples = [e for e in examples if e.id in keep]
        if len(examples) != len(keep):
            raise DatasetFormatError(
                f"{root / info.only_ids} names {len(keep)} ids but only {len(examples)} are in {path}; "
                "restore both files from ../shared/data"
            )
    return unique_ids(examples)
