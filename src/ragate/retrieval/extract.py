"""Text and title out of one document file: plain text, Markdown and other plain-text markup, HTML and PDF.

Each function takes the file's bytes or decoded text and its stem (the fallback title) and returns an
:class:`Extracted`. Spans of chunks are offsets into ``Extracted.text``, so that text is the reference every
passage is cut from. Nothing here touches the file system; :mod:`ragate.retrieval.documents` reads the files.

- text: decoded as UTF-8 (a byte-order mark is dropped), line ends made ``\\n``; title = the stem.
- Markdown: the text as it is (after the same decoding); title = the first ``# `` heading outside code fences,
  else the stem.
- reStructuredText, AsciiDoc, Org and Textile: read as text, the markup left in place (as Markdown's is); title =
  the first section title (reST: a line over an underline of one punctuation character at least as long; AsciiDoc:
  ``= Title``; Org: ``#+TITLE:``, else the first ``* heading``; Textile: ``h1.``), else the stem.
- HTML: the standard library's :class:`html.parser.HTMLParser`; ``script``, ``style``, ``template``, ``noscript``
  and everything in ``head`` are dropped except ``<title>``, which is the title (else the first ``<h1>``, else
  the stem); block elements end a line; white space inside a line is folded as a browser shows it (kept in
  ``<pre>``); blank lines are dropped.
- PDF: ``pypdf`` (``pip install 'ragate[docs]'``); the pages' text joined by blank lines; title = the PDF's
  metadata title, else the stem. A scanned PDF has no text layer and extracts as empty.
"""

from __future__ import annotations

import io
import itertools
import re
from dataclasses import dataclass
from html.parser import HTMLParser

from ragate.errors import RagateError

PDF_INSTALL = "pip install 'ragate[docs]'"


@dataclass(frozen=True)
class Extracted:
    """A document's title and its text (the text chunk spans refer to)."""

    title: str
    text: str


class DamagedFile(Exception):
    """A file that cannot be read as its type says; the caller adds the file name and the fix."""


