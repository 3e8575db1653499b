"""Fuzz: every body and header the service parses (issue N). Whatever a client sends, the service answers with
a status it means (200, or a 4xx that names the fault), never a 500 or a dropped connection, and an error body is
JSON with a message. The app runs in-process over the demo index; a scripted model answers (this is about
parsing, and each example must cost milliseconds)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from fuzzing import byte_mutation, dumps, fuzz_settings, json_mutation
from hypothesis import given
from hypothesis import strategies as st

from ragate.backends.scripted import ScriptedBackend, make_generation
from ragate.retrieval.demo import demo_index
from ragate.retrieval.index import open_index
from ragate.service.app import create_app
from ragate.service.settings import ServiceSettings

KEY = "fuzz-key-0123"
AUTH = {"Authorization": f"Bearer {KEY}"}
BODIES: dict[str, Any] = {
    "/v1/answer": {"question": "Who wrote Hamlet?", "method": "dtr", "options": {"k": 2, "max_tokens": 8},
                   "draft_tokens": True},
    "/v1/search": {"query": "Hamlet author", "k": 3},
    "/v1/chat/completions": {
        "model": "ragate",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who wrote Hamlet?"}],
        "max_tokens": 8,
        "stream": False,
    },
}


@pytest.fixture(scope="module")
def http() -> Iterator[TestClient]:
    lm = ScriptedBackend(lambda _: make_generation(["Shake", "speare"], [-0.2, -0.1]))
    settings = ServiceSettings(method="dtr", api_key=KEY, max_body_bytes=4096)
    with open_index(demo_index(progress=False)) as index, TestClient(create_app(settings, lm, index)) as client:
        yield client


def _check(response: Any) -> None:
    assert response.status_code in (200, 400, 401, 404, 405, 408, 413, 415, 422, 429), response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["message"]
    elif response.headers.get("content-type", "").startswith("application/json"):
        json.loads(response.text)


@fuzz_settings
@given(st.sampled_from(sorted(BODIES)), st.data())
def test_fuzz_service_body_values(http: TestClient, path: str, data: st.DataObject) -> None:
    body = data.draw(json_mutation(BODIES[path]))
    _check(http.post(path, content=dumps(body), headers={**AUTH, "Content-Type": "application/json"}))


@fuzz_settings
@given(st.sampled_from(sorted(BODIES)), st.data())
def test_fuzz_service_body_bytes(http: TestClient, path: str, data: st.DataObject) -> None:
    raw = data.draw(byte_mutation(dumps(BODIES[path])))
    _check(http.post(path, content=raw, headers={**AUTH, "Content-Type": "application/json"}))


_header_values = st.one_of(
    st.sampled_from(["", " ", "application/json", "text/plain", "application/json; charset=latin-1", "-1", "1e3",
                     "99999999999999999999", "Bearer", f"Bearer  {KEY} ", f"bearer {KEY}", f"Basic {KEY}",
                     "Bearer \u00e9", "0x10"]),
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=255), max_size=40),
)  # fmt: skip


@fuzz_settings
@given(
    st.sampled_from(sorted(BODIES)),
    st.dictionaries(
        # Content-Length and Transfer-Encoding are the client library's to set: test_service.py sends wrong ones
        # over a real socket
        st.sampled_from(["Content-Type", "Authorization", "Content-Encoding", "Accept", "Accept-Charset"]),
        _header_values,
        max_size=3,
    ),
)
def test_fuzz_service_headers(http: TestClient, path: str, headers: dict[str, str]) -> None:
    merged = {**AUTH, "Content-Type": "application/json", **headers}
    raw = {name: value.encode("latin-1") for name, value in merged.items()}  # bytes a raw client could send
    _check(http.post(path, content=dumps(BODIES[path]), headers=raw))
