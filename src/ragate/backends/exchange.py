"""One bounded HTTP exchange with a model server: one deadline over connect, headers and body, and a cap on the
reply's size.

httpx bounds each socket operation (the connect, each read, each write, the wait for a pooled connection), not
their sum: a server that sends one header byte a second never trips a 60 s read timeout and holds the call, and
its thread, for as long as it likes; and a body is read to its end however large it grows. Here each socket
operation of an exchange gets at most what is left of the exchange's deadline (a network backend under httpcore's
connection pool shortens every timeout it is handed), and the body is streamed and dropped past ``max_bytes``.
"""

from __future__ import annotations

import contextlib
import ssl
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx


class ReplyTooLarge(Exception):
    """A reply longer than the cap: the exchange stopped reading it and closed the connection."""


@dataclass(frozen=True)
class Reply:
    """A complete reply: status, headers and body (at most the cap)."""

    status: int
    headers: httpx.Headers
    content: bytes | bytearray


class Deadlines:
    """The deadline of the exchange each thread is in (a thread makes one exchange at a time)."""

    def __init__(self) -> None:
        self._local = threading.local()

    @contextlib.contextmanager
    def within(self, seconds: float) -> Iterator[None]:
        self._local.at = time.monotonic() + seconds
        try:
            yield
        finally:
            self._local.at = None

    def left(self, timeout: float | None, error: type[Exception]) -> float | None:
        """``timeout`` shortened to what is left of this thread's deadline; ``error`` once nothing is left."""
        at = getattr(self._local, "at", None)
        if at is None:
            return timeout
        left = at - time.monotonic()
        if left <= 0:
            raise error("the exchange's deadline passed")
        return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, stream: httpcore.NetworkStream, deadlines: Deadlines) -> None:
        self._stream, self._deadlines = stream, deadlines

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, self._deadlines.left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, self._deadlines.left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        left = self._deadlines.left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._stream.start_tls(ssl_context, server_hostname, left), self._deadlines)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's sockets, each operation bounded by what is left of its thread's exchange."""

    def __init__(self, deadlines: Deadlines) -> None:
        self._backend, self._deadlines = httpcore.SyncBackend(), deadlines

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        left = self._deadlines.left(timeout, httpcore.ConnectTimeout)
        stream = self._backend.connect_tcp(host, port, left, local_address, socket_options)
        return _DeadlineStream(stream, self._deadlines)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        left = self._deadlines.left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._backend.connect_unix_socket(path, left, socket_options), self._deadlines)

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


class _Transport(httpx.HTTPTransport):
    """httpx's own transport (its request and error mapping) over a pool of deadline-keeping sockets."""

    def __init__(self, limits: httpx.Limits, deadlines: Deadlines) -> None:
        super().__init__(limits=limits)
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_DeadlineBackend(deadlines),
        )


def bounded_client(*, headers: dict[str, str], connections: int, deadlines: Deadlines) -> httpx.Client:
    """An httpx client whose exchanges :func:`exchange` bounds: ``connections`` at most, all kept alive."""
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.Client(headers=headers, transport=_Transport(limits, deadlines))


def exchange(
    client: httpx.Client,
    deadlines: Deadlines,
    method: str,
    url: str,
    body: dict[str, Any] | None,
    *,
    timeout: float,
    max_bytes: int,
) -> Reply:
    """One request and its whole reply within ``timeout`` seconds (connect, headers and body together; httpx's
    ``TimeoutException`` past it), the reply at most ``max_bytes`` long (:class:`ReplyTooLarge` past it, the rest
    left unread and the connection closed)."""
    with deadlines.within(timeout), client.stream(method, url, json=body, timeout=timeout) as response:
        declared = response.headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise ReplyTooLarge(
                f"announced a reply of {int(declared)} bytes, past the cap of {max_bytes} bytes"
            )
        data = bytearray()
        for chunk in response.iter_bytes():
            data += chunk
            if len(data) > max_bytes:
                raise ReplyTooLarge(f"sent a reply past the cap of {max_bytes} bytes, the rest left unread")
        return Reply(response.status_code, response.headers, data)
