"""A stand-in for a GPU inference server with many slots: an OpenAI-compatible HTTP server that answers every call
after a fixed latency, so concurrency benchmarks and tests measure ragate's scheduling, not a model.

    .venv/bin/python benchmarks/latency_server.py [--host 127.0.0.1] [--port 0] [--latency 0.2] \
        [--model latency-stub] [--fail STATUS:N] [--top-k 20] [--mode ok] [--flood-mb 0] [--no-logprobs]

Once listening it prints one line, its base URL (``http://127.0.0.1:PORT/v1``), then serves until SIGTERM or
SIGINT. It answers ``GET /v1/models``, ``GET /v1/stats`` (POSTs answered and failed, the most in flight at once),
``POST /v1/completions`` and ``POST /v1/chat/completions`` in the formats
:mod:`ragate.backends.openai_compat` parses. Each POST sleeps ``--latency`` seconds in its own thread, so 16 calls
in flight finish in about one latency. The answer is a function of the request's prompt (or messages),
``max_tokens`` and ``stop`` alone (a generator seeded with the sha256 of their sorted JSON): short sentences of
common words, each token " word" or ".", with logprobs in (-3, 0) and, per step, the chosen token first among
``min(k, --top-k)`` alternatives of lower logprob whose probabilities sum to less than 1. ``--fail 503:3`` answers
the first 3 POSTs HTTP 503 with ``Retry-After: 0`` (to exercise a client's retries). Import :func:`make_server`
and :func:`answer` to run it in-process.

``--mode`` makes it a hostile upstream, for the tests of a client's timeouts, reply cap and failover; a mode
changes how POSTs are answered (``GET /v1/models`` stays correct, as behind a proxy that answers for a broken
model server), and ``POST /v1/mode`` with ``{"mode": "..."}`` switches it while the server runs:

- ``ok``: the normal answers above;
- ``slow-headers``: the status line, then one header byte every 0.1 s for as long as the client listens;
- ``flood``: HTTP 200 and a chunked JSON body that never ends (``--flood-mb N``: it stops after N MiB and then
  sends nothing more, keeping the connection open);
- ``not-json``: HTTP 200 with ``Content-Type: application/json`` and a body cut in the middle of the JSON;
- ``no-choices``: HTTP 200 with valid JSON that has no ``choices``;
- ``nan-logprobs``, ``inf-logprobs``, ``positive-logprobs``: the normal answer with its second token's logprob
  NaN, -infinity or +5 (Python's JSON writes ``NaN`` and ``-Infinity``, as some servers do).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import MappingProxyType
from typing import Any

WORDS = (
    "the", "a", "of", "and", "to", "in", "is", "was", "it", "for", "on", "that", "with", "as", "by", "at",
    "from", "he", "she", "they", "his", "her", "which", "one", "first", "new", "year", "city", "time", "people",
    "state", "world", "part", "known", "name", "called", "after", "also", "most", "many", "film", "war",
    "river", "king", "song", "team", "born", "french", "american", "north",
)  # fmt: skip
VOCAB = tuple(f" {w}" for w in WORDS) + (".",)
MODES = ("ok", "slow-headers", "flood", "not-json", "no-choices", "nan-logprobs", "inf-logprobs", "positive-logprobs")
POISON = {"nan-logprobs": math.nan, "inf-logprobs": -math.inf, "positive-logprobs": 5.0}  # a token's logprob


def request_seed(body: dict[str, Any]) -> int:
    """The seed of a request's answer: sha256 of the JSON of its prompt or messages, max_tokens and stop."""
    stop = body.get("stop")
    key = {
        "prompt": body.get("prompt"),
        "messages": body.get("messages"),
        "max_tokens": body.get("max_tokens"),
        "stop": [stop] if isinstance(stop, str) else stop or [],
    }
    blob = json.dumps(key, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return int.from_bytes(hashlib.sha256(blob.encode("utf-8")).digest(), "big")


def answer(body: dict[str, Any], k: int) -> tuple[list[tuple[str, float, list[tuple[str, float]]]], str]:
    """The steps (token, logprob, ``k`` alternatives with the token first) and finish reason of ``body``'s answer."""
    rng = random.Random(request_seed(body))
    max_tokens = max(1, int(body.get("max_tokens") or 16))
    end = rng.randint(1, max_tokens) if rng.random() < 0.5 else None  # None: runs to max_tokens
    steps: list[tuple[str, float, list[tuple[str, float]]]] = []
    since_stop = 0
    for i in range(end or max_tokens):
        last = end is not None and i == end - 1
        period = last or (since_stop >= 3 and rng.random() < 0.15)
        token = "." if period else rng.choice(VOCAB[:-1])
        since_stop = 0 if period else since_stop + 1
        p = math.exp(rng.uniform(-2.99, -0.01))
        alternatives, mass, prev = [(token, math.log(p))], 1.0 - p, p
        for other in rng.sample([v for v in VOCAB if v != token], min(max(k - 1, 0), len(VOCAB) - 1)):
            q = min(prev, mass) * rng.uniform(0.2, 0.9)  # each below the last, the total below 1
            alternatives.append((other, math.log(q)))
            mass, prev = mass - q, q
        steps.append((token, math.log(p), alternatives[:k]))
    return steps, "length" if end is None else "stop"


def cut_at_stop(steps: list[Any], stop: list[str]) -> tuple[str, list[Any], bool]:
    """The text up to the first stop string and the steps that start before it; whether a stop string cut it."""
    text = "".join(s[0] for s in steps)
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=-1)
    if cut < 0:
        return text, steps, False
    kept, pos = [], 0
    for s in steps:
        if pos >= cut:
            break
        kept.append(s)
        pos += len(s[0])
    return text[:cut], kept, True


