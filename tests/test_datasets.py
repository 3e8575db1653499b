"""QA dataset loaders over the real files of ../shared/data, and the common JSONL form on small files."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from ragate.errors import DataNotFoundError, DatasetFormatError
from ragate.eval.datasets import DATASETS, Example, data_dir, load_dataset, read_jsonl_examples
from ragate.models import ragate_home
from ragate.retrieval import pooled


def _find_data() -> Path | None:
    try:
        return data_dir()
    except DataNotFoundError:
        return None


DATA = _find_data()
needs_data = pytest.mark.skipif(
    DATA is None, reason="no QA data folder (../shared/data from the repo root, or $RAGATE_DATA_DIR)"
)

# The question counts of ../shared/data/README.md, transcribed.
README_COUNTS = {
    "nq-open": 2705,
    "nq-open-efficientqa-dev": 1800,
    "nq-open-efficientqa-test": 1769,
    "nq-dpr-dev": 8757,
    "nq-dpr-test": 2782,
    "nq-open-oracle": 1750,
    "squad-v1": 10570,
    "squad-v2": 11873,
    "squad-open": 10570,
    "hotpotqa": 350,
    "hotpotqa-train-raw": 100,
    "2wikimultihopqa": 500,
    "musique": 500,
    "triviaqa-dev": 8837,
    "triviaqa-test": 11313,
    "webquestions": 2032,
    "curatedtrec": 694,
    "strategyqa-train": 1290,
    "strategyqa-dev": 500,
    "pubmedqa": 1000,
    "pubmedqa-test": 500,
}

# name -> (id, question, first answer), the first question of each file
FIRST = {
    "nq-open": ("nq-open-0", "when was the last time anyone was on the moon", "14 December 1972 UTC"),
    "nq-open-efficientqa-dev": (
        "nq-open-efficientqa-dev-0",
        "the last time la dodgers won the world series",
        "1988",
    ),
    "nq-open-efficientqa-test": (
        "nq-open-efficientqa-test-0",
        "on the 6th day of christmas my true love sent to me",
        "6 geese a-laying",
    ),
    "nq-dpr-dev": ("nq-dpr-dev-0", "who sings does he love me with reba", "Linda Davis"),
    "nq-dpr-test": ("nq-dpr-test-0", "who got the first nobel prize in physics", "Wilhelm Conrad Röntgen"),
    "nq-open-oracle": (
        "nq-open-oracle-0",
        "who got the first nobel prize in physics",
        "Wilhelm Conrad Röntgen",
    ),
    "squad-v1": ("5725b33f6a3fe71400b8952d", "When did the 1973 oil crisis begin?", "October 1973"),
    "squad-v2": ("5725b33f6a3fe71400b8952d", "When did the 1973 oil crisis begin?", "October 1973"),
    "squad-open": ("squad-open-0", "Which NFL team represented the AFC at Super Bowl 50?", "Denver Broncos"),
    "hotpotqa": (
        "5a8c7595554299585d9e36b6",
        (
            "What government position was held by the woman who portrayed Corliss Archer in the film Kiss "
            "and Tell?"
        ),
        "Chief of Protocol",
    ),
    "hotpotqa-train-raw": ("5a77ec115542992a6e59dff7", "If Gallu is a demon Lilu is what?", "a spirit"),
    "2wikimultihopqa": (
        "0",
        "Which film has the director who was born first, Socha Na Tha or Moonnu Masangalku Mumbu?",
        "Moonnu Masangalku Mumbu",
    ),
    "musique": (
        "0",
        (
            "Where did the arguer that Dmitry Okhotsimsky's country of citizenship had become an imperialist "
            "power declare he would intervene in the Korean conflict?"
        ),
        "the Politburo",
    ),
    "triviaqa-dev": ("triviaqa-dev-0", "The VS-300 was a type of what?", "🚁"),
    "triviaqa-test": ("triviaqa-test-0", "Who was the man behind The Chipmunks?", "David Seville"),
    "webquestions": (
        "webquestions-0",
        "what does jamaican people speak?",
        "Jamaican Creole English Language",
    ),
    "curatedtrec": (
        "curatedtrec-0",
        "How tall is Mount McKinley?",
        r"20\s?,?\s?(32|40)0\s?-?\s?f(ee|oo)t|6,194-meter",
    ),
    "strategyqa-train": (
        "b8677742616fef051f00",
        "Are more people today related to Genghis Khan than Julius Caesar?",
        "yes",
    ),
    "strategyqa-dev": ("916", "Do solo pianists require a conductor?", "no"),
    "pubmedqa": (
        "21645374",
        "Do mitochondria play a role in remodelling lace plant leaves during programmed cell death?",
        "yes",
    ),
    "pubmedqa-test": (
        "21645374",
        "Do mitochondria play a role in remodelling lace plant leaves during programmed cell death?",
        "yes",
    ),
}

# the pooled corpus's gold files (retrieval/pooled.py source names) for the sets whose gold ids it gives
POOLED_GOLD = {
    "nq-open-oracle": "nq_open_oracle",
    "squad-v1": "squad_v1_dev",
    "squad-v2": "squad_v2_dev",
    "hotpotqa": "hotpotqa_dev",
    "hotpotqa-train-raw": "hipporag_hotpotqa_train",
    "musique": "musique",
}


@pytest.fixture(scope="module")
def loaded() -> dict[str, list[Example]]:
    """Every registered split, loaded once (a few seconds, the SQuAD and TriviaQA files being the largest)."""
    if DATA is None:
        pytest.skip("no QA data folder (../shared/data from the repo root, or $RAGATE_DATA_DIR)")
    return {name: load_dataset(name, data_dir=DATA) for name in DATASETS}


def _write(path: Path, lines: list[object]) -> Path:
    text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


# ----------------------------------------------------------------------------------------------- the registry


def test_registry_covers_the_readme_and_never_strategyqa_test() -> None:
    assert set(DATASETS) == set(README_COUNTS) == set(FIRST)
    assert {name: info.count for name, info in DATASETS.items()} == README_COUNTS
    assert all(info.path != "strategyqa/test.jsonl" for info in DATASETS.values())
    assert all(info.license and info.description for info in DATASETS.values())


@needs_data
@pytest.mark.parametrize("name", sorted(README_COUNTS))
def test_counts_match_the_readme(loaded: dict[str, list[Example]], name: str) -> None:
    examples = loaded[name]
    assert len(examples) == README_COUNTS[name]
    assert len({e.id for e in examples}) == len(examples), "ids must be unique within a dataset"
    assert all(e.dataset == name and e.question and e.question == e.question.strip() for e in examples)


@needs_data
@pytest.mark.parametrize("name", sorted(FIRST))
def test_first_question_of_each_file(loaded: dict[str, list[Example]], name: str) -> None:
    first = loaded[name][0]
    qid, question, answer = FIRST[name]
    assert (first.id, first.question) == (qid, question)
    assert first.answers[0].startswith(answer)


@needs_data
def test_kinds_labels_and_answers(loaded: dict[str, list[Example]]) -> None:
    kinds = {name: {e.kind for e in examples} for name, examples in loaded.items()}
    yesno = {"strategyqa-train", "strategyqa-dev", "pubmedqa", "pubmedqa-test"}
    assert kinds == {
        name: {"yesno"} if name in yesno else {"regex"} if name == "curatedtrec" else {"span"}
        for name in kinds
    }
    for name in yesno:
        assert all(e.label is not None and e.answers == (e.label,) for e in loaded[name])
    assert {e.label for e in loaded["strategyqa-train"]} == {"yes", "no"}
    labels = [e.label for e in loaded["pubmedqa"]]
    assert (labels.count("yes"), labels.count("no"), labels.count("maybe")) == (552, 338, 110)
    assert all(e.label is None for name in set(loaded) - yesno for e in loaded[name])
    unanswerable = [e for e in loaded["squad-v2"] if not e.answers]
    assert len(unanswerable) == 5945 and all(e.kind == "span" and e.gold_ids for e in unanswerable)
    answered = set(loaded) - {"squad-v2"}
    assert all(e.answers and all(a.strip() for a in e.answers) for name in answered for e in loaded[name])
    assert "|" in loaded["curatedtrec"][1].answers[0]  # "After the Fall|Finishing the Play": one pattern


@needs_data
def test_dpr_topic_files_are_csv_with_python_list_answers(loaded: dict[str, list[Example]]) -> None:
    by_question = {e.question: e for e in loaded["nq-dpr-dev"]}
    assert by_question["who was the first woman appointed to the supreme court"].answers == (
        "Sandra Day O'Connor",
    )
    mona_lisa = by_question["where was the mona lisa kept during ww2"].answers
    assert mona_lisa == (
        "the Ingres Museum",
        "Château d'Amboise",
        "Château de Chambord",
        "the Loc - Dieu Abbey",
    )
    trivia = {e.question: e for e in loaded["triviaqa-test"]}
    assert 'Who was the target of the failed "Bomb Plot" of 1944?' in trivia  # quoted twice in the file
    assert not any(e.question.startswith('"') and '""' in e.question for e in loaded["triviaqa-dev"])
    gary = next(e for e in loaded["triviaqa-dev"] if e.question.startswith("In which decade did golfer Gary"))
    assert "The '70s" in gary.answers and "1970s" in gary.answers


@needs_data
def test_contexts(loaded: dict[str, list[Example]]) -> None:
    oracle = loaded["nq-open-oracle"][0]
    assert oracle.contexts[0].startswith("The first Nobel Prize in Physics was awarded in 1901")
    assert oracle.gold_ids == (pooled.pooled_id(oracle.contexts[0]),)
    assert all(len(e.contexts) == len(e.gold_ids) == 2 for e in loaded["hotpotqa"])
    assert len({c for e in loaded["musique"] for c in e.contexts}) == 880  # README: 880 passages
    assert all(len(e.contexts) == 1 and not e.gold_ids for e in loaded["2wikimultihopqa"])
    assert sum(len(e.contexts) for e in loaded["pubmedqa"]) == 3358  # README: 3,358 sections
    assert len({e.gold_ids for e in loaded["squad-v1"]}) == 2067  # README: 2,067 paragraphs
    assert len({e.gold_ids for e in loaded["squad-v2"]}) == 1204
    no_context = {"nq-open", "nq-dpr-dev", "squad-open", "triviaqa-dev", "webquestions", "strategyqa-dev"}
    assert all(not e.contexts and not e.gold_ids for name in no_context for e in loaded[name])


@needs_data
def test_pubmedqa_test_is_the_ground_truth_ids(loaded: dict[str, list[Example]]) -> None:
    assert DATA is not None
    truth = json.loads((DATA / "pubmedqa" / "test_ground_truth.json").read_text(encoding="utf-8"))
    assert {e.id: e.label for e in loaded["pubmedqa-test"]} == truth
    assert {e.id for e in loaded["pubmedqa-test"]} <= {e.id for e in loaded["pubmedqa"]}


@needs_data
def test_limit_takes_the_first_questions(loaded: dict[str, list[Example]]) -> None:
    assert load_dataset("squad-open", limit=7) == loaded["squad-open"][:7]
    assert load_dataset("pubmedqa-test", limit=3) == loaded["pubmedqa-test"][:3]
    assert load_dataset("nq-open", limit=0) == []
    with pytest.raises(ValueError, match="limit"):
        load_dataset("nq-open", limit=-1)


# ----------------------------------------------------------------------------------------------- gold ids


@needs_data
@pytest.mark.parametrize("name", sorted(POOLED_GOLD))
def test_gold_ids_are_the_pooled_readers_ids(loaded: dict[str, list[Example]], name: str) -> None:
    """Run retrieval/pooled.py's own reader over the same file: the same gold ids, question by question."""
    assert DATA is not None
    source = next(s for s in pooled.SOURCES if s.name == POOLED_GOLD[name])
    theirs = source.reader(DATA / source.file, pooled._Pool(), source.name)
    mine = loaded[name]
    assert len(theirs) == len(mine)
    assert [q.gold_ids for q in theirs] == [e.gold_ids for e in mine]
    assert [q.question.strip() for q in theirs] == [e.question for e in mine]
    assert all(e.gold_ids for e in mine)


