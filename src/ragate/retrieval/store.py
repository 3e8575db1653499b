"""Index directories: the manifest, checksums, atomic writes, and the memory-mapped passage store.

Every index directory holds::

    manifest.json           format version, kind, encoder identity, passage count, build params, created-at,
                            ragate version, and the size and sha256 of every other file
    passages.jsonl          one passage per line: {"id", "title", "text", "source"?, "span"?}, in row order
    passages.offsets.npy    int64 (n + 1,) byte offsets of the lines (memory-mapped)
    ids.sorted.npy          the ids as UTF-8 bytes (numpy ``S`` dtype), sorted (memory-mapped)
    ids.rows.npy            int64 row of each sorted id (memory-mapped)

plus the files of its kind (``bm25/`` arrays, ``embeddings.npy``, ``hnsw.faiss``), and ``documents.json`` when it
was built from documents (:mod:`ragate.retrieval.documents`). Nothing is pickled: arrays are
``.npy`` files read with ``allow_pickle=False``, metadata is JSON. A directory is written under a temporary name
beside the target, fsynced, then renamed into place, so a crash never leaves a half index under the final name.
"""

from __future__ import annotations

import contextlib
import glob
import json
import mmap
import os
import shlex
import shutil
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from tokenize import TokenError
from typing import Any, Literal

import numpy as np
from tqdm.auto import tqdm

from ragate.errors import IndexFormatError
from ragate.fileio import exclusive_lock, parse_json, sha256_file, utf8_text
from ragate.retrieval.corpus import passage_json
from ragate.retrieval.types import Passage

FORMAT_NAME = "ragate-index"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
PASSAGES = "passages.jsonl"
OFFSETS = "passages.offsets.npy"
IDS_SORTED = "ids.sorted.npy"
IDS_ROWS = "ids.rows.npy"
KINDS = ("bm25", "dense", "hybrid")
BM25_FILES = (
    "data.csc.index.npy",
    "indices.csc.index.npy",
    "indptr.csc.index.npy",
    "params.index.json",
    "vocab.index.json",
)
_HASH_PROGRESS_BYTES = 256 << 20


def rebuild_hint(
    index_dir: Path, manifest: dict[str, Any] | None = None, *, encoder: str | None = None
) -> str:
    """The exact ``ragate index build`` command that rebuilds this index (placeholders where unknown; a damaged
    manifest's fields are used only where they have the type a build writes)."""

    def field(data: Any, key: str, kind: type) -> Any:
        value = data.get(key) if isinstance(data, dict) else None
        return value if isinstance(value, kind) else None

    manifest = manifest or {}
    documents = field(manifest, "documents", dict)
    if documents:
        paths = [p for p in field(documents, "paths", list) or [] if isinstance(p, str)]
        source = "--docs " + " ".join(shlex.quote(p) for p in paths or ["PATH"])
    else:
        source = f"--corpus {shlex.quote(field(manifest, 'corpus', str) or 'CORPUS')}"
    kind = manifest.get("kind") if manifest.get("kind") in KINDS else "bm25|dense|hybrid"
    parts = ["ragate index build", source, f"--kind {kind}", f"--out {index_dir}"]
    chunking = field(manifest, "chunking", dict)
    if chunking and chunking.get("unit", "characters") == "characters":  # word pieces: the default, no flag
        parts.append(
            f"--chunk-size {chunking.get('size')} --chunk-overlap {chunking.get('overlap')} "
            f"--min-chunk {chunking.get('min_size')}"
        )
    encoder = encoder or field(field(manifest, "encoder", dict), "source", str)
    if encoder:
        parts.append(f"--encoder {shlex.quote(encoder)}")
    if field(manifest, "params", dict) and manifest["params"].get("hnsw"):
        parts.append("--hnsw")
    parts.append("--force")
    return " ".join(parts)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _index_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST)