def completion(
    body: dict[str, Any], path: str, model: str, top_k: int, logprobs: bool = True
) -> dict[str, Any]:
    """The OpenAI-format answer to a POST of ``body`` to ``/v1/completions`` or ``/v1/chat/completions``
    (``logprobs`` False: never any logprobs, as a server that does not return them)."""
    chat = path.endswith("/chat/completions")
    lp: dict[str, Any]
    wants = logprobs and (bool(body.get("logprobs")) if chat else body.get("logprobs") is not None)
    k = min(int((body.get("top_logprobs") if chat else body.get("logprobs")) or 0), top_k) if wants else 0
    stop = body.get("stop") or []
    steps, finish = answer(body, k)
    text, steps, stopped = cut_at_stop(steps, [stop] if isinstance(stop, str) else list(stop))
    finish = "stop" if stopped else finish
    if chat:
        prompt = " ".join(str(m.get("content") or "") for m in body.get("messages") or [])
        lp = {"content": [
            {"token": t, "logprob": p, "bytes": list(t.encode()),
             "top_logprobs": [{"token": a, "logprob": b, "bytes": list(a.encode())} for a, b in alts]}
            for t, p, alts in steps
        ]}  # fmt: skip
        choice = {"index": 0, "message": {"role": "assistant", "content": text}}
    else:
        prompt = str(body.get("prompt") or "")
        offsets = [len(prompt) + sum(len(s[0]) for s in steps[:i]) for i in range(len(steps))]
        lp = {"tokens": [s[0] for s in steps], "token_logprobs": [s[1] for s in steps],
              "top_logprobs": [dict(s[2]) for s in steps], "text_offset": offsets}  # fmt: skip
        choice = {"index": 0, "text": text}
    choice |= {"logprobs": lp if wants else None, "finish_reason": finish}
    used = len(prompt.split())
    return {
        "id": f"cmpl-{request_seed(body) % 10**12}",
        "object": "chat.completion" if chat else "text_completion",
        "created": 0,
        "model": model,
        "choices": [choice],
        "usage": {"prompt_tokens": used, "completion_tokens": len(steps), "total_tokens": used + len(steps)},
    }


