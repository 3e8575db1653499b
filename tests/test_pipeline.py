"""``ragate.Pipeline`` the way a user meets it: the README's Python example run unchanged on a folder of documents
the test writes, a plain-function search, errors before any cost, and a threshold set on unlabelled questions."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import ragate
from ragate.errors import CapabilityError, IndexNeedError, RagateError
from ragate.retrieval.function import FunctionRetriever, SearchError

README = Path(__file__).parents[1] / "README.md"
RAGATE = Path(sys.executable).with_name("ragate")

# a small handbook of made-up facts: no model knows them, so an answer that states them read them
MY_DOCS = {
    "warranty.txt": (
        "Warranty terms for Brewmaster kettles.\n\nThe Brewmaster 3000 kettle comes with a warranty of seven "
        "years from the date of purchase. The warranty covers the heating element and the thermostat, but not "
        "the glass jug, which is covered for two years. Claims are made through the Lakeside Appliances service "
        "desk with the original receipt."
    ),
    "support.md": (
        "# Support hours\n\nThe Lakeside Appliances service desk is open from 8 am to 6 pm, Monday to Saturday. "
        "Calls on Sundays are answered by the night team in Tromsø, who can book a repair but cannot issue "
        "refunds.\n"
    ),
    "recall.html": (
        "<html><head><title>Recall notice</title><style>p {color: red}</style></head><body>"
        "<h1>Recall notice</h1><p>Brewmaster 2000 kettles made in March 2024 are recalled because the lid "
        "hinge can break. Owners receive a free replacement lid by post.</p><script>track()</script></body></html>"
    ),
}


def write_docs(root: Path) -> Path:
    folder = root / "my_docs"
    folder.mkdir()
    for name, text in MY_DOCS.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def readme_python(first: bool = False) -> str:
    """A README Python code block, as it is: the quick start (``first``), or the first that uses both an index and
    a search function of the user's ("Your own documents and search")."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.DOTALL)
    assert blocks, "README.md has no ```python block"
    if first:
        return str(blocks[0])
    both = [b for b in blocks if "ragate.Pipeline(" in b and "search=" in b and "index=" in b]
    assert both, "README.md has no Python block with both index= and search="
    return str(both[0])


