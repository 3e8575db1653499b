"""`ragate ask`'s start-up (issue 51, item 6): an index's encoder loads when a text is first embedded, so a question
the gate answers without retrieval never imports sentence-transformers (torch, transformers, scikit-learn)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import numpy as np
import pytest


def test_the_demo_index_opens_without_loading_its_encoder_and_embeds_as_before(minilm: Any) -> None:
    from ragate.retrieval.demo import demo_index
    from ragate.retrieval.encoders import DeferredEncoder
    from ragate.retrieval.index import open_index

    retriever = open_index(demo_index(progress=False))
    encoder = retriever.dense.encoder  # the demo index is hybrid
    assert isinstance(encoder, DeferredEncoder) and not encoder.loaded
    assert encoder.identity() == minilm.identity()
    texts = ["Who wrote Hamlet?", "where do the greasers live in the outsiders"]
    vectors = retriever.embed_queries(texts)
    assert encoder.loaded
    assert np.array_equal(vectors, minilm.encode_queries(texts))  # the same model, bit for bit
    assert encoder.with_identity(name="x").loaded  # copies share the loaded model
    assert encoder.model is encoder._once.encoder.model  # type: ignore[union-attr]


def test_a_missing_encoder_is_an_error_when_the_index_opens(tmp_path: Any) -> None:
    import shutil

    from ragate.errors import ModelNotFoundError
    from ragate.retrieval.demo import demo_index
    from ragate.retrieval.index import open_index

    copy = tmp_path / "index"
    shutil.copytree(demo_index(progress=False), copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["encoder"]["source"] = str(tmp_path / "no-such-model")
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelNotFoundError, match="cannot be loaded here"):
        open_index(copy, verify=False)


CHILD = """
import json, sys
from ragate.pipeline import Pipeline
rag = Pipeline("targ-margin", threshold=1.5)  # a margin score is <= 1: never retrieves
answer = rag.answer("what is the main mineral in lithium batteries")
heavy = [m for m in ("torch", "transformers", "sentence_transformers", "sklearn") if m in sys.modules]
print(json.dumps({"retrieved": answer.retrieved, "heavy": heavy}))
"""


def test_a_question_answered_without_retrieval_imports_no_encoder(llama_backend: Any) -> None:
    pytest.importorskip("sentence_transformers")
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=600, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"retrieved": False, "heavy": []}
