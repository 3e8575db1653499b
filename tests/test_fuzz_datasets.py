"""Fuzz: the QA files ragate reads (issue N). JSONL in the common form (``load_dataset(path)``, plain and gzipped),
DPR's topic TSV and SQuAD's and PubMedQA's JSON (registered names over a data folder built here), and the question
files ``ragate calibrate --questions`` reads. Each file starts as real rows of those datasets; a mutated file is
either read as questions a model can take (non-empty stripped text, no lone surrogates, answers as strings, ids
unique) or refused with a DatasetFormatError that names it. A file with no question is refused, never an empty
run."""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from fuzzing import HOSTILE_VALUES, byte_mutation, dumps, fuzz_settings, json_mutation, refused_or_accepted
from hypothesis import given
from hypothesis import strategies as st

from ragate.errors import DatasetFormatError
from ragate.eval.datasets import KINDS, Example, load_dataset, read_questions

# the first questions of the demo set (NQ-open) and of nq_open/topics.dpr.nq.dev.txt, and one SQuAD paragraph and
# one PubMedQA record, shortened
ROWS: list[Any] = [
    {
        "id": "0",
        "question": "who got the first nobel prize in physics",
        "answers": ["Wilhelm Conrad Röntgen"],
        "gold_ids": ["p15a5da119748"],
        "dataset": "nq_open_oracle",
    },
    {
        "id": "1",
        "question": "the south west wind blows across nigeria between",
        "answers": ["till September"],
    },
    {"question": "Is water wet?", "label": "yes", "kind": "yesno"},
    {"id": 7, "question": "Year?", "answer": "19[0-9]{2}", "kind": "regex", "contexts": ["Some passage."]},
]
TSV = (
    "who sings does he love me with reba\t['Linda Davis']\n"
    "how many pages is invisible man by ralph ellison\t['581 ( second edition )']\n"
    "where do the great lakes meet the ocean\t['the Saint Lawrence River']\n"
)
SQUAD = {
    "data": [
        {
            "title": "1973_oil_crisis",
            "paragraphs": [
                {
                    "context": "The 1973 oil crisis began in October 1973 when the members of the Organization of "
                    "Arab Petroleum Exporting Countries proclaimed an oil embargo.",
                    "qas": [
                        {
                            "id": "5725b33f6a3fe71400b8952d",
                            "question": "When did the 1973 oil crisis begin?",
                            "answers": [{"text": "October 1973", "answer_start": 29}, {"text": "1973"}],
                        },
                        {
                            "id": "x2",
                            "question": "Who proclaimed an embargo?",
                            "answers": [],
                            "is_impossible": True,
                        },
                    ],
                }
            ],
        }
    ]
}
PUBMEDQA = {
    "21645374": {
        "QUESTION": "Do mitochondria play a role in remodelling lace plant leaves during programmed cell death?",
        "CONTEXTS": ["Programmed cell death (PCD) is the regulated death of cells within an organism."],
        "final_decision": "yes",
    }
}
_names = itertools.count()


def _jsonl(rows: Any) -> bytes:
    """A JSON-lines file of ``rows`` (a list: one line each; anything else, as a mutation leaves the root: one)."""
    if not isinstance(rows, list):
        return dumps(rows) + b"\n"
    return b"".join(dumps(row) + b"\n" for row in rows)


def well_formed(examples: list[Example]) -> None:
    """What every reader promises of what it accepts: at least one question, each a model can read."""
    assert examples, "an accepted file gave no questions"
    assert len({ex.id for ex in examples}) == len(examples)
    for ex in examples:
        assert isinstance(ex.id, str) and ex.id
        assert isinstance(ex.question, str) and ex.question and ex.question == ex.question.strip()
        assert ex.kind in KINDS and (ex.label is None or isinstance(ex.label, str))
        for texts in (ex.answers, ex.gold_ids, ex.contexts):
            assert isinstance(texts, tuple) and all(isinstance(t, str) for t in texts)
        for text in (ex.id, ex.question, ex.dataset, *ex.answers, *ex.gold_ids, *ex.contexts):
            text.encode("utf-8")  # no lone surrogate: the tokenizer and the record writer encode every text


