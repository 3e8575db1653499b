"""The service's web page (``GET /``) in a real browser: Debian's chromium driven by Playwright.

Two ``ragate serve`` processes on 127.0.0.1, each started once for the module, with SmolLM2 on llama.cpp:

- **demo**: TARG-margin with the demo calibration (tau for a 50% budget) over the demo index, with an API key. The
  page asks the Makefile's two demo questions, the one the gate answers from its draft and the one it retrieves
  for, and shows one coloured cell per draft token, the score against tau, the decision and the documents with
  their source; a wrong key shows the service's 401, the right one answers; a compare view puts a second method
  beside the first. Its screenshot is docs/img/page.png (the README shows it).
- **docs**: TARG-margin with ``--budget 0.5 --window 10`` over an index of a small folder of documents, one of
  which carries ``<script>`` and an ``onerror`` image in its text, its heading and its file name: the page shows
  them as text and runs none of them. After a burst of requests the budget panel shows the rate and tau the
  service reports (docs/img/page-budget.png).

The browser is /usr/bin/chromium (``make install`` puts it there with apt-get; ``playwright install`` is never
run). Without it, or without Playwright, the tests skip saying so, except under CI, where they fail.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
# the screenshots the docs show are rewritten only when asked (RAGATE_UPDATE_SCREENSHOTS=1): a test run leaves the
# checkout as it found it, and the screenshots go to a temporary folder
UPDATE_SCREENSHOTS = os.environ.get("RAGATE_UPDATE_SCREENSHOTS") == "1"


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ROOT / "docs" / "img" if UPDATE_SCREENSHOTS else tmp_path_factory.mktemp("screenshots")
KEY = "page-test-key-3"
CHROMIUM_FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
]  # fmt: skip
IN_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _unavailable(reason: str) -> None:
    """Skip with the reason, or fail under CI, where the browser test must run."""
    if IN_CI:
        pytest.fail(f"the web page's browser test cannot run under CI: {reason}", pytrace=False)
    pytest.skip(reason)


def _chromium() -> str:
    for candidate in (os.environ.get("RAGATE_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    _unavailable("chromium was not found at /usr/bin/chromium (`make install` installs it with apt-get)")
    raise AssertionError  # unreachable


def _make_variable(name: str) -> str:
    """A DEMO_* variable of the Makefile (the demo questions and calibration `make demo` uses)."""
    found = re.search(rf"^{name} \?= (.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert found, f"the Makefile has no {name}"
    return found.group(1).strip()


SKIP_QUESTION = _make_variable("DEMO_SKIP_QUESTION")
RAG_QUESTION = _make_variable("DEMO_RAG_QUESTION")
CALIBRATION = ROOT / _make_variable("DEMO_CALIBRATION")

# a document whose text, heading and file name try to run code in the page
XSS_NAME = "<img src=x onerror=window.__pwned=3>.md"
XSS_SCRIPT = "<script>window.__pwned = 1</script>"
XSS_DOC = f"""# The <b>Brewmaster</b> kettle <img src=x onerror="window.__pwned=2">