def write_manifest(root: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Checksum every file under ``root``, fsync them, and write ``manifest.json`` last. Returns the manifest."""
    files: dict[str, dict[str, Any]] = {}
    for path in _index_files(root):
        with open(path, "rb") as f:
            os.fsync(f.fileno())
        files[path.relative_to(root).as_posix()] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    full = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        **manifest,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "files": files,
    }
    with open(root / MANIFEST, "w", encoding="utf-8") as f:
        json.dump(full, f, indent=2, ensure_ascii=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    for directory in {p.parent for p in _index_files(root)} | {root}:
        _fsync_dir(directory)
    return full


@contextlib.contextmanager
def staged_directory(out_dir: Path, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a fresh temporary directory beside ``out_dir``; on success rename it to ``out_dir``.

    Refuses a non-empty ``out_dir`` unless ``overwrite``; then the old directory is moved aside, the new one
    renamed in and the old one deleted. On any error the temporary directory is removed and ``out_dir`` is
    left as it was. One build at a time per ``out_dir`` (a lock file beside it names the holder's PID); a
    build killed before it could clean up leaves its temporary directory, which the next build removes.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise IndexFormatError(f"{out_dir} exists and is not a directory: choose another --out path")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise IndexFormatError(
            f"{out_dir} exists and is not empty: choose another --out directory, or pass --force "
            "(overwrite=True) to replace it"
        )
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    lock = out_dir.parent / f".{out_dir.name}.lock"
    with exclusive_lock(lock, f"index directory {out_dir} (another build into it)"):
        for kind in ("tmp", "old"):  # left by a build that was killed: no live build holds them
            for stale in out_dir.parent.glob(f".{glob.escape(out_dir.name)}.{kind}-*"):
                shutil.rmtree(stale, ignore_errors=True)
        tag = uuid.uuid4().hex[:8]
        staging = out_dir.parent / f".{out_dir.name}.tmp-{tag}"
        staging.mkdir()
        try:
            yield staging
            if out_dir.exists():
                old = out_dir.parent / f".{out_dir.name}.old-{tag}"
                os.replace(out_dir, old)
                os.replace(staging, out_dir)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(staging, out_dir)
            _fsync_dir(out_dir.parent)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)


def read_manifest(index_dir: Path) -> dict[str, Any]:
    """Parse and check ``manifest.json`` (format and version); files are checked by :func:`verify_files`."""
    index_dir = Path(index_dir)
    path = index_dir / MANIFEST
    if not index_dir.is_dir():
        raise IndexFormatError(
            f"{index_dir} is not a directory: build an index with `{rebuild_hint(index_dir)}`"
        )
    if not path.is_file():
        raise IndexFormatError(
            f"{path} is missing: {index_dir} is not a ragate index or its build was interrupted; "
            f"rebuild it with `{rebuild_hint(index_dir)}`"
        )
    fix = f"rebuild the index with `{rebuild_hint(index_dir)}`"
    manifest = parse_json(utf8_text(path, IndexFormatError, fix), str(path), IndexFormatError, fix)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise IndexFormatError(
            f"{path} is not a ragate index manifest; rebuild with `{rebuild_hint(index_dir)}`"
        )
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise IndexFormatError(
            f"{index_dir} has index format version {version!r}, this ragate reads version {FORMAT_VERSION}; "
            f"rebuild it with this version: `{rebuild_hint(index_dir, manifest)}` "
            "(or use the ragate version that built it)"
        )
    if manifest.get("kind") not in KINDS or not isinstance(manifest.get("files"), dict):
        raise IndexFormatError(
            f"{path} is incomplete (kind or files); rebuild with `{rebuild_hint(index_dir)}`"
        )
    fault = manifest_fault(manifest)
    if fault:
        raise IndexFormatError(
            f"{path} is damaged: {fault}; rebuild the index with `{rebuild_hint(index_dir, manifest)}`"
        )
    return manifest


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _inside(rel: Any) -> bool:
    """A manifest's file name: a relative path that stays inside the index directory."""
    if not isinstance(rel, str) or not rel or "\\" in rel or "\x00" in rel:
        return False
    parts = PurePosixPath(rel).parts
    return not PurePosixPath(rel).is_absolute() and ".." not in parts and rel != MANIFEST


def manifest_fault(manifest: dict[str, Any]) -> str | None:
    """What is wrong with the fields of a manifest that opening an index reads (None: nothing). A manifest is
    written by ragate; one that fails this was edited or damaged, and trusting it would read files outside the
    index or fail deep inside numpy or bm25s."""
    for rel, entry in manifest["files"].items():
        if not _inside(rel):
            return f"it lists the file {rel!r}, which is not a path inside the index"
        if not isinstance(entry, dict) or not _count(entry.get("size")):
            return f"the entry of {rel!r} has no byte size"
        digest = entry.get("sha256")
        if not (
            isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)
        ):
            return f"the entry of {rel!r} has no sha256"
    kind, encoder, params = manifest["kind"], manifest.get("encoder"), manifest.get("params")
    needed = [PASSAGES, OFFSETS, IDS_SORTED, IDS_ROWS]  # what opening reads by name: each must be checked
    if kind in ("bm25", "hybrid"):
        needed += [f"bm25/{name}" for name in BM25_FILES]
    if kind in ("dense", "hybrid"):
        needed += ["embeddings.npy"] + (
            ["hnsw.faiss"] if isinstance(params, dict) and params.get("hnsw") else []
        )
    missing = [name for name in needed if name not in manifest["files"]]
    if missing:
        return f"it does not list {', '.join(missing)}, which a {kind} index reads"
    if not _count(manifest.get("passages")):
        return f"'passages' is {manifest.get('passages')!r}, not a passage count"
    if not isinstance(params, dict):
        return "'params' is not an object"
    if kind in ("bm25", "hybrid"):
        bm25 = params.get("bm25")
        if not isinstance(bm25, dict):
            return "'params.bm25' is not an object"
        for key in ("method", "stopwords", "stemmer"):
            if not isinstance(bm25.get(key, ""), str):
                return f"'params.bm25.{key}' is not a string"
    if kind in ("dense", "hybrid"):
        if not isinstance(encoder, dict):
            return "'encoder' is not an object"
        for key in ("name", "source"):
            if not isinstance(encoder.get(key), str):
                return f"'encoder.{key}' is not a string"
        for key in ("query_prefix", "document_prefix"):
            if not isinstance(encoder.get(key, ""), str):
                return f"'encoder.{key}' is not a string"
        if params.get("hnsw") and not isinstance(params.get("hnsw_params"), dict):
            return "'params.hnsw_params' is not an object"
    for key in ("documents", "chunking"):
        if manifest.get(key) is not None and not isinstance(manifest[key], dict):
            return f"'{key}' is not an object"
    return None


