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
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from ragate.backends.base import Backend, Capabilities
from ragate.backends.fleet import HealthPolicy, ServerView
from ragate.backends.upstream import MAX_REPLY_BYTES, BadAnswer, BadReplyError, ProbeRequest, Upstream
from ragate.errors import BackendError, BackendTimeoutError, BackendUnavailableError, CapabilityError
from ragate.types import FinishReason, Generation, GenerationRequest, TopLogprob

Step = tuple[str, float, list[tuple[str, float]], bytes | None]  # token, logprob, alternatives, raw bytes


class OpenAICompatBackend(Backend):
    """Requests to an OpenAI-compatible server at ``base_url``, which must include the ``/v1`` part, or to a fleet
    of servers serving one model: ``base_url`` a sequence of URLs.

    A fleet's calls are spread over its servers that are up, each to the one with the fewest calls in flight
    (ties: the one sent the fewest so far, so one call at a time takes turns). A call that fails on a server
    (no connection, no complete answer within ``timeout``, HTTP 5xx, a reply over ``max_reply_bytes`` or one that
    is not an OpenAI answer) goes on at once to another; a server that fails ``fail_after`` calls in a row, or
    that nothing listens on, is down: it gets no calls, and is probed (a one-token call) after ``probe_backoff``
    seconds, doubling up to ``probe_max``, until it answers and is back (the rules: :mod:`ragate.backends.fleet`;
    :meth:`servers` says what the balancer believes, :meth:`check_servers` probes first; the HTTP:
    :mod:`ragate.backends.upstream`). When none is up a call
    fails with :class:`BackendUnavailableError` naming each server and its next probe. The servers must serve the
    same model: each one's first ``GET /models`` id is compared when the backend opens, and a difference is an
    error.

    ``model`` defaults to the first id of ``GET {base_url}/models``. ``api_key`` defaults to ``$OPENAI_API_KEY``.
    Each HTTP exchange takes at most ``timeout`` seconds in all (connect, headers and body together, however
    slowly a server trickles them) and reads at most ``max_reply_bytes`` of reply. 429, 5xx and dropped
    connections are retried ``max_retries`` times after ``backoff * 2**attempt`` seconds (or the server's
    ``Retry-After``, capped at ``timeout``); each attempt tries each server that is up at most once. Other 4xx
    answers are the request's fault and are not retried; a timeout, an oversized or a malformed reply is retried
    only on another server. A batch is sent over at most ``max_concurrency`` connections per server.

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
        max_reply_bytes: int = MAX_REPLY_BYTES,
        fail_after: int = 2,
        probe_backoff: float = 0.5,
        probe_max: float = 15.0,
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
        if max_reply_bytes < 1024:
            raise ValueError(
                f"max_reply_bytes must be at least 1024 (a one-token answer is longer), got {max_reply_bytes}"
            )
        self.base_urls = tuple(url.rstrip("/") for url in urls)
        self.base_url = self.base_urls[0]
        self._calls_path = "/chat/completions"  # the endpoint calls use, once one was made: what probes ask
        self.timeout, self.max_retries, self.backoff = timeout, max_retries, backoff
        self.max_reply_bytes = max_reply_bytes
        self.max_concurrency = max_concurrency
        self.extra_body = dict(extra_body or {})
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self._upstream = Upstream(
            self.base_urls,
            headers={"Authorization": f"Bearer {key}"} if key else {},
            timeout=timeout,
            max_retries=max_retries,
            backoff=backoff,
            connections=max_concurrency * len(self.base_urls),  # each server gets max_concurrency at once
            max_reply_bytes=max_reply_bytes,
            policy=HealthPolicy(fail_after, probe_backoff, probe_max),
            probe_request=self._probe_request,
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
        """Each server's first ``GET /models`` id; a fleet whose servers serve different models is an error. A
        fleet's server that does not answer is down from the start (probed like any down server)."""
        served: dict[str, str] = {}
        for url in self.base_urls:
            try:
                data = self._request("GET", "/models", server=url).get("data") or []
            except (BackendUnavailableError, BackendTimeoutError, BadReplyError) as err:
                if len(self.base_urls) == 1:
                    raise
                self._upstream.fleet.put_down(url, str(err))
                continue
            if not data or not isinstance(data, list) or not isinstance(data[0], dict) or "id" not in data[0]:
                raise BackendError(
                    f"the server at {url}/models lists no models; pass the model name explicitly (model=...)"
                )
            served[url] = str(data[0]["id"])
        if not served:
            raise BackendUnavailableError(
                f"no OpenAI-compatible server of the fleet answered GET /models ({self._upstream.fleet.down_message()}); "
                "are they running? check --base-url"
            )
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
        self._calls_path = path  # what a down server's probe asks of it
        start = time.perf_counter()
        return self._upstream.call(
            "POST", path, body, lambda answer: self._generation(answer, request, time.perf_counter() - start)
        )

    def _generation(
        self, answer: Mapping[str, Any], request: GenerationRequest, seconds: float
    ) -> Generation:
        """The :class:`Generation` in a server's answer; an answer without the fields asked for raises
        ``ValueError`` (a failure of the server that sent it)."""
        choice = answer["choices"][0]
        text, steps = parse_text(choice), parse_steps(choice)
        finish: FinishReason = "length" if choice.get("finish_reason") == "length" else "stop"
        usage = answer.get("usage") or {}
        if not self.capabilities.logprobs:  # text only: no per-token steps
            return Generation(
                text=text, tokens=(), token_ids=(), logprobs=(), top_logprobs=(), offsets=(),
                finish_reason=finish, prompt_tokens=int(usage.get("prompt_tokens") or 0),
                completion_tokens=int(usage.get("completion_tokens") or 0), seconds=seconds,
            )  # fmt: skip
        if steps is None:
            raise BadAnswer(
                "returned no logprobs although they were requested: it does not support logprobs (for "
                "llama-cpp-python start it with --logits_all true; for vLLM set --max-logprobs >= top_logprobs), "
                "or run text-only gates with logprobs='off'"
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

    # -- HTTP: failover over the fleet, retries with back-off --------------------------------------------------------
    def _request(
        self, method: str, path: str, body: dict[str, Any] | None = None, *, server: str | None = None
    ) -> dict[str, Any]:
        """One call whose answer is a JSON object (``server`` pins it to one server)."""
        return self._upstream.call(method, path, body, dict, server=server)

    # -- the balancer's view ----------------------------------------------------------------------------------------
    def servers(self) -> tuple[ServerView, ...]:
        """What the balancer believes of each server (up or down, since when, why, the next probe); no I/O."""
        return self._upstream.servers()

    def check_servers(self, timeout: float) -> tuple[ServerView, ...]:
        """Probe each server that is up (``GET /models`` within ``timeout``) and each down one whose probe is
        due, then :meth:`servers`: what ``/healthz`` reports."""
        return self._upstream.check_servers(timeout)

    def _probe_request(self) -> ProbeRequest:
        """What a down server's probe asks: a one-token answer from the endpoint calls use, with logprobs where
        calls ask for them, checked as a call's answer would be."""
        path, asks = self._calls_path, self.capabilities.logprobs
        body: dict[str, Any] = {"model": self.model, "max_tokens": 1, "temperature": 0.0, **self.extra_body}
        if path == "/completions":
            body |= {"prompt": "OK"} | ({"logprobs": 1} if asks else {})
        else:
            body |= {"messages": [{"role": "user", "content": "Say OK."}]}
            body |= {"logprobs": True, "top_logprobs": 1} if asks else {}
        return path, body, _answer_check(asks)

    def close(self) -> None:
        self._upstream.close()

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


LOGPROB_SLACK = 1e-4  # a server's rounding may put a sure token's log-probability a hair above 0


def logprob(value: Any, field: str) -> float:
    """A log-probability from a reply: a finite number <= 0 (within :data:`LOGPROB_SLACK`). NaN, an infinity or a
    positive value is a malformed reply (:class:`~ragate.backends.upstream.BadAnswer`: the server failed, not the
    gate reading it), which fails over to another server of a fleet and marks this one."""
    number = float(value)
    if not math.isfinite(number) or number > LOGPROB_SLACK:
        raise BadAnswer(f"sent {field} = {value!r}, which is not a log-probability (a finite number <= 0)")
    return min(number, 0.0)


def parse_steps(choice: Mapping[str, Any]) -> list[Step] | None:
    """Per-token (token, logprob, alternatives, bytes) of one choice; ``None`` when the server sent no logprobs.
    A logprob that is not one (NaN, an infinity, above 0) makes the reply malformed (:func:`logprob`)."""
    lp = choice.get("logprobs")
    if "message" in choice:
        content = lp.get("content") if isinstance(lp, Mapping) else None
        if content is None:
            return None if parse_text(choice) else []
        where = "choices[0].logprobs.content"
        return [
            (
                str(c["token"]),
                logprob(c["logprob"], f"{where}[{i}].logprob"),
                [
                    (str(t["token"]), logprob(t["logprob"], f"{where}[{i}].top_logprobs[{j}].logprob"))
                    for j, t in enumerate(c.get("top_logprobs") or [])
                ],
                bytes(c["bytes"]) if c.get("bytes") is not None else None,
            )
            for i, c in enumerate(content)
        ]
    if not isinstance(lp, Mapping) or lp.get("tokens") is None:
        return None if parse_text(choice) else []
    tops = lp.get("top_logprobs") or [None] * len(lp["tokens"])
    where = "choices[0].logprobs"
    return [
        (
            str(t),
            logprob(p, f"{where}.token_logprobs[{i}]"),
            [(str(a), logprob(b, f"{where}.top_logprobs[{i}][{a!r}]")) for a, b in (top or {}).items()],
            None,
        )
        for i, (t, p, top) in enumerate(zip(lp["tokens"], lp["token_logprobs"], tops, strict=True))
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


def _answer_check(logprobs: bool) -> Callable[[dict[str, Any]], None]:
    """A probe's check of a one-token answer: a choice with text, and logprobs if they were asked for."""

    def check(answer: dict[str, Any]) -> None:
        choice = answer["choices"][0]
        parse_text(choice)
        if logprobs and parse_steps(choice) is None:
            raise BadAnswer("returned no logprobs although they were requested")

    return check