def _jsonl_file(tmp_path: Path, data: bytes, suffix: str = ".jsonl") -> list[Example] | None:
    path = tmp_path / f"mine-{next(_names)}{suffix}"
    path.write_bytes(data)
    examples = refused_or_accepted(lambda: load_dataset(path), path)
    if examples is not None:
        well_formed(examples)
    return examples


def _registered(tmp_path: Path, name: str, relative: str, data: bytes) -> list[Example] | None:
    root = tmp_path / f"data-{next(_names)}"
    path = root / relative
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    examples = refused_or_accepted(lambda: load_dataset(name, data_dir=root), path)
    if examples is not None:
        well_formed(examples)
    return examples


@pytest.fixture(scope="module")
def originals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Example]]:
    """What each unmutated file reads as (a BOM in front must read the same)."""
    tmp = tmp_path_factory.mktemp("originals")
    out = {
        "jsonl": _jsonl_file(tmp, _jsonl(ROWS)),
        "tsv": _registered(tmp, "nq-dpr-dev", "nq_open/topics.dpr.nq.dev.txt", TSV.encode()),
        "squad": _registered(tmp, "squad-v1", "squad/dev-v1.1.reconstructed.json", dumps(SQUAD)),
    }
    assert all(out.values())
    return {k: v for k, v in out.items() if v is not None}


def _same_if_only_a_bom(
    data: bytes, original: bytes, examples: list[Example] | None, expected: list[Example]
) -> None:
    if data == b"\xef\xbb\xbf" + original:
        assert examples is not None and [replace_dataset(e) for e in examples] == [
            replace_dataset(e) for e in expected
        ]


def replace_dataset(ex: Example) -> tuple[Any, ...]:
    """An example without its dataset name (the name comes from the file name, which differs per example)."""
    return ex.id.split("-")[-1], ex.question, ex.answers, ex.kind, ex.gold_ids, ex.label, ex.contexts


# ------------------------------------------------------------------------------------------------ the properties


@fuzz_settings
@given(st.data())
def test_fuzz_jsonl_values(tmp_path: Path, data: st.DataObject) -> None:
    _jsonl_file(tmp_path, _jsonl(data.draw(json_mutation(ROWS))))


@fuzz_settings
@given(st.data())
def test_fuzz_jsonl_bytes(tmp_path: Path, originals: dict[str, list[Example]], data: st.DataObject) -> None:
    mutated = data.draw(byte_mutation(_jsonl(ROWS)))
    _same_if_only_a_bom(mutated, _jsonl(ROWS), _jsonl_file(tmp_path, mutated), originals["jsonl"])


@fuzz_settings
@given(st.data())
def test_fuzz_gzipped_jsonl_bytes(tmp_path: Path, data: st.DataObject) -> None:
    compressed = gzip.compress(_jsonl(ROWS), mtime=0)
    mutated = data.draw(st.one_of(byte_mutation(compressed), byte_mutation(_jsonl(ROWS)).map(gzip.compress)))
    _jsonl_file(tmp_path, mutated, ".jsonl.gz")


@fuzz_settings
@given(st.data())
def test_fuzz_dpr_tsv_bytes(tmp_path: Path, originals: dict[str, list[Example]], data: st.DataObject) -> None:
    mutated = data.draw(byte_mutation(TSV.encode()))
    examples = _registered(tmp_path, "nq-dpr-dev", "nq_open/topics.dpr.nq.dev.txt", mutated)
    _same_if_only_a_bom(mutated, TSV.encode(), examples, originals["tsv"])


@fuzz_settings
@given(st.data())
def test_fuzz_dpr_tsv_columns(tmp_path: Path, data: st.DataObject) -> None:
    """One column of one line replaced by a hostile value, as its Python literal or as plain text."""
    lines = [line.split("\t") for line in TSV.splitlines()]
    row, column = data.draw(st.integers(0, len(lines) - 1)), data.draw(st.integers(0, 1))
    value = data.draw(st.sampled_from(HOSTILE_VALUES))
    lines[row][column] = repr(value) if data.draw(st.booleans()) else str(value)
    text = "".join("\t".join(line) + "\n" for line in lines)
    _registered(
        tmp_path, "nq-dpr-dev", "nq_open/topics.dpr.nq.dev.txt", text.encode("utf-8", "surrogatepass")
    )


