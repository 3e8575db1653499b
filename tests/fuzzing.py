"""Shared pieces of the fuzz suite (issue N): byte- and value-level mutations of the files ragate reads, and the
one property every reader must keep.

The property: a mutated input is either accepted (the reader returns well-formed values; each test checks what
"well-formed" means for its reader) or refused with a :class:`~ragate.errors.RagateError` whose message names the
file. Anything else (a ``KeyError``, ``UnicodeEncodeError``, a numpy or sqlite exception) is a traceback a user
would meet, and fails the test.

The example budget per test is small in CI (``RAGATE_FUZZ_EXAMPLES``, default 40: seconds per reader) and set
larger for a long run: ``RAGATE_FUZZ_EXAMPLES=2000 .venv/bin/python -m pytest tests -k fuzz``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from ragate.errors import RagateError

T = TypeVar("T")

FUZZ_EXAMPLES = int(os.environ.get("RAGATE_FUZZ_EXAMPLES", "40"))

# one settings object for every fuzz test: the example budget above, no deadline (a shared, loaded machine), and
# function-scoped fixtures allowed (each example writes its own files under a fresh name inside tmp_path)
fuzz_settings = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=FUZZ_EXAMPLES <= 100,  # CI: the same examples every run; a long run explores
)

# values that break readers which trust a JSON field's type or range
HOSTILE_VALUES: tuple[Any, ...] = (
    None,
    True,
    False,
    0,
    -1,
    10**400,
    1e308,
    -1e308,
    math.nan,
    math.inf,
    -math.inf,
    "",
    "0.7",
    "abc",
    "123",
    "q\ud800",
    "\ufeffx",
    "../../../../etc/passwd",
    "/etc/passwd",
    [],
    [1, 2],
    {},
    {"a": 1},
)

# byte sequences that are not UTF-8 or that UTF-8 readers often mishandle
HOSTILE_BYTES: tuple[bytes, ...] = (
    b"\xff",
    b"\xc3",  # a lead byte with no continuation
    b"\xed\xa0\x80",  # a UTF-8-encoded surrogate (invalid UTF-8)
    b"\xef\xbb\xbf",  # a BOM
    b"\x00",
    b"\n",
    b"\r",
    b'"',
    b"{",
    b"\\ud800",  # a JSON escape for a lone surrogate
    b"NaN",
    b"Infinity",
    b"1e999",
    b"1" * 5000,  # an integer past Python's 4,300-digit limit for int()
    b"[" * 100_000,  # nesting past the interpreter's recursion limit
)


@st.composite
def byte_mutation(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` with one fault: cut at any byte, a flipped bit, hostile bytes inserted or overwritten, a BOM in
    front, or emptied."""
    kind = draw(st.sampled_from(["truncate", "flip", "insert", "overwrite", "bom", "empty"]))
    if kind == "empty" or not data:
        return b""
    if kind == "bom":
        return b"\xef\xbb\xbf" + data
    at = draw(st.integers(0, len(data) - 1))
    if kind == "truncate":
        return data[:at]
    if kind == "flip":
        bit = draw(st.integers(0, 7))
        return data[:at] + bytes([data[at] ^ (1 << bit)]) + data[at + 1 :]
    bad = draw(st.sampled_from(HOSTILE_BYTES))
    if kind == "insert":
        return data[:at] + bad + data[at:]
    return data[:at] + bad + data[at + len(bad) :]


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path (keys and indexes) to a value inside a JSON document, the root included."""
    out = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value[:8]):
            out += _paths(item, (*prefix, i))
    return out


def _replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _replaced(value[head], rest, new)}
    copy = list(value)
    copy[head] = _replaced(value[head], rest, new)
    return copy


def _deleted(value: Any, path: tuple[Any, ...]) -> Any:
    head, rest = path[0], path[1:]
    if not rest:
        if isinstance(value, dict):
            return {k: v for k, v in value.items() if k != head}
        return [v for i, v in enumerate(value) if i != head]
    if isinstance(value, dict):
        return {**value, head: _deleted(value[head], rest)}
    copy = list(value)
    copy[head] = _deleted(value[head], rest)
    return copy


@st.composite
def json_mutation(draw: st.DrawFn, document: Any) -> Any:
    """``document`` with one value replaced by a hostile one (a wrong type, NaN, inf, a huge number, a lone
    surrogate, a path that leaves its folder) or one key or item removed."""
    paths = _paths(document)
    path = draw(st.sampled_from(paths))
    if path and draw(st.booleans()):
        return _deleted(document, path)
    return _replaced(document, path, draw(st.sampled_from(HOSTILE_VALUES)))


def dumps(document: Any) -> bytes:
    """JSON as Python writes it, NaN and infinity included (as a careless or hostile writer would), lone
    surrogates as escapes."""
    return json.dumps(document, allow_nan=True).encode()


def refused_or_accepted(read: Callable[[], T], path: Path | str) -> T | None:
    """Run ``read``: its value if it accepts the input, None if it refuses with a RagateError that names
    ``path`` (by its file name); anything else fails the calling test."""
    try:
        return read()
    except RagateError as err:
        name = Path(path).name
        assert name in str(err), f"the error does not name {name}: {err}"
        return None
