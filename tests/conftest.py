"""Shared fixtures: the real default model (SmolLM2-135M-Instruct) on each local engine, loaded once."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from ragate.errors import ModelNotFoundError


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from ragate.models import resolve_model

    try:
        return resolve_model(None)
    except ModelNotFoundError as err:
        pytest.skip(f"default model not installed: {err}")


@pytest.fixture(scope="session")
def llama_backend(smollm2_path: Path) -> Iterator[object]:
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (pip install 'ragate[llamacpp]')")
    from ragate.backends.llamacpp import LlamaCppBackend

    backend = LlamaCppBackend(smollm2_path, name="smollm2-135m", n_ctx=2048)
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def hf_backend(smollm2_path: Path) -> Iterator[object]:
    if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("torch") is None:
        pytest.skip("transformers/torch are not installed (pip install torch==2.13.0 'ragate[transformers]')")
    from ragate.backends.hf import TransformersBackend

    backend = TransformersBackend(smollm2_path, name="smollm2-135m")
    yield backend
    backend.close()