def verify_files(index_dir: Path, manifest: dict[str, Any], *, checksums: bool = True) -> None:
    """Every file the manifest lists exists inside the index with its size and (if ``checksums``) its sha256."""
    index_dir = Path(index_dir)
    files: dict[str, dict[str, Any]] = manifest["files"]
    hint = rebuild_hint(index_dir, manifest)
    total = sum(int(entry["size"]) for entry in files.values())
    root = index_dir.resolve()
    for rel, entry in files.items():
        path = index_dir / rel
        if not path.resolve().is_relative_to(root):  # a link out of the index: never read what it points to
            raise IndexFormatError(f"{path} leads outside the index; rebuild it with `{hint}`")
        if not path.is_file():
            raise IndexFormatError(f"{path} is missing from the index; rebuild it with `{hint}`")
        size = path.stat().st_size
        if size != entry["size"]:
            raise IndexFormatError(
                f"{path} is {size} bytes, the manifest says {entry['size']} (truncated or modified); "
                f"rebuild the index with `{hint}`"
            )
    if not checksums:
        return
    for rel, entry in files.items():
        path = index_dir / rel
        if sha256_file(path, progress=total >= _HASH_PROGRESS_BYTES) != entry["sha256"]:
            raise IndexFormatError(
                f"{path} is corrupted (its sha256 differs from the manifest's); rebuild the index with `{hint}`"
            )


def load_array(path: Path, *, mmap_mode: Literal["r"] | None = "r") -> np.ndarray:
    """A ``.npy`` array, memory-mapped read-only by default, never unpickled."""
    try:
        return np.load(path, mmap_mode=mmap_mode, allow_pickle=False)
    except (ValueError, SyntaxError, TokenError, EOFError, OSError) as err:
        # a damaged header is parsed as a Python literal (SyntaxError), a cut body ends early (EOFError)
        raise IndexFormatError(
            f"{path} is not a plain numpy array file ({type(err).__name__}: {err}); rebuild the index"
        ) from None


def passage_from_json(line: bytes | str) -> Passage:
    record = json.loads(line)
    span = record.get("span")
    return Passage(
        id=record["id"],
        title=record["title"],
        text=record["text"],
        source=record.get("source"),
        span=(span[0], span[1]) if span is not None else None,
    )


def _store_fault(offsets: np.ndarray, sorted_ids: np.ndarray, rows: np.ndarray, size: int) -> str | None:
    """What does not fit together in a passage store's arrays (None: they do), in time linear in the passages:
    offsets that delimit the lines of ``passages.jsonl`` (``size`` bytes), one sorted unique id and one row per
    passage."""
    if offsets.ndim != 1 or offsets.dtype.kind not in "iu" or len(offsets) < 2:
        return f"{OFFSETS} is not a list of byte offsets"
    n = len(offsets) - 1
    if offsets[0] != 0 or offsets[-1] != size or np.any(np.diff(offsets) <= 0):
        return f"{OFFSETS} does not delimit the {size} bytes of {PASSAGES}"
    if sorted_ids.ndim != 1 or sorted_ids.dtype.kind != "S" or len(sorted_ids) != n:
        return f"{IDS_SORTED} does not hold one id for each of the {n} passages"
    if n > 1 and not np.all(sorted_ids[1:] > sorted_ids[:-1]):
        return f"{IDS_SORTED} is not sorted or holds an id twice"
    if (
        rows.ndim != 1
        or rows.dtype.kind not in "iu"
        or len(rows) != n
        or int(rows.min()) < 0
        or int(rows.max()) >= n
    ):
        return f"{IDS_ROWS} does not hold one row for each of the {n} passages"
    return None