def decode_text(data: bytes) -> str:
    """UTF-8 text with ``\\n`` line ends; ``DamagedFile`` with the byte offset when it is not UTF-8."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise DamagedFile(
            f"not valid UTF-8 (byte 0x{data[err.start]:02x} at offset {err.start}); convert it to UTF-8, "
            "e.g. `iconv -f latin1 -t utf-8`"
        ) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def extract_text(text: str, stem: str) -> Extracted:
    return Extracted(stem, text)


_HEADING = re.compile(r"^ {0,3}# +(.+?)(?: +#+)? *$")
_FENCE = re.compile(r"^ {0,3}(```|~~~)")


def extract_markdown(text: str, stem: str) -> Extracted:
    fenced = False
    for line in text.split("\n"):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and (match := _HEADING.match(line)):
            return Extracted(match.group(1).strip(), text)
    return Extracted(stem, text)


_RST_ADORNMENT = re.compile(r"""^([=\-`:'"~^_*+#<>.])\1+[ \t]*$""")
_ADOC_TITLE = re.compile(r"^= +(\S.*?)[ \t]*$")
_ORG_TITLE = re.compile(r"^#\+title:[ \t]*(\S.*?)[ \t]*$", re.IGNORECASE)
_ORG_HEADING = re.compile(r"^\*+ +(\S.*?)[ \t]*$")
_TEXTILE_TITLE = re.compile(r"^h1(?:\([^)]*\)|\{[^}]*\}|\[[^\]]*\]|[<>=]+)*\. +(\S.*?)[ \t]*$")


def _rst_title(lines: list[str]) -> str | None:
    """The first section title: a text line (not indented, not a directive or comment) whose next line is an
    adornment of one punctuation character at least as long as the title."""
    for line, under in itertools.pairwise(lines):
        title = line.strip()
        if (
            title
            and not line[0].isspace()
            and not line.startswith("..")
            and not _RST_ADORNMENT.match(line)
            and _RST_ADORNMENT.match(under)
            and len(under.rstrip()) >= len(title)
        ):
            return title
    return None


def extract_markup(text: str, stem: str, kind: str) -> Extracted:
    """A plain-text markup file (``kind``: ``rst``, ``asciidoc``, ``org`` or ``textile``) read as text, its markup
    left in place; the title is its document or first section title, else the stem."""
    lines = text.split("\n")
    title: str | None = None
    if kind == "rst":
        title = _rst_title(lines)
    else:
        patterns = {
            "asciidoc": (_ADOC_TITLE,),
            "org": (_ORG_TITLE, _ORG_HEADING),
            "textile": (_TEXTILE_TITLE,),
        }[kind]
        for pattern in patterns:
            title = next((m.group(1) for line in lines if (m := pattern.match(line))), None)
            if title:
                break
    return Extracted(title or stem, text)


_SKIP = frozenset({"script", "style", "template", "noscript"})
_BLOCK = frozenset(
    """address article aside blockquote br caption dd details div dl dt fieldset figcaption figure footer form
    h1 h2 h3 h4 h5 h6 header hr li main nav ol p pre section summary table td th tr ul""".split()  # noqa: SIM905
)


class _HTMLText(HTMLParser):
    """Collects visible text (block elements end lines), the ``<title>`` and the first ``<h1>``."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.title: list[str] = []
        self.h1: list[str] = []
        self.skip_depth = 0
        self.in_head = False
        self.in_title = False
        self.h1_depth = 0
        self.h1_done = False
        self.pre_depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self.in_title = True
        elif tag in ("head", "body"):  # a page may leave out </head>
            self.in_head = tag == "head"
        elif tag in _SKIP:
            self.skip_depth += 1
        if tag in _BLOCK:
            self.parts.append("\n")
        if tag == "pre":
            self.pre_depth += 1
        if tag == "h1" and not self.h1_done:
            self.h1_depth += 1

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self.in_title = False
        elif tag == "head":
            self.in_head = False
        elif tag in _SKIP:
            self.skip_depth = max(0, self.skip_depth - 1)
        if tag in _BLOCK:
            self.parts.append("\n")
        if tag == "pre":
            self.pre_depth = max(0, self.pre_depth - 1)
        if tag == "h1" and self.h1_depth:
            self.h1_depth -= 1
            self.h1_done = self.h1_depth == 0

    def handle_data(self, data: str) -> None:
        if self.in_title:
            self.title.append(data)
        elif not self.skip_depth and not self.in_head:
            if self.h1_depth:
                self.h1.append(data)
            self.parts.append(data if self.pre_depth else re.sub(r"\s+", " ", data))


def _fold(text: str) -> str:
    return " ".join(text.split())


def extract_html(text: str, stem: str) -> Extracted:
    parser = _HTMLText()
    parser.feed(text)
    parser.close()
    lines = (line.strip() for line in "".join(parser.parts).split("\n"))
    body = "\n".join(line for line in lines if line)
    title = _fold("".join(parser.title)) or _fold("".join(parser.h1)) or stem
    return Extracted(title, body)


def extract_pdf(data: bytes, stem: str) -> Extracted:
    """The text layer of every page (``pypdf``); ``DamagedFile`` for a file pypdf cannot parse or decrypt."""
    try:
        import pypdf
    except ImportError:
        raise RagateError(f"reading PDF files needs pypdf: {PDF_INSTALL}") from None
    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise DamagedFile(
                "the PDF is encrypted with a password; decrypt it first (e.g. `qpdf --decrypt`)"
            )
        pages = [page.extract_text() or "" for page in reader.pages]
        title = reader.metadata.title if reader.metadata and reader.metadata.title else ""
    except DamagedFile:
        raise
    except Exception as err:  # noqa: BLE001 (pypdf raises PdfReadError, ValueError, KeyError, ... on a broken file)
        raise DamagedFile(
            f"not a readable PDF ({type(err).__name__}: {err}); re-export or re-download it"
        ) from None
    text = "\n\n".join(page.replace("\r\n", "\n").strip() for page in pages if page.strip())
    return Extracted(_fold(str(title)) or stem, text)