@fuzz_settings
@given(st.data())
def test_fuzz_squad_json(tmp_path: Path, originals: dict[str, list[Example]], data: st.DataObject) -> None:
    as_bytes = data.draw(st.booleans())
    mutated = data.draw(byte_mutation(dumps(SQUAD))) if as_bytes else dumps(data.draw(json_mutation(SQUAD)))
    examples = _registered(tmp_path, "squad-v1", "squad/dev-v1.1.reconstructed.json", mutated)
    _same_if_only_a_bom(mutated, dumps(SQUAD), examples, originals["squad"])


@fuzz_settings
@given(st.data())
def test_fuzz_pubmedqa_json(tmp_path: Path, data: st.DataObject) -> None:
    as_bytes = data.draw(st.booleans())
    mutated = (
        data.draw(byte_mutation(dumps(PUBMEDQA))) if as_bytes else dumps(data.draw(json_mutation(PUBMEDQA)))
    )
    _registered(tmp_path, "pubmedqa", "pubmedqa/ori_pqal.json", mutated)


@fuzz_settings
@given(st.data())
def test_fuzz_calibration_questions(tmp_path: Path, data: st.DataObject) -> None:
    """``ragate calibrate --questions FILE``: one question a line, or JSONL with "question"."""
    suffix = data.draw(st.sampled_from([".txt", ".jsonl"]))
    original = TSV.replace("\t", " ").encode() if suffix == ".txt" else _jsonl(ROWS)
    if suffix == ".jsonl" and data.draw(st.booleans()):
        mutated = _jsonl(data.draw(json_mutation(ROWS)))
    else:
        mutated = data.draw(byte_mutation(original))
    path = tmp_path / f"questions-{next(_names)}{suffix}"
    path.write_bytes(mutated)
    questions = refused_or_accepted(lambda: read_questions(path), path)
    if questions is not None:
        assert questions and all(isinstance(q, str) and q and q == q.strip() for q in questions)
        for q in questions:
            q.encode("utf-8")
    if mutated == b"\xef\xbb\xbf" + original:
        assert questions == read_questions_of(tmp_path, original, suffix)


def read_questions_of(tmp_path: Path, data: bytes, suffix: str) -> list[str]:
    path = tmp_path / f"questions-{next(_names)}{suffix}"
    path.write_bytes(data)
    return read_questions(path)


# ------------------------------------------------------------------------------------- faults the fuzzing found


def test_a_lone_surrogate_in_a_question_is_refused_naming_file_and_line(tmp_path: Path) -> None:
    """``"q1\\ud800"`` (a JSON escape) used to load and then fail in the llama.cpp tokenizer (UnicodeEncodeError)."""
    path = tmp_path / "mine.jsonl"
    path.write_text(
        '{"question": "who wrote hamlet", "answers": ["Shakespeare"]}\n'
        '{"question": "q1\\ud800", "answers": ["x"]}\n',
        encoding="utf-8",
    )
    with pytest.raises(DatasetFormatError, match=r"mine\.jsonl:2: .*lone surrogate.*write the character"):
        load_dataset(path)
    pair = tmp_path / "pair.jsonl"  # a surrogate pair is an ordinary character (here an emoji)
    pair.write_text('{"question": "q1 \\ud83d\\ude00", "answers": ["x"]}\n', encoding="utf-8")
    assert load_dataset(pair)[0].question == "q1 \U0001f600"


def test_a_lone_surrogate_in_a_tsv_answer_or_a_questions_file_is_refused(tmp_path: Path) -> None:
    topics = tmp_path / "nq_open" / "topics.dpr.nq.dev.txt"
    topics.parent.mkdir()
    topics.write_text("who wrote hamlet\t['Shakespeare\\ud800']\n", encoding="utf-8")
    with pytest.raises(DatasetFormatError, match=r"topics\.dpr\.nq\.dev\.txt:1: 'answers': .*lone surrogate"):
        load_dataset("nq-dpr-dev", data_dir=tmp_path)
    questions = tmp_path / "questions.jsonl"
    questions.write_text('{"question": "who \\udc00 wrote hamlet"}\n', encoding="utf-8")
    with pytest.raises(DatasetFormatError, match=r"questions\.jsonl:1: .*lone surrogate"):
        read_questions(questions)