The Brewmaster 3000 kettle has a warranty of two years. {XSS_SCRIPT} Its warranty covers the heating element,
the lid and the switch, and is honoured by every shop that sells Brewmaster kettles. Keep the receipt: the
warranty of the Brewmaster 3000 kettle starts on the day it was bought. \u202eSpoofed text\u202c after it.
"""
OTHER_DOCS = {
    "desk.txt": "The service desk is open from nine to five on weekdays and from ten to two on Sundays. It "
    "answers questions about orders, deliveries and returns, and it can book a repair of a kettle.",
    "recall.txt": "In 2024 the Kettlemax 200 was recalled because its lid could open while the water boiled. "
    "Owners can return it to any shop for a full refund or a replacement kettle of another model.",
}


# -- servers and browser ----------------------------------------------------------------------------------------
@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(args: list[str], log: Path) -> Server:
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "ragate.cli.main",
        "serve",
        "--port",
        str(port),
        "--log-level",
        "warning",
        *args,
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "RAGATE_API_KEY": ""}
        )
    return Server(f"http://127.0.0.1:{port}", proc, log)


def _wait(server: Server, seconds: float = 240) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and server.proc.poll() is None:
        try:
            httpx.get(f"{server.url}/healthz", timeout=3)
            return
        except httpx.TransportError:
            time.sleep(0.3)
    tail = server.log.read_text(errors="replace")[-3000:]
    _stop(server)
    pytest.fail(f"ragate serve did not answer within {seconds} s (exit {server.proc.poll()}):\n{tail}")


def _stop(server: Server) -> None:
    if server.proc.poll() is None:
        server.proc.terminate()
        try:
            server.proc.wait(15)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    for module in ("fastapi", "uvicorn", "prometheus_client"):
        if importlib.util.find_spec(module) is None:
            _unavailable(f"{module} is not installed: pip install 'ragate[service]'")
    if importlib.util.find_spec("playwright") is None:
        _unavailable("Playwright is not installed: pip install -e '.[dev]' (or `make install`)")
    executable = _chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS, timeout=60_000)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def servers(
    smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory, browser: Any
) -> Iterator[dict[str, Server]]:
    """Both services, started together (their start-ups overlap) and stopped at the end of the module."""
    import ragate

    folder = tmp_path_factory.mktemp("page")
    docs = folder / "docs"
    docs.mkdir()
    (docs / XSS_NAME).write_text(XSS_DOC, encoding="utf-8")
    for name, text in OTHER_DOCS.items():
        (docs / name).write_text(text, encoding="utf-8")
    index = ragate.index_documents([docs], folder / "index", kind="bm25", progress=False)
    demo = ["--method", "targ-margin", "--calibration", str(CALIBRATION), "--api-key", KEY]
    budget = ["--budget", "0.5", "--window", "10", "--budget-state", str(folder / "budget.json")]
    started = {
        "demo": _start(demo, folder / "demo.log"),
        "docs": _start(["--method", "targ-margin", "--index", str(index), *budget], folder / "docs.log"),
    }
    try:
        for server in started.values():
            _wait(server)
        yield started
    finally:
        for server in started.values():
            _stop(server)


@pytest.fixture()
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    tab = context.new_page()
    problems: list[str] = []
    tab.on("pageerror", lambda err: problems.append(f"page error: {err}"))
    # script errors and CSP refusals ("Refused to ..."); not the browser's note of each 4xx the page was answered
    tab.on(
        "console",
        lambda m: (
            problems.append(f"console: {m.text}")
            if m.type == "error" and not m.text.startswith("Failed to load resource")
            else None
        ),
    )
    tab.problems = problems
    yield tab
    context.close()


# -- helpers ----------------------------------------------------------------------------------------------------
def _open(page: Any, server: Server, key: str | None = None) -> None:
    page.goto(server.url + "/")
    page.wait_for_selector("body[data-ready=true]")
    if key is not None:
        _set_key(page, key)


def _set_key(page: Any, key: str) -> None:
    page.fill("#key", key)
    page.dispatch_event("#key", "change")


def _ask(
    page: Any,
    question: str,
    *,
    compare: str | None = None,
    **options: str,
) -> list[dict[str, Any]]:
    """Ask through the page as a user does; the JSON bodies the page received, in its columns' order."""
    page.fill("#question", question)
    for field in ("max-tokens", "k", "threshold"):
        page.fill(f"#{field}", options.get(field.replace("-", "_"), ""))
    if compare is not None:
        page.wait_for_selector(f"#compare option[value='{compare}']", state="attached")
    page.select_option("#compare", compare or "")
    responses: list[Any] = []
    listener = lambda r: responses.append(r) if r.url.endswith("/v1/answer") else None
    page.on("response", listener)
    page.click("#ask-button")
    page.wait_for_selector("#ask-button:not([disabled])", timeout=180_000)
    page.remove_listener("response", listener)
    bodies = {json.loads(r.request.post_data)["method"]: r.json() for r in responses}
    methods = [None, compare] if compare else [None]
    return [bodies[m] for m in methods]


def _column(page: Any, i: int = 0) -> Any:
    return page.locator("#results article.result").nth(i)


