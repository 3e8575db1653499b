"""``ragate serve`` as real processes on 127.0.0.1, spoken to over HTTP.

Two services, each started once: the default one (SmolLM2 on llama.cpp in-process, the demo index, no auth, small
body and question limits) and a scale-out one (two uvicorn workers, the LM on llama-cpp-python's OpenAI-compatible
server, a BM25 index, an API key, one slot per worker). The second is where the LM server is killed, restarted
and paused, to see 503, recovery, 504 and 429.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

for _module in ("fastapi", "uvicorn", "prometheus_client"):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"{_module} is not installed: pip install 'ragate[service]'", allow_module_level=True)

from ragate.cli.main import main
from ragate.service.settings import ServiceSettings

WIKI = Path(__file__).parent / "data" / "wiki_passages.jsonl"
KEY = "test-key-7"
QUESTION = "Who wrote Hamlet?"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(url: str, proc: subprocess.Popen[bytes], log: Path, seconds: float) -> None:
    """Until ``url`` answers at all (any status), or fail with the log's tail."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            httpx.get(url, timeout=3)
            return
        except httpx.TransportError:
            time.sleep(0.3)
    tail = log.read_text(errors="replace")[-3000:]
    _stop(proc)
    pytest.fail(f"{url} did not answer within {seconds} s (exit {proc.poll()}):\n{tail}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _serve(
    args: list[str], log: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
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
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    _wait(f"{url}/healthz", proc, log, 240)
    return proc, url


def _error(r: httpx.Response, status: int, *words: str) -> str:
    """The JSON error's message, after checking the status, the shape, the words, and that no traceback leaks."""
    assert r.status_code == status, r.text
    body = r.json()
    message = body["error"]["message"]
    assert isinstance(message, str) and message and body["error"]["type"]
    assert "Traceback" not in r.text and 'File "' not in r.text
    for word in words:
        assert word in message, message
    return str(message)


# -- the default service ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def service_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default service's folder: its log, its answer log (answers.jsonl) and its spans (spans.jsonl)."""
    return tmp_path_factory.mktemp("service")


@pytest.fixture(scope="module")
def service(smollm2_path: Path, service_files: Path) -> Iterator[str]:
    log = service_files / "serve.log"
    args = ["--method", "dtr", "--max-body-bytes", "2048", "--max-question-chars", "200", "--read-timeout", "3",
            "--answer-log", str(service_files / "answers.jsonl"), "--trace", str(service_files / "spans.jsonl")]  # fmt: skip
    proc, url = _serve(args, log, env={"RAGATE_API_KEY": ""})
    yield url
    _stop(proc)


@pytest.fixture(scope="module")
def http(service: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=service, timeout=120) as client:
        yield client


def test_healthz_names_what_is_served(http: httpx.Client) -> None:
    r = http.get("/healthz")
    assert r.status_code == 200
    info = r.json()
    assert info["status"] == "ok" and info["model"] == "smollm2-135m" and info["engine"] == "llama.cpp"
    assert info["method"] == "dtr" and info["index"].endswith("demo") and info["passages"] > 0


def test_answer_without_retrieval(http: httpx.Client) -> None:
    r = http.post(
        "/v1/answer", json={"question": QUESTION, "method": "no-retrieval", "options": {"max_tokens": 8}}
    )
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["answer"] and d["method"] == "no-retrieval" and d["retrieved"] is False and d["documents"] == []
    assert d["gate"] == {"score": 0.0, "threshold": 0.0, "retrieve": False, "reason": "never retrieves",
                         "summary": "this method never retrieves: answered from what it knows"}  # fmt: skip
    assert d["trace"]["stages"][0]["completion_tokens"] <= 8
    t = d["timings"]
    assert t["total_seconds"] >= t["pipeline_seconds"] > 0 and set(t["stages"]) == {"answer"}


def test_answer_with_retrieval_returns_the_documents(http: httpx.Client) -> None:
    body = {"question": "who got the first nobel prize in physics", "method": "standard-rag"}
    r = http.post("/v1/answer", json={**body, "options": {"max_tokens": 8, "k": 1}})
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["retrieved"] is True and len(d["documents"]) == 1
    doc = d["documents"][0]
    assert doc["rank"] == 1 and doc["text"] and doc["title"] and doc["id"] == d["trace"]["documents"][0]["id"]
    assert "retrieve" in d["timings"]["stages"] and d["trace"]["queries"] == [body["question"]]
    counted = _metrics(http)
    assert counted['ragate_retrievals_total{method="standard-rag"}'] >= 1
    assert counted['ragate_retrieval_ratio{method="standard-rag"}'] == 1.0


def test_dtr_reports_its_gate_score_and_threshold(http: httpx.Client) -> None:
    r = http.post(
        "/v1/answer", json={"question": QUESTION, "options": {"max_tokens": 8, "threshold": 1000.0}}
    )  # the default method (dtr); a threshold no draft reaches keeps it cheap
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["method"] == "dtr" and d["retrieved"] is False and d["answer"]
    assert d["gate"]["threshold"] == 1000.0 and 0 < d["gate"]["score"] < 1000 and "u =" in d["gate"]["reason"]


def test_search(http: httpx.Client) -> None:
    r = http.post("/v1/search", json={"query": "first Nobel Prize in Physics", "k": 3})
    assert r.status_code == 200, r.text
    hits = r.json()["hits"]
    assert [h["rank"] for h in hits] == [1, 2, 3] and "Nobel" in hits[0]["title"] + hits[0]["text"]


def test_bad_input_gets_4xx_with_a_message(http: httpx.Client) -> None:
    json_h = {"Content-Type": "application/json"}
    _error(http.post("/v1/answer", content=b"{}" + b" " * 3000, headers=json_h), 413, "2048 bytes")

    def chunks() -> Iterator[bytes]:  # no Content-Length: the streamed size is what counts
        yield b'{"question": "'
        for _ in range(40):
            yield b"x" * 100
        yield b'"}'

    _error(http.post("/v1/answer", content=chunks(), headers=json_h), 413, "2048 bytes")
    _error(http.post("/v1/answer", json={"question": "why " * 60}), 400, "239 characters", "at most 200")
    _error(http.post("/v1/answer", content=b"", headers=json_h), 400, "empty")
    _error(http.post("/v1/answer", json={"question": "   "}), 400, "question is empty")
    _error(http.post("/v1/answer", content=b'{"question": "caf\xe9?"}', headers=json_h), 400, "UTF-8", "0xe9")
    _error(http.post("/v1/answer", content=b'{"question": ', headers=json_h), 400, "not valid JSON")
    _error(
        http.post("/v1/answer", content=b"question=hi", headers={"Content-Type": "text/plain"}), 415, "JSON"
    )
    msg = _error(http.post("/v1/answer", json={"question": 5, "options": {"max_tokens": 0, "top": 1}}), 422)
    assert "question:" in msg and "options.max_tokens:" in msg and "options.top:" in msg
    _error(http.post("/v1/answer", json={"question": QUESTION, "method": "dtrr"}), 400, "Did you mean 'dtr'")
    _error(http.post("/v1/answer", json={"question": QUESTION, "options": {"max_tokens": 99999}}), 400, "512")
    _error(http.post("/v1/search", json={"query": "x", "k": 500}), 400, "at most 20")
    for loose in ("4", True, 4.0):  # numbers are JSON numbers of the right kind, not strings or booleans
        _error(http.post("/v1/search", json={"query": "x", "k": loose}), 422, "k:")
        _error(http.post("/v1/answer", json={"question": QUESTION, "options": {"max_tokens": loose}}), 422)
    _error(http.post("/v1/answer", json={"question": QUESTION, "options": {"threshold": "0.5"}}), 422)
    # a lone surrogate is valid JSON but not Unicode text: one check and one 400 for every text field
    lone = rb'"\ud800 nobel"'
    for path, body in (
        ("/v1/search", b'{"query": ' + lone + b"}"),
        ("/v1/answer", b'{"question": ' + lone + b"}"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": ' + lone + b"}]}"),
    ):
        _error(http.post(path, content=body, headers=json_h), 400, "lone surrogate", "character 0")
    _error(http.get("/v1/nothing"), 404, "/v1/nothing", "POST /v1/answer")
    _error(http.get("/v1/answer"), 405, "GET")


