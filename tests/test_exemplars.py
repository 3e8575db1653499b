"""The dynamic methods' few-shot exemplars (issue 50): the authors' sets of DRAGIN and ETC ship as data, load with
the authors' number per dataset family, are what a dynamic method's prompt holds by default, and ragate's own
three stay as a named option; every shipped file, damaged, stops with an error that names it."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ragate.backends.scripted import ScriptedBackend, make_generation
from ragate.dynamic import exemplars as ex
from ragate.dynamic.prompts import FEWSHOT, exemplars_for, messages
from ragate.errors import RagateError
from ragate.methods import get_method, run_method
from ragate.retrieval.types import Hit, Passage
from ragate.types import GenerationRequest

SHIPPED = sorted(p.name for p in ex.exemplar_dir().glob("*.json"))
# set -> (the authors' number, the size of the authors' pool): DRAGIN's configs (config/*/<dataset>/*.json,
# "fewshot") and ETC's config.json; PubMedQA and BioASQ: ETC's pool of 8, all of it
AUTHORS = {
    "hotpotqa": (8, 11),
    "2wikimultihopqa": (6, 8),
    "iirc": (8, 20),
    "strategyqa": (6, 6),
    "pubmedqa": (8, 8),
    "bioasq": (8, 8),
}
FIRST = {
    "hotpotqa": "Jeremy Theobald and Christopher Nolan share what profession?",
    "2wikimultihopqa": "When did the director of film Hypocrite (Film) die?",
    "strategyqa": "Do hamsters provide food for any animals?",
    "pubmedqa": "Is there a connection between sublingual varices and hypertension?",
}


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    ex.author_set.cache_clear()
    yield
    ex.author_set.cache_clear()


def test_every_shipped_set_loads_with_the_authors_number_and_names_its_source_and_licence() -> None:
    assert SHIPPED == sorted(f"{name}.json" for name in AUTHORS)
    assert set(ex.AUTHOR_SETS.values()) == set(AUTHORS)
    for name, (fewshot, pool) in AUTHORS.items():
        found = ex.author_set(name)
        assert (found.name, found.fewshot, len(found.examples)) == (name, fewshot, pool)
        assert len(found.pairs()) == fewshot
        for (q, a), (q0, cot, answer) in zip(found.pairs(), found.examples, strict=False):
            assert q == q0 and a == f"{cot} So the answer is {answer}."
        repos = {s["repo"] for s in found.sources}
        assert "pkuserc/ETC" in repos and (name in ("pubmedqa", "bioasq") or "oneal2000/DRAGIN" in repos)
        for source in found.sources:
            assert re.fullmatch(r"[0-9a-f]{40}", source["commit"])
            assert source["licence"] in ("Apache-2.0", "MIT")
            assert (ex.exemplar_dir() / source["licence_file"]).is_file()
    assert "Copyright (c) 2025 pkuserc" in (ex.exemplar_dir() / "LICENSE-ETC").read_text()
    assert "Apache License" in (ex.exemplar_dir() / "LICENSE-DRAGIN").read_text()


def test_dataset_names_map_to_the_authors_sets() -> None:
    for dataset, first in [
        ("hotpotqa", FIRST["hotpotqa"]),
        ("hotpotqa-train-raw", FIRST["hotpotqa"]),
        ("2wikimultihopqa", FIRST["2wikimultihopqa"]),
        ("musique", FIRST["2wikimultihopqa"]),  # neither paper ran MuSiQue: 2Wiki's compositional questions
        ("strategyqa-train", FIRST["strategyqa"]),
        ("pubmedqa-test", FIRST["pubmedqa"]),
        ("nq-open", FIRST["hotpotqa"]),  # open-domain factoid sets read HotpotQA's, as before
        (None, FIRST["hotpotqa"]),
    ]:
        assert exemplars_for(dataset)[0][0] == first, dataset
    assert len(exemplars_for("hotpotqa")) == 8 and len(exemplars_for("strategyqa")) == 6


def test_the_named_option_gives_ragates_old_three() -> None:
    for key, shots in FEWSHOT.items():
        assert exemplars_for(key, "ragate-3") == shots and len(shots) == 3
    assert exemplars_for("nq-open", "ragate-3") == FEWSHOT["hotpotqa"]
    with pytest.raises(RagateError, match="unknown exemplar set 'ragate-8'"):
        exemplars_for("hotpotqa", "ragate-8")
    assert get_method("etc").dynamic.exemplars == "authors"  # type: ignore[union-attr]
    assert get_method("etc-ragate-3").dynamic.exemplars == "ragate-3"  # type: ignore[union-attr]
    assert get_method("dragin-ragate-3").dynamic.exemplars == "ragate-3"  # type: ignore[union-attr]


class OnePassage:
    """A retriever stand-in: one fixed passage for any query."""

    kind = "stub"

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        return [
            [Hit(Passage("p1", "Nolan", "Christopher Nolan is a film director."), 1.0, 0)] for _ in queries
        ]


def answered(request: GenerationRequest) -> Any:
    """A confident reply that ends the loop at once (no trigger fires)."""
    tokens = ["He", " is", " a", " producer", ".", " So", " the", " answer", " is", " producer", "."]
    return make_generation(tokens, [0.0] * len(tokens), entropies=[0.0] * len(tokens))


def prompt_of(method: str, dataset: str | None) -> str:
    lm = ScriptedBackend(answered)
    run_method(get_method(method), "What do Nolan and Theobald share?", lm, OnePassage(), dataset=dataset)  # type: ignore[arg-type]
    return str(lm.calls[0].prompt[0].content)  # type: ignore[union-attr]


@pytest.mark.parametrize("method", ["etc", "dragin"])
def test_a_dynamic_method_writes_with_the_authors_exemplars_by_default(method: str) -> None:
    prompt = prompt_of(method, "hotpotqa")
    pool = ex.author_set("hotpotqa").examples
    assert f"Question: {FIRST['hotpotqa']}\nAnswer: {pool[0][1]} So the answer is {pool[0][2]}." in prompt
    assert pool[7][0] in prompt and pool[8][0] not in prompt  # the first 8 of 11, as the authors' config
    assert FEWSHOT["hotpotqa"][0][0] not in prompt
    assert prompt.endswith("Question: What do Nolan and Theobald share?\nAnswer:")
    assert (
        prompt_of(method, "strategyqa").count("\nAnswer: ") == 6
    )  # the question's "Answer:" ends the prompt


@pytest.mark.parametrize("method", ["etc-ragate-3", "dragin-ragate-3"])
def test_the_ragate_3_methods_write_with_the_old_three(method: str) -> None:
    prompt = prompt_of(method, "hotpotqa")
    assert all(q in prompt for q, _ in FEWSHOT["hotpotqa"]) and FIRST["hotpotqa"] not in prompt
    assert prompt.count("\nAnswer: ") == 3


def test_passages_come_after_the_exemplars() -> None:
    prompt = prompt_of("single-rag", "hotpotqa")  # retrieves with the question before writing
    last = ex.author_set("hotpotqa").examples[7][0]
    assert prompt.index(last) < prompt.index("Context:\n[1] Nolan:") < prompt.rindex("Question: What do")
    # the exemplars are a prefix shared by every prompt of the dataset (their key/value cache is reused)
    bare = messages("What do Nolan and Theobald share?", [], "hotpotqa")[0].content
    head = bare[: bare.rindex("Question: What do")]
    assert prompt.startswith(head)


# ---- damaged files --------------------------------------------------------------------------------------------


def _damage(doc: dict[str, Any], how: str) -> Any:
    if how == "list":
        return [doc]
    doc = json.loads(json.dumps(doc))
    if how == "format":
        doc["format"] = "ragate-exemplars/0"
    elif how == "fewshot":
        doc["fewshot"] = len(doc["examples"]) + 1
    elif how == "fewshot-type":
        doc["fewshot"] = "8"
    elif how == "no-cot":
        del doc["examples"][0]["cot"]
    elif how == "empty-answer":
        doc["examples"][-1]["answer"] = " "
    elif how == "no-sources":
        doc["sources"] = []
    elif how == "no-licence":
        del doc["sources"][0]["licence"]
    elif how == "surrogate":
        doc["examples"][0]["question"] = "\ud800?"
    return doc


DAMAGES = [
    "list",
    "format",
    "fewshot",
    "fewshot-type",
    "no-cot",
    "empty-answer",
    "no-sources",
    "no-licence",
    "surrogate",
]


@pytest.mark.parametrize("name", SHIPPED)
def test_every_file_damaged_gives_an_error_that_names_it(name: str, tmp_path: Path) -> None:
    raw = (ex.exemplar_dir() / name).read_bytes()
    doc = json.loads(raw)
    bad = tmp_path / name
    for how in DAMAGES:
        bad.write_text(json.dumps(_damage(doc, how)), encoding="utf-8")
        with pytest.raises(RagateError, match=re.escape(str(bad))):
            ex.load_exemplar_file(bad)
    for broken, why in [
        (raw[: len(raw) // 2], "not valid JSON"),
        (b"", "not valid JSON"),
        (raw[:40] + b"\xff" + raw[40:], "not valid UTF-8"),
    ]:
        bad.write_bytes(broken)
        with pytest.raises(RagateError, match=why) as err:
            ex.load_exemplar_file(bad)
        assert str(bad) in str(err.value)
    bad.unlink()
    with pytest.raises(RagateError, match=re.escape(str(bad))):
        ex.load_exemplar_file(bad)


def test_a_damaged_shipped_file_stops_the_method_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in SHIPPED:
        (tmp_path / name).write_bytes((ex.exemplar_dir() / name).read_bytes())
    (tmp_path / "hotpotqa.json").write_text(
        '{"format": "ragate-exemplars/1", "set": "hotpotqa"', encoding="utf-8"
    )
    monkeypatch.setattr(ex, "exemplar_dir", lambda: tmp_path)
    with pytest.raises(RagateError, match=re.escape(str(tmp_path / "hotpotqa.json"))):
        prompt_of("etc", "hotpotqa")
    assert FIRST["strategyqa"] in prompt_of("etc", "strategyqa")  # the other sets still load
    assert FEWSHOT["hotpotqa"][0][0] in prompt_of("etc-ragate-3", "hotpotqa")  # the old three need no file
    (tmp_path / "hotpotqa.json").write_text(
        (ex.exemplar_dir() / "2wikimultihopqa.json").read_text(encoding="utf-8"), encoding="utf-8"
    )
    with pytest.raises(RagateError, match="holds the set '2wikimultihopqa', not 'hotpotqa'"):
        prompt_of("etc", "hotpotqa")