def test_a_dataset_file_with_no_question_is_refused(tmp_path: Path) -> None:
    """An empty or blank JSONL file used to load as no questions: `ragate calibrate` and the service then had
    nothing to say why."""
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"\n  \n")
    with pytest.raises(DatasetFormatError, match=r"empty\.jsonl holds no questions"):
        load_dataset(path)


def test_an_empty_id_is_refused(tmp_path: Path) -> None:
    """``"id": ""`` used to load as a question with an empty id (and a SQuAD "id": null as the id "None")."""
    path = tmp_path / "ids.jsonl"
    path.write_bytes(_jsonl([{"id": "", "question": "q", "answers": ["a"]}]))
    with pytest.raises(
        DatasetFormatError, match=r"ids\.jsonl:1: the question's id must be a non-empty string"
    ):
        load_dataset(path)
    squad = tmp_path / "squad" / "dev-v1.1.reconstructed.json"
    squad.parent.mkdir()
    squad.write_bytes(dumps(json.loads(json.dumps(SQUAD).replace('"x2"', "null"))))
    with pytest.raises(DatasetFormatError, match=r"qas\[1\]: the question's id must be .* not None"):
        load_dataset("squad-v1", data_dir=tmp_path)


def test_a_bom_in_front_reads_as_the_same_file(tmp_path: Path) -> None:
    """A byte-order mark (Notepad's UTF-8) used to make the first JSONL line "not valid JSON" and, in a TSV or a
    questions file, to become part of the first question."""
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + _jsonl(ROWS))
    plain = tmp_path / "bom2.jsonl"
    plain.write_bytes(_jsonl(ROWS))
    assert [replace_dataset(e) for e in load_dataset(path)] == [
        replace_dataset(e) for e in load_dataset(plain)
    ]
    topics = tmp_path / "nq_open" / "topics.dpr.nq.dev.txt"
    topics.parent.mkdir()
    topics.write_bytes(b"\xef\xbb\xbf" + TSV.encode())
    assert load_dataset("nq-dpr-dev", data_dir=tmp_path)[0].question == "who sings does he love me with reba"
    text = tmp_path / "questions.txt"
    text.write_bytes(b"\xef\xbb\xbfwho wrote hamlet\n")
    assert read_questions(text) == ["who wrote hamlet"]


def test_a_damaged_gzip_file_is_refused_naming_it(tmp_path: Path) -> None:
    """A cut or corrupt ``.jsonl.gz`` used to raise EOFError or BadGzipFile (a traceback)."""
    whole = gzip.compress(_jsonl(ROWS), mtime=0)
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(DatasetFormatError, match=r"cut\.jsonl\.gz: the gzip stream is truncated or corrupt"):
        load_dataset(cut)
    garbage = tmp_path / "garbage.jsonl.gz"
    garbage.write_bytes(b"not gzip at all\n")
    with pytest.raises(DatasetFormatError, match=r"garbage\.jsonl\.gz: the gzip stream"):
        load_dataset(garbage)


def test_a_number_too_long_or_nesting_too_deep_is_not_json(tmp_path: Path) -> None:
    """json.loads raises ValueError for an integer of more than 4,300 digits and RecursionError for deep nesting,
    neither a JSONDecodeError: both used to escape as tracebacks."""
    long_id = tmp_path / "long.jsonl"
    long_id.write_text('{"id": ' + "9" * 5000 + ', "question": "q", "answers": ["a"]}\n', encoding="utf-8")
    with pytest.raises(DatasetFormatError, match=r"long\.jsonl:1: not valid JSON \(Exceeds the limit"):
        load_dataset(long_id)
    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 100_000 + "\n", encoding="utf-8")
    with pytest.raises(DatasetFormatError, match=r"deep\.jsonl:1: not valid JSON \(nested too deeply\)"):
        load_dataset(deep)
    squad = tmp_path / "squad" / "dev-v1.1.reconstructed.json"
    squad.parent.mkdir()
    squad.write_text(json.dumps(SQUAD).replace('"answer_start": 29', '"answer_start": ' + "1" * 5000))
    with pytest.raises(DatasetFormatError, match=r"dev-v1\.1\.reconstructed\.json: not valid JSON"):
        load_dataset("squad-v1", data_dir=tmp_path)
