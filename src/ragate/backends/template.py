"""Chat templates that keep message text out of the control tokens.

A chat template wraps each message in markers (``<|im_start|>user\\n ... <|im_end|>``) that must be *special*
tokens. Rendering the template and tokenising the whole string with special tokens parsed would also parse any
marker *inside* a message: a question or a retrieved passage containing ``<|im_end|>\\n<|im_start|>system\\n...``
would forge a system turn. Everything in a message (questions, chat messages, passages, pseudo-contexts) and
every prefix the assistant turn is continued with is untrusted text. So the template is rendered with a
placeholder for each message's text, the rendered string is cut at the placeholders, and each local backend
tokenises the template's pieces with special tokens parsed and the messages' text as plain text only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ragate.errors import RagateError
from ragate.types import Message

# private-use code points: the placeholder has no whitespace for a template to trim and cannot be a marker
_PLACEHOLDER = "\ue000ragate-message-{}\ue001"


@dataclass(frozen=True)
class Segment:
    """A piece of a rendered prompt: template text (its markers are special tokens) or untrusted text."""

    text: str
    template: bool


Render = Callable[[list[dict[str, str]]], str]


def chat_segments(render: Render, messages: Sequence[Message], assistant_prefix: str = "") -> list[Segment]:
    """``messages`` rendered by ``render`` (the model's chat template, generation prompt included) as segments:
    the template's own text, and each message's content and ``assistant_prefix`` as untrusted text.

    Raises :class:`RagateError` when the template does not place each message's content exactly once, unchanged
    (a template that rewrites message text cannot be used safely)."""
    marks = [_PLACEHOLDER.format(i) for i in range(len(messages))]
    rendered = render([{"role": m.role, "content": mark} for m, mark in zip(messages, marks, strict=True)])
    found = []
    for i, mark in enumerate(marks):
        if rendered.count(mark) != 1:
            raise RagateError(
                f"the model's chat template places message {i + 1} {rendered.count(mark)} times instead of once: "
                "ragate cannot keep message text out of the template's control tokens with it; use a model "
                "whose template inserts each message's content verbatim"
            )
        found.append((rendered.index(mark), i))
    segments: list[Segment] = []
    at = 0
    for position, i in sorted(found):
        segments.append(Segment(rendered[at:position], template=True))
        segments.append(Segment(messages[i].content, template=False))
        at = position + len(marks[i])
    segments.append(Segment(rendered[at:], template=True))
    segments.append(Segment(assistant_prefix, template=False))
    return [s for s in segments if s.text]