def test_the_readme_quick_start_runs_unchanged_and_answers_right(
    minilm: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The first example, with the model it names (which `make` installs): its answer states the warranty the
    documents give. Runs the 1.5B model for one question (~20 s on one core)."""
    code = readme_python(first=True)
    assert len(code.strip().splitlines()) <= 12  # a quick start, not a tour
    named = re.search(r'model="([^"]+)"', code)
    assert named, "the quick start names its model (model=...)"
    require_model(named.group(1))
    write_docs(tmp_path)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {}
    exec(compile(code, str(README), "exec"), namespace)  # noqa: S102 - the project's own README
    assert (tmp_path / "my_index" / "manifest.json").is_file()
    ans = namespace["ans"]
    assert isinstance(ans, ragate.Answer) and ans.text and ans.decision.reason
    assert re.search(r"\b(seven|7) years\b", ans.text, flags=re.IGNORECASE), ans.text  # warranty.txt's fact
    assert ans.documents[0].source == "my_docs/warranty.txt"
    out = capsys.readouterr().out
    assert ans.text in out and all(str(d.source) in out for d in ans.documents)


def require_model(name: str) -> None:
    """Skip without the model (fail in CI, where `make` installs it)."""
    from ragate.errors import ModelNotFoundError
    from ragate.models import resolve_model

    try:
        resolve_model(name)
    except ModelNotFoundError as err:
        if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
            raise
        pytest.skip(f"the quick start's model is not installed ({err})")


def test_the_readme_example_runs_unchanged_on_a_folder_of_documents(
    smollm2_path: Path,
    minilm: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    write_docs(tmp_path)
    monkeypatch.chdir(tmp_path)
    code = readme_python()
    assert "ragate.Pipeline(" in code and "search=" in code and "index=" in code  # both ways in
    namespace: dict[str, Any] = {}
    exec(compile(code, str(README), "exec"), namespace)  # noqa: S102 - the project's own README
    out = capsys.readouterr().out
    assert (tmp_path / "my_index" / "manifest.json").is_file()
    sources = re.findall(r"my_docs/\S+", out)
    assert sources and all(Path(tmp_path, s).exists() for s in sources)  # every document read names its file
    assert "warranty" in out  # the warranty page was among the documents read
    ans = namespace["ans"]
    assert isinstance(ans, ragate.Answer) and ans.stages and ans.decision.reason


def test_a_plain_function_search_serves_every_selector_including_dtr(smollm2_path: Path, minilm: Any) -> None:
    calls: list[tuple[str, int]] = []

    def search(query: str, k: int) -> list[Any]:
        calls.append((query, k))
        docs = [{"text": text, "title": name, "source": f"kb/{name}"} for name, text in MY_DOCS.items()]
        return [*docs, "a plain string result is a document too"][:k]

    with ragate.Pipeline(method="dtr", search=search, encoder=minilm, threshold=-1.0) as rag:
        ans = rag.answer("How long is the Brewmaster 3000 warranty?")
    assert ans.retrieved and len(ans.documents) == 3  # DPR-AIS kept k = 3 of the two paths' documents
    assert {q for q, _ in calls} >= {"How long is the Brewmaster 3000 warranty?"} and len(
        calls
    ) == 2  # q and p
    assert all(d.source and d.source.startswith("kb/") or d.title == "" for d in ans.documents)
    assert -1.0 <= ans.documents[0].score <= 1.0  # cos(theta1 + theta2) from ragate's own embeddings


def test_search_results_are_checked_and_named() -> None:
    retriever = FunctionRetriever(lambda q, k: ["one", {"text": "two", "id": 7, "score": 0.5}, "one"])
    [hits] = retriever.search(["q"], 5)
    assert [h.passage.text for h in hits] == ["one", "two"]  # a repeated document is read once
    assert hits[1].id == "7" and hits[1].score == 0.5 and hits[0].score == 1.0
    assert hits[0].id == FunctionRetriever(lambda q, k: ["one"]).search(["x"], 1)[0][0].id  # stable ids
    for bad, message in (
        ("just text", "returned str"),
        ([{"title": "no text"}], "no 'text' string"),
        ([{"text": "t", "score": float("nan")}], "finite number"),
        ([3], "is a int"),
        (["\ud800"], "lone surrogate"),
    ):
        with pytest.raises(SearchError, match=message):
            FunctionRetriever(lambda q, k, bad=bad: bad).search(["q"], 2)

    def broken(query: str, k: int) -> list[str]:
        raise ConnectionError("the search cluster is down")

    with pytest.raises(SearchError, match="'broken' failed on the query 'q': ConnectionError"):
        FunctionRetriever(broken).search(["q"], 2)
    with pytest.raises(TypeError, match="search must be a function"):
        FunctionRetriever(42)


def test_needs_are_checked_before_the_model_loads(wiki_passages: list[Any], tmp_path: Path) -> None:
    from ragate.retrieval.index import build_index

    bm25 = build_index(wiki_passages, tmp_path / "bm25", "bm25", progress=False)
    # the model does not exist: the index's problem must be found first, before anything loads
    with pytest.raises(IndexNeedError, match="holds none: build a dense or hybrid index"):
        ragate.Pipeline(method="dtr", index=bm25, model="/no/such/model.gguf")
    with pytest.raises(IndexNeedError, match="cannot search by vector"):
        ragate.Pipeline(method="hyde", index=bm25, model="/no/such/model.gguf")
    with pytest.raises(RagateError, match="Did you mean 'targ-margin'"):
        ragate.Pipeline(method="targ-margn")
    with pytest.raises(RagateError, match="unknown gate 'ugtt'"):
        ragate.Pipeline(method="dtr", gate="ugtt")
    with pytest.raises(RagateError, match="one of index=, search= or retriever="):
        ragate.Pipeline(index=bm25, search=lambda q, k: [])


def test_ask_refuses_dtr_on_a_bm25_index_before_any_lm_call(
    smollm2_path: Path, wiki_passages: list[Any], tmp_path: Path
) -> None:
    from ragate.retrieval.index import build_index

    if not RAGATE.exists():
        pytest.skip("the ragate command is not installed in this environment (pip install -e .)")
    bm25 = build_index(wiki_passages, tmp_path / "bm25", "bm25", progress=False)
    start = time.perf_counter()
    proc = subprocess.run(
        [str(RAGATE), "ask", "who discovered penicillin", "--method", "dtr", "--index", str(bm25)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "compares embeddings" in proc.stderr and "--kind hybrid" in proc.stderr
    assert "ragate: draft" not in proc.stderr  # no stage started
    print(f"refused in {time.perf_counter() - start:.1f} s")
    from ragate.cli.main import main

    run = tmp_path / "run"
    argv = ["eval", "--dataset", "demo", "--methods", "no-retrieval,dtr", "--index", str(bm25), "--limit", "2",
            "--out", str(run), "--quiet", "--no-call-cache"]  # fmt: skip
    assert main(argv) == 2  # the whole run is refused, not one error record per answer
    assert not (run / "questions.jsonl").exists() or not (run / "questions.jsonl").read_text().strip()


def test_max_tokens_reaches_every_answer_stage(smollm2_path: Path, wiki_dense: Any) -> None:
    with ragate.Pipeline(method="standard-rag", retriever=wiki_dense, max_tokens=4) as rag:
        read = rag.answer("Who discovered penicillin?")
        closed = rag.answer("Who discovered penicillin?", method="no-retrieval")
        dynamic = rag.answer("Who discovered penicillin?", method="wo-rag", max_tokens=6)
    assert [s.completion_tokens <= 4 for s in read.stages if s.name == "answer"] == [True]
    assert all(s.completion_tokens <= 4 for s in closed.stages)
    assert dynamic.trace.dynamic is not None and dynamic.trace.dynamic.generated_tokens <= 6 + 16


def test_calibrate_on_unlabelled_questions_sets_the_threshold(smollm2_path: Path, tmp_path: Path) -> None:
    from ragate.eval.datasets import load_dataset

    questions = [ex.question for ex in load_dataset("demo")][:30]
    with ragate.Pipeline(method="targ-margin") as rag:  # the gate alone: the demo index is never opened
        cal = rag.calibrate(questions, budget=0.3)
        assert rag.spec.gate.tau == cal.tau and cal.n == 30 and cal.retrieval_rate <= 0.3
        assert rag.index_name.startswith("the demo index (built on first use)")
        path = cal.save(tmp_path / "cal.json")
        bounded = rag.calibrate(questions, budget=0.3, confidence=0.9)  # 30 questions can bound 0.3 at 0.9
        assert (
            bounded.k is not None and bounded.tau >= cal.tau and bounded.retrieval_rate <= cal.retrieval_rate
        )
        assert bounded.to_json()["rate_interval"] == list(bounded.rate_interval or ())
    data = json.loads(path.read_text())
    assert data["method"] == "targ-margin" and data["tau"] == cal.tau and data["model"] is None
    with ragate.Pipeline(method="targ-margin", calibration=path) as again:
        assert again.spec.gate.tau == cal.tau
    with pytest.raises(RagateError, match="calibrates 'targ-margin', not 'dtr'"):
        ragate.Pipeline(method="dtr", calibration=path)
    with pytest.raises(RagateError, match="was calibrated with model None"):
        ragate.Pipeline(method="targ-margin", calibration=path, model="qwen2.5-coder-1.5b")
    with pytest.raises(RagateError, match="no gate threshold"):
        ragate.Pipeline(method="standard-rag").calibrate(questions, budget=0.3)


def test_a_budget_holds_over_the_calls_a_pipeline_answers(smollm2_path: Path, wiki_dense: Any) -> None:
    from ragate.eval.datasets import load_dataset

    questions = [ex.question for ex in load_dataset("demo")][:24]
    with ragate.Pipeline(
        method="targ-margin", retriever=wiki_dense, budget=0.5, window=10, max_tokens=8
    ) as rag:
        answers = [rag.answer(q) for q in questions]
        assert rag.budget is not None and rag.budget.rate() is not None
    first = answers[0].decision.threshold
    assert first == ragate.get_method("targ-margin").gate.tau  # before any score, the method's own
    assert len({a.decision.threshold for a in answers}) > 2  # tau follows the window
    late = [a.retrieved for a in answers[10:]]
    assert 0.2 <= sum(late) / len(late) <= 0.8


def test_calibration_files_and_questions_are_read_strictly(tmp_path: Path) -> None:
    from ragate.eval.datasets import read_questions
    from ragate.tuning.calibrate import read_calibration

    (tmp_path / "q.txt").write_text("first?\n\n  second?  \n")
    assert read_questions(tmp_path / "q.txt") == ["first?", "second?"]
    (tmp_path / "q.jsonl").write_text('{"question": "a?"}\n{"question": "b?", "answers": ["x"]}\n')
    assert read_questions(tmp_path / "q.jsonl") == ["a?", "b?"]
    (tmp_path / "bad.jsonl").write_text('{"question": "a?"}\n{"q": "b?"}\n')
    with pytest.raises(RagateError, match=r"bad.jsonl:2: no \"question\" string"):
        read_questions(tmp_path / "bad.jsonl")
    (tmp_path / "empty.txt").write_text("\n \n")
    with pytest.raises(RagateError, match="holds no questions"):
        read_questions(tmp_path / "empty.txt")
    (tmp_path / "nan.json").write_text('{"method": "dtr", "tau": NaN}')
    with pytest.raises(RagateError, match="finite number"):
        read_calibration(tmp_path / "nan.json")


def test_the_old_flag_names_still_parse() -> None:
    from ragate.cli.eval import base_urls
    from ragate.cli.main import build_parser

    parser = build_parser()
    for argv in (
        ["ask", "q", "--openai-base-url", "http://x/v1"],
        ["serve", "--openai-base-url", "http://x/v1"],
        ["calibrate", "--gate", "dtr", "--questions", "q.txt", "--openai-base-url", "http://x/v1"],
    ):
        value = parser.parse_args(argv).base_url  # calibrate's repeats for a fleet (issue O)
        assert (base_urls(value) if isinstance(value, list) else value) == "http://x/v1"
    assert parser.parse_args(["ask", "q", "--base-url", "http://y/v1"]).base_url == "http://y/v1"


def test_a_method_the_backend_cannot_serve_fails_before_the_index_opens(tmp_path: Path) -> None:
    from ragate.backends.scripted import TEXT_ONLY, ScriptedBackend

    lm = ScriptedBackend([], capabilities=TEXT_ONLY)
    with pytest.raises(CapabilityError, match="no logprobs"):
        ragate.Pipeline(method="targ-margin", lm=lm)
    assert not lm.calls


def test_the_package_face_is_lazy_and_complete() -> None:
    code = (
        "import sys, ragate; heavy = [m for m in ('torch', 'ragate.pipeline', 'ragate.methods', 'llama_cpp') "
        "if m in sys.modules]; print(heavy); print(ragate.Pipeline.__module__, ragate.register_gate.__module__)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    first, second = proc.stdout.splitlines()
    assert first == "[]"  # `import ragate` loads no model code; the face is imported on first use
    assert second == "ragate.pipeline ragate.methods.registry"
    assert sorted(ragate.__all__) == sorted(dir(ragate))
    for name in ragate.__all__:
        assert getattr(ragate, name) is not None


def test_arguments_are_checked_at_construction_with_their_names() -> None:
    bad = {  # each refused before any model loads (the model named does not exist)
        "k": (2.5, "k must be a whole number, not 2.5"),
        "threshold": ("0.5", "threshold must be a number, not '0.5' (str)"),
        "max_tokens": (True, "max_tokens must be a whole number, not True"),
        "window": (0, "window must be at least 1, got 0"),
        "budget": (float("nan"), "budget must be a finite number, got nan"),
        "model": (3, "model must be a non-empty string, not 3"),
        "seed": (-1, "seed must be at least 0"),
    }
    for name, (value, said) in bad.items():
        with pytest.raises(RagateError) as err:
            ragate.Pipeline(**{"method": "targ-margin", "model": "/no/such/model.gguf", name: value})
        assert said in str(err.value), str(err.value)
    with pytest.raises(
        RagateError, match=r"threshold must be a finite number, got nan \(a NaN threshold never"
    ):
        ragate.Pipeline(method="targ-margin", threshold=float("nan"), model="/no/such/model.gguf")


def test_a_closed_pipeline_says_so(smollm2_path: Path) -> None:
    rag = ragate.Pipeline(method="no-retrieval", max_tokens=2)
    with rag:
        assert rag.answer("Who wrote Hamlet?").text
        with pytest.raises(RagateError, match="k must be a whole number"):
            rag.answer("Who wrote Hamlet?", k=1.5)  # type: ignore[arg-type]
        with pytest.raises(RagateError, match="threshold must be a finite number"):
            rag.answer("Who wrote Hamlet?", threshold=float("inf"))
    for call in (rag.answer, rag.decide, rag.retrieve):
        with pytest.raises(RagateError, match="this Pipeline is closed"):
            call("Who wrote Hamlet?")
    with pytest.raises(RagateError, match="this Pipeline is closed"):
        rag.calibrate(["Who wrote Hamlet?"], budget=0.5)


def test_calibrating_on_too_few_or_tied_questions_warns(smollm2_path: Path, tmp_path: Path) -> None:
    with ragate.Pipeline(method="targ-margin") as rag:
        with pytest.warns(
            RuntimeWarning, match=r"retrieves for 0.0%, not the budget's 30%: 1 question cannot"
        ):
            one = rag.calibrate(["Who wrote Hamlet?"], budget=0.3)
        assert one.warning and one.to_json()["warning"] == one.warning
        with pytest.warns(RuntimeWarning, match="only 1 distinct score among 6 questions"):
            rag.calibrate(["Who wrote Hamlet?"] * 6, budget=0.3)
        with pytest.raises(RagateError, match=r"budget is a retrieval rate in \[0, 1\]"):
            rag.calibrate(["Who wrote Hamlet?"], budget=float("nan"))
    questions = tmp_path / "q.txt"
    questions.write_text("Who wrote Hamlet?\n")
    from ragate.cli.main import main

    start = time.perf_counter()
    assert main(["calibrate", "--gate", "targ-margin", "--questions", str(questions), "--budget", "nan"]) == 2
    assert time.perf_counter() - start < 5  # refused before the model loads and scores anything


def test_a_framework_reads_with_the_gates_own_model_and_never_pays_the_draft_twice(llama_backend: Any) -> None:
    """Pipeline.retrieve(answer_skipped=True) gives the skipped question's answer (the draft, continued: the very
    answer and stages of Pipeline.answer); select=False decides only; complete() is the model as a plain LLM;
    model_of shares one loaded model."""
    from test_integrations import CALIBRATION, RAG_QUESTION, SKIP_QUESTION

    def nothing(query: str, k: int) -> list[dict[str, str]]:
        return [{"id": "d1", "title": "T", "text": "The greasers live on the East Side of Tulsa."}]

    with ragate.Pipeline(method="targ-margin", calibration=CALIBRATION, lm=llama_backend, search=nothing) as rag:
        answered = rag.answer(SKIP_QUESTION)
        routed = rag.retrieve(SKIP_QUESTION, answer_skipped=True)
        assert not routed.retrieved and routed.answer == answered.text and answered.text.strip()
        assert [(s.name, s.completion_tokens) for s in routed.stages] == [
            (s.name, s.completion_tokens) for s in answered.stages
        ]
        assert rag.retrieve(SKIP_QUESTION).answer is None  # not asked for: nothing written
        decided = rag.retrieve(RAG_QUESTION, answer_skipped=True, select=False)
        assert decided.retrieved and decided.documents == () and decided.answer is None
        assert rag.retrieve(RAG_QUESTION).documents  # selecting: the search's passage

        text, stage = rag.complete("Say hello.", max_tokens=5)
        assert text.strip() and 0 < stage.completion_tokens <= 5 and stage.name == "read"
        with pytest.raises(RagateError, match="empty prompt"):
            rag.complete("   ")
        with pytest.raises(RagateError, match="role 'tool' is not one of system, user, assistant"):
            rag.complete([("tool", "x")])

        with ragate.Pipeline(method="no-retrieval", model_of=rag, search=nothing) as other:
            assert other.lm is rag.lm and other._lock is rag._lock and other.learner.turns is rag.learner.turns  # one model, one lock
        with pytest.raises(RagateError, match="drop model="):
            ragate.Pipeline(method="no-retrieval", model_of=rag, model="smollm2-135m", search=nothing)
        saved = rag.savings(answered.trace)
        assert saved.spent.tokens == answered.tokens and saved.how in ("unknown", "estimated")


def test_a_corpus_goes_with_a_search_function_and_is_checked() -> None:
    def search(query: str, k: int) -> list[str]:
        return ["Tulsa"]

    with pytest.raises(RagateError, match="corpus= .* goes with search="):
        ragate.Pipeline(method="corpus-coverage", corpus=["a text"], model="/no/such/model.gguf")
    with pytest.raises(RagateError, match="corpus= is empty"):
        ragate.Pipeline(method="corpus-coverage", search=search, corpus=[], model="/no/such/model.gguf")
    with pytest.raises(RagateError, match=r"corpus= takes the documents' texts \(str\), not int"):
        ragate.Pipeline(method="corpus-coverage", search=search, corpus=[1], model="/no/such/model.gguf")
    with pytest.raises(IndexNeedError, match="'question-rarity' counts terms in your corpus"):
        ragate.Pipeline(method="question-rarity", search=search, model="/no/such/model.gguf")
