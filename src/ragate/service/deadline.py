"""A deadline for a request's headers: uvicorn times out idle keep-alive connections, but not a client
that opens a connection and sends its request line and headers a byte at a time. :class:`HeaderDeadline` is
uvicorn's HTTP protocol with one addition: while a connection waits for a request's headers, it must complete
them within ``RAGATE_READ_TIMEOUT`` seconds (``ragate serve --read-timeout``), or it is closed. The body is bounded
by :class:`ragate.service.guard.Guard` (408). The timeout travels in the environment because uvicorn's worker
processes import this class by name.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol

READ_TIMEOUT_ENV = "RAGATE_READ_TIMEOUT"
DEFAULT_READ_TIMEOUT = 10.0


class HeaderDeadline(AutoHTTPProtocol):  # type: ignore[misc,valid-type]
    """uvicorn's HTTP protocol (h11 or httptools) that closes a connection whose request headers are too slow."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_timeout = float(os.environ.get(READ_TIMEOUT_ENV, DEFAULT_READ_TIMEOUT))
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _waiting_for_headers(self) -> bool:
        return self.cycle is None or self.cycle.response_complete  # no request, or only finished ones

    def _arm(self) -> None:
        if not self._waiting_for_headers():
            self._disarm()  # the headers came: the body has its own deadline
        elif self._header_timer is None and not self.transport.is_closing():
            self._header_timer = self.loop.call_later(self._read_timeout, self._too_slow, self.cycle)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _too_slow(self, cycle: Any) -> None:
        self._header_timer = None
        if (
            self.cycle is cycle and self._waiting_for_headers()
        ):  # no new request began since the timer started
            self.transport.close()
