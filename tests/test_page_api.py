"""What the web page reads from the service, in-process with a scripted model (milliseconds): the opt-in
``draft_tokens`` field of ``POST /v1/answer`` (each draft token with what the gate reads in it), ``GET
/v1/budget``, and the page's own files (no key, a Content-Security-Policy). The page itself, in a browser against
a real server: tests/test_page_browser.py."""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

for _module in ("fastapi", "uvicorn", "prometheus_client"):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"{_module} is not installed: pip install 'ragate[service]'", allow_module_level=True)

from fastapi.testclient import TestClient

import ragate
from ragate.backends.scripted import ScriptedBackend, make_generation
from ragate.retrieval.index import open_index
from ragate.service.app import create_app
from ragate.service.settings import ServiceSettings

KEY = "page-api-key-1"
AUTH = {"Authorization": f"Bearer {KEY}"}
TOKENS = ["Jane", " Aus", "ten", "\n"]
LOGPROBS = [-0.5, -1.5, -0.05, -2.0]
TOPS = [[(t, lp), (alt, lp - gap)] for t, lp, alt, gap in zip(TOKENS, LOGPROBS, ["Emily", " Bro", "tin", "."],
                                                               [0.3, 0.1, 4.0, 1.2], strict=True)]  # fmt: skip
ENTROPIES = [0.9, 1.4, 0.2, 1.8]


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    import ragate

    docs = tmp_path_factory.mktemp("docs")
    (docs / "austen.txt").write_text("Pride and Prejudice is a novel by Jane Austen, published in 1813. " * 4)
    (docs / "hamlet.txt").write_text("Hamlet is a tragedy written by William Shakespeare around 1600. " * 4)
    folder = ragate.index_documents(
        [docs], tmp_path_factory.mktemp("index") / "bm25", kind="bm25", progress=False
    )
    with open_index(folder) as opened:
        yield opened


def _client(index: Any, **settings: Any) -> TestClient:
    lm = ScriptedBackend(lambda _: make_generation(TOKENS, LOGPROBS, TOPS, entropies=ENTROPIES))
    return TestClient(create_app(ServiceSettings(api_key=KEY, **settings), lm, index))


@pytest.fixture(scope="module")
def http(index: Any) -> Iterator[TestClient]:
    with _client(index, method="targ-margin") as client:
        yield client


def _answer(http: TestClient, **body: Any) -> dict[str, Any]:
    r = http.post("/v1/answer", json={"question": "Who wrote Pride and Prejudice?", **body}, headers=AUTH)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_draft_tokens_are_opt_in_and_carry_what_targ_margin_reads_per_token(http: TestClient) -> None:
    assert "draft" not in _answer(http) and "draft" not in _answer(http)["ragate"]
    body = _answer(http, draft_tokens=True)
    draft = body["draft"]
    assert draft == body["ragate"]["draft"]
    assert draft["measure"] == "margin exp(-g/3)" and draft["scale"] == 1.0 and draft["scored"] == 4
    assert [t["text"] for t in draft["tokens"]] == TOKENS
    assert [t["logprob"] for t in draft["tokens"]] == LOGPROBS
    gaps = [0.3, 0.1, 4.0, 1.2]
    assert [t["u"] for t in draft["tokens"]] == pytest.approx([math.exp(-g / 3) for g in gaps])
    assert draft["tokens"][0]["runner_up"] == {"text": "Emily", "logprob": pytest.approx(-0.8)}
    # the gate's score is the sum of what it reads in the first `scored` tokens over k = 20 (TARG Eq. 2), even
    # when the draft stopped sooner
    assert draft["divisor"] == 20
    assert body["gate"]["score"] == pytest.approx(sum(t["u"] for t in draft["tokens"]) / draft["divisor"])
    assert "draft" not in body["trace"]  # the trace (what `ragate eval` stores) is unchanged


@pytest.mark.parametrize(
    ("method", "measure", "values", "scored"),
    [
        ("targ-entropy", "entropy H", ENTROPIES, 4),
        (
            "targ-variance",
            "1 - p (this gate scores no single token)",
            [1 - math.exp(lp) for lp in LOGPROBS],
            0,
        ),
    ],
)
def test_each_gate_says_what_it_reads_in_a_token(
    http: TestClient, method: str, measure: str, values: list[float], scored: int
) -> None:
    draft = _answer(http, method=method, draft_tokens=True)["draft"]
    assert draft["measure"] == measure and draft["scored"] == scored
    assert [t["u"] for t in draft["tokens"]] == pytest.approx(values)