@needs_data
@pytest.mark.parametrize("name", sorted(POOLED_GOLD))
def test_gold_ids_equal_the_built_pooled_corpus(loaded: dict[str, list[Example]], name: str) -> None:
    gold = ragate_home() / "corpora" / "pooled" / "gold" / f"{POOLED_GOLD[name]}.jsonl"
    if not gold.is_file():
        pytest.skip(f"no built pooled corpus gold file at {gold} (build it with `ragate corpus build`)")
    rows = [json.loads(line) for line in gold.read_text(encoding="utf-8").splitlines() if line.strip()]
    mine = loaded[name]
    assert len(rows) == len(mine)
    assert [tuple(r["gold_ids"]) for r in rows] == [e.gold_ids for e in mine]
    assert [r["question"].strip() for r in rows] == [e.question for e in mine]


# ------------------------------------------------------------------------------------------- locating data


def test_data_dir_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert data_dir(tmp_path) == tmp_path.resolve()
    monkeypatch.setenv("RAGATE_DATA_DIR", str(tmp_path))
    assert data_dir() == tmp_path.resolve()
    monkeypatch.delenv("RAGATE_DATA_DIR")
    monkeypatch.chdir(tmp_path)  # no ../shared/data from here
    with pytest.raises(DataNotFoundError, match=r"--data-dir.*RAGATE_DATA_DIR"):
        data_dir()
    with pytest.raises(DataNotFoundError, match="nowhere"):
        data_dir(tmp_path / "nowhere")