def make_server(
    latency: float = 0.2,
    model: str = "latency-stub",
    fail: tuple[int, int] | None = None,
    top_k: int = 20,
    host: str = "127.0.0.1",
    port: int = 0,
    mode: str = "ok",
    flood_mb: int = 0,
    logprobs: bool = True,
) -> ThreadingHTTPServer:
    """A bound server (one thread per connection, keep-alive); call ``serve_forever()`` to answer requests.
    ``fail`` = (status, n): the first n POSTs are answered ``status`` with ``Retry-After: 0``. ``mode``: how POSTs
    are answered (:data:`MODES`, see the module docstring); ``flood_mb``: where a flood stops (0: never);
    ``logprobs`` False: answers carry no logprobs, whatever is asked (a text-only API)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    failures = {"left": fail[1] if fail else 0}
    counts = {"posts": 0, "failed": 0, "in_flight": 0, "most_in_flight": 0}
    state = {"mode": mode}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep connections open, as real servers do

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def send(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            for name, value in {"Content-Type": "application/json", "Content-Length": str(len(data)),
                                **(headers or {})}.items():  # fmt: skip
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/v1/models":
                return self.send(200, {"object": "list", "data": [{"id": model, "object": "model"}]})
            if self.path.rstrip("/") == "/v1/stats":  # what a test or benchmark asks of the server
                with lock:
                    return self.send(200, {**counts, "mode": state["mode"]})
            self.send(404, {"error": {"message": f"no such path {self.path}"}})

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            path = self.path.rstrip("/")
            if path == "/v1/mode":
                wanted = json.loads(raw or b"{}").get("mode")
                if wanted not in MODES:
                    return self.send(400, {"error": {"message": f"mode must be one of {', '.join(MODES)}"}})
                with lock:
                    state["mode"] = wanted
                return self.send(200, {"mode": wanted})
            if path not in ("/v1/completions", "/v1/chat/completions"):
                return self.send(404, {"error": {"message": f"no such path {self.path}"}})
            with lock:
                failing = failures["left"] > 0
                failures["left"] -= failing
                counts["posts"] += 1
                counts["failed"] += failing
                hostile = HOSTILE.get(state["mode"])
            if hostile is not None:
                try:
                    return hostile(self, flood_mb)
                except OSError:  # the client gave up: what these modes wait for
                    self.close_connection = True
                    return
            if failing and fail is not None:
                message = {"error": {"message": f"simulated HTTP {fail[0]}", "type": "server_error"}}
                return self.send(fail[0], message, {"Retry-After": "0"})
            try:
                body = json.loads(raw)
                answered = completion(body, path, model, top_k, logprobs)
            except (ValueError, TypeError, AttributeError) as e:
                return self.send(400, {"error": {"message": f"bad request: {e}"}})
            if state["mode"] in POISON:
                _poison(answered, POISON[state["mode"]])
            with lock:
                counts["in_flight"] += 1
                counts["most_in_flight"] = max(counts["most_in_flight"], counts["in_flight"])
            try:
                time.sleep(latency)
            finally:
                with lock:
                    counts["in_flight"] -= 1
            self.send(200, answered)

    class Server(ThreadingHTTPServer):
        request_queue_size = 256  # the default backlog of 5 drops connections when many clients open at once
        daemon_threads = True

    return Server((host, port), Handler)


def _slow_headers(handler: BaseHTTPRequestHandler, flood_mb: int) -> None:
    """The status line, then a header that never ends, one byte every 0.1 s (each read a client makes is
    answered in time, the headers never are)."""
    handler.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Slow: ")
    handler.wfile.flush()
    for _ in range(36000):  # an hour: longer than any test, and bounded if nobody ever stops it
        handler.wfile.write(b"a")
        handler.wfile.flush()
        time.sleep(0.1)


def _flood(handler: BaseHTTPRequestHandler, flood_mb: int) -> None:
    """HTTP 200 and a JSON string that never closes, 64 KiB a chunk, as fast as the client reads (``flood_mb``:
    at most that many MiB, then silence with the connection open)."""
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    chunk = b"a" * 65536
    first = b'{"choices": [{"index": 0, "text": "'
    handler.wfile.write(b"%x\r\n%s\r\n" % (len(first), first))
    sent = 0
    while not flood_mb or sent < flood_mb * 2**20:
        handler.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        sent += len(chunk)
    handler.wfile.flush()
    time.sleep(3600)


def _not_json(handler: BaseHTTPRequestHandler, flood_mb: int) -> None:
    """HTTP 200, a JSON content type and a body cut in the middle of the JSON."""
    data = b'{"choices": [{"index": 0, "text": " Paris'
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def _no_choices(handler: BaseHTTPRequestHandler, flood_mb: int) -> None:
    """HTTP 200 with valid JSON that is not a completion: no ``choices``."""
    data = json.dumps({"id": "cmpl-0", "object": "text_completion", "model": "?"}).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def _poison(answer: dict[str, Any], value: float) -> None:
    """The answer's second token (the first where there is one) given the logprob ``value``."""
    lp = answer["choices"][0].get("logprobs") or {}
    if lp.get("content"):
        lp["content"][min(1, len(lp["content"]) - 1)]["logprob"] = value
    elif lp.get("token_logprobs"):
        lp["token_logprobs"][min(1, len(lp["token_logprobs"]) - 1)] = value


HOSTILE: MappingProxyType[str, Callable[[BaseHTTPRequestHandler, int], None]] = MappingProxyType(
    {"slow-headers": _slow_headers, "flood": _flood, "not-json": _not_json, "no-choices": _no_choices}
)


def _fail(value: str) -> tuple[int, int]:
    status, _, n = value.partition(":")
    return int(status), int(n or 1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: any free port (the printed URL says which)")
    p.add_argument("--latency", type=float, default=0.2, help="seconds each POST takes")
    p.add_argument("--model", default="latency-stub")
    p.add_argument(
        "--fail", type=_fail, default=None, metavar="STATUS:N", help="answer the first N POSTs STATUS"
    )
    p.add_argument("--top-k", type=int, default=20, help="most alternatives returned per token")
    p.add_argument(
        "--mode", choices=MODES, default="ok", help="how POSTs are answered (hostile modes: see above)"
    )
    p.add_argument("--flood-mb", type=int, default=0, help="with --mode flood: stop after N MiB (0: never)")
    p.add_argument("--no-logprobs", action="store_true", help="never return logprobs (a text-only API)")
    args = p.parse_args(argv)
    server = make_server(
        args.latency, args.model, args.fail, args.top_k, args.host, args.port, args.mode, args.flood_mb,
        logprobs=not args.no_logprobs,
    )  # fmt: skip
    for sig in (signal.SIGTERM, signal.SIGINT):  # also when started with SIGINT ignored (a shell's `&`)
        signal.signal(sig, lambda *_: sys.exit(0))
    print(f"http://{args.host}:{server.server_address[1]}/v1", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