def test_dtrs_gate_reads_each_tokens_negative_log_probability() -> None:
    """(DTR's own selector needs an index with embeddings, so its gate is asked directly here.)"""
    from ragate.gates.registry import get_gate
    from ragate.gates.ugt import ugt
    from ragate.methods import get_method

    draft = make_generation(TOKENS, LOGPROBS, TOPS)
    view = get_gate("ugt").token_uncertainty(draft, get_method("dtr").gate)
    assert view is not None and view.measure == "-log p (their mean is u)" and view.scored == 4
    assert view.values == tuple(-lp for lp in LOGPROBS) and view.scale is None
    assert sum(view.values) / 4 == pytest.approx(ugt(draft).score)


def test_a_method_whose_gate_drafts_nothing_says_null(http: TestClient) -> None:
    for method in ("no-retrieval", "standard-rag"):
        body = _answer(http, method=method, draft_tokens=True)
        assert body["draft"] is None, method


def test_draft_tokens_must_be_a_boolean(http: TestClient) -> None:
    r = http.post("/v1/answer", json={"question": "q", "draft_tokens": "yes"}, headers=AUTH)
    assert r.status_code == 422 and "draft_tokens" in r.json()["error"]["message"]


def test_the_page_and_its_files_need_no_key_and_carry_a_csp(http: TestClient) -> None:
    for path, kind in (("/", "text/html"), ("/ui/app.js", "text/javascript"), ("/ui/style.css", "text/css"),
                       ("/ui/icon.svg", "image/svg+xml")):  # fmt: skip
        r = http.get(path)
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind), path
        assert "script-src 'self'" in r.headers["content-security-policy"]
        assert "default-src 'none'" in r.headers["content-security-policy"]
        assert r.headers["x-content-type-options"] == "nosniff"
    assert 'src="ui/app.js"' in http.get("/").text
    assert http.head("/").status_code == 200
    assert http.post("/", json={}).status_code == 401  # only reading the page's files is open
    assert http.get("/ui/other.js").status_code == 401  # no other file behind the page's names
    assert http.get("/ui/other.js", headers=AUTH).status_code == 404
    assert "GET / (the web page)" in http.get("/nowhere", headers=AUTH).json()["error"]["message"]


def test_budget_endpoint_without_a_budget_says_how_to_start_one(http: TestClient) -> None:
    assert http.get("/v1/budget").status_code == 401
    body = http.get("/v1/budget", headers=AUTH).json()
    assert body["enabled"] is False and "--budget" in body["message"]


def test_budget_endpoint_gives_the_controllers_state_and_its_history(index: Any, tmp_path: Path) -> None:
    with _client(
        index, method="targ-margin", budget=0.5, budget_window=10, budget_state=str(tmp_path / "b.json")
    ) as client:
        start = client.get("/v1/budget", headers=AUTH).json()
        assert start["enabled"] and start["budget"] == 0.5 and start["window"] == 10 and start["gain"] == 16
        assert start["history"] == [] and start["window_rate"] is None and start["observed"] == 0
        answers = [_answer(client) for _ in range(3)]
        _answer(client, options={"threshold": 0.1})  # a threshold of its own: answered, not counted
        state = client.get("/v1/budget", headers=AUTH).json()
    assert state["observed"] == state["window_requests"] == len(state["history"]) == 3
    assert [p["n"] for p in state["history"]] == [1, 2, 3]
    assert [p["score"] for p in state["history"]] == [a["gate"]["score"] for a in answers]
    assert [p["retrieved"] for p in state["history"]] == [a["retrieved"] for a in answers]
    assert state["window_retrieved"] == sum(a["retrieved"] for a in answers)
    assert state["window_rate"] == state["history"][-1]["rate"] == state["window_retrieved"] / 3
    assert state["tau"] == state["history"][-1]["tau"] == answers[-1]["budget"]["next_threshold"]


def test_the_page_gets_a_plain_reason_the_served_tau_and_a_grouped_menu(http: TestClient) -> None:
    body = _answer(http, question="who wrote hamlet", options={"threshold": 1e9, "max_tokens": 8})
    assert body["gate"]["summary"] == "the model was sure of its first words: answered from what it knows"
    body = _answer(http, question="who wrote hamlet", options={"threshold": -1.0, "max_tokens": 8, "k": 1})
    assert body["gate"]["summary"] == "the model was unsure of its first words: retrieved"
    info = http.get("/healthz").json()
    assert info["method"] == "targ-margin" and info["threshold"] == 0.25
    assert info["method_description"].startswith("TARG: ")
    assert http.get("/v1/methods").status_code == 401  # like /v1/models: behind the key
    groups = http.get("/v1/methods", headers=AUTH).json()["groups"]
    names = {g["group"]: [m["name"] for m in g["methods"]] for g in groups}
    assert "targ-margin" in names["TARG (a draft's uncertainty) and its §5.1 baselines"]
    assert "etc" in names["dynamic retrieval while writing: ETC and its baselines"]
    assert "corpus-coverage" in names["ragate's own gates (no model, your corpus, a proxy model, learned)"]
    assert sum(len(v) for v in names.values()) == len(ragate.all_methods())
    assert all(m["description"] for g in groups for m in g["methods"])
