"""The OpenAI chat-completions shapes ``POST /v1/chat/completions`` reads and writes.

The request is OpenAI's: ``model``, ``messages``, ``max_tokens`` (or ``max_completion_tokens``), ``stream``, and
fields ragate accepts but does not use (``temperature``, ``top_p``, ...: each method decodes as its paper says).
The question is the text of the **last user message**; earlier turns and system messages are not sent to the
pipeline. ``model`` names a ragate method (``dtr``, ``no-retrieval``, ...) or anything else for the server's
default method. The answer is OpenAI's ``chat.completion`` plus a ``ragate`` field: retrieved, gate, documents.
With ``stream: true`` the finished answer is sent as ``chat.completion.chunk`` server-sent events ending with
``data: [DONE]`` (the pipeline decides before it writes, so streaming adds no work but no earlier first token).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ragate.methods.trace import Trace


class ContentPart(BaseModel):
    """One part of a multi-part message; only ``text`` parts carry a question."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "\n".join(p.text for p in self.content if p.type == "text" and p.text)
        return self.content or ""


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    """OpenAI's request body; unknown fields are accepted (clients send many) and ignored."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str = ""
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n: int = Field(default=1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None

    def question(self) -> str:
        """The last user message's text; ``ValueError`` when there is none."""
        for message in reversed(self.messages):
            if message.role == "user":
                return message.text()
        raise ValueError("messages hold no user message: the last user message is the question")

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


def usage(trace: Trace) -> dict[str, int]:
    """Every token the pipeline spent (draft, pseudo-context, answer), as OpenAI's ``usage``."""
    prompt = sum(s.prompt_tokens for s in trace.stages)
    completion = sum(s.completion_tokens for s in trace.stages)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion(trace: Trace, model: str, extension: dict[str, Any]) -> dict[str, Any]:
    """The ``chat.completion`` object for a finished trace."""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": trace.answer},
                "logprobs": None,
                "finish_reason": trace.finish_reason,
            }
        ],
        "usage": usage(trace),
        "ragate": extension,
    }


def stream_events(
    trace: Trace, model: str, extension: dict[str, Any], *, include_usage: bool
) -> Iterator[str]:
    """Server-sent events: a role chunk, the answer a word at a time, a finish chunk (with the ``ragate``
    field), a usage chunk when asked for, then ``[DONE]``."""
    base = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
    }
    base["model"] = model

    def chunk(delta: dict[str, Any], finish: str | None = None, **more: Any) -> str:
        body = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        return f"data: {json.dumps({**body, **more}, ensure_ascii=False)}\n\n"

    yield chunk({"role": "assistant", "content": ""})
    for piece in re.findall(r"\s*\S+", trace.answer):
        yield chunk({"content": piece})
    yield chunk({}, trace.finish_reason, ragate=extension)
    if include_usage:
        yield f"data: {json.dumps({**base, 'choices': [], 'usage': usage(trace)})}\n\n"
    yield "data: [DONE]\n\n"


def model_list(methods: list[str], created: int) -> dict[str, Any]:
    """``GET /v1/models``: every ragate method is a model a client can name."""
    return {
        "object": "list",
        "data": [{"id": m, "object": "model", "created": created, "owned_by": "ragate"} for m in methods],
    }
