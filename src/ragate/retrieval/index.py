"""Build an index directory from passages, and open one (verified) as a :class:`Retriever`.

``build_index(passages, out_dir, "bm25" | "dense" | "hybrid")`` streams the passages once into the passage store,
then builds the kind's files from the stored copy, all inside a temporary directory that is renamed into place
when complete (see :mod:`ragate.retrieval.store` for the layout). ``open_index(dir)`` checks the manifest, every
file's size and sha256, and that the encoder matches the one that built the index.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from ragate import __version__
from ragate.errors import EncoderMismatchError, IndexFormatError, ModelNotFoundError
from ragate.retrieval.bm25 import BM25_DIR, BM25Params, BM25Retriever, build_bm25
from ragate.retrieval.dense import (
    EMBEDDINGS,
    HNSW_FILE,
    DenseRetriever,
    HNSWParams,
    build_embeddings,
    build_hnsw,
)
from ragate.retrieval.encoders import Encoder, encoder_differences, load_encoder
from ragate.retrieval.hybrid import FUSION_DEPTH, HybridRetriever
from ragate.retrieval.store import (
    KINDS,
    PASSAGES,
    PassageStore,
    read_manifest,
    rebuild_hint,
    staged_directory,
    verify_files,
    write_manifest,
    write_passage_store,
)
from ragate.retrieval.types import Passage, Retriever

IndexKind = Literal["bm25", "dense", "hybrid"]


def build_index(
    passages: Iterable[Passage],
    out_dir: str | Path,
    kind: IndexKind,
    *,
    encoder: Encoder | str | Path | None = None,
    hnsw: bool = False,
    hnsw_params: HNSWParams | None = None,
    bm25_params: BM25Params | None = None,
    batch_size: int = 32,
    overwrite: bool = False,
    progress: bool = True,
    corpus: str | None = None,
) -> Path:
    """Build a ``kind`` index of ``passages`` in ``out_dir`` (atomically) and return ``out_dir``.

    ``encoder`` (dense/hybrid): an :class:`Encoder`, a name or model directory, or ``None`` for the default
    all-MiniLM-L6-v2. ``corpus`` is recorded in the manifest so that errors can print the rebuild command.
    A non-empty ``out_dir`` is refused unless ``overwrite``.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown index kind {kind!r}: choose one of {', '.join(KINDS)}")
    if hnsw and kind == "bm25":
        raise ValueError("hnsw applies to dense and hybrid indexes, not bm25")
    out_dir = Path(out_dir)
    dense = kind in ("dense", "hybrid")
    enc: Encoder | None = None
    if dense:
        enc = encoder if isinstance(encoder, Encoder) else load_encoder(encoder)
    bm25_params = bm25_params or BM25Params()
    hnsw_params = hnsw_params or HNSWParams()
    params: dict[str, Any] = {"hnsw": hnsw}
    with staged_directory(out_dir, overwrite=overwrite) as root:
        n = write_passage_store(passages, root, progress=progress)
        if kind in ("bm25", "hybrid"):
            build_bm25(root / PASSAGES, n, root / BM25_DIR, bm25_params, progress=progress)
            params["bm25"] = bm25_params.to_json()
        if enc is not None:
            build_embeddings(
                root / PASSAGES, n, root / EMBEDDINGS, enc, batch_size=batch_size, progress=progress
            )
            if hnsw:
                build_hnsw(root / EMBEDDINGS, root / HNSW_FILE, hnsw_params, progress=progress)
                params["hnsw_params"] = hnsw_params.to_json()
        write_manifest(
            root,
            {
                "kind": kind,
                "passages": n,
                "encoder": {**enc.identity(), "source": enc.source} if enc is not None else None,
                "params": params,
                "corpus": corpus,
                "ragate_version": __version__,
            },
        )
    return out_dir


def check_encoder(index_dir: Path, manifest: dict[str, Any], encoder: Encoder) -> None:
    """``EncoderMismatchError`` unless ``encoder`` has the name, dimension and prefixes the index was built with."""
    built = manifest["encoder"]
    differ = encoder_differences(built, encoder)
    if not differ:
        return
    raise EncoderMismatchError(
        f"{index_dir} was built with encoder {built.get('name')!r} (dim {built.get('dim')}, from "
        f"{built.get('source')!r}) but is being searched with {encoder.name!r} ({differ}): its vectors live in "
        f"another space. Open it with the encoder that built it (--encoder {built.get('source')}, or no "
        f"--encoder), or rebuild the index with yours: `{rebuild_hint(index_dir, manifest, encoder=encoder.source)}`"
    )


def _load_index_encoder(index_dir: Path, manifest: dict[str, Any]) -> Encoder:
    built = manifest["encoder"]
    try:
        return load_encoder(
            built["source"],
            name=built["name"],
            query_prefix=built["query_prefix"],
            document_prefix=built["document_prefix"],
        )
    except ModelNotFoundError as err:
        raise ModelNotFoundError(
            f"{index_dir} was built with encoder {built['name']!r} from {built['source']!r}, which cannot be "
            f"loaded here ({err}); pass the same model as encoder= (CLI: --encoder PATH)"
        ) from err


def open_index(
    index_dir: str | Path,
    *,
    encoder: Encoder | str | Path | None = None,
    verify: bool = True,
    ef_search: int | None = None,
    fusion_depth: int = FUSION_DEPTH,
) -> Retriever:
    """Open an index directory as a retriever, after checking its manifest and files.

    ``verify=False`` skips the sha256 pass (sizes are still checked). ``encoder`` defaults to the one recorded
    in the manifest; a different one raises :class:`EncoderMismatchError`. ``ef_search`` overrides HNSW's.
    """
    index_dir = Path(index_dir)
    manifest = read_manifest(index_dir)
    verify_files(index_dir, manifest, checksums=verify)
    kind = manifest["kind"]
    enc: Encoder | None = None
    if kind in ("dense", "hybrid"):
        if not manifest.get("encoder"):
            raise IndexFormatError(f"{index_dir}: a {kind} index without an encoder record; rebuild it")
        if encoder is None:
            enc = _load_index_encoder(index_dir, manifest)
        else:
            enc = encoder if isinstance(encoder, Encoder) else load_encoder(encoder)
        check_encoder(index_dir, manifest, enc)
    passages = PassageStore.open(index_dir)
    try:
        if len(passages) != manifest["passages"]:
            raise IndexFormatError(
                f"{index_dir / PASSAGES} holds {len(passages)} passages, the manifest says {manifest['passages']}; "
                f"rebuild with `{rebuild_hint(index_dir, manifest)}`"
            )
        params = manifest["params"]
        bm25 = None
        if kind in ("bm25", "hybrid"):
            bm25 = BM25Retriever.load(index_dir / BM25_DIR, passages, BM25Params.from_json(params["bm25"]))
            if kind == "bm25":
                return bm25
        assert enc is not None
        dense = DenseRetriever.load(
            index_dir, passages, enc, hnsw=bool(params.get("hnsw")), ef_search=ef_search
        )
        if kind == "dense":
            return dense
        assert bm25 is not None
        return HybridRetriever(bm25, dense, fusion_depth=fusion_depth)
    except BaseException:
        passages.close()
        raise


def index_info(index_dir: str | Path, *, verify: bool = True) -> dict[str, Any]:
    """The manifest of an index directory, after checking its files (sha256 too unless ``verify=False``)."""
    index_dir = Path(index_dir)
    manifest = read_manifest(index_dir)
    verify_files(index_dir, manifest, checksums=verify)
    return manifest
