"""Fuzz: SKR label sets (``ragate skr fit`` writes them, ``--skr-labels`` reads them; issue N). The file is one
``.npz`` of plain arrays (ids, questions, labels, embeddings) and a JSON record of its encoder, model and format.
A mutated file (its bytes; one array replaced by one of another type, shape or length, or removed; its JSON record
mutated) is either read as a label set that votes (one finite embedding of the encoder's dimension, one label and
one text per question) or refused with a RagateError naming it. The records `skr fit` reads are fuzzed with the
sweep (test_fuzz_sweep.py)."""

from __future__ import annotations

import io
import itertools
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fuzzing import byte_mutation, fuzz_settings, json_mutation, refused_or_accepted
from hypothesis import given
from hypothesis import strategies as st
from test_targ_baselines import TRAIN  # real questions; unit vectors stand in for their embeddings

from ragate.errors import RagateError
from ragate.gates import skr

DIM = 16
ENCODER = {"name": "all-MiniLM-L6-v2", "dim": DIM, "query_prefix": "", "document_prefix": ""}
MODEL = {"engine": "llama.cpp", "model": "smollm2-135m", "sha256": "b179c952"}
_names = itertools.count()


def _embeddings(n: int) -> np.ndarray:
    vectors = np.random.default_rng(0).normal(size=(n, DIM)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


LABELS = skr.LabelSet(
    tuple(f"t{i}" for i in range(len(TRAIN))),
    tuple(TRAIN),
    np.array([True, True, True, False, False, False]),
    _embeddings(len(TRAIN)),
    {"encoder": ENCODER, "model": MODEL, "dataset": "demo", "family": "targ", "metric": "em"},
)


def _arrays() -> dict[str, np.ndarray]:
    meta = {"format": skr.FORMAT, "format_version": skr.FORMAT_VERSION, **LABELS.meta}
    return {
        "ids": np.array(LABELS.ids, dtype=str),
        "questions": np.array(LABELS.questions, dtype=str),
        "retrieve": LABELS.retrieve,
        "embeddings": LABELS.embeddings,
        "meta": np.array(json.dumps(meta)),
    }


def _npz(arrays: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # object arrays are pickled here, as a hostile writer could
    return buffer.getvalue()


n = len(TRAIN)
HOSTILE_ARRAYS: tuple[Any, ...] = (
    np.array([]),
    np.array([1, 2]),
    np.array(["a"] * n),
    np.array([True] * (n + 1)),
    np.zeros((n,), np.float32),
    np.zeros((n, DIM), np.float64),
    np.zeros((n + 1, DIM), np.float32),
    np.zeros((n, DIM + 1), np.float32),
    np.zeros((n, DIM, 1), np.float32),
    np.full((n, DIM), np.nan, np.float32),
    np.full((n, DIM), np.inf, np.float32),
    np.array(["q\ud800"] * n),
    np.array([b"bytes"] * n),
    np.array([{"a": 1}] * n, dtype=object),
    np.array(["x"] * n).reshape(2, n // 2),
    np.array("[]"),
    np.array("{"),
    np.array(1.5),
)


@st.composite
def array_mutation(draw: st.DrawFn) -> dict[str, Any]:
    """The label set's arrays with one replaced by a hostile one, one removed, or its JSON record mutated."""
    arrays: dict[str, Any] = _arrays()
    key = draw(st.sampled_from(sorted(arrays)))
    kind = draw(st.sampled_from(["replace", "remove", "meta"]))
    if kind == "remove":
        del arrays[key]
    elif kind == "meta":
        meta = draw(json_mutation(json.loads(str(arrays["meta"]))))
        arrays["meta"] = np.array(json.dumps(meta, allow_nan=True))
    else:
        arrays[key] = draw(st.sampled_from(HOSTILE_ARRAYS))
    return arrays


def _load(tmp_path: Path, data: bytes) -> skr.LabelSet | None:
    path = tmp_path / f"labels-{next(_names)}.npz"
    path.write_bytes(data)
    labels = refused_or_accepted(lambda: skr.load_labels(path), path)
    if labels is None:
        return None
    # what the gate and `ragate eval` do with it: check encoder and model, vote, hash, look for overlaps
    n = len(labels.ids)
    assert n >= 1 and len(labels.questions) == len(labels.retrieve) == len(labels.embeddings) == n
    assert labels.embeddings.dtype == np.float32 and np.all(np.isfinite(labels.embeddings))
    assert all(isinstance(t, str) for t in (*labels.ids, *labels.questions))
    try:  # a record of another encoder or model (or none) is refused where the label set is used
        skr.check_encoder(labels, {**ENCODER, "dim": labels.embeddings.shape[1]}, "this index")
        skr.check_model(labels, MODEL)
    except RagateError as err:
        assert "the SKR label set" in str(err) and "`ragate s" in str(err)
    share, voters, _ = skr.vote(labels.embeddings[0], labels, k=3)
    assert 0.0 <= share <= 1.0 and 1 <= voters <= 3
    assert len(labels.content_sha256) == 64
    labels.overlap(TRAIN)
    return labels


# ------------------------------------------------------------------------------------------------ the properties


@fuzz_settings
@given(st.data())
def test_fuzz_label_set_bytes(tmp_path: Path, data: st.DataObject) -> None:
    _load(tmp_path, data.draw(byte_mutation(_npz(_arrays()))))


@fuzz_settings
@given(array_mutation())
def test_fuzz_label_set_arrays(tmp_path: Path, arrays: dict[str, Any]) -> None:
    _load(tmp_path, _npz(arrays))


def test_the_unmutated_label_set_reads_back(tmp_path: Path) -> None:
    back = _load(tmp_path, _npz(_arrays()))
    assert back is not None and back.content_sha256 == LABELS.content_sha256


# ------------------------------------------------------------------------------------- faults the fuzzing found


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("retrieve", np.array([True] * 7), r"6 ids, 6 questions, 7 labels, 6 embeddings"),
        ("embeddings", np.full((6, DIM), np.nan, np.float32), r"embeddings hold NaN or infinity"),
        (
            "embeddings",
            np.zeros((6, DIM + 1), np.float32),
            r"embeddings of dimension 17, but its encoder's is 16",
        ),
        ("questions", np.array(["q\ud800"] * 6), r"lone surrogate"),
        ("ids", np.array([1, 2, 3, 4, 5, 6]), r"ids int64 \(6,\) and questions .* are not text"),
        (
            "meta",
            np.array(json.dumps({"format": skr.FORMAT, "format_version": 1, "encoder": [1]})),
            r"encoder",
        ),
    ],
)
def test_a_damaged_label_set_is_refused_naming_the_file(
    tmp_path: Path, key: str, value: np.ndarray, message: str
) -> None:
    """Each used to load: a length mismatch then failed with a RagateError that named no file; NaN embeddings
    voted at random; another dimension, or an encoder that is a list, stopped every question's gate with a
    ValueError or AttributeError; a lone surrogate failed when the label set was hashed (UnicodeEncodeError);
    numeric ids were read as text."""
    path = tmp_path / "labels.npz"
    path.write_bytes(_npz(_arrays() | {key: value}))
    with pytest.raises(RagateError, match=r"labels\.npz: damaged label set: .*" + message):
        skr.load_labels(path)


def test_a_record_that_is_not_an_object_is_refused(tmp_path: Path) -> None:
    """``meta`` holding a JSON list used to raise AttributeError ('list' object has no attribute 'get')."""
    path = tmp_path / "labels.npz"
    path.write_bytes(_npz(_arrays() | {"meta": np.array("[1, 2]")}))
    with pytest.raises(RagateError, match=r"labels\.npz is not an SKR label set of format"):
        skr.load_labels(path)


def test_a_corrupt_member_is_refused(tmp_path: Path) -> None:
    """A member whose bytes were changed (CRC mismatch) is refused, not read."""
    data = bytearray(_npz(_arrays()))
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as z:
        info = z.getinfo("embeddings.npy")
    data[info.header_offset + 30 + len(info.filename) + 200] ^= 0xFF  # a byte of the embeddings' data
    path = tmp_path / "labels.npz"
    path.write_bytes(bytes(data))
    with pytest.raises(RagateError, match=r"labels\.npz is not an SKR label set"):
        skr.load_labels(path)


# the central directory's flag bits (1: encrypted) and compression method (99: none zipfile knows)
@pytest.mark.parametrize(("offset", "value"), [(8, 1), (10, 99)])
def test_a_member_flagged_encrypted_or_of_an_unknown_compression_is_refused(
    tmp_path: Path, offset: int, value: int
) -> None:
    """One flipped bit in a member's header used to escape as RuntimeError ("File 'retrieve.npy' is encrypted")
    or NotImplementedError ("That compression method is not supported")."""
    data = bytearray(_npz(_arrays()))
    entry = data.index(b"PK\x01\x02")  # the first member's entry in the zip's central directory
    data[entry + offset : entry + offset + 2] = value.to_bytes(2, "little")
    path = tmp_path / "labels.npz"
    path.write_bytes(bytes(data))
    with pytest.raises(
        RagateError, match=r"labels\.npz is not an SKR label set \((RuntimeError|NotImplemented)"
    ):
        skr.load_labels(path)