def _check_answer_shown(column: Any, body: dict[str, Any]) -> None:
    """The column shows the answer, the decision, the score and tau, and one coloured cell per draft token."""
    assert column.locator(".answer").text_content() == body["answer"]
    decision = column.locator(".decision")
    assert decision.get_attribute("data-decision") == body["decision"]
    words = "Retrieved" if body["retrieved"] else "Answered without retrieval"
    assert words in decision.text_content()
    assert column.locator(".reason").text_content() == body["gate"]["reason"]
    for cls, value in (("score-value", body["gate"]["score"]), ("tau-value", body["gate"]["threshold"])):
        shown = column.locator(f".{cls}")
        assert float(shown.get_attribute("data-value")) == value
        assert math.isclose(float(shown.text_content()), value, rel_tol=1e-3)
    draft = body["draft"]
    cells = column.locator(".tokens .tok")
    assert cells.count() == len(draft["tokens"]) > 0
    for i, token in enumerate(draft["tokens"]):
        cell = cells.nth(i)
        assert cell.text_content() == token["text"].replace("\n", "↵")
        assert float(cell.get_attribute("data-u")) == token["u"]
        assert draft["measure"] in cell.get_attribute("title")
        colour = cell.evaluate("c => getComputedStyle(c).backgroundColor")
        assert colour.startswith("rgb") and colour not in ("rgba(0, 0, 0, 0)", "rgb(255, 255, 255)")
    # the score is the sum of what the gate reads in the first `scored` tokens over k = 20 (TARG's margin, Eq. 2),
    # also when the draft stopped sooner
    scored = [t["u"] for t in draft["tokens"][: draft["scored"]]]
    assert draft["divisor"] == 20
    assert math.isclose(sum(scored) / draft["divisor"], body["gate"]["score"], rel_tol=1e-9)


# -- the demo service: TARG-margin's two demo questions, the API key, a compare view ---------------------------
def test_a_wrong_key_shows_the_services_error_and_the_right_one_answers(
    servers: dict[str, Server], page: Any
) -> None:
    _open(page, servers["demo"])
    assert "needs an API key" in page.text_content("#status")
    _set_key(page, "not-the-key")
    _ask(page, SKIP_QUESTION, max_tokens="8")
    error = _column(page).locator(".error").text_content()
    assert error.startswith("401 authentication_error: wrong API key"), error
    assert page.text_content("#status") == "no answer: the error is shown below the question"  # no time
    _set_key(page, KEY)
    page.wait_for_selector("#compare option[value='no-retrieval']", state="attached")  # the key lists methods
    (body,) = _ask(page, SKIP_QUESTION, max_tokens="8")
    assert _column(page).locator(".error").count() == 0
    _check_answer_shown(_column(page), body)


def test_the_question_the_gate_skips_shows_its_draft_tokens_and_a_compare_view(
    servers: dict[str, Server], page: Any
) -> None:
    _open(page, servers["demo"], KEY)
    served = page.text_content("#served")  # before any answer: the served method, its tau and what it does
    tau = json.loads(CALIBRATION.read_text())["tau"]
    assert served.startswith("method targ-margin, τ ") and f"{tau:.4g}"[:5] in served, served
    assert "targ-margin: TARG: " in served
    page.wait_for_selector("#method optgroup", state="attached")  # the menu, grouped, once the key lists methods
    groups = page.locator("#method optgroup")
    assert groups.count() >= 5 and "TARG" in " ".join(groups.evaluate_all("gs => gs.map(g => g.label)"))
    gated, plain = _ask(page, SKIP_QUESTION, compare="no-retrieval", max_tokens="16")
    why = _column(page, 0).locator(".summary").text_content()
    assert why == f"Why: {gated['gate']['summary']}." == "Why: the model was sure of its first words: answered from what it knows."
    assert gated["method"] == "targ-margin" and gated["decision"] == "skip"
    assert gated["gate"]["threshold"] == json.loads(CALIBRATION.read_text())["tau"]
    _check_answer_shown(_column(page, 0), gated)
    assert "<=" in gated["gate"]["reason"] and "≤" in _column(page, 0).locator(".gate-numbers").text_content()
    assert _column(page, 0).locator(".docs").count() == 0  # "No documents read."
    assert [s["name"] for s in gated["trace"]["stages"]] == ["draft"]
    assert _column(page, 0).locator(".stages tbody tr").count() == 2  # the draft and the total
    # side by side: no-retrieval, which drafts nothing and says so
    assert page.locator("#results.compare article.result").count() == 2
    other = _column(page, 1)
    assert other.locator("h2").text_content() == "no-retrieval" == plain["method"]
    assert other.locator(".answer").text_content() == plain["answer"]
    assert "read no draft" in other.text_content()
    assert page.problems == []


