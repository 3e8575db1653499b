"""Opening the small proxy model a proxy gate drafts with (:mod:`ragate.gates.proxy`) beside the answering one."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ragate.backends.proxy import WithProxy


def proxy_model(gates: Iterable[Any]) -> tuple[bool, str | None]:
    """Whether the gates (``GateSpec`` values) draft with a proxy model, and which (its name or path; None: the
    default model). Two gates naming different proxies are an error."""
    from ragate.errors import RagateError
    from ragate.gates.registry import get_gate

    wanted = {g.proxy for g in gates if getattr(get_gate(g.kind), "drafts_with_proxy", False)}
    if not wanted:
        return False, None
    if len(wanted) > 1:
        raise RagateError(
            f"one run opens one proxy model; these gates name several: {sorted(map(str, wanted))}"
        )
    return True, wanted.pop()


def attach_proxy(
    lm: Any, gates: Iterable[Any], *, threads: int | str | None = None, close_main: bool = True
) -> Any:
    """``lm`` with the proxy model the ``gates`` need opened beside it (llama.cpp), else ``lm`` itself."""
    from ragate.backends import load_backend
    from ragate.backends.threads import thread_options

    needed, name = proxy_model(gates)
    if not needed:
        return lm
    proxy = load_backend(name, "llama.cpp", **thread_options("llama.cpp", threads, None))
    return WithProxy(lm, proxy, close_main=close_main)
