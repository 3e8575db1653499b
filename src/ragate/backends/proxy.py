"""A backend with a small proxy model beside it, for the gates that draft with one (:mod:`ragate.gates.proxy`).

:class:`WithProxy` is the answering model for every call (its name, capabilities and engine helpers are the
answering model's), and holds ``proxy``, which only :meth:`QuestionRun.proxy_draft
<ragate.methods.question.QuestionRun.proxy_draft>` calls. :func:`ragate.methods.proxy.attach_proxy` opens the
proxy named by the method's gate (SmolLM2-135M through llama.cpp by default) where the gate needs one, and returns the backend as it
was otherwise; Pipeline and eval call it once, when they open the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self

from ragate.types import Generation, GenerationRequest


class WithProxy:
    """``main`` answers; ``proxy`` (a local backend) drafts for a proxy gate. Closing closes the proxy, and
    ``main`` too unless ``close_main`` is False (a backend its caller owns)."""

    def __init__(self, main: Any, proxy: Any, *, close_main: bool = True) -> None:
        self.main, self.proxy, self.close_main = main, proxy, close_main
        self.engine, self.model, self.capabilities = main.engine, main.model, main.capabilities
        self.max_context = getattr(main, "max_context", None)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        return self.main.generate(requests)  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        # the answering engine's helpers (generate_settled, exact_prefix_reuse, clear_cache, ...)
        if name in ("main", "proxy"):
            raise AttributeError(name)
        return getattr(self.main, name)

    def close(self) -> None:
        try:
            self.proxy.close()
        finally:
            if self.close_main:
                self.main.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"WithProxy(main={self.main!r}, proxy={self.proxy!r})"
