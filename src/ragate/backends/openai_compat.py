"""A backend for any OpenAI-compatible server (vLLM, SGLang, llama.cpp's server, llama-cpp-python's server).

This is how ragate scales out: the model runs in a server, ragate sends HTTP requests with ``httpx``. Like
lm-evaluation-harness's API models, the backend fills three hooks: :meth:`OpenAICompatBackend.payload` builds
the request body, :func:`parse_steps` reads the per-token logprobs and :func:`parse_text` the answer text.

Text prompts go to ``POST {base_url}/completions`` (``logprobs: k``), message prompts to
``POST {base_url}/chat/completions`` (``logprobs: true, top_logprobs: k``). Only standard OpenAI parameters are
sent, plus ``repetition_penalty`` (vLLM's and SGLang's name) when a request sets it; server-specific ones (e.g.
llama-cpp-python's ``repeat_penalty``, which it sets to 1.1 unless told otherwise) go through ``extra_body``.
Log-probabilities are whatever the server computes (llama-cpp-python and vLLM report the model's raw
distribution, before sampling); servers return only the top k, so ``Generation.entropies`` is ``None``.

Offsets: when the server gives each token's bytes (chat), spans come from decoding them; otherwise the token
strings are aligned with the text. Characters no token string accounts for (a character split over tokens that
the server shows as empty or as U+FFFD) go to the last unmatched token before them; tokens past the end of the
text (the stop string, which the text leaves out) are dropped. ``completion_tokens`` is the server's ``usage``.
"""

from __future__ import annotations

import codecs
import email.utils
import json
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import httpx

from ragate.backends.base import Backend, Capabilities
from ragate.errors import BackendError, BackendTimeoutError, BackendUnavailableError, CapabilityError
from ragate.types import FinishReason, Generation, GenerationRequest, TopLogprob

_log = logging.getLogger("ragate")

Step = tuple[str, float, list[tuple[str, float]], bytes | None]  # token, logprob, alternatives, raw bytes


