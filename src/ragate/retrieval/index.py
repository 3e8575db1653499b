"""Build an index directory from passages, and open one (verified) as a :class:`Retriever`.

``build_index(passages, out_dir, "bm25" | "dense" | "hybrid")`` streams the passages once into the passage store,
then builds the kind's files from the stored copy, all inside a temporary directory that is renamed into place
when complete (see :mod:`ragate.retrieval.store` for the layout). ``open_index(dir)`` checks the manifest, every
file's size and sha256, and that the encoder matches the one that built the index.

The pieces of a build (:func:`write_index_files`, :func:`index_manifest`) and :func:`write_updated_index`, which
rewrites an index with some passages dropped and new ones added while copying the kept embedding rows, are what
:mod:`ragate.retrieval.documents` builds and extends indexes of your own documents with.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

import numpy as np
from tqdm.auto import tqdm

from ragate.errors import EncoderMismatchError, IndexFormatError, ModelNotFoundError
from ragate.retrieval.bm25 import BM25_DIR, BM25Params, BM25Retriever, build_bm25
from ragate.retrieval.dense import (
    EMBEDDINGS,
    ENCODE_CHUNK,
    HNSW_FILE,
    DenseRetriever,
    HNSWParams,
    build_embeddings,
    build_hnsw,
)
from ragate.retrieval.encoders import (
    DeferredEncoder,
    Encoder,
    encoder_differences,
    load_encoder,
    resolve_encoder_dir,
)
from ragate.retrieval.hybrid import FUSION_DEPTH, HybridRetriever
from ragate.retrieval.pooled import ChunkSettings
from ragate.retrieval.store import (
    KINDS,
    PASSAGES,
    PassageStore,
    load_array,
    read_manifest,
    rebuild_hint,
    staged_directory,
    verify_files,
    write_manifest,
    write_passage_store,
)
from ragate.retrieval.types import Passage, Retriever
from ragate.version import __version__

IndexKind = Literal["bm25", "dense", "hybrid"]
COPY_ROWS = 65_536


def build_encoder(kind: IndexKind, encoder: Encoder | str | Path | None) -> Encoder | None:
    """The encoder a ``kind`` index is built with (``None`` for bm25); ``ValueError`` for an unknown kind."""
    if kind not in KINDS:
        raise ValueError(f"unknown index kind {kind!r}: choose one of {', '.join(KINDS)}")
    if kind == "bm25":
        return None
    return encoder if isinstance(encoder, Encoder) else load_encoder(encoder)


def write_index_files(
    root: Path,
    passages: Iterable[Passage],
    kind: IndexKind,
    enc: Encoder | None,
    *,
    hnsw: bool = False,
    hnsw_params: HNSWParams | None = None,
    bm25_params: BM25Params | None = None,
    batch_size: int = 32,
    progress: bool = True,
) -> tuple[int, dict[str, Any]]:
    """Write the passage store and the ``kind``'s files into ``root``; returns the passage count and the build
    params the manifest records. ``enc`` is :func:`build_encoder`'s."""
    if hnsw and kind == "bm25":
        raise ValueError("hnsw applies to dense and hybrid indexes, not bm25")
    n = write_passage_store(passages, root, progress=progress)
    params: dict[str, Any] = {"hnsw": hnsw}
    if kind in ("bm25", "hybrid"):
        bm25_params = bm25_params or BM25Params()
        build_bm25(root / PASSAGES, n, root / BM25_DIR, bm25_params, progress=progress)
        params["bm25"] = bm25_params.to_json()
    if enc is not None:
        build_embeddings(root / PASSAGES, n, root / EMBEDDINGS, enc, batch_size=batch_size, progress=progress)
        if hnsw:
            hnsw_params = hnsw_params or HNSWParams()
            build_hnsw(root / EMBEDDINGS, root / HNSW_FILE, hnsw_params, progress=progress)
            params["hnsw_params"] = hnsw_params.to_json()
    return n, params


def index_manifest(
    kind: str,
    n: int,
    enc: Encoder | None,
    params: dict[str, Any],
    *,
    corpus: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """What :func:`~ragate.retrieval.store.write_manifest` records about a build (``extra`` keys last)."""
    return {
        "kind": kind,
        "passages": n,
        "encoder": {**enc.identity(), "source": enc.source} if enc is not None else None,
        "params": params,
        "corpus": corpus,
        "ragate_version": __version__,
        **(extra or {}),
    }


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
    chunking: ChunkSettings | None = None,
) -> Path:
    """Build a ``kind`` index of ``passages`` in ``out_dir`` (atomically) and return ``out_dir``.

    ``encoder`` (dense/hybrid): an :class:`Encoder`, a name or model directory, or ``None`` for the default
    all-MiniLM-L6-v2. ``corpus`` is recorded in the manifest so that errors can print the rebuild command, and
    so is ``chunking`` when the passages were chunked. A non-empty ``out_dir`` is refused unless ``overwrite``.
    """
    if hnsw and kind == "bm25":
        raise ValueError("hnsw applies to dense and hybrid indexes, not bm25")
    enc = build_encoder(kind, encoder)
    out_dir = Path(out_dir)
    extra = {"chunking": asdict(chunking)} if chunking is not None else None
    with staged_directory(out_dir, overwrite=overwrite) as root:
        n, params = write_index_files(
            root,
            passages,
            kind,
            enc,
            hnsw=hnsw,
            hnsw_params=hnsw_params,
            bm25_params=bm25_params,
            batch_size=batch_size,
            progress=progress,
        )
        write_manifest(root, index_manifest(kind, n, enc, params, corpus=corpus, extra=extra))
    return out_dir


