"""Hostile upstreams and a fleet that heals: ``OpenAICompatBackend`` against real HTTP servers on 127.0.0.1.

Each server is a ``benchmarks/latency_server.py`` process, turned hostile with ``--mode`` (or ``POST /v1/mode``):
one that trickles its headers, one that streams a body without end, one that answers 200 with a cut JSON body or
with JSON that is no completion; and ordinary ones killed and restarted on their port. Every call that could hang
runs in a thread given a bounded time, and every server is stopped when its test ends.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_fleet import MODEL, free_port, posts, set_mode, start, stop, until

from ragate.backends.openai_compat import OpenAICompatBackend
from ragate.errors import BackendError, BackendTimeoutError, BackendUnavailableError
from ragate.types import GenerationRequest

T = TypeVar("T")


def ask(i: int) -> GenerationRequest:
    return GenerationRequest(f"What is the capital of country number {i}?", max_tokens=4)


def backend(urls: str | list[str], **options: Any) -> OpenAICompatBackend:
    return OpenAICompatBackend(urls, model=MODEL, logprobs="on", max_retries=1, backoff=0.05, **options)


def bounded(fn: Callable[[], T], seconds: float) -> tuple[T | BaseException, float]:
    """``fn()``'s result (or the exception it raised) and its seconds; the test fails if it runs past
    ``seconds`` (the thread is left to end when the test stops its servers)."""
    box: list[tuple[T | BaseException, float]] = []

    def run() -> None:
        start = time.monotonic()
        try:
            box.append((fn(), time.monotonic() - start))
        except BaseException as err:  # noqa: BLE001 - handed to the test's thread
            box.append((err, time.monotonic() - start))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if not box:
        pytest.fail(f"the call was still waiting after {seconds} s")
    return box[0]


@contextmanager
def servers(*modes: str) -> Iterator[list[str]]:
    """One latency server per mode, stopped on the way out."""
    procs = [start("--mode", mode) for mode in modes]
    try:
        yield [url for _, url in procs]
    finally:
        for proc, _ in procs:
            stop(proc)


def view(b: OpenAICompatBackend) -> dict[str, Any]:
    return {v.url: v for v in b.servers()}


# -- the balancer's rules, as pure functions ----------------------------------------------------------------------
def test_health_rules() -> None:
    from ragate.backends.fleet import HealthPolicy, ServerState, answered, failed, probed

    policy = HealthPolicy(fail_after=2, probe_backoff=0.5, probe_max=4.0)
    s = failed(ServerState(), "HTTP 503", policy, now=100.0, wall=1.0)
    assert s.up and s.failures == 1  # one failure: still up
    s = failed(s, "HTTP 503", policy, now=100.0, wall=2.0)
    assert not s.up and s.since == 2.0 and s.next_probe == 100.5 and s.problem == "HTTP 503"
    s = probed(s, "refused", policy, now=101.0, wall=3.0)  # each failed probe doubles the wait
    assert not s.up and s.next_probe == 102.0
    s = probed(s, "refused", policy, now=102.0, wall=4.0)
    assert s.next_probe == 104.0
    for _ in range(5):
        s = probed(s, "refused", policy, now=200.0, wall=5.0)
    assert s.next_probe == 204.0  # capped at probe_max
    s = probed(s, None, policy, now=210.0, wall=6.0)
    assert s.up and s.probation and s.since == 6.0
    s = failed(s, "not JSON", policy, now=220.0, wall=7.0)  # on probation: one failure is enough
    assert not s.up and s.next_probe == 221.0  # and it went down twice without answering a call: 1 s
    s = answered(probed(s, None, policy, now=230.0, wall=8.0), wall=9.0)
    assert s == ServerState(up=True, since=8.0)  # a call answered: a clean record
    assert not failed(ServerState(), "refused", policy, now=0.0, wall=0.0, gone=True).up  # nothing listens
    assert answered(failed(ServerState(), "x", policy, now=0, wall=0, gone=True), wall=5.0).up


# -- an upstream that hangs or floods -----------------------------------------------------------------------------
def test_slow_headers_end_at_the_timeout_and_fail_over() -> None:
    """A server that sends one header byte every 0.1 s answers each read in time and never finishes: the call
    ends at ``timeout`` all the same, and in a fleet goes on to another server."""
    with servers("slow-headers", "ok") as (slow, good):
        lone = backend(slow, timeout=1.0)
        outcome, took = bounded(lambda: lone.generate([ask(0)]), 10)
        assert isinstance(outcome, BackendTimeoutError), outcome
        assert "timed out after 1 s" in str(outcome) and slow in str(outcome)
        assert took < 3, took
        fleet = backend([slow, good], timeout=1.0)
        for i in range(4):
            outcome, took = bounded(lambda i=i: fleet.generate([ask(i)]), 10)  # type: ignore[misc]
            assert isinstance(outcome, list) and outcome[0].text, outcome
            assert took < 3, took
        state = view(fleet)
        assert not state[slow].up and "no complete answer within 1 s" in state[slow].problem
        assert state[good].up and posts(good) == 4


FLOOD = r"""
import inspect, json, sys
from ragate.backends.openai_compat import OpenAICompatBackend
from ragate.types import GenerationRequest

def kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))

good, flood, cap = sys.argv[1], sys.argv[2], int(sys.argv[3])
capped = "max_reply_bytes" in inspect.signature(OpenAICompatBackend).parameters
options = {"model": "latency-stub", "logprobs": "on", "timeout": 5, "max_retries": 0}
options |= {"max_reply_bytes": cap} if capped else {}
ask = GenerationRequest("What is the capital of France?", max_tokens=4)
OpenAICompatBackend(good, **options).generate([ask])  # every import and first allocation made
out = []
for urls in ([flood], [flood, good]):
    b = OpenAICompatBackend(urls, **options)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak (VmHWM) starts again from here
    before = kib("VmRSS")
    try:
        text, error = b.generate([ask])[0].text, None
    except Exception as err:
        text, error = None, f"{type(err).__name__}: {err}"
    out.append({"urls": len(urls), "before_kib": before, "peak_kib": kib("VmHWM"), "text": text, "error": error})
print(json.dumps(out))
"""
CAP = 2**20  # 1 MiB
MARGIN_KIB = 6 * 1024


def test_an_endless_body_stops_at_the_reply_cap(tmp_path: Path) -> None:
    """A server that streams a body without end (here: 64 MiB, then silence) costs the process holding the backend
    no more memory than the cap and a small margin: the lone server's call fails naming the cap, a fleet's goes on
    to the other server. Measured in a subprocess, from the peak RSS (VmHWM, reset before each call)."""
    script = tmp_path / "flood.py"
    script.write_text(FLOOD)
    good_proc, good = start()
    flood_proc, flood = start("--mode", "flood", "--flood-mb", "64")
    try:
        run = subprocess.run(
            [sys.executable, str(script), good, flood, str(CAP)],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        stop(good_proc)
        stop(flood_proc)
    assert run.returncode == 0, run.stderr[-3000:]
    lone, fleet = json.loads(run.stdout)
    for case in (lone, fleet):
        growth = case["peak_kib"] - case["before_kib"]
        print(f"flood, {case['urls']} server(s): RSS {case['before_kib']} KiB -> peak {case['peak_kib']} KiB")
        assert growth < CAP // 1024 + MARGIN_KIB, (growth, case)
    assert (
        lone["text"] is None and "BadReplyError" in lone["error"] and f"cap of {CAP} bytes" in lone["error"]
    )
    assert "max-reply-bytes" in lone["error"]
    assert fleet["error"] is None and fleet["text"]


# -- a reply that is not an answer --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("mode", "said"),
    [
        ("not-json", "not JSON"),
        ("no-choices", "choices"),
        # a logprob that is not one: it used to fail every answer with a 500 blaming the targ-margin gate
        ("nan-logprobs", "= nan, which is not a log-probability"),
        ("inf-logprobs", "= -inf, which is not a log-probability"),
        ("positive-logprobs", "= 5.0, which is not a log-probability"),
    ],
)
def test_a_malformed_reply_fails_over_and_puts_its_server_down(mode: str, said: str) -> None:
    """HTTP 200 with a body that is no completion is a failure of that server: the call goes on to another, and
    after two such failures the server is down and gets no more calls (its probes, one-token calls, fail the
    same way, so it stays down; its GET /models would have let it back)."""
    with servers(mode, "ok") as (bad, good):
        fleet = backend([bad, good])
        for i in range(8):
            outcome, _ = bounded(lambda i=i: fleet.generate([ask(i)]), 20)  # type: ignore[misc]
            assert isinstance(outcome, list) and outcome[0].text, outcome
        assert posts(good) == 8
        state = view(fleet)
        assert state[bad].calls == 2 and posts(bad) <= 4  # two calls, and a probe or two
        assert not state[bad].up and said in state[bad].problem and state[good].up
        with pytest.raises(BackendError, match=said) as err:
            backend(bad).generate([ask(0)])
        assert not isinstance(err.value, BackendUnavailableError | BackendTimeoutError)  # 502, not 503 or 504


# -- a fleet that heals -------------------------------------------------------------------------------------------
def test_a_killed_server_re_enters_when_it_answers_again() -> None:
    """Kill one of two servers: calls go to the other. Restart it at its URL: it gets calls again. Kill the other:
    calls go to the restarted one. Restart that: both answer."""
    ports = [free_port(), free_port()]
    (a, url_a), (b, url_b) = start(port=ports[0]), start(port=ports[1])
    try:
        fleet = backend([url_a, url_b])
        calls = iter(range(10**6))

        def call() -> None:
            outcome, _ = bounded(lambda: fleet.generate([ask(next(calls))]), 20)
            assert isinstance(outcome, list), outcome

        for _ in range(4):
            call()
        stop(a)
        for _ in range(4):
            call()
        a, _ = start(port=ports[0])
        until(lambda: posts(url_a) > 0, 15, "the restarted server got no call", call)
        stop(b)  # every call is answered, by the one that came back
        until(lambda: not view(fleet)[url_b].up, 10, "the killed server was not marked down", call)
        state = view(fleet)
        assert state[url_a].up and "could not connect" in state[url_b].problem
        b, _ = start(port=ports[1])
        until(lambda: posts(url_b) > 0, 15, "the second restarted server got no call", call)
        assert all(v.up for v in fleet.servers())
    finally:
        stop(a)
        stop(b)


def test_slow_headers_do_not_hold_the_service(tmp_path: Path) -> None:
    """``ragate serve --openai-timeout 1`` over a server that starts trickling its headers: requests get 504 after
    about a second, not at ``--timeout``, and leave their slots; once the server answers again, so does the
    service, its first retrieval loading the demo index's encoder (before: the slots stayed taken by calls that
    never ended, and every later request got 429 or 504)."""
    from test_service import _serve, _stop

    proc, upstream = start()
    args = ["--base-url", upstream, "--model", MODEL, "--method", "targ-margin", "--openai-timeout", "1"]
    args += ["--timeout", "30", "--max-concurrency", "2"]  # room for the first retrieval to load the encoder
    service, url = _serve(args, tmp_path / "serve.log", env={"RAGATE_API_KEY": ""})
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            set_mode(upstream, "slow-headers")

            def ask_service() -> httpx.Response:
                return client.post("/v1/answer", json={"question": "What is the capital of France?"})

            results = [bounded(ask_service, 20) for _ in range(2)]
            for r, took in results:
                assert isinstance(r, httpx.Response) and r.status_code == 504, r
                assert took < 5, (took, r.text)  # --openai-timeout 1 ended it, not --timeout 30
            set_mode(upstream, "ok")
            r, _ = bounded(ask_service, 40)
            assert isinstance(r, httpx.Response) and r.status_code == 200, r
    finally:
        stop(proc)
        _stop(service)


def test_the_reply_cap_is_a_serve_option(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from ragate.cli import serve
    from ragate.errors import RagateError

    monkeypatch.delenv("RAGATE_API_KEY", raising=False)
    parser = argparse.ArgumentParser()
    serve.register(parser.add_subparsers())
    base = ["serve", "--base-url", "http://127.0.0.1:1/v1"]
    settings = serve.settings_from_args(parser.parse_args([*base, "--max-reply-bytes", "4096"]))
    assert settings.backend_options["max_reply_bytes"] == 4096
    assert serve.settings_from_args(parser.parse_args(base)).max_reply_bytes == 32 * 2**20
    with pytest.raises(RagateError, match="--max-reply-bytes must be at least 1024"):
        serve.settings_from_args(parser.parse_args([*base, "--max-reply-bytes", "10"]))
