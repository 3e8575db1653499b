"""ragate's gate in LlamaIndex: a retriever that returns no nodes when the model knows the answer, and a query
engine that answers with ragate's decision over your retriever (``pip install 'ragate[llamaindex]'``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ragate.integrations._common import (
    FrameworkSearch,
    OwnsPipeline,
    collecting,
    decision_record,
    missing,
    open_pipeline,
    record,
)

try:
    from llama_index.core.base.base_retriever import BaseRetriever
    from llama_index.core.base.response.schema import Response
    from llama_index.core.bridge.pydantic import PrivateAttr
    from llama_index.core.callbacks import CallbackManager
    from llama_index.core.query_engine import CustomQueryEngine
    from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle, TextNode
except ImportError as err:
    raise missing("LlamaIndex (llama-index-core)", "llamaindex", err) from err

if TYPE_CHECKING:
    from ragate.answers import Document
    from ragate.pipeline import Pipeline


def as_search(retriever: BaseRetriever) -> FrameworkSearch[NodeWithScore]:
    """A LlamaIndex retriever as a ragate search function: ``ragate.Pipeline(search=as_search(retriever))``.

    Each node becomes ``{"id": node_id, "text", "title": metadata["title"], "score"}``; the retriever's own
    ``similarity_top_k`` bounds how many it returns."""

    def convert(found: NodeWithScore) -> dict[str, Any]:
        node = found.node
        text = node.get_content(metadata_mode=MetadataMode.NONE)
        return record(node.node_id, text, node.metadata.get("title"), found.score)

    return FrameworkSearch(lambda query, k: retriever.retrieve(query), convert, type(retriever).__name__)


def _nodes(documents: tuple[Document, ...], seen: dict[str, Any]) -> list[NodeWithScore]:
    """ragate's chosen documents as your retriever's own nodes, scored by ragate (a new ``TextNode`` for one that
    came from the pipeline's own index)."""
    out = []
    for doc in documents:
        original = seen.get(doc.id)
        if isinstance(original, NodeWithScore):
            out.append(NodeWithScore(node=original.node, score=doc.score))
        else:
            meta = {"title": doc.title, "source": doc.source} if doc.source else {"title": doc.title}
            out.append(
                NodeWithScore(node=TextNode(id_=doc.id, text=doc.text, metadata=meta), score=doc.score)
            )
    return out


class RagateRetriever(OwnsPipeline, BaseRetriever):
    """Your retriever behind ragate's gate: no nodes when the gate says the model knows, else the nodes ragate's
    method chooses from what your retriever returns (each your own node, scored by ragate).

    Usage example::

        from llama_index.retrievers.bm25 import BM25Retriever
        from ragate.integrations.llamaindex import RagateRetriever

        bm25 = BM25Retriever.from_defaults(nodes=nodes, similarity_top_k=5)
        with RagateRetriever(bm25, method="targ-margin", calibration="targ-margin.json") as retriever:
            nodes = retriever.retrieve("Who wrote Hamlet?")  # [] when the model knows

    :param retriever: your LlamaIndex retriever (its ``similarity_top_k`` should cover ragate's ``k``).
    :param pipeline: a ready :class:`ragate.Pipeline` instead (you close it); it searches with its own ``search=``
        (e.g. ``as_search(retriever)``) or index.
    :param options: :class:`ragate.Pipeline`'s keywords: ``method`` (a registered gate's name works too),
        ``calibration`` or ``threshold`` or ``budget``, ``model`` or ``base_url`` (your model server), ``k``, ...
    """

    def __init__(
        self,
        retriever: BaseRetriever | None = None,
        *,
        pipeline: Pipeline | None = None,
        callback_manager: CallbackManager | None = None,
        verbose: bool = False,
        **options: Any,
    ) -> None:
        if retriever is None and pipeline is None:
            raise TypeError("RagateRetriever needs retriever= (your LlamaIndex retriever) or pipeline=")
        search = as_search(retriever) if retriever is not None else None
        self.pipeline, self._owned = open_pipeline("RagateRetriever", pipeline, options, search)
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        with collecting() as seen:
            chosen = self.pipeline.retrieve(query_bundle.query_str)
        return _nodes(chosen.documents, seen) if chosen.retrieved else []


class RagateQueryEngine(OwnsPipeline, CustomQueryEngine):
    """A query engine that answers with ragate over your retriever: the model's own answer (the gate's draft) when
    the gate says it knows, else its answer from the nodes ragate chooses from your retriever's.

    The response's ``source_nodes`` are the nodes read (your own, scored by ragate; none when it did not
    retrieve) and ``metadata["ragate"]`` the gate's decision (``method``, ``retrieved``, ``score``, ``threshold``,
    ``reason``).

    Usage example::

        from ragate.integrations.llamaindex import RagateQueryEngine

        with RagateQueryEngine(bm25, method="targ-margin", base_url="http://localhost:8080/v1") as engine:
            response = engine.query("Where do the greasers live in The Outsiders?")
            print(response, response.metadata["ragate"], response.source_nodes)

    :param retriever: your LlamaIndex retriever.
    :param pipeline: a ready :class:`ragate.Pipeline` instead (you close it).
    :param options: :class:`ragate.Pipeline`'s keywords (``method``, ``calibration``, ``budget``, ``base_url``,
        ...).
    """

    retriever: BaseRetriever | None = None
    pipeline: Any = None
    _owned: bool = PrivateAttr(default=False)

    def __init__(
        self,
        retriever: BaseRetriever | None = None,
        *,
        pipeline: Pipeline | None = None,
        callback_manager: CallbackManager | None = None,
        **options: Any,
    ) -> None:
        if retriever is None and pipeline is None:
            raise TypeError("RagateQueryEngine needs retriever= (your LlamaIndex retriever) or pipeline=")
        search = as_search(retriever) if retriever is not None else None
        built, owned = open_pipeline("RagateQueryEngine", pipeline, options, search)
        fields: dict[str, Any] = {"retriever": retriever, "pipeline": built}
        if callback_manager is not None:
            fields["callback_manager"] = callback_manager
        try:
            super().__init__(**fields)
        except BaseException:
            if owned:
                built.close()
            raise
        self._owned = owned

    def custom_query(self, query_str: str) -> Response:
        with collecting() as seen:
            answer = self.pipeline.answer(query_str)
        nodes = _nodes(answer.documents, seen)
        meta = {"ragate": decision_record(answer.method, answer.decision)}
        return Response(answer.text, source_nodes=nodes, metadata=meta)
