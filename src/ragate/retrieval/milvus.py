"""Dense retrieval in Milvus through pymilvus's ``MilvusClient``: the same search as the FAISS flat index, served
by a vector database.

The URI picks the deployment and nothing else changes: a local path (``"index/milvus.db"``) runs milvus-lite
in-process (tests, laptops), ``"http://host:19530"`` a Milvus standalone server or cluster (pass ``token=`` for
authentication), a Zilliz Cloud URI the managed service.

When to move from a FAISS index directory to Milvus
---------------------------------------------------
A flat FAISS index keeps 4·dim bytes per passage in memory (float32): 384-d (all-MiniLM-L6-v2) is 1.5 KB a passage,
so 1M passages ≈ 1.5 GB, 10M ≈ 15 GB and 21M (all of Wikipedia as DPR's 100-word passages) ≈ 32 GB, plus the
passage text (≈ 0.6 KB a passage as JSONL) on disk; a 768-d encoder doubles the vectors. Up to a few million
passages a memory-mapped flat or HNSW index on one machine is simpler and faster (no network hop). Move to
Milvus when the vectors no longer fit in one machine's RAM, or when the corpus changes while it is served. Milvus
gives sharding across query nodes (a collection larger than any one node), persistence and replication
independent of the process that searches, concurrent writers (insert/delete while others search, no rebuild
and rename), index types built for scale (IVF, HNSW, DiskANN, quantised), and many clients sharing one index.

Schema: ``id`` VARCHAR primary key, ``vector`` FLOAT_VECTOR(dim), ``title``/``text``/``source`` VARCHAR; metric IP
over L2-normalised vectors (= cosine), index FLAT (exact, the default) or AUTOINDEX. The encoder identity and the
passage count are stored as the collection property ``ragate.manifest`` (JSON); opening with another encoder is
an :class:`EncoderMismatchError`.

milvus-lite quirks handled here: a renamed collection comes back released (we load it); the schema description
is not kept (hence a collection property); a ``.db`` URI is a directory in milvus-lite 3.x. Servers cap a search's
``limit`` at 16384.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from itertools import islice
from pathlib import Path
from typing import Any, Literal

import numpy as np
from tqdm.auto import tqdm

from ragate.errors import EncoderMismatchError, IndexFormatError
from ragate.retrieval.encoders import Encoder, encoder_differences, load_encoder
from ragate.retrieval.ranking import check_queries
from ragate.retrieval.types import Hit, Passage, Retriever
from ragate.version import __version__

DEFAULT_COLLECTION = "ragate_passages"
MANIFEST_PROPERTY = "ragate.manifest"
FORMAT_VERSION = 1
MAX_ID_CHARS = 1024
MAX_TEXT_BYTES = 65535
MAX_LIMIT = 16384
TEXT_FIELDS = ("title", "text", "source")


def _client(uri: str | Path, token: str | None) -> Any:
    from pymilvus import MilvusClient

    return MilvusClient(uri=str(uri), token=token or "")


def _row(passage: Passage, vector: np.ndarray) -> dict[str, Any]:
    if len(passage.id) > MAX_ID_CHARS:
        raise ValueError(
            f"passage id {passage.id[:40]!r}... is longer than {MAX_ID_CHARS} characters: shorten the ids"
        )
    for name in TEXT_FIELDS:
        value = getattr(passage, name) or ""
        if len(value.encode("utf-8")) > MAX_TEXT_BYTES:
            raise ValueError(
                f"passage {passage.id!r}: {name} is over {MAX_TEXT_BYTES} bytes, Milvus's VARCHAR limit; chunk the "
                "corpus first (ragate corpus build chunks long documents)"
            )
    return {
        "id": passage.id,
        "vector": vector.tolist(),
        "title": passage.title,
        "text": passage.text,
        "source": passage.source or "",
    }


def _create_collection(client: Any, name: str, dim: int, index_type: str) -> None:
    from pymilvus import DataType, MilvusClient

    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=MAX_ID_CHARS)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
    for field in TEXT_FIELDS:
        schema.add_field(field, DataType.VARCHAR, max_length=MAX_TEXT_BYTES)
    index_params = client.prepare_index_params()
    index_params.add_index(field_name="vector", index_type=index_type, metric_type="IP")
    client.create_collection(name, schema=schema, index_params=index_params, consistency_level="Strong")


class MilvusRetriever(Retriever):
    """Search a Milvus collection of passages and their normalised embeddings (scores are cosines)."""

    kind = "milvus"
    score_kind = "cosine"

    def __init__(self, client: Any, collection: str, encoder: Encoder, manifest: dict[str, Any]) -> None:
        self.client = client
        self.collection = collection
        self.encoder = encoder
        self.manifest = manifest

    @classmethod
    def build(
        cls,
        passages: Iterable[Passage],
        uri: str | Path,
        *,
        encoder: Encoder | str | Path | None = None,
        vectors: Iterable[np.ndarray] | None = None,
        collection: str = DEFAULT_COLLECTION,
        index_type: Literal["FLAT", "AUTOINDEX"] = "FLAT",
        insert_batch: int = 512,
        encode_batch: int = 32,
        overwrite: bool = False,
        progress: bool = True,
        token: str | None = None,
    ) -> MilvusRetriever:
        """Embed and insert ``passages`` into a new collection, then open it.

        The collection is filled under a temporary name and renamed when complete (the manifest property is
        written before the rename), so a crashed build never leaves a half collection under ``collection``.
        ``vectors`` (one normalised row per passage, e.g. a dense index's ``embeddings``) skips the encoding.
        """
        enc = encoder if isinstance(encoder, Encoder) else load_encoder(encoder)
        client = _client(uri, token)
        if client.has_collection(collection) and not overwrite:
            client.close()
            raise IndexFormatError(
                f"collection {collection!r} already exists at {uri}: choose another collection name or pass "
                "overwrite=True to replace it"
            )
        staging = f"{collection}__building_{uuid.uuid4().hex[:8]}"
        _create_collection(client, staging, enc.dim, index_type)
        try:
            n = 0
            stream = iter(passages)
            row_vectors: Iterator[np.ndarray] | None = iter(vectors) if vectors is not None else None
            with tqdm(desc=f"milvus insert ({enc.name})", unit=" passages", disable=not progress) as bar:
                while batch := list(islice(stream, insert_batch)):
                    if row_vectors is None:
                        embedded = enc.encode_documents([p.contents for p in batch], batch_size=encode_batch)
                    else:
                        embedded = np.asarray([next(row_vectors) for _ in batch], dtype=np.float32)
                    client.insert(staging, [_row(p, v) for p, v in zip(batch, embedded, strict=True)])
                    n += len(batch)
                    bar.update(len(batch))
            if n == 0:
                raise IndexFormatError("the corpus has no passages: check the --corpus file (is it empty?)")
            client.flush(staging)
            manifest = {
                "format_version": FORMAT_VERSION,
                "kind": "milvus",
                "passages": n,
                "encoder": {**enc.identity(), "source": enc.source},
                "params": {"index_type": index_type, "metric": "IP"},
                "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "ragate_version": __version__,
            }
            client.alter_collection_properties(staging, properties={MANIFEST_PROPERTY: json.dumps(manifest)})
            if client.has_collection(collection):
                client.drop_collection(collection)
            client.rename_collection(staging, collection)
        except BaseException:
            if client.has_collection(staging):
                client.drop_collection(staging)
            client.close()
            raise
        client.close()
        return cls.open(uri, collection=collection, encoder=enc, token=token)

    @classmethod
    def open(
        cls,
        uri: str | Path,
        *,
        collection: str = DEFAULT_COLLECTION,
        encoder: Encoder | str | Path | None = None,
        token: str | None = None,
    ) -> MilvusRetriever:
        """Open a collection built by :meth:`build`; ``encoder`` defaults to the one recorded in it."""
        client = _client(uri, token)
        try:
            if not client.has_collection(collection):
                raise IndexFormatError(
                    f"no collection {collection!r} at {uri}: build it with MilvusRetriever.build(passages, uri)"
                )
            properties = client.describe_collection(collection).get("properties") or {}
            raw = properties.get(MANIFEST_PROPERTY)
            if raw is None:
                raise IndexFormatError(
                    f"collection {collection!r} at {uri} has no {MANIFEST_PROPERTY} property: it was not built by "
                    "ragate; rebuild it with MilvusRetriever.build(passages, uri, overwrite=True)"
                )
            manifest = json.loads(raw)
            if manifest.get("format_version") != FORMAT_VERSION:
                raise IndexFormatError(
                    f"collection {collection!r} has format version {manifest.get('format_version')!r}, this ragate "
                    f"reads {FORMAT_VERSION}: rebuild it with MilvusRetriever.build(..., overwrite=True)"
                )
            built = manifest["encoder"]
            enc: Encoder
            if encoder is None:
                enc = load_encoder(
                    built["source"],
                    name=built["name"],
                    query_prefix=built["query_prefix"],
                    document_prefix=built["document_prefix"],
                )
            else:
                enc = encoder if isinstance(encoder, Encoder) else load_encoder(encoder)
            differ = encoder_differences(built, enc)
            if differ:
                raise EncoderMismatchError(
                    f"Milvus collection {collection!r} was built with encoder {built['name']!r} (dim {built['dim']}, "
                    f"from {built['source']!r}) but is being searched with {enc.name!r} ({differ}). Open it with "
                    "the encoder that built it (or none), or rebuild it with yours (overwrite=True)"
                )
            client.load_collection(collection)
        except BaseException:
            client.close()
            raise
        return cls(client, collection, enc, manifest)

    def __len__(self) -> int:
        return int(self.manifest["passages"])

    @property
    def has_embeddings(self) -> bool:
        return True

    def _get(self, passage_ids: Sequence[str], fields: list[str]) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        unique = list(dict.fromkeys(passage_ids))
        for start in range(0, len(unique), 1000):
            for record in self.client.get(
                self.collection, ids=unique[start : start + 1000], output_fields=fields
            ):
                found[record["id"]] = record
        missing = [pid for pid in unique if pid not in found]
        if missing:
            raise KeyError(f"no passage with id {missing[0]!r} in Milvus collection {self.collection!r}")
        return found

    def passage(self, passage_id: str) -> Passage:
        return _passage(self._get([passage_id], list(TEXT_FIELDS))[passage_id])

    def embed_queries(self, queries: Sequence[str]) -> np.ndarray:
        check_queries(queries, 1)
        return self.encoder.encode_queries(queries)

    def passage_embeddings(self, passage_ids: Sequence[str]) -> np.ndarray:
        """The stored vectors of these passages, one row per id, in order (KeyError for an unknown id)."""
        found = self._get(passage_ids, ["vector"])
        rows = [np.asarray(found[pid]["vector"], dtype=np.float32) for pid in passage_ids]
        return np.stack(rows) if rows else np.zeros((0, self.encoder.dim), dtype=np.float32)

    def search_vectors(self, vectors: np.ndarray, k: int) -> list[list[Hit]]:
        """Top-``k`` hits for normalised query vectors (k is capped at the collection size)."""
        limit = min(k, len(self))
        if limit > MAX_LIMIT:
            raise ValueError(f"Milvus returns at most {MAX_LIMIT} hits a query; ask for k <= {MAX_LIMIT}")
        if len(vectors) == 0:
            return []
        results = self.client.search(
            self.collection,
            data=np.asarray(vectors, dtype=np.float32).tolist(),
            limit=limit,
            search_params={"metric_type": "IP"},
            output_fields=list(TEXT_FIELDS),
        )
        return [
            [
                Hit(_passage({"id": hit["id"], **hit["entity"]}), float(hit["distance"]), rank)
                for rank, hit in enumerate(hits, start=1)
            ]
            for hits in results
        ]

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        check_queries(queries, k)
        if not queries:
            return []
        return self.search_vectors(self.encoder.encode_queries(queries), k)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None


def _passage(record: dict[str, Any]) -> Passage:
    return Passage(
        id=record["id"], title=record["title"], text=record["text"], source=record["source"] or None
    )
