"""What every request meets first: :class:`Guard` (bearer token, body size, JSON content type, UTF-8) and the
JSON error shape ``{"error": {"message", "type"}}`` that every refusal uses."""

from __future__ import annotations

import hmac
import time

import anyio
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ragate.service.metrics import ServiceMetrics
from ragate.service.page import PAGE_PATHS
from ragate.service.settings import ServiceSettings

ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
    405: "method_not_allowed", 408: "request_timeout", 413: "request_too_large", 415: "unsupported_media_type",
    422: "invalid_request_error", 429: "rate_limit_exceeded", 500: "internal_error", 502: "backend_error",
    503: "backend_unavailable", 504: "timeout",
}  # fmt: skip


class ApiError(Exception):
    """An error answer: HTTP status, a message that says what to change, and optional headers."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": ERROR_TYPES.get(status, "error")}}
    return JSONResponse(body, status_code=status, headers=headers)


class Guard:
    """Pure ASGI middleware: metrics for every exchange, then the bearer token (all paths but ``/healthz`` and
    the web page's files),
    then the body: at most ``max_body_bytes`` (checked on ``Content-Length`` and on the bytes that arrive),
    JSON content type, UTF-8. The checked body is replayed to the app."""

    def __init__(self, app: ASGIApp, settings: ServiceSettings, metrics: ServiceMetrics) -> None:
        self.app, self.settings, self.metrics = app, settings, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), [500]

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                headers = list(message.get("headers", []))
                if not any(name.lower() == b"x-content-type-options" for name, _ in headers):
                    headers.append((b"x-content-type-options", b"nosniff"))  # every answer, JSON included
                message = {**message, "headers": headers}
            await send(message)

        try:
            rejection = self._authorise(scope)
            if rejection is None and scope["method"] in ("POST", "PUT", "PATCH"):
                rejection, receive = await self._body(scope, receive)
            if rejection is not None:
                await rejection(scope, receive, watch)
            else:
                await self.app(scope, receive, watch)
        finally:
            self.metrics.observe_request(scope["path"], status[0], time.perf_counter() - start)
            if status[0] >= 400:
                self.metrics.observe_error(ERROR_TYPES.get(status[0], "error"))

    def _authorise(self, scope: Scope) -> Response | None:
        key = self.settings.api_key
        if key is None or scope["path"] == "/healthz":
            return None
        if scope["path"] in PAGE_PATHS and scope["method"] in ("GET", "HEAD"):  # the page's files: no data
            return None
        scheme, _, token = Headers(scope=scope).get("authorization", "").partition(" ")
        how = "send the header 'Authorization: Bearer <key>' with the key given to ragate serve (--api-key or RAGATE_API_KEY)"
        if scheme.lower() != "bearer" or not token.strip():
            return error_response(401, f"this server needs an API key: {how}", {"WWW-Authenticate": "Bearer"})
        if not hmac.compare_digest(token.strip().encode(), key.encode()):
            return error_response(401, f"wrong API key: {how}", {"WWW-Authenticate": "Bearer"})
        return None

    async def _body(self, scope: Scope, receive: Receive) -> tuple[Response | None, Receive]:
        limit, headers = self.settings.max_body_bytes, Headers(scope=scope)
        too_large = f"the request body is larger than this server's limit of {limit} bytes"
        declared = headers.get("content-length")
        if declared is not None:
            if not declared.isdigit():
                return error_response(400, f"Content-Length {declared!r} is not a number of bytes"), receive
            if int(declared) > limit:
                return error_response(413, f"{too_large} (Content-Length: {declared})"), receive
        chunks: list[bytes] = []
        size, wait = 0, self.settings.read_timeout
        with anyio.move_on_after(wait) as deadline:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return Response(status_code=400), receive  # nobody is listening any more
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    return error_response(413, too_large), receive
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
        if deadline.cancelled_caught:
            return error_response(
                408,
                f"the request body did not arrive within {wait:g} s ({size} bytes came): send the whole body "
                "at once",
                {"Connection": "close"},
            ), receive
        body = b"".join(chunks)
        if not body.strip():
            return error_response(
                400, 'the request body is empty: send a JSON object, e.g. {"question": "..."}'
            ), receive
        ctype = headers.get("content-type")
        if ctype is None:  # curl without -H: assume JSON rather than refuse
            scope["headers"] = [*scope["headers"], (b"content-type", b"application/json")]
        elif ctype.split(";")[0].strip().lower() != "application/json":
            return error_response(
                415,
                f"the request body must be JSON, not {ctype!r}: send 'Content-Type: application/json' "
                "(curl: -H 'Content-Type: application/json')",
            ), receive
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as err:
            return error_response(
                400,
                f"the request body is not valid UTF-8 (byte 0x{body[err.start]:02x} at position {err.start}: "
                f"{err.reason}); send JSON encoded as UTF-8",
            ), receive
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return None, replay