class OpenAICompatBackend(Backend):
    """Requests to an OpenAI-compatible server at ``base_url``, which must include the ``/v1`` part, or to a fleet
    of servers serving one model: ``base_url`` a sequence of URLs.

    A fleet's requests are spread over its servers, each to the one with the fewest requests in flight (ties: the
    one sent the fewest so far, so one call at a time takes turns); a retry
    goes to whichever is least busy then. A server that cannot be connected to is left out for the rest of the
    backend's life (a warning names it) while others answer; when none is left the call fails with
    :class:`BackendUnavailableError` naming every server. The servers must serve the same model: each one's first
    ``GET /models`` id is compared when the backend opens, and a difference is an error.

    ``model`` defaults to the first id of ``GET {base_url}/models``. ``api_key`` defaults to ``$OPENAI_API_KEY``.
    Each HTTP exchange takes at most ``timeout`` seconds; 429, 5xx and dropped connections are retried
    ``max_retries`` times after ``backoff * 2**attempt`` seconds (or the server's ``Retry-After``, capped at
    ``timeout``), so a request never takes longer than ``(max_retries + 1) * timeout`` plus those waits.
    4xx answers and timeouts are not retried. A batch is sent over at most ``max_concurrency`` connections.

    ``logprobs`` says what the server returns: ``"auto"`` (the default) asks once, with a one-token request for
    ``top_k`` alternatives, and sets :attr:`capabilities` from the answer (an error or an answer without
    logprobs: none; fewer alternatives than asked: that many); ``"on"`` trusts ``top_k`` without asking;
    ``"off"`` never asks for logprobs (text only: only the gates that need none run, see
    :mod:`ragate.methods.needs`). :attr:`capability_note` says how the capabilities were found.
    """

    engine = "openai"

    def __init__(
        self,
        base_url: str | Sequence[str],
        model: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        max_concurrency: int = 4,
        top_k: int = 20,
        extra_body: Mapping[str, Any] | None = None,
        logprobs: Literal["auto", "on", "off"] = "auto",
    ) -> None:
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not urls:
            raise ValueError("base_url: give at least one server URL, e.g. http://127.0.0.1:8000/v1")
        for url in urls:
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise ValueError(
                    f"base_url must be an http(s) URL such as http://127.0.0.1:8000/v1, got {url!r}"
                )
        if len(set(urls)) < len(urls):
            raise ValueError(f"base_url names a server twice: {urls}")
        if logprobs not in ("auto", "on", "off"):
            raise ValueError(f"logprobs must be 'auto', 'on' or 'off', got {logprobs!r}")
        if timeout <= 0 or max_retries < 0 or backoff < 0 or max_concurrency < 1 or top_k < 0:
            raise ValueError(
                "need timeout > 0, max_retries >= 0, backoff >= 0, max_concurrency >= 1, top_k >= 0"
            )
        self.base_urls = tuple(url.rstrip("/") for url in urls)
        self.base_url = self.base_urls[0]
        self._in_flight = dict.fromkeys(self.base_urls, 0)
        self._sent = dict.fromkeys(self.base_urls, 0)
        self._down: dict[str, str] = {}  # a fleet's servers that refused connection, and why
        self._pick_lock = threading.Lock()
        self.timeout, self.max_retries, self.backoff = timeout, max_retries, backoff
        self.max_concurrency = max_concurrency
        self.extra_body = dict(extra_body or {})
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        connections = max_concurrency * len(self.base_urls)  # each server gets max_concurrency at once
        self._client = httpx.Client(
            headers=headers,
            timeout=timeout,
            limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
        )
        self.capabilities = _caps(top_k if logprobs != "off" else None)
        self.capability_note = {"on": "logprobs=on: not checked", "off": "logprobs=off: text only"}.get(
            logprobs, ""
        )
        served = self._served_models() if model is None or len(self.base_urls) > 1 else {}
        self.model = model if model is not None else next(iter(served.values()))
        if logprobs == "auto":
            self.capabilities, self.capability_note = self._probe(top_k)

    def _probe(self, top_k: int) -> tuple[Capabilities, str]:
        """Ask once for a one-token chat answer with ``top_k`` alternatives and read what comes back."""
        body = {"model": self.model, "messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 1,
                "temperature": 0.0, **self.extra_body}  # fmt: skip
        try:
            answer = self._request(
                "POST", "/chat/completions", {**body, "logprobs": True, "top_logprobs": top_k}
            )
        except BackendError as e:
            self._request("POST", "/chat/completions", body)  # a server that fails this too is broken: raise
            return _caps(None), f"probed: the server refuses logprobs ({str(e)[:200]})"
        try:
            steps = parse_steps(answer["choices"][0])
        except (KeyError, IndexError, TypeError, ValueError):
            steps = None
        if not steps:
            return _caps(None), "probed: the server returns no logprobs"
        seen = max(len(s[2]) for s in steps)
        return _caps(min(top_k, seen)), f"probed: token logprobs with top-{min(top_k, seen)} alternatives"

    def _served_models(self) -> dict[str, str]:
        """Each server's first ``GET /models`` id; a fleet whose servers serve different models is an error."""
        served: dict[str, str] = {}
        for url in self.base_urls:
            try:
                data = self._request("GET", "/models", server=url).get("data") or []
            except BackendUnavailableError as err:
                if len(self.base_urls) == 1 or len(self._down) == len(self.base_urls) - 1:
                    raise  # nothing left to answer
                self._leave_out(url, str(err).split(" (")[0])
                continue
            if not data or not isinstance(data[0], dict) or "id" not in data[0]:
                raise BackendError(
                    f"the server at {url}/models lists no models; pass the model name explicitly (model=...)"
                )
            served[url] = str(data[0]["id"])
        if len(set(served.values())) > 1:
            said = ", ".join(f"{url} serves {name!r}" for url, name in served.items())
            raise BackendError(
                f"the servers serve different models ({said}): a fleet answers with one model, or its answers "
                "would depend on which server took each call; give only servers of the same model"
            )
        return served

    # -- hook 1: the request body ---------------------------------------------------------------------------------
    def payload(self, request: GenerationRequest) -> tuple[str, dict[str, Any]]:
        """The endpoint path and JSON body for ``request`` (standard OpenAI parameters plus ``extra_body``)."""
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
        }
        if request.stop:
            body["stop"] = list(request.stop)
        if request.seed is not None:
            body["seed"] = request.seed
        if request.repetition_penalty != 1.0:
            body["repetition_penalty"] = (
                request.repetition_penalty
            )  # vLLM / SGLang name; not OpenAI's own API
        asks = self.capabilities.logprobs
        if isinstance(request.prompt, str):
            path = "/completions"
            body.update(prompt=request.prompt + request.assistant_prefix)
            if asks:
                body.update(logprobs=request.top_logprobs)
        else:
            if request.assistant_prefix:
                raise CapabilityError(
                    "continuing an assistant prefix through /chat/completions is server-specific; "
                    "send a text prompt (the model's chat template applied) to continue a draft"
                )
            path = "/chat/completions"
            messages = [{"role": m.role, "content": m.content} for m in request.prompt]
            body.update(messages=messages)
            if asks:
                body.update(logprobs=True, top_logprobs=request.top_logprobs)
        return path, {**body, **self.extra_body}

    def _generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        if len(requests) <= 1 or self.max_concurrency == 1:
            return [self._one(r) for r in requests]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(requests))) as pool:
            futures = [pool.submit(self._one, r) for r in requests]
            try:
                return [f.result() for f in futures]
            except BaseException:
                for f in futures:
                    f.cancel()
                raise

    def _one(self, request: GenerationRequest) -> Generation:
        path, body = self.payload(request)
        start = time.perf_counter()
        answer = self._request("POST", path, body)
        seconds = time.perf_counter() - start
        try:
            choice = answer["choices"][0]
            text, steps = parse_text(choice), parse_steps(choice)
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise BackendError(
                f"unexpected answer from {self.base_url}{path}: {e!r}; is it OpenAI-compatible?"
            ) from e
        finish: FinishReason = "length" if choice.get("finish_reason") == "length" else "stop"
        usage = answer.get("usage") or {}
        if not self.capabilities.logprobs:  # text only: no per-token steps
            return Generation(
                text=text, tokens=(), token_ids=(), logprobs=(), top_logprobs=(), offsets=(),
                finish_reason=finish, prompt_tokens=int(usage.get("prompt_tokens") or 0),
                completion_tokens=int(usage.get("completion_tokens") or 0), seconds=seconds,
            )  # fmt: skip
        if steps is None:
            raise BackendError(
                f"the server at {self.base_url} returned no logprobs although they were requested: it does not "
                "support logprobs (for llama-cpp-python start it with --logits_all true; for vLLM set "
                "--max-logprobs >= top_logprobs), or run text-only gates with logprobs='off'"
            )
        offsets = align_offsets(text, steps)
        steps = steps[: len(offsets)]
        k = request.top_logprobs
        ids = [_token_id(s[0]) for s in steps]
        return Generation(
            text=text,
            tokens=tuple(s[0] for s in steps),
            token_ids=tuple(i for i in ids if i is not None) if all(i is not None for i in ids) else (),
            logprobs=tuple(s[1] for s in steps),
            top_logprobs=tuple(
                tuple(TopLogprob(_token_id(t), t, lp) for t, lp in sorted(s[2], key=lambda a: -a[1])[:k])
                for s in steps
            ),
            offsets=tuple(offsets),
            finish_reason=finish,
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or len(steps)),
            seconds=seconds,
        )

    # -- HTTP with retries ----------------------------------------------------------------------------------------
    def _pick(self) -> str:
        """The live server with the fewest requests in flight (of those, the one sent the fewest so far)."""
        with self._pick_lock:
            live = [url for url in self.base_urls if url not in self._down]
            if not live:
                said = "; ".join(f"{url}: {why}" for url, why in self._down.items())
                raise BackendUnavailableError(
                    f"every OpenAI-compatible server of the fleet is down ({said}); restart them (or give others "
                    "with --base-url) and rerun with --resume: the answers so far are kept"
                )
            url = min(live, key=lambda u: (self._in_flight[u], self._sent[u]))  # ties: the least used so far
            self._in_flight[url] += 1
            self._sent[url] += 1
            return url

    def _leave_out(self, url: str, why: str) -> None:
        """A fleet's server that cannot be reached answers no more calls while others can."""
        with self._pick_lock:
            if len(self.base_urls) > 1 and url not in self._down:
                self._down[url] = why
                left = len(self.base_urls) - len(self._down)
                _log.warning("ragate: the server at %s is down (%s); %d other(s) go on", url, why, left)

    def _request(
        self, method: str, path: str, body: dict[str, Any] | None = None, *, server: str | None = None
    ) -> dict[str, Any]:
        """One call, retried on 429, 5xx and dropped connections. In a fleet each attempt goes to the least busy
        live server (``server`` pins the call to one), and a server that cannot be connected to is left out and
        the call tried at once on another, without counting the attempt."""
        problems: list[str] = []  # distinct failures, in order
        fleet = server is None and len(self.base_urls) > 1
        url, attempt = f"{server or self.base_url}{path}", 0
        while attempt <= self.max_retries:
            delay = self.backoff * 2**attempt
            base = self._pick() if fleet else server or self.base_url
            url = f"{base}{path}"
            try:
                status, headers, content = self._send(method, url, body)
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                problem = f"{type(e).__name__}: could not connect" + (
                    f" within {self.timeout} s" if isinstance(e, httpx.ConnectTimeout) else f" ({e})"
                )
                if fleet:
                    self._leave_out(base, problem)
                    continue  # another server takes it now (or _pick says every one is down)
            except httpx.PoolTimeout:
                problem = f"PoolTimeout: no free connection within {self.timeout} s"
            except httpx.TimeoutException as e:
                raise BackendTimeoutError(
                    f"request to {url} timed out after {self.timeout} s ({type(e).__name__}); raise the timeout "
                    "(timeout=..., --openai-timeout) or ask for fewer tokens (max_tokens)"
                ) from e
            except httpx.TransportError as e:  # ReadError, RemoteProtocolError, WriteError, ...
                problem = f"{type(e).__name__}: {e}"
            else:
                if status < 400:
                    try:
                        return dict(json.loads(content))
                    except (ValueError, TypeError) as e:
                        raise BackendError(
                            f"{url} answered HTTP {status} with a body that is not JSON"
                        ) from e
                message = _error_message(content)
                if status != 429 and status < 500:
                    raise BackendError(
                        f"{method} {url} failed with HTTP {status}: {message}{self._hint(status)}"
                    )
                problem = f"HTTP {status}: {message}"
                delay = _retry_after(headers.get("Retry-After"), default=delay, cap=self.timeout)
            finally:
                if fleet:
                    with self._pick_lock:
                        self._in_flight[base] -= 1
            if problem not in problems:
                problems.append(problem)
            if attempt < self.max_retries:
                time.sleep(delay)
            attempt += 1
        attempts, problem = f"{self.max_retries + 1} attempts", "; then ".join(problems)
        if problems[-1].startswith("HTTP"):
            raise BackendUnavailableError(
                f"OpenAI-compatible server at {url} failed on all {attempts} ({problem}); "
                "check the server's log, or retry later if it is overloaded"
            )
        raise BackendUnavailableError(
            f"OpenAI-compatible server at {url} is unreachable or closed the connection ({attempts}: "
            f"{problem}); is it running? check --openai-base-url"
        )

    def _send(self, method: str, url: str, body: dict[str, Any] | None) -> tuple[int, httpx.Headers, bytes]:
        """One HTTP exchange that takes at most ``timeout`` seconds in all (httpx bounds each read, not the sum)."""
        deadline = time.monotonic() + self.timeout
        with self._client.stream(method, url, json=body) as response:
            chunks = []
            for chunk in response.iter_bytes():
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    raise httpx.ReadTimeout("the answer took too long", request=response.request)
            return response.status_code, response.headers, b"".join(chunks)

    def _hint(self, status: int) -> str:
        if status == 404 and not self.base_url.endswith("/v1"):
            return f"; base_url must include /v1 (e.g. {self.base_url}/v1)"
        if status == 404:
            return "; the server has no such endpoint: is it OpenAI-compatible, and is base_url its /v1 root?"
        if status in (401, 403):
            return "; check the API key (api_key=... or $OPENAI_API_KEY)"
        return ""

    def close(self) -> None:
        self._client.close()

    def __repr__(self) -> str:
        where = self.base_url if len(self.base_urls) == 1 else list(self.base_urls)
        return f"OpenAICompatBackend(base_url={where!r}, model={self.model!r})"


