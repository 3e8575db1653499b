"""HTTP to the model servers behind an OpenAI-compatible backend: failover over a fleet, retries with back-off,
bounded exchanges, and each server's health (:class:`Upstream`).

A call goes to the least busy server that is up; a failure of that server (see :mod:`ragate.backends.fleet`)
sends it on at once to the next, each at most once per attempt; 429, 5xx and dropped connections are retried
after a back-off (``tenacity``: ``backoff * 2**attempt``, or the server's ``Retry-After``); other 4xx are the
request's own fault and raise at once. What ends a call is named in its error: :class:`BackendTimeoutError`
(504 in the service), :class:`BadReplyError` (502), :class:`BackendUnavailableError` (503).
"""

from __future__ import annotations

import email.utils
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import httpx
import tenacity

from ragate.backends.exchange import Deadlines, ReplyTooLarge, bounded_client, exchange
from ragate.backends.fleet import Fleet, HealthPolicy, ServerView
from ragate.errors import BackendError, BackendTimeoutError, BackendUnavailableError

T = TypeVar("T")
# ~10,000 tokens with top-20 chat logprobs (each token with its alternatives' bytes: ~3 KB); a longer reply is a
# failure of the server that sends it
MAX_REPLY_BYTES = 32 * 2**20


class BadReplyError(BackendError):
    """A server answered, but not with an OpenAI answer: not JSON, without the fields asked for, or longer than
    the reply cap (the service answers it 502)."""


# what a down server's probe asks: the path, the body, and the check of its answer (raises if it is no answer)
ProbeRequest = tuple[str, dict[str, Any], Callable[[dict[str, Any]], object]]


class BadAnswer(ValueError):
    """An answer without what the request asked for (e.g. its logprobs); the message says what, as a phrase
    following the server's URL."""


class _Fault(Exception):
    """What failed on one server in one exchange: ``retry`` (worth another attempt after a back-off), ``counts``
    (against the server's health), ``gone`` (nothing accepted the connection), ``timeout`` (no complete answer in
    time), ``retry_after`` (the server's header)."""

    def __init__(
        self,
        url: str,
        problem: str,
        *,
        retry: bool = False,
        counts: bool = True,
        gone: bool = False,
        timeout: bool = False,
        retry_after: str | None = None,
    ) -> None:
        super().__init__(problem)
        self.url, self.problem, self.retry, self.counts = url, problem, retry, counts
        self.gone, self.timeout, self.retry_after = gone, timeout, retry_after


