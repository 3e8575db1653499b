"""Language-model backends behind one interface, :class:`~ragate.backends.base.Backend`.

Engines are imported lazily, so a missing optional dependency only matters for the engine that needs it.
"""

from __future__ import annotations

import difflib
import importlib
from pathlib import Path
from typing import Any, Literal

from ragate.backends.base import Backend, Capabilities
from ragate.errors import RagateError

Engine = Literal["llama.cpp", "transformers", "openai"]

ENGINES: dict[str, str] = {
    "llama.cpp": "ragate.backends.llamacpp:LlamaCppBackend",
    "transformers": "ragate.backends.hf:TransformersBackend",
    "openai": "ragate.backends.openai_compat:OpenAICompatBackend",
}

__all__ = ["ENGINES", "Backend", "Capabilities", "Engine", "load_backend"]


def load_backend(
    model: str | None = None,
    engine: str = "llama.cpp",
    *,
    home: Path | None = None,
    **options: Any,
) -> Backend:
    """Open ``model`` on ``engine``.

    For the local engines ``model`` is a known model name (see ``ragate models list``; default SmolLM2-135M),
    a GGUF file or a model directory. For ``openai`` pass ``base_url=...`` and ``model`` is the name the server
    knows (``None``: the server's first model). Other keyword options go to the engine's constructor.
    """
    target = ENGINES.get(engine)
    if target is None:
        close = difflib.get_close_matches(engine, ENGINES, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise RagateError(f"unknown backend {engine!r}; choose one of {', '.join(ENGINES)}.{hint}")
    module_name, class_name = target.split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    if engine == "openai":
        return cls(model=model, **options)  # type: ignore[no-any-return]
    from ragate.models import DEFAULT_MODEL, resolve_model

    path = resolve_model(model, home=home)
    if engine == "llama.cpp" and path.is_dir():
        raise RagateError(
            f"{path} is a model directory; the llama.cpp backend needs a GGUF file (use --backend transformers)"
        )
    return cls(path, name=model or DEFAULT_MODEL, **options)  # type: ignore[no-any-return]