def write_updated_index(
    root: Path,
    old_dir: Path,
    manifest: dict[str, Any],
    keep_ids: Sequence[str],
    new: Sequence[Passage],
    enc: Encoder | None,
    *,
    batch_size: int = 32,
    progress: bool = True,
) -> tuple[int, dict[str, Any]]:
    """Write into ``root`` the index at ``old_dir`` (its ``manifest``) with only the passages ``keep_ids`` (in
    their old row order) followed by ``new``. Kept passages' embedding rows are copied, only ``new`` ones are
    encoded; BM25 and HNSW are rebuilt over the whole store. Returns the passage count and the build params."""
    params = dict(manifest["params"])
    with contextlib.closing(PassageStore.open(old_dir)) as old:
        keep_rows = np.sort(old.rows_of(keep_ids))
        n = write_passage_store(
            itertools.chain((old.by_row(int(r)) for r in keep_rows), new), root, progress=progress
        )
    if "bm25" in params:
        build_bm25(
            root / PASSAGES, n, root / BM25_DIR, BM25Params.from_json(params["bm25"]), progress=progress
        )
    if enc is not None:
        vectors = load_array(old_dir / EMBEDDINGS)
        out = np.lib.format.open_memmap(root / EMBEDDINGS, mode="w+", dtype=np.float32, shape=(n, enc.dim))
        for start in range(0, len(keep_rows), COPY_ROWS):
            rows = keep_rows[start : start + COPY_ROWS]
            out[start : start + len(rows)] = vectors[rows]
        row = len(keep_rows)
        with tqdm(total=len(new), desc=f"embed ({enc.name})", unit=" passages", disable=not progress) as bar:
            for start in range(0, len(new), ENCODE_CHUNK):
                texts = [p.contents for p in new[start : start + ENCODE_CHUNK]]
                out[row : row + len(texts)] = enc.encode_documents(texts, batch_size=batch_size)
                row += len(texts)
                bar.update(len(texts))
        out.flush()
        del out, vectors
        if params.get("hnsw"):
            hnsw_params = HNSWParams(**params["hnsw_params"])
            build_hnsw(root / EMBEDDINGS, root / HNSW_FILE, hnsw_params, progress=progress)
    return n, params


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


def index_encoder(
    index_dir: Path, manifest: dict[str, Any], encoder: Encoder | str | Path | None = None
) -> Encoder:
    """The encoder to search (or extend) a dense or hybrid index with: ``encoder`` if given (it must match the
    manifest's, else :class:`EncoderMismatchError`), else the one the manifest records."""
    if not manifest.get("encoder"):
        raise IndexFormatError(
            f"{index_dir}: a {manifest['kind']} index without an encoder record; rebuild it"
        )
    if encoder is None:
        enc = _load_index_encoder(index_dir, manifest)
    else:
        enc = encoder if isinstance(encoder, Encoder) else load_encoder(encoder)
    check_encoder(index_dir, manifest, enc)
    return enc


def _load_index_encoder(index_dir: Path, manifest: dict[str, Any]) -> Encoder:
    """The encoder the manifest records, loaded on first use (:class:`DeferredEncoder`): its identity is the
    manifest's, and the model's files are looked for now, so a missing model is an error before any cost."""
    built = manifest["encoder"]

    def missing(err: ModelNotFoundError) -> ModelNotFoundError:
        return ModelNotFoundError(
            f"{index_dir} was built with encoder {built['name']!r} from {built['source']!r}, which cannot be "
            f"loaded here ({err}); pass the same model as encoder= (CLI: --encoder PATH)"
        )

    try:
        resolve_encoder_dir(built["source"])
    except ModelNotFoundError as err:
        raise missing(err) from err

    def load() -> Encoder:
        try:
            enc = load_encoder(
                built["source"],
                name=built["name"],
                query_prefix=built["query_prefix"],
                document_prefix=built["document_prefix"],
            )
        except ModelNotFoundError as err:
            raise missing(err) from err
        check_encoder(index_dir, manifest, enc)  # the model's own dimension, now that it is loaded
        return enc

    try:
        dim = int(built["dim"])
        identity = {k: str(built[k]) for k in ("name", "source", "query_prefix", "document_prefix")}
    except (KeyError, TypeError, ValueError):
        return load()  # a manifest without the full record: load now (check_encoder names what differs)
    return DeferredEncoder(dim=dim, load=load, **identity)


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
        enc = index_encoder(index_dir, manifest, encoder)
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