def test_a_registered_file_missing_from_the_data_dir(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match=r"nq_open/NQ-open\.dev\.jsonl"):
        load_dataset("nq-open", data_dir=tmp_path)


def test_unknown_name_suggests_close_names() -> None:
    with pytest.raises(DataNotFoundError, match=r"did you mean 'nq-open'") as err:
        load_dataset("nq-opn")
    assert "registered:" in str(err.value) and "triviaqa-test" in str(err.value)
    with pytest.raises(DataNotFoundError, match=r"did you mean 'squad-v1'"):
        load_dataset("squad_v1")


def test_dpr_topic_file_errors_name_the_line(tmp_path: Path) -> None:
    topics = tmp_path / "nq_open" / "topics.dpr.nq.dev.txt"
    topics.parent.mkdir()
    good = "who wrote hamlet\t['William Shakespeare', \"Shakespeare's\"]\n"
    topics.write_text(good + "no answers column\n", encoding="utf-8")
    with pytest.raises(DatasetFormatError, match=r"topics\.dpr\.nq\.dev\.txt:2: expected 2 tab-separated"):
        load_dataset("nq-dpr-dev", data_dir=tmp_path)
    topics.write_text(good + "q\t__import__('os').getcwd()\n", encoding="utf-8")  # parsed, never evaluated
    with pytest.raises(DatasetFormatError, match=r":2: "):
        load_dataset("nq-dpr-dev", data_dir=tmp_path)
    topics.write_text(good + "q\t['a', 3]\n", encoding="utf-8")
    with pytest.raises(DatasetFormatError, match=r":2: 'answers' must be"):
        load_dataset("nq-dpr-dev", data_dir=tmp_path)
    topics.write_text(good, encoding="utf-8")
    [example] = load_dataset("nq-dpr-dev", data_dir=tmp_path)
    assert example.answers == ("William Shakespeare", "Shakespeare's")


