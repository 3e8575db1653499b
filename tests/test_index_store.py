"""Index directories: manifest, verification on load (corrupted, truncated, missing files), encoder mismatch,
atomic writes, no pickle, memory-mapping, and the ``ragate index`` / ``ragate search`` commands."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from ragate import __version__
from ragate.cli.main import main
from ragate.errors import EncoderMismatchError, IndexFormatError
from ragate.retrieval.encoders import Encoder, load_encoder
from ragate.retrieval.index import build_index, index_info, open_index
from ragate.retrieval.store import FORMAT_VERSION, MANIFEST
from ragate.retrieval.types import Passage

PICKLE_MAGIC = tuple(bytes([0x80, proto]) for proto in range(2, 6))


@pytest.fixture(scope="module")
def small(wiki_passages: list[Passage]) -> list[Passage]:
    return wiki_passages[:12]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, small: list[Passage], minilm: Encoder) -> dict[str, Path]:
    """One pristine index of each kind; tests copy them before damaging anything."""
    root = tmp_path_factory.mktemp("pristine")
    return {
        "bm25": build_index(small, root / "bm25", "bm25", progress=False, corpus="wiki.jsonl"),
        "dense": build_index(
            small, root / "dense", "dense", encoder=minilm, progress=False, corpus="wiki.jsonl"
        ),
        "hnsw": build_index(small, root / "hnsw", "dense", encoder=minilm, hnsw=True, progress=False),
        "hybrid": build_index(small, root / "hybrid", "hybrid", encoder=minilm, progress=False),
    }


@pytest.fixture()
def copy_of(built: dict[str, Path], tmp_path: Path) -> Iterator[object]:
    def copy(kind: str) -> Path:
        return Path(shutil.copytree(built[kind], tmp_path / kind))

    yield copy


def test_manifest_contents(built: dict[str, Path], small: list[Passage]) -> None:
    manifest = json.loads((built["dense"] / MANIFEST).read_text())
    assert manifest["format"] == "ragate-index" and manifest["format_version"] == FORMAT_VERSION
    assert manifest["kind"] == "dense" and manifest["passages"] == len(small)
    assert manifest["encoder"] == {
        "name": "all-MiniLM-L6-v2",
        "dim": 384,
        "query_prefix": "",
        "document_prefix": "",
        "source": "all-MiniLM-L6-v2",
    }
    assert manifest["params"] == {"hnsw": False}
    assert manifest["ragate_version"] == __version__ and manifest["created_at"]
    assert manifest["corpus"] == "wiki.jsonl"
    on_disk = sorted(
        p.relative_to(built["dense"]).as_posix() for p in built["dense"].rglob("*") if p.is_file()
    )
    assert sorted(manifest["files"]) == [f for f in on_disk if f != MANIFEST]
    assert {"passages.jsonl", "passages.offsets.npy", "ids.sorted.npy", "embeddings.npy"} <= set(
        manifest["files"]
    )
    for entry in manifest["files"].values():
        assert entry["size"] > 0 and len(entry["sha256"]) == 64
    bm25 = json.loads((built["bm25"] / MANIFEST).read_text())
    assert (
        bm25["encoder"] is None
        and bm25["params"]["bm25"]["k1"] == 1.5
        and bm25["params"]["bm25"]["b"] == 0.75
    )
    assert any(f.startswith("bm25/") for f in bm25["files"])
    hnsw = json.loads((built["hnsw"] / MANIFEST).read_text())
    assert (
        hnsw["params"]["hnsw"] and hnsw["params"]["hnsw_params"]["m"] == 32 and "hnsw.faiss" in hnsw["files"]
    )
    assert index_info(built["hybrid"])["kind"] == "hybrid"


def test_no_staging_directories_are_left(built: dict[str, Path]) -> None:
    assert sorted(p.name for p in next(iter(built.values())).parent.iterdir()) == [
        "bm25",
        "dense",
        "hnsw",
        "hybrid",
    ]


@pytest.mark.parametrize("kind", ["bm25", "dense", "hnsw", "hybrid"])
def test_no_pickle_anywhere(built: dict[str, Path], kind: str) -> None:
    for path in built[kind].rglob("*"):
        if not path.is_file():
            continue
        head = path.read_bytes()[:2]
        assert head not in PICKLE_MAGIC, path
        if path.suffix == ".npy":
            array = np.load(path, allow_pickle=False)
            assert array.dtype != object, path
        elif path.suffix == ".json":
            json.loads(path.read_text(encoding="utf-8"))
        elif path.suffix == ".jsonl":
            for line in path.read_text(encoding="utf-8").splitlines():
                json.loads(line)
        else:
            assert path.name == "hnsw.faiss", path  # FAISS's own binary format, read by faiss.read_index


def test_arrays_are_memory_mapped(built: dict[str, Path], minilm: Encoder) -> None:
    with open_index(built["hybrid"], encoder=minilm) as hybrid:
        assert isinstance(hybrid.dense.embeddings, np.memmap)  # type: ignore[attr-defined]
        store = hybrid.passages  # type: ignore[attr-defined]
        assert all(isinstance(a, np.memmap) for a in (store.offsets, store.sorted_ids, store.rows))
        assert all(isinstance(hybrid.bm25.model.scores[k], np.memmap) for k in ("data", "indices", "indptr"))  # type: ignore[attr-defined]


def test_reopen_without_an_encoder_uses_the_recorded_one(built: dict[str, Path]) -> None:
    with open_index(built["dense"]) as dense:
        assert dense.encoder.name == "all-MiniLM-L6-v2"  # type: ignore[attr-defined]
        assert dense.search(["Who painted The Starry Night?"], 1)[0][0].id  # a search works


# ----------------------------------------------------------------------------- damage is detected


def flip_byte(path: Path, offset: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("dense", "embeddings.npy"),
        ("dense", "passages.jsonl"),
        ("bm25", "bm25/data.csc.index.npy"),
        ("hnsw", "hnsw.faiss"),
        ("hybrid", "ids.sorted.npy"),
    ],
)
def test_corrupted_file(copy_of: object, kind: str, name: str, minilm: Encoder) -> None:
    index_dir = copy_of(kind)  # type: ignore[operator]
    flip_byte(index_dir / name)
    with pytest.raises(IndexFormatError, match="corrupted") as info:
        open_index(index_dir, encoder=minilm)
    message = str(info.value)
    assert str(index_dir / name) in message and "ragate index build" in message and "--force" in message
    if kind == "dense":
        assert "--corpus wiki.jsonl --kind dense" in message and "--encoder all-MiniLM-L6-v2" in message
    if name == "embeddings.npy":  # the flip is in the data: sizes match, only sha256 sees it
        open_index(index_dir, encoder=minilm, verify=False).close()


def test_truncated_file(copy_of: object, minilm: Encoder) -> None:
    index_dir = copy_of("dense")  # type: ignore[operator]
    path = index_dir / "embeddings.npy"
    path.write_bytes(path.read_bytes()[:-100])
    for verify in (True, False):
        with pytest.raises(IndexFormatError, match="truncated") as info:
            open_index(index_dir, encoder=minilm, verify=verify)
        assert str(path) in str(info.value)


def test_missing_file(copy_of: object) -> None:
    index_dir = copy_of("bm25")  # type: ignore[operator]
    (index_dir / "passages.offsets.npy").unlink()
    with pytest.raises(IndexFormatError, match="passages.offsets.npy is missing"):
        open_index(index_dir)


def test_missing_manifest(copy_of: object, tmp_path: Path) -> None:
    index_dir = copy_of("bm25")  # type: ignore[operator]
    (index_dir / MANIFEST).unlink()
    with pytest.raises(IndexFormatError, match="manifest.json is missing") as info:
        open_index(index_dir)
    assert "ragate index build --corpus CORPUS" in str(info.value)
    with pytest.raises(IndexFormatError, match="not a directory"):
        open_index(tmp_path / "nowhere")


def test_unknown_format_version(copy_of: object) -> None:
    index_dir = copy_of("bm25")  # type: ignore[operator]
    manifest = json.loads((index_dir / MANIFEST).read_text())
    manifest["format_version"] = 99
    (index_dir / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(IndexFormatError, match="format version 99, this ragate reads version 1"):
        open_index(index_dir)
    (index_dir / MANIFEST).write_text("{not json")
    with pytest.raises(IndexFormatError, match="not valid JSON"):
        open_index(index_dir)


# ----------------------------------------------------------------------------- encoder identity


def test_another_encoder_is_refused(built: dict[str, Path], minilm: Encoder, tiny_encoder_dir: Path) -> None:
    # Same weights under e5-style prefixes: another embedding space for queries, so refused.
    e5_style = minilm.with_identity(
        name="minilm-e5-style", query_prefix="query: ", document_prefix="passage: "
    )
    with pytest.raises(EncoderMismatchError, match="built with encoder 'all-MiniLM-L6-v2'") as info:
        open_index(built["dense"], encoder=e5_style)
    assert "query_prefix '' vs 'query: '" in str(info.value)
    # A real model with another dimension: MiniLM's modules plus a Dense layer to 64-d, saved and loaded by path.
    tiny = load_encoder(tiny_encoder_dir)
    for kind in ("dense", "hybrid"):
        with pytest.raises(EncoderMismatchError, match="dim 384 vs 64") as info:
            open_index(built[kind], encoder=tiny)
        assert "--encoder all-MiniLM-L6-v2" in str(info.value) and str(tiny_encoder_dir) in str(info.value)
    open_index(built["dense"], encoder=minilm).close()
    open_index(built["bm25"], encoder=tiny).close()  # BM25 has no embedding space to mismatch


# ----------------------------------------------------------------------------- writes


def test_existing_directory_is_not_overwritten_unless_asked(tmp_path: Path, small: list[Passage]) -> None:
    out = tmp_path / "ix"
    out.mkdir()
    build_index(small, out, "bm25", progress=False)  # an empty directory is fine
    with pytest.raises(IndexFormatError, match="not empty.*--force"):
        build_index(small[:3], out, "bm25", progress=False)
    assert index_info(out)["passages"] == len(small)
    build_index(small[:3], out, "bm25", progress=False, overwrite=True)
    assert index_info(out)["passages"] == 3
    assert [p.name for p in tmp_path.iterdir()] == ["ix"]


def test_failed_build_leaves_nothing(tmp_path: Path, small: list[Passage]) -> None:
    def broken() -> Iterator[Passage]:
        yield from small[:5]
        raise RuntimeError("corpus read failed")

    with pytest.raises(RuntimeError, match="corpus read failed"):
        build_index(broken(), tmp_path / "ix", "bm25", progress=False)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(IndexFormatError, match="no passages"):
        build_index([], tmp_path / "ix", "bm25", progress=False)
    with pytest.raises(IndexFormatError, match="'a' occurs more than once"):
        build_index(
            [Passage("a", "", "x"), Passage("b", "", "y"), Passage("a", "", "z")], tmp_path / "ix", "bm25"
        )
    assert list(tmp_path.iterdir()) == []


def test_failed_overwrite_keeps_the_old_index(tmp_path: Path, small: list[Passage]) -> None:
    out = build_index(small, tmp_path / "ix", "bm25", progress=False)
    with pytest.raises(IndexFormatError):
        build_index([], out, "bm25", progress=False, overwrite=True)
    assert index_info(out)["passages"] == len(small)


def test_passage_ids_of_any_length_and_script(tmp_path: Path) -> None:
    passages = [
        Passage("é", "", "accent"),
        Passage("ab", "", "two"),
        Passage("a", "", "one"),
        Passage("日本", "", "x"),
    ]
    with open_index(build_index(passages, tmp_path / "ix", "bm25", progress=False)) as r:
        for p in passages:
            assert r.passage(p.id) == p
        for missing in ("abc", "", "日", "日本語のとても長いid", "é" * 40):
            with pytest.raises(KeyError):
                r.passage(missing)


# ----------------------------------------------------------------------------- CLI


def test_cli_build_info_search(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = Path(__file__).parent / "data" / "wiki_passages.jsonl"
    out = tmp_path / "ix"
    assert (
        main(["index", "build", "--corpus", str(corpus), "--kind", "bm25", "--out", str(out), "--quiet"]) == 0
    )
    printed = capsys.readouterr().out
    assert "indexed 40 passages (bm25)" in printed and "passages/s" in printed and str(out) in printed

    assert main(["index", "info", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "passages   40" in printed and "sha256 verified" in printed and "passages.jsonl" in printed

    assert main(["search", str(out), "Who painted The Starry Night?", "-k", "2"]) == 0
    printed = capsys.readouterr().out
    assert "  1 " in printed and "w30  Vincent van Gogh" in printed

    assert main(["search", str(out), "Who painted The Starry Night?", "penicillin", "--json", "-k", "3"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["hits"][0]["id"] for line in lines] == ["w30", "w27"]
    assert lines[0]["hits"][0]["rank"] == 1 and len(lines[1]["hits"]) == 3

    assert (
        main(["index", "build", "--corpus", str(corpus), "--kind", "bm25", "--out", str(out), "--quiet"]) == 2
    )
    assert "--force" in capsys.readouterr().err

    flip_byte(out / "passages.jsonl")
    assert main(["search", str(out), "anything"]) == 2
    assert "corrupted" in capsys.readouterr().err


def test_cli_bad_corpus_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = tmp_path / "c.jsonl"
    good = [json.dumps({"id": f"d{i}", "title": "T", "text": f"passage number {i}"}) for i in range(3)]
    corpus.write_text("\n".join(good) + '\n{"id": "d9", "title": "T", "te')  # a truncated last line
    argv = [
        "index",
        "build",
        "--corpus",
        str(corpus),
        "--kind",
        "bm25",
        "--out",
        str(tmp_path / "ix"),
        "--quiet",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{corpus}:4" in err and "--skip-bad" in err
    assert not (tmp_path / "ix").exists()
    assert main([*argv, "--skip-bad"]) == 0
    assert "indexed 3 passages" in capsys.readouterr().out