class Upstream:
    """Calls to one model server or a fleet of servers of one model, as a load balancer makes them: each to the
    least busy server that is up, failed over to another when that server fails, retried with back-off
    (``tenacity``) on 429, 5xx and dropped connections, each exchange bounded in time and size
    (:mod:`ragate.backends.exchange`), and each server's health kept and probed by the rules of
    :mod:`ragate.backends.fleet`. ``probe_request`` gives what a down server's probe asks."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        headers: dict[str, str],
        timeout: float,
        max_retries: int,
        backoff: float,
        connections: int,
        max_reply_bytes: int,
        policy: HealthPolicy,
        probe_request: Callable[[], ProbeRequest],
    ) -> None:
        self.urls = tuple(urls)
        self.fleet = Fleet(self.urls, policy)
        self.timeout, self.max_retries, self.backoff = timeout, max_retries, backoff
        self.max_reply_bytes = max_reply_bytes
        self._probe_request = probe_request
        self._deadlines = Deadlines()
        self._closed = threading.Event()
        # probes share the pool: one more connection per server keeps them from waiting behind calls
        self._client = bounded_client(
            headers=headers, connections=connections + len(self.urls), deadlines=self._deadlines
        )

    def call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        parse: Callable[[dict[str, Any]], T],
        *,
        server: str | None = None,
    ) -> T:
        """``parse`` of one call's answer: each attempt goes to the servers that are up, one after another until
        one answers (:meth:`_attempt`), and attempts are retried on 429, 5xx and dropped connections."""
        problems: list[str] = []  # distinct failures, in order
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.max_retries + 1),
            wait=self._retry_wait,
            retry=tenacity.retry_if_exception(lambda e: isinstance(e, _Fault) and e.retry),
            reraise=True,
        )
        try:
            return retrying(self._attempt, method, path, body, parse, server, problems)
        except _Fault as fault:
            raise self._failure(fault, problems, int(retrying.statistics.get("attempt_number", 1))) from None

    def _attempt(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        parse: Callable[[dict[str, Any]], T],
        server: str | None,
        problems: list[str],
    ) -> T:
        """One attempt: the least busy server that is up, and on a failure of that server the next one, each at
        most once; the last failure when every one failed, an error naming each when none is up."""
        if server is None and len(self.urls) > 1:
            self._probe_due()
        tried: set[str] = set()
        fault: _Fault | None = None
        while True:
            base = server if server is not None else self.fleet.pick(tried)
            if base is None:
                if fault is not None:
                    raise fault
                raise BackendUnavailableError(
                    f"every OpenAI-compatible server of the fleet is down ({self.fleet.down_message()}); each is "
                    "probed again and gets calls once it answers: start them again (or give others with "
                    "--base-url); an eval run keeps the answers so far for --resume"
                )
            try:
                result = self._exchange(base, method, path, body, parse, self.timeout)
            except _Fault as failure:
                fault = failure
                said = f"{base}: {failure.problem}" if len(self.urls) > 1 else failure.problem
                if said not in problems:
                    problems.append(said)
                if failure.counts:
                    self.fleet.failed(base, failure.problem, gone=failure.gone)
                if server is not None:
                    raise
                tried.add(base)
                continue
            finally:
                if server is None:
                    self.fleet.release(base)
            self.fleet.answered(base)
            return result

    def _exchange(
        self,
        base: str,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        parse: Callable[[dict[str, Any]], T],
        timeout: float,
    ) -> T:
        """One exchange with the server at ``base``, bounded in time and size: ``parse`` of its JSON answer, or
        :class:`_Fault` naming what failed there (a 4xx other than 429 raises :class:`BackendError`: the request's
        own fault, which another server would answer the same)."""
        url = f"{base}{path}"
        try:
            reply = exchange(
                self._client,
                self._deadlines,
                method,
                url,
                body,
                timeout=timeout,
                max_bytes=self.max_reply_bytes,
            )
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            within = f" within {timeout:g} s" if isinstance(e, httpx.ConnectTimeout) else f" ({e})"
            raise _Fault(url, f"{type(e).__name__}: could not connect{within}", retry=True, gone=True) from e
        except httpx.PoolTimeout as e:  # ragate's own connections were all busy: not the server's failure
            raise _Fault(
                url, f"PoolTimeout: no free connection within {timeout:g} s", retry=True, counts=False
            ) from e
        except httpx.TimeoutException as e:
            problem = f"{type(e).__name__}: no complete answer within {timeout:g} s"
            raise _Fault(url, problem, timeout=True) from e
        except httpx.TransportError as e:  # ReadError, RemoteProtocolError, WriteError, ...
            raise _Fault(url, f"{type(e).__name__}: {e}", retry=True) from e
        except ReplyTooLarge as e:
            raise _Fault(
                url,
                f"{e} (if its replies are that long, raise the cap: max_reply_bytes=..., --max-reply-bytes)",
            ) from e
        if reply.status >= 400:
            message = _error_message(reply.content)
            if reply.status != 429 and reply.status < 500:
                raise BackendError(
                    f"{method} {url} failed with HTTP {reply.status}: {message}{self._hint(reply.status)}"
                )
            raise _Fault(
                url, f"HTTP {reply.status}: {message}", retry=True, counts=reply.status != 429,
                retry_after=reply.headers.get("Retry-After"),
            )  # fmt: skip
        try:
            answer = json.loads(reply.content)
        except ValueError as e:
            raise _Fault(url, f"answered HTTP {reply.status} with a body that is not JSON ({e})") from e
        if not isinstance(answer, dict):
            raise _Fault(url, f"answered HTTP {reply.status} with JSON that is not an object")
        try:
            return parse(answer)
        except BadAnswer as e:
            raise _Fault(url, str(e)) from e
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise _Fault(url, f"sent an unexpected answer ({e!r}): is it OpenAI-compatible?") from e

    def _retry_wait(self, state: tenacity.RetryCallState) -> float:
        """Seconds before attempt ``n + 1``: the server's ``Retry-After`` (at most ``timeout``), else
        ``backoff * 2**(n - 1)``."""
        fault = state.outcome.exception() if state.outcome is not None else None
        delay = self.backoff * 2 ** (state.attempt_number - 1)
        after = fault.retry_after if isinstance(fault, _Fault) else None
        return _retry_after(after, default=delay, cap=self.timeout)

    def _failure(self, fault: _Fault, problems: list[str], attempts: int) -> BackendError:
        """The error of a call whose last attempt ended in ``fault``."""
        said = "; then ".join(problems)
        if fault.timeout:
            return BackendTimeoutError(
                f"request to {fault.url} timed out after {self.timeout:g} s ({said}); raise the timeout "
                "(timeout=..., --openai-timeout) or ask for fewer tokens (max_tokens)"
            )
        if not fault.retry:
            if len(self.urls) == 1:
                return BadReplyError(f"the OpenAI-compatible server at {fault.url} {said}")
            return BadReplyError(f"no OpenAI-compatible server of the fleet gave an answer: {said}")
        if fault.problem.startswith("HTTP"):
            return BackendUnavailableError(
                f"OpenAI-compatible server at {fault.url} failed on all {attempts} attempts ({said}); "
                "check the server's log, or retry later if it is overloaded"
            )
        return BackendUnavailableError(
            f"OpenAI-compatible server at {fault.url} is unreachable or closed the connection ({attempts} "
            f"attempts: {said}); is it running? check --openai-base-url"
        )

    # -- the balancer's view and its probes --------------------------------------------------------------------------
    def servers(self) -> tuple[ServerView, ...]:
        """What the balancer believes of each server (up or down, since when, why, the next probe); no I/O."""
        return self.fleet.views()

    def check_servers(self, timeout: float) -> tuple[ServerView, ...]:
        """Probe now, all at once, each server that is up (is it still there? ``GET /models`` within ``timeout``)
        and each down one whose probe is due (does it answer? see :meth:`_probe_down`), then :meth:`servers`: what
        ``/healthz`` reports. A probe still running after ``timeout`` reports when it ends."""
        checks = [(self._probe_down, url, self.timeout) for url in self.fleet.due()]
        checks += [(self._still_there, url, timeout) for url in self.fleet.up_urls()]
        threads = [threading.Thread(target=check, args=(url, t), daemon=True) for check, url, t in checks]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + timeout + 0.5
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return self.servers()

    def _probe_due(self) -> None:
        """Start, each in its own thread, the probes of down servers that are due (a call does not wait)."""
        if self._closed.is_set():
            return
        for url in self.fleet.due():
            threading.Thread(target=self._probe_down, args=(url, self.timeout), daemon=True).start()

    def _probe_down(self, base: str, timeout: float) -> None:
        """Whether a down server answers what a call asks (``probe_request``: for an OpenAI backend a one-token
        request to the endpoint calls use, with logprobs where calls ask for them, whose answer must parse as a
        call's would; ``GET /models`` is not enough: a server whose engine hangs or whose answers are broken can
        still list its models)."""
        path, body, check = self._probe_request()
        self._report(base, lambda: self._exchange(base, "POST", path, body, check, timeout))

    def _still_there(self, base: str, timeout: float) -> None:
        """Whether a server that is up still answers ``GET /models`` with a list of models."""
        self._report(base, lambda: self._exchange(base, "GET", "/models", None, _model_list, timeout))

    def _report(self, base: str, probe: Callable[[], object]) -> None:
        """Run ``probe`` of the server at ``base`` and give the fleet its outcome."""
        problem: str | None = None
        gone = False
        try:
            probe()
        except _Fault as fault:
            problem, gone = fault.problem, fault.gone
        except BackendError as err:  # a 4xx
            problem = str(err)
        except Exception as err:  # noqa: BLE001 - e.g. the backend was closed under it
            if self._closed.is_set():
                return
            problem = f"{type(err).__name__}: {err}"
        self.fleet.probed(base, problem, gone=gone)

    def _hint(self, status: int) -> str:
        if status == 404 and not self.urls[0].endswith("/v1"):
            return f"; base_url must include /v1 (e.g. {self.urls[0]}/v1)"
        if status == 404:
            return "; the server has no such endpoint: is it OpenAI-compatible, and is base_url its /v1 root?"
        if status in (401, 403):
            return "; check the API key (api_key=... or $OPENAI_API_KEY)"
        return ""

    def close(self) -> None:
        self._closed.set()
        self._client.close()


def _error_message(content: bytes | bytearray) -> str:
    """The server's error message (OpenAI's ``error.message``, FastAPI's ``detail``) on one line."""
    try:
        body = json.loads(content)
    except ValueError:
        return " ".join(content.decode("utf-8", "replace").split())[:500] or "(empty body)"
    if isinstance(body, Mapping):
        error = body.get("error", body.get("detail", body.get("message", body)))
        body = error.get("message", error) if isinstance(error, Mapping) else error
    return " ".join((body if isinstance(body, str) else json.dumps(body)).split())[:500]


def _model_list(answer: dict[str, Any]) -> None:
    """A probe's check of ``GET /models``: a JSON object with a list under ``data``."""
    if not isinstance(answer.get("data"), list):
        raise TypeError("no list of models under 'data'")


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