def test_the_question_the_gate_retrieves_for_shows_the_documents_and_their_source(
    servers: dict[str, Server], page: Any, shots: Path
) -> None:
    _open(page, servers["demo"], KEY)
    (body,) = _ask(page, RAG_QUESTION, max_tokens="16", k="2")
    assert body["decision"] == "retrieve" and len(body["documents"]) == 2
    column = _column(page)
    _check_answer_shown(column, body)
    rows = column.locator(".docs tbody tr")
    assert rows.count() == 2
    for i, doc in enumerate(body["documents"]):
        row = rows.nth(i)
        assert row.locator(".doc-title").text_content() == doc["title"]
        assert row.locator(".doc-source").text_content() == doc["source"] != ""
        assert row.locator(".passage").text_content() == doc["text"]
    assert column.locator(".stages").text_content().count("overhead") == 1  # the draft, thrown away
    assert page.problems == []
    page.screenshot(path=str(shots / "page.png"), full_page=True)
    assert (shots / "page.png").stat().st_size > 10_000


def test_the_page_carries_a_content_security_policy_and_needs_no_key_for_its_files(
    servers: dict[str, Server],
) -> None:
    for path in ("/", "/ui/app.js", "/ui/style.css", "/ui/icon.svg"):
        r = httpx.get(servers["demo"].url + path, timeout=30)
        assert r.status_code == 200, (path, r.text)
        assert "script-src 'self'" in r.headers["content-security-policy"]
        assert r.headers["x-content-type-options"] == "nosniff"
    assert httpx.get(servers["demo"].url + "/v1/budget", timeout=30).status_code == 401
    source = httpx.get(servers["demo"].url + "/ui/app.js", timeout=30).text
    assert "innerHTML" not in source and "insertAdjacentHTML" not in source and "eval(" not in source


# -- the docs service: hostile documents and the live budget ---------------------------------------------------
def test_markup_in_a_passage_its_title_and_its_file_name_is_shown_as_text(
    servers: dict[str, Server], page: Any
) -> None:
    _open(page, servers["docs"])
    (body,) = _ask(page, "How long is the warranty on the Brewmaster 3000 kettle?", threshold="0", k="1")
    source = body["documents"][0]["source"]
    assert body["retrieved"] and source.endswith("/" + XSS_NAME), body["documents"]
    column = _column(page)
    assert column.locator(".doc-source").text_content() == source
    assert "<b>Brewmaster</b>" in column.locator(".doc-title").text_content()
    shown = column.locator(".passage").text_content()  # the markup's text, for reading
    assert "Brewmaster" in shown and "<script" not in shown and "window.__pwned" not in shown
    assert XSS_SCRIPT in column.locator(".passage-raw").text_content()  # the markup itself, as text
    # a right-to-left override in the text is shown by name, and reorders nothing after it
    assert "⟨RLO⟩Spoofed text⟨PDF⟩ after it." in shown and "\u202e" not in column.text_content()
    assert page.locator("#results script, #results img, #results b").count() == 0
    page.locator(".doc-title").click()  # open the passage: still text
    page.locator(".raw summary").click()  # and its markup
    page.wait_for_timeout(300)
    assert page.evaluate("window.__pwned") is None
    assert page.problems == []


