"""The HTTP service (``ragate serve``): answers, search and an OpenAI-compatible chat endpoint over one adaptive
pipeline, with Prometheus metrics. See docs/service.md.

FastAPI, uvicorn and prometheus-client are the ``service`` extra; nothing here is imported by the rest of ragate.
"""

from ragate.service.settings import ServiceSettings

__all__ = ["ServiceSettings"]
