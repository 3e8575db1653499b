"""The service's own web page: ``GET /`` and the files it loads (``ui/app.js``, ``ui/style.css``, ``ui/icon.svg``).

Plain HTML, CSS and JavaScript shipped inside the package (``ragate/service/page/``; nothing is fetched from
anywhere else and nothing is built). The page asks ``POST /v1/answer`` with ``draft_tokens`` and draws what comes
back: the answer, the draft's tokens coloured by the gate's per-token uncertainty, the score against tau, the
documents read and the cost of each stage; it polls ``GET /v1/budget`` for the budget panel. It speaks to the
service as any client does (with the API key it is given), and shows every text through ``textContent``: no text
of a question, an answer, a passage or a file name is ever parsed as HTML. Its files need no key (they hold no
data); every header carries a Content-Security-Policy that allows scripts and styles from the service alone.
"""

from __future__ import annotations

import logging
from importlib import resources

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

log = logging.getLogger("ragate.service")

# path -> (file under ragate/service/page, media type)
PAGE_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/ui/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/ui/style.css": ("style.css", "text/css; charset=utf-8"),
    "/ui/icon.svg": ("icon.svg", "image/svg+xml"),
}
PAGE_PATHS = frozenset(PAGE_FILES)
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def load_page() -> dict[str, bytes] | None:
    """The page's files by path, read once; None (and a warning) where the installation lacks them."""
    folder = resources.files("ragate.service").joinpath("page")
    try:
        return {path: folder.joinpath(name).read_bytes() for path, (name, _) in PAGE_FILES.items()}
    except OSError as err:
        log.warning("the web page's files are missing (%s): GET / answers 500", err)
        return None


def install_page(app: FastAPI) -> None:
    """Serve the page's files (GET and HEAD), each with the security headers."""
    files = load_page()

    def route(path: str, media_type: str) -> None:
        async def serve() -> Response:
            if files is None:
                message = (
                    "the web page's files are missing from this installation (ragate/service/page/): reinstall "
                    "ragate; the API endpoints work without them"
                )  # the error shape of guard.error_response (which imports this module's paths)
                return JSONResponse(
                    {"error": {"message": message, "type": "internal_error"}}, status_code=500
                )
            return Response(files[path], media_type=media_type, headers=HEADERS)

        app.add_api_route(path, serve, methods=["GET", "HEAD"], include_in_schema=False)

    for path, (_, media_type) in PAGE_FILES.items():
        route(path, media_type)