def test_the_budget_panel_shows_the_realised_rate_and_tau_after_a_burst(
    servers: dict[str, Server], page: Any, shots: Path
) -> None:
    from ragate.retrieval.corpus import demo_dir

    url = servers["docs"].url
    _open(page, servers["docs"])
    questions = [
        json.loads(line)["question"] for line in (demo_dir() / "questions.jsonl").read_text().splitlines()
    ][:10]

    def one(question: str) -> bool:
        body = {"question": question, "options": {"max_tokens": 2, "k": 1}}
        r = httpx.post(f"{url}/v1/answer", json=body, timeout=180)
        assert r.status_code == 200, r.text
        return bool(r.json()["retrieved"])

    with ThreadPoolExecutor(4) as pool:  # a burst: four clients at once
        decided = list(pool.map(one, questions))
    state = httpx.get(f"{url}/v1/budget", timeout=30).json()
    assert state["enabled"] and state["budget"] == 0.5 and state["window"] == 10
    assert state["window_requests"] == 10 and len(state["history"]) == state["observed"] >= 10
    burst = [p for p in state["history"] if p["n"] > state["observed"] - 10]
    assert state["window_retrieved"] == sum(p["retrieved"] for p in burst) == sum(decided)
    # the page polls GET /v1/budget: its panel catches up without a reload
    from playwright.sync_api import expect

    expect(page.locator("#budget-note")).to_contain_text(
        f"{state['observed']} requests observed", timeout=20_000
    )
    assert page.is_visible("#budget")
    rate, tau = page.locator("#budget-rate"), page.locator("#budget-tau")
    assert float(rate.get_attribute("data-value")) == state["window_rate"]
    assert rate.text_content() == f"{state['window_rate']:.3f}"
    assert float(tau.get_attribute("data-value")) == state["tau"]
    assert math.isclose(float(tau.text_content()), state["tau"], rel_tol=1e-3)
    assert page.text_content("#budget-target") == "0.5"
    assert f"{state['window_retrieved']} of the last 10 requests" in page.text_content("#budget-count")
    points = page.locator("#budget-rate-chart polyline").get_attribute("points").split()
    assert len(points) == len(state["history"])
    assert page.locator("#budget-tau-chart circle").count() == len(state["history"])
    assert page.problems == []
    page.locator("#budget").screenshot(path=str(shots / "page-budget.png"))
    assert (shots / "page-budget.png").stat().st_size > 1_000


def test_a_route_budget_panel_shows_mean_retrievals_and_lambda(
    smollm2_path: Path, browser: Any, page: Any, tmp_path: Path
) -> None:
    """``ragate serve --method route --calibration LEARNED --budget 0.5``: the page's budget panel names what a
    route budget holds (mean retrievals per question, against lambda) and draws the mean on its own scale."""
    from test_route_budget import ROUTES, _policy_scenario

    from ragate.report.route_budget import route_calibration
    from ragate.report.routes import route_table

    _, records = _policy_scenario(120, seed=3)  # the third route's records spend 2 retrievals
    cal = tmp_path / "learned.json"
    cal.write_text(json.dumps(route_calibration(route_table(records, ROUTES), 0.5, policy="learned")
                              | {"model": "smollm2-135m"}))  # fmt: skip
    server = _start(["--method", "route", "--calibration", str(cal), "--budget", "0.5", "--window", "10",
                     "--budget-state", str(tmp_path / "budget.json")], tmp_path / "route.log")  # fmt: skip
    try:
        _wait(server)
        _open(page, server)
        r = httpx.post(f"{server.url}/v1/answer", json={"question": "Who wrote Hamlet?", "options": {"max_tokens": 4}},
                       timeout=180)  # fmt: skip
        assert r.status_code == 200, r.text
        state = httpx.get(f"{server.url}/v1/budget", timeout=30).json()
        from playwright.sync_api import expect

        expect(page.locator("#budget-note")).to_contain_text("1 requests observed", timeout=20_000)
        assert page.text_content("#budget-rate-name") == "realised mean retrievals"
        assert page.text_content("#budget-tau-name") == "λ now"
        assert "mean retrievals per request" in page.text_content("#budget-rate-caption")
        assert float(page.locator("#budget-tau").get_attribute("data-value")) == state["tau"]
        assert state["rate_high"] == 2.0  # the rate is drawn up to the dearest route's cost, not a share's 1
        assert page.locator("#budget-rate-chart text.tick").all_text_contents()[:2] == ["0", "2"]
        assert page.locator("#budget-tau-chart circle").count() == 0  # no gate score to dot
        assert page.problems == []
    finally:
        _stop(server)