def test_a_body_that_trickles_in_is_cut_off_at_the_read_timeout(service: str) -> None:
    """Slow-body clients (12 of 1000 promised bytes, then nothing) get 408 and a closed socket after
    --read-timeout (3 s here), instead of holding 10 connections open for as long as they like."""
    host, port = service.removeprefix("http://").split(":")
    head = (
        f"POST /v1/answer HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        "Content-Length: 1000\r\n\r\n"
    )
    socks = []
    for _ in range(10):
        sock = socket.create_connection((host, int(port)), timeout=15)
        sock.sendall(head.encode() + b'{"question":')  # 12 bytes of the 1000
        socks.append(sock)
    start = time.monotonic()
    for sock in socks:
        got = b""
        while chunk := sock.recv(4096):  # returns b"" once the server closes the connection
            got += chunk
        sock.close()
        assert got.startswith(b"HTTP/1.1 408"), got[:200]
        assert b"did not arrive within 3 s (12 bytes came)" in got
    assert time.monotonic() - start < 12


def test_headers_that_trickle_in_are_cut_off_at_the_read_timeout(service: str) -> None:
    """Slowloris: 10 connections that send half a request line, or headers without their blank line, are closed
    after --read-timeout (3 s), while a keep-alive connection that answered a request still works."""
    host, port = service.removeprefix("http://").split(":")
    partial = [b"POST /v1/ans", f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n".encode()]
    socks = []
    for i in range(10):
        sock = socket.create_connection((host, int(port)), timeout=15)
        sock.sendall(partial[i % 2])
        socks.append(sock)
    start = time.monotonic()
    for sock in socks:
        assert sock.recv(4096) == b""  # closed by the server, with nothing to say to half a request
        sock.close()
    assert 2.5 < time.monotonic() - start < 12
    with httpx.Client(base_url=service, timeout=30) as client:  # one connection, several requests
        for _ in range(2):
            assert client.get("/healthz").status_code == 200
            time.sleep(1)


def test_openai_client_chat_completions(service: str) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{service}/v1", api_key="unused", max_retries=0, timeout=120)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}]
    reply = client.chat.completions.create(model="no-retrieval", messages=messages, max_tokens=8)
    assert reply.object == "chat.completion" and reply.model == "no-retrieval"
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert reply.usage is not None
    # SmolLM2 answers in sentences: 8 tokens cut it, and the client is told so
    assert choice.finish_reason == ("length" if reply.usage.completion_tokens >= 8 else "stop")
    assert (
        reply.usage is not None
        and reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    )
    extension = (reply.model_extra or {})["ragate"]
    assert extension["retrieved"] is False and extension["gate"]["reason"] == "never retrieves"

    stream = client.chat.completions.create(
        model="no-retrieval",
        messages=messages,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content  # greedy: the same answer
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [choice.finish_reason]
    short = client.chat.completions.create(model="no-retrieval", messages=messages, max_tokens=1)
    assert short.choices[0].finish_reason == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == reply.usage.total_tokens

    assert "dtr" in [m.id for m in client.models.list()]
    with pytest.raises(openai.BadRequestError, match="no user message"):
        client.chat.completions.create(model="dtr", messages=[{"role": "system", "content": "hi"}])


def _metrics(http: httpx.Client) -> dict[str, float]:
    lines = http.get("/metrics").text.splitlines()
    return {k: float(v) for k, _, v in (line.rpartition(" ") for line in lines if not line.startswith("#"))}


def test_metrics_count_requests_retrieval_rate_latency_and_errors(http: httpx.Client) -> None:
    before = _metrics(http)
    _error(http.post("/v1/answer", content=b" " * 5000, headers={"Content-Type": "application/json"}), 413)
    assert http.post(
        "/v1/answer", json={"question": QUESTION, "method": "no-retrieval", "options": {"max_tokens": 2}}
    ).is_success
    after = _metrics(http)

    def grew(key: str) -> float:
        return after[key] - before.get(key, 0.0)

    assert grew('ragate_http_requests_total{endpoint="/v1/answer",status="200"}') == 1
    assert grew('ragate_http_requests_total{endpoint="/v1/answer",status="413"}') == 1
    assert grew('ragate_errors_total{type="request_too_large"}') == 1
    assert grew('ragate_answers_total{method="no-retrieval"}') == 1
    assert grew('ragate_http_request_duration_seconds_count{endpoint="/v1/answer"}') == 2
    assert grew('ragate_http_request_duration_seconds_bucket{endpoint="/v1/answer",le="+Inf"}') == 2
    assert grew('ragate_stage_duration_seconds_count{stage="answer"}') == 1
    assert after['ragate_retrieval_ratio{method="no-retrieval"}'] == 0.0
    assert after["ragate_requests_in_progress"] == 0


# -- settings and the command line, in-process ------------------------------------------------------------------
SKIP = {"threshold": 1000.0, "max_tokens": 8}  # no draft's margin score reaches it: the gate skips
READ = {"threshold": -1.0, "max_tokens": 8, "k": 2}  # every score is above it: the gate retrieves


def test_answers_carry_usage_and_what_the_gate_saved(http: httpx.Client, service_files: Path) -> None:
    question = "who got the first nobel prize in physics"
    read = http.post(
        "/v1/answer", json={"question": question, "method": "targ-margin", "options": READ}
    ).json()
    skip = http.post(
        "/v1/answer", json={"question": question, "method": "targ-margin", "options": SKIP}
    ).json()
    for d in (read, skip):
        usage, ragate = d["usage"], d["ragate"]
        assert (
            usage["total_tokens"]
            == usage["prompt_tokens"] + usage["completion_tokens"]
            == d["trace"]["tokens"]
        )
        assert ragate["savings"]["spent"]["tokens"] == usage["total_tokens"]
        assert ragate["gate"]["score"] == d["gate"]["score"] and ragate["method"] == "targ-margin"
        assert (
            ragate["savings"]["gate"]["tokens"]
            == d["trace"]["stages"][0]["prompt_tokens"] + d["trace"]["stages"][0]["completion_tokens"]
        )  # the gate's 20-token draft
    r, k = read["ragate"], skip["ragate"]
    assert (r["decision"], r["gate"]["threshold"], k["decision"], k["gate"]["threshold"]) == (
        "retrieve", -1.0, "skip", 1000.0
    )  # fmt: skip
    measured = r["savings"]
    assert (
        measured["how"] == "measured" and measured["always_retrieve"]["tokens"] < measured["spent"]["tokens"]
    )
    assert (
        measured["saved"]["tokens"] == -measured["gate"]["tokens"]
    )  # retrieving anyway: the draft was extra
    estimated = k["savings"]
    assert estimated["how"] == "estimated" and "targ-margin that retrieved" in estimated["estimator"]
    assert estimated["saved"]["tokens"] > 0  # reading 2 passages costs more than the draft the gate kept
    chat = http.post(
        "/v1/chat/completions",
        json={"model": "targ-margin", "messages": [{"role": "user", "content": question}], "max_tokens": 8},
    ).json()
    assert chat["usage"]["total_tokens"] == chat["ragate"]["savings"]["spent"]["tokens"] > 0
    assert chat["ragate"]["decision"] in ("retrieve", "skip")

    lines = [json.loads(x) for x in (service_files / "answers.jsonl").read_text().splitlines()]
    mine = [e for e in lines if e["method"] == "targ-margin"][-3:]
    assert [e["retrieved"] for e in mine[:2]] == [True, False]
    assert mine[1]["saved"] == estimated["saved"] and mine[1]["how"] == "estimated"
    assert question not in (service_files / "answers.jsonl").read_text()  # the log keeps no question text
    report = subprocess.run(
        [sys.executable, "-m", "ragate.cli.main", "report", str(service_files / "answers.jsonl")],
        check=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "| targ-margin |" in report.stdout and "| from (UTC) | answers | retrieval rate |" in report.stdout

    spans = [json.loads(x) for x in (service_files / "spans.jsonl").read_text().splitlines()]
    names = {x["name"] for x in spans}
    assert {"ragate.answer", "ragate.gate", "ragate.retrieve"} <= names and any(
        n.startswith("chat ") for n in names
    )
    assert question not in (service_files / "spans.jsonl").read_text()  # no text unless --trace-content
    assert {x["resource"]["attributes"]["service.name"] for x in spans} == {"ragate"}  # not unknown_service


def test_metrics_have_decisions_scores_budget_and_savings_named_as_prometheus_asks(
    http: httpx.Client,
) -> None:
    question = "who wrote the novel dracula"
    for options in (READ, SKIP):
        http.post("/v1/answer", json={"question": question, "method": "targ-margin", "options": options})
    text = http.get("/metrics").text
    m = _metrics(http)
    assert m['ragate_gate_decisions_total{decision="retrieve",method="targ-margin"}'] >= 1
    assert m['ragate_gate_decisions_total{decision="skip",method="targ-margin"}'] >= 1
    assert m['ragate_gate_score_count{method="targ-margin"}'] >= 2
    assert (
        m['ragate_gate_score_bucket{le="+Inf",method="targ-margin"}']
        == m['ragate_gate_score_count{method="targ-margin"}']
    )
    assert m['ragate_tokens_total{method="targ-margin"}'] > 0
    assert m['ragate_always_retrieve_tokens_total{how="estimated",method="targ-margin"}'] > 0
    assert m['ragate_always_retrieve_tokens_total{how="measured",method="targ-margin"}'] > 0
    assert m['ragate_saved_tokens_total{method="targ-margin"}'] > 0
    assert m['ragate_gate_extra_tokens_total{method="targ-margin"}'] > 0
    types = dict(line.split()[2:4] for line in text.splitlines() if line.startswith("# TYPE"))
    types = {name: kind for name, kind in types.items() if not name.endswith("_created")}  # start times
    assert all(name.startswith("ragate_") for name in types), types
    for name, kind in types.items():  # Prometheus naming: the unit ends the name (counters then get _total)
        if "duration" in name:
            assert name.endswith("_seconds"), name
        if kind == "counter":
            assert name.endswith("_total"), name
        if "token" in name:
            assert name.removesuffix("_total").endswith("_tokens"), name
    assert "ragate_budget_target_ratio" in types and "ragate_budget_realised_ratio" in types


def test_settings_defaults_are_safe() -> None:
    s = ServiceSettings()
    assert s.host == "127.0.0.1" and s.loopback and s.api_key is None and s.max_body_bytes <= 1 << 20
    env = {
        "RAGATE_SERVICE_SETTINGS": ServiceSettings(api_key="k", port=9000).to_json(),
        "RAGATE_API_KEY": "k2",
    }
    assert json.loads(ServiceSettings(api_key="k").to_json())["api_key"] is None  # the key travels on its own
    assert ServiceSettings.from_env(env) == ServiceSettings(port=9000, api_key="k2")
    assert not ServiceSettings(host="0.0.0.0").loopback and ServiceSettings(host="::1").loopback
    with pytest.raises(ValueError, match="max_concurrency = 0"):
        ServiceSettings(max_concurrency=0)


def test_public_host_without_a_key_warns(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAGATE_API_KEY", raising=False)
    assert main(["serve", "--host", "0.0.0.0", "--method", "nosuch"]) == 2  # fails before binding anything
    err = capsys.readouterr().err
    assert "warning: serving on 0.0.0.0 without an API key" in err and "unknown method 'nosuch'" in err


# -- the scale-out service: LM on an OpenAI-compatible server that fails ------------------------------------------
@dataclass
class LlamaServer:
    """llama-cpp-python's OpenAI-compatible server with SmolLM2 on a fixed port, which can be killed and restarted."""

    model: Path
    port: int
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(self.model), "--host", "127.0.0.1",
               "--port", str(self.port), "--n_ctx", "2048", "--logits_all", "true"]  # fmt: skip
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        _wait(f"{self.base}/models", self.proc, self.log, 90)
        warm_up = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "logprobs": True}
        httpx.post(
            f"{self.base}/chat/completions", json=warm_up, timeout=120
        )  # the first call is slow (~10 s)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


@pytest.fixture(scope="module")
def llama(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llama_cpp.server") is None:
        pytest.skip("llama_cpp.server is not installed: pip install 'llama-cpp-python[server]==0.3.36'")
    server = LlamaServer(smollm2_path, _free_port(), tmp_path_factory.mktemp("llama") / "server.log")
    server.start()
    yield server
    if server.proc is not None:
        server.proc.send_signal(signal.SIGCONT)
        _stop(server.proc)


@pytest.fixture(scope="module")
def remote(llama: LlamaServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    from ragate.retrieval.corpus import read_passages
    from ragate.retrieval.index import build_index

    tmp = tmp_path_factory.mktemp("remote")
    index = build_index(read_passages(WIKI), tmp / "bm25", "bm25", progress=False)
    args = ["--openai-base-url", llama.base, "--index", str(index), "--method", "no-retrieval", "--workers", "2",
            "--max-concurrency", "1", "--timeout", "10"]  # fmt: skip
    proc, url = _serve(args, tmp / "serve.log", env={"RAGATE_API_KEY": KEY})
    with httpx.Client(base_url=url, timeout=60, headers={"Authorization": f"Bearer {KEY}"}) as client:
        yield client
    _stop(proc)


def _ask(client: httpx.Client, **headers: str) -> httpx.Response:
    return client.post(
        "/v1/answer", json={"question": QUESTION, "options": {"max_tokens": 4}}, headers=headers
    )


def test_api_key_is_required_except_for_healthz(remote: httpx.Client) -> None:
    bare = httpx.Client(base_url=remote.base_url, timeout=30)
    r = bare.post("/v1/answer", json={"question": QUESTION})
    _error(r, 401, "API key", "Authorization: Bearer")
    assert r.headers["WWW-Authenticate"] == "Bearer"
    _error(bare.get("/metrics", headers={"Authorization": "Bearer nope"}), 401, "wrong API key")
    r = bare.get("/healthz")
    assert r.status_code == 200  # no key needed, and then no paths on this machine
    assert r.json()["index"] == "(send the API key to see it)" and "/" not in r.json()["model"]
    full = remote.get("/healthz").json()
    assert full["index"].startswith("/") and full["index"].endswith("bm25") and full["model"].startswith("/")
    r = _ask(remote)
    assert r.status_code == 200 and r.json()["answer"] and r.json()["model"].endswith(".gguf")


def test_lm_server_killed_gives_503_then_recovers(remote: httpx.Client, llama: LlamaServer) -> None:
    assert _ask(remote).status_code == 200
    llama.kill()
    r = _ask(remote)
    _error(r, 503, "the language model is unavailable", llama.base)
    assert r.headers["Retry-After"] == "5"
    health = remote.get("/healthz")  # the service itself is up, and says what is down
    assert health.status_code == 503 and health.json()["status"] == "unavailable"
    assert llama.base in health.json()["error"]["message"]
    llama.start()  # same port
    for _ in range(2):  # each worker's pool had connections to the dead server
        r = _ask(remote)
        assert r.status_code == 200, r.text
    assert remote.get("/healthz").status_code == 200


def test_stalled_lm_gives_504_and_a_full_server_429(remote: httpx.Client, llama: LlamaServer) -> None:
    """The LM server is paused: requests wait past --timeout (504); with 2 workers x 1 slot, one of 3 requests
    sent together finds its worker's slot taken (429 with Retry-After)."""
    assert llama.proc is not None
    llama.proc.send_signal(signal.SIGSTOP)
    results: list[httpx.Response] = []
    try:
        threads = [threading.Thread(target=lambda: results.append(_ask(remote))) for _ in range(3)]
        for t in threads:
            t.start()
            time.sleep(0.3)
        for t in threads:
            t.join(60)
    finally:
        llama.proc.send_signal(signal.SIGCONT)
    statuses = sorted(r.status_code for r in results)
    assert 429 in statuses and 504 in statuses and set(statuses) <= {429, 504}, statuses
    busy = next(r for r in results if r.status_code == 429)
    _error(busy, 429, "busy")
    assert int(busy.headers["Retry-After"]) >= 1
    _error(next(r for r in results if r.status_code == 504), 504, "10 s", "--timeout")
    deadline = time.monotonic() + 30  # the abandoned calls end at the backend timeout and free their slots
    while (r := _ask(remote)).status_code != 200 and time.monotonic() < deadline:
        time.sleep(1)
    assert r.status_code == 200, r.text


# -- a live retrieval budget (issue H.3) -----------------------------------------------------------------------
def _gauge(client: httpx.Client, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")


def test_a_budget_steers_the_retrieval_rate_and_survives_a_kill(demo_bm25: Path, tmp_path: Path) -> None:
    """`ragate serve --budget 0.3` with SmolLM2: its default TARG-entropy threshold would retrieve for nearly
    every question; the controller brings the rate over its window toward 0.3, and a kill -9 and restart keeps
    the threshold it had reached."""
    from ragate.retrieval.corpus import demo_dir

    questions = [
        json.loads(line)["question"] for line in (demo_dir() / "questions.jsonl").read_text().splitlines()
    ]
    state = tmp_path / "budget.json"
    args = ["--method", "targ-entropy", "--budget", "0.3", "--window", "10", "--budget-state", str(state)]
    args += ["--index", str(demo_bm25)]  # the demo passages without the encoder's start-up
    proc, url = _serve(args, tmp_path / "serve.log", env={"RAGATE_API_KEY": ""})
    decided = []
    try:
        with httpx.Client(base_url=url, timeout=120) as client:
            assert _gauge(client, "ragate_budget_target_ratio") == 0.3
            for q in questions[:30]:  # the first window at the default tau, then 20 answers under the controller
                r = client.post("/v1/answer", json={"question": q, "options": {"max_tokens": 4}})
                assert r.status_code == 200, r.text
                body = r.json()
                decided.append((body["gate"]["threshold"], body["retrieved"]))
                assert body["budget"]["budget"] == 0.3 and body["budget"]["window"] == 10
            first = [retrieved for _, retrieved in decided[:10]]
            last = [retrieved for _, retrieved in decided[-20:]]
            assert decided[0][0] == 0.8  # TARG's default before any score was seen
            assert abs(sum(last) / 20 - 0.3) < abs(sum(first) / 10 - 0.3) or abs(sum(last) / 20 - 0.3) <= 0.15
            assert abs(_gauge(client, "ragate_budget_realised_ratio") - 0.3) <= 0.25
            tau = _gauge(client, "ragate_budget_threshold")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert json.loads(state.read_text())["tau"] == tau
    proc, url = _serve(args, tmp_path / "serve2.log", env={"RAGATE_API_KEY": ""})
    try:
        with httpx.Client(base_url=url, timeout=120) as client:
            assert _gauge(client, "ragate_budget_threshold") == tau
            r = client.post("/v1/answer", json={"question": questions[30], "options": {"max_tokens": 4}})
            assert r.json()["gate"]["threshold"] == tau  # the first answer after the restart uses it
    finally:
        _stop(proc)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--budget", "1.5"], "strictly between 0 and 1"),
        (["--budget", "0.3", "--window", "5"], "at least 10"),
        (["--budget", "0.3", "--method", "no-retrieval"], "no threshold to control"),
        (["--budget", "0.3", "--workers", "2"], "--workers 1"),
    ],
)
def test_bad_budget_settings_are_named(
    extra: list[str], words: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["serve", "--budget-state", str(tmp_path / "s.json"), *extra]) == 2
    assert words in capsys.readouterr().err


def test_a_budget_state_of_another_model_is_refused(tmp_path: Path) -> None:
    from ragate.errors import RagateError
    from ragate.methods import get_method
    from ragate.service.budget import BudgetController

    state = tmp_path / "s.json"
    controller = BudgetController(0.3, 10, get_method("targ-margin"), state, model="model-a")
    for score in range(12):
        controller.observe(float(score), retrieved=score > 8)
    again = BudgetController(0.3, 10, get_method("targ-margin"), state, model="model-a")
    assert again.tau == controller.tau == 8.0  # F^-1(0.7) of the last ten scores 2..11: 9, 10, 11 above
    with pytest.raises(RagateError, match="model 'model-a', not 'model-b'"):
        BudgetController(0.3, 10, get_method("targ-margin"), state, model="model-b")
    with pytest.raises(RagateError, match="method 'targ-margin', not 'targ-entropy'"):
        BudgetController(0.3, 10, get_method("targ-entropy"), state, model="model-a")


def test_a_budget_controls_the_gate_that_decides_not_the_one_a_fallback_replaced(tmp_path: Path) -> None:
    """A text-only backend serves DTR through a fallback gate; the budget must control that gate, and a fallback
    with no threshold (verbal confidence) is refused at start, saying a fallback stands in."""
    from dataclasses import replace

    from ragate.backends.scripted import SCRIPTED_CAPABILITIES, ScriptedBackend
    from ragate.errors import RagateError
    from ragate.retrieval.demo import demo_index
    from ragate.retrieval.index import open_index
    from ragate.service.app import create_app
    from ragate.service.settings import ServiceSettings

    text_only = replace(SCRIPTED_CAPABILITIES, logprobs=False, top_k=0)
    settings = ServiceSettings(
        method="dtr", fallback="verbal-confidence", budget=0.3, budget_state=str(tmp_path / "s.json")
    )
    with open_index(demo_index()) as index, pytest.raises(RagateError, match="fallback gate stands in"):
        create_app(settings, ScriptedBackend([], capabilities=text_only), index)