# ----------------------------------------------------------------------------------------------- common JSONL


COMMON = [
    {"id": "q1", "question": "Who wrote Hamlet?", "answers": ["William Shakespeare", "Shakespeare"]},
    {"id": 7, "question": "  Capital of France? ", "golden_answers": ["Paris"], "gold_doc_ids": ["d1", "d2"]},
    {"question": "Largest planet?", "answer": "Jupiter", "gold_ids": ["p1"]},
    {"question": "Is water wet?", "label": "yes", "kind": "yesno"},
    {"question": "Year?", "answers": ["19[0-9]{2}"], "kind": "regex", "contexts": ["Some passage."]},
]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_common_jsonl(tmp_path: Path, suffix: str) -> None:
    path = _write(tmp_path / f"mine{suffix}", [*COMMON[:2], "", *COMMON[2:]])
    examples = load_dataset(path)
    assert examples == read_jsonl_examples(path, "mine") == load_dataset(str(path))
    assert examples[0] == Example("q1", "Who wrote Hamlet?", ("William Shakespeare", "Shakespeare"), "mine")
    assert examples[1] == Example("7", "Capital of France?", ("Paris",), "mine", gold_ids=("d1", "d2"))
    assert examples[2] == Example("mine-2", "Largest planet?", ("Jupiter",), "mine", gold_ids=("p1",))
    assert examples[3] == Example("mine-3", "Is water wet?", ("yes",), "mine", kind="yesno", label="yes")
    assert examples[4].kind == "regex" and examples[4].contexts == ("Some passage.",)
    assert [e.id for e in read_jsonl_examples(path, "other", kind="regex")][2:] == [
        "other-2",
        "other-3",
        "other-4",
    ]
    assert load_dataset(path, limit=2) == examples[:2]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"question": "Who?", "answers": ["x"]', r"mine\.jsonl:3: not valid JSON"),
        ({"question": "  ", "answers": ["x"]}, r"mine\.jsonl:3: empty question"),
        ({"answers": ["x"]}, r"mine\.jsonl:3: empty question"),
        ({"question": "Who?"}, r"mine\.jsonl:3: no 'answers'"),
        ({"question": "Who?", "answers": [1]}, r"mine\.jsonl:3: 'answers' must be a string or a list"),
        ({"question": "Who?", "answers": ["x"], "kind": "mcq"}, r"mine\.jsonl:3: 'kind' must be one of"),
        ({"question": "Who?", "answers": ["x"], "id": [1]}, r"mine\.jsonl:3: 'id' must be"),
        (["Who?", ["x"]], r"mine\.jsonl:3: expected a JSON object"),
    ],
)
def test_malformed_lines_name_the_file_and_line(tmp_path: Path, line: object, message: str) -> None:
    path = _write(tmp_path / "mine.jsonl", [*COMMON[:2], line])
    with pytest.raises(DatasetFormatError, match=message):
        load_dataset(path)


def test_repeated_ids_are_made_unique_in_file_order(tmp_path: Path) -> None:
    ids = ["a", "a", "a-2", "b", "a"]
    path = _write(
        tmp_path / "dups.jsonl", [{"id": i, "question": f"q{n}", "answers": ["x"]} for n, i in enumerate(ids)]
    )
    examples = load_dataset(path)
    assert [e.id for e in examples] == ["a", "a-3", "a-2", "b", "a-4"]
    assert [e.question for e in examples] == ["q0", "q1", "q2", "q3", "q4"]
    assert load_dataset(path) == examples  # deterministic


def test_a_missing_path_is_reported(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match="no registered name and no file"):
        load_dataset(tmp_path / "absent.jsonl")