def _caps(top_k: int | None) -> Capabilities:
    """An OpenAI-style server's capabilities: token logprobs with ``top_k`` alternatives, or none (``None``)."""
    return Capabilities(
        logprobs=top_k is not None, top_k=top_k or 0, attentions=False, sampling=True, chat_template=True,
        full_distribution=False, token_ids=False, prefix_cache=False, continues=False,
    )  # fmt: skip


# -- hooks 2 and 3: the answer ----------------------------------------------------------------------------------
def parse_text(choice: Mapping[str, Any]) -> str:
    """The generated text of one choice (``text`` for completions, ``message.content`` for chat)."""
    if "message" in choice:
        return str(choice["message"].get("content") or "")
    return str(choice.get("text") or "")


def parse_steps(choice: Mapping[str, Any]) -> list[Step] | None:
    """Per-token (token, logprob, alternatives, bytes) of one choice; ``None`` when the server sent no logprobs."""
    lp = choice.get("logprobs")
    if "message" in choice:
        content = lp.get("content") if isinstance(lp, Mapping) else None
        if content is None:
            return None if parse_text(choice) else []
        return [
            (
                str(c["token"]),
                float(c["logprob"]),
                [(str(t["token"]), float(t["logprob"])) for t in c.get("top_logprobs") or []],
                bytes(c["bytes"]) if c.get("bytes") is not None else None,
            )
            for c in content
        ]
    if not isinstance(lp, Mapping) or lp.get("tokens") is None:
        return None if parse_text(choice) else []
    tops = lp.get("top_logprobs") or [None] * len(lp["tokens"])
    return [
        (str(t), float(p), [(str(a), float(b)) for a, b in (top or {}).items()], None)
        for t, p, top in zip(lp["tokens"], lp["token_logprobs"], tops, strict=True)
    ]