def write_passage_store(passages: Iterable[Passage], root: Path, *, progress: bool = True) -> int:
    """Write ``passages.jsonl`` and its offsets and id arrays into ``root``. Returns the passage count.

    Duplicate ids are refused (lookup by id must be unambiguous); so is an empty corpus.
    """
    offsets = [0]
    ids: list[bytes] = []
    with open(root / PASSAGES, "wb") as f:
        for passage in tqdm(passages, desc="store passages", unit=" passages", disable=not progress):
            if not isinstance(passage, Passage):
                raise TypeError(f"expected Passage objects, got {type(passage).__name__}")
            line = (passage_json(passage) + "\n").encode("utf-8")
            f.write(line)
            offsets.append(offsets[-1] + len(line))
            ids.append(passage.id.encode("utf-8"))
    if not ids:
        raise IndexFormatError("the corpus has no passages: check the --corpus file (is it empty?)")
    np.save(root / OFFSETS, np.asarray(offsets, dtype=np.int64), allow_pickle=False)
    id_array = np.asarray(ids, dtype=np.bytes_)
    if any(raw.endswith(b"\x00") for raw in ids):
        raise IndexFormatError("a passage id ends with a NUL character: clean the ids in the corpus")
    order = np.argsort(id_array, kind="stable")
    sorted_ids = id_array[order]
    dup = np.flatnonzero(sorted_ids[1:] == sorted_ids[:-1])
    if dup.size:
        first = sorted_ids[dup[0]].decode("utf-8")
        raise IndexFormatError(
            f"passage id {first!r} occurs more than once in the corpus ({dup.size} duplicate ids in all): "
            "ids must be unique; de-duplicate the corpus (ragate corpus build does) and rebuild"
        )
    np.save(root / IDS_SORTED, sorted_ids, allow_pickle=False)
    np.save(root / IDS_ROWS, order.astype(np.int64), allow_pickle=False)
    return len(ids)


def iter_passage_file(path: Path) -> Iterator[Passage]:
    """Stream the passages of a ``passages.jsonl`` written by :func:`write_passage_store`."""
    with open(path, "rb") as f:
        for line in f:
            yield passage_from_json(line)


@dataclass
class PassageStore:
    """Passages of an index by row or by id, read lazily from memory-mapped files (nothing loaded up front)."""

    root: Path
    offsets: np.ndarray = field(repr=False)
    sorted_ids: np.ndarray = field(repr=False)
    rows: np.ndarray = field(repr=False)
    _map: mmap.mmap | None = field(repr=False, default=None)

    @classmethod
    def open(cls, root: Path) -> PassageStore:
        offsets, sorted_ids, rows = (load_array(root / name) for name in (OFFSETS, IDS_SORTED, IDS_ROWS))
        with open(root / PASSAGES, "rb") as f:  # the map keeps its own handle on the file
            size = os.fstat(f.fileno()).st_size
            fault = _store_fault(offsets, sorted_ids, rows, size)
            if fault:
                raise IndexFormatError(f"{root}: {fault}; rebuild the index with `{rebuild_hint(root)}`")
            view = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return cls(root, offsets, sorted_ids, rows, view)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def by_row(self, row: int) -> Passage:
        if self._map is None:
            raise ValueError(f"the passage store at {self.root} is closed")
        start, end = int(self.offsets[row]), int(self.offsets[row + 1])
        try:
            return passage_from_json(self._map[start:end])
        except (
            ValueError,
            KeyError,
            TypeError,
            IndexError,
            AttributeError,
        ) as err:  # JSON and UTF-8 errors too
            raise IndexFormatError(
                f"{self.root / PASSAGES}: the passage at row {row} cannot be read ({type(err).__name__}: {err}); "
                f"rebuild the index with `{rebuild_hint(self.root)}`"
            ) from None

    def row_of(self, passage_id: str) -> int:
        """The row of a passage id; ``KeyError`` naming the id when the corpus has none."""
        key = np.bytes_(passage_id.encode("utf-8"))
        i = int(np.searchsorted(self.sorted_ids, key))
        if i >= len(self.sorted_ids) or self.sorted_ids[i] != key:
            raise KeyError(f"no passage with id {passage_id!r} in the index at {self.root}")
        return int(self.rows[i])

    def rows_of(self, passage_ids: Sequence[str]) -> np.ndarray:
        return np.asarray([self.row_of(pid) for pid in passage_ids], dtype=np.int64)

    def get(self, passage_id: str) -> Passage:
        return self.by_row(self.row_of(passage_id))

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
