"""ragate's gate inside the RAG frameworks apps are built with, one optional extra each.

- :mod:`ragate.integrations.llamaindex` (``pip install 'ragate[llamaindex]'``): ``RagateRetriever`` and
  ``RagateQueryEngine`` over your LlamaIndex retriever;
- :mod:`ragate.integrations.langchain` (``'ragate[langchain]'``): ``RagateRetriever`` over your LangChain retriever
  and ``RagateRouter``, a Runnable that routes a question to ``"retrieve"`` or ``"answer"`` (LCEL, LangGraph);
- :mod:`ragate.integrations.haystack` (``'ragate[haystack]'``): the components ``RagateRouter`` (sockets
  ``retrieve`` and ``skip``) and ``RagateGenerator`` (answers, with the documents it read).

Each takes a ready :class:`ragate.Pipeline` (``pipeline=``) or its keywords (method, calibration or budget, model
or base_url, ...). Nothing here imports a framework: import the submodule you use (docs/integrations.md).
"""