def align_offsets(text: str, steps: Sequence[Step]) -> list[tuple[int, int]]:
    """Character spans of the steps in ``text``; steps past the end of the text (a stop string) get none.

    With every token's bytes, a token that ends inside a character gets an empty span and the token completing
    it covers it. Otherwise token strings are matched left to right; see the module docstring.
    """
    if steps and all(s[3] is not None for s in steps):
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pieces = [decoder.decode(s[3] or b"") for s in steps]
        if "".join(pieces).startswith(text):
            spans, pos = [], 0
            for piece in pieces:
                if pos >= len(text) and piece:
                    break  # the text ended: the rest is the stop string
                spans.append((pos, min(pos + len(piece), len(text))))
                pos += len(piece)
            return spans
    spans, pos, unmatched = [], 0, 0  # unmatched: steps just before pos whose string was not found
    for token, *_ in steps:
        if pos == len(text) and token:
            break  # the text ended: the rest is the stop string
        if text.startswith(token, pos) and token:
            spans.append((pos, pos + len(token)))
            pos, unmatched = pos + len(token), 0
        elif token and token.startswith(text[pos:]):  # the text ends inside this token
            spans.append((pos, len(text)))
            pos, unmatched = len(text), 0
        else:
            found = text.find(token, pos, pos + unmatched + len(token)) if token and unmatched else -1
            if found > pos:  # the skipped characters belong to the last unmatched step
                spans[-1] = (pos, found)
                spans.append((found, found + len(token)))
                pos, unmatched = found + len(token), 0
            else:
                spans.append((pos, pos))
                unmatched += 1
    if spans and pos < len(text):  # text no token string explains goes to the last step
        spans[-1] = (spans[-1][0], len(text))
    return spans


def _token_id(token: str) -> int | None:
    """The id in vLLM's ``token_id:123`` token strings (``--return-tokens-as-token-ids``), else ``None``."""
    if token.startswith("token_id:") and token[9:].isdigit():
        return int(token[9:])
    return None


def _error_message(content: bytes) -> str:
    """The server's error message (OpenAI's ``error.message``, FastAPI's ``detail``) on one line."""
    try:
        body = json.loads(content)
    except ValueError:
        return " ".join(content.decode("utf-8", "replace").split())[:500] or "(empty body)"
    if isinstance(body, Mapping):
        error = body.get("error", body.get("detail", body.get("message", body)))
        body = error.get("message", error) if isinstance(error, Mapping) else error
    return " ".join((body if isinstance(body, str) else json.dumps(body)).split())[:500]


def _retry_after(value: str | None, *, default: float, cap: float) -> float:
    """Seconds to wait from a ``Retry-After`` header (seconds or HTTP date), else ``default``; at most ``cap``."""
    if value is None:
        return default
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return default
    return min(max(seconds, 0.0), cap)
