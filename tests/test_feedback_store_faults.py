"""The feedback store is a side channel, with real components: a SQLite store on a disk that fills, and ``ragate
serve`` processes on 127.0.0.1 over the stand-in model server (``benchmarks/latency_server.py``).

A write that fails (a full disk) is a 503 with Retry-After, counted in /metrics, and the answers go on; a home or a
store that cannot be written, or a store URL of a scheme ragate does not serve, is refused at start naming it and
the fix; /healthz without the key names no path; a Pipeline given a store of the wrong type is told what it takes.
The full disk of the served store is a real limit on the size of the files the server process may write
(``RLIMIT_FSIZE``, as a quota sets): its write-ahead log reaches it after a few answers.
"""

from __future__ import annotations

import importlib.util
import os
import re
import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

for _module in ("fastapi", "uvicorn", "prometheus_client"):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"{_module} is not installed: pip install 'ragate[service]'", allow_module_level=True)

from test_fleet import MODEL, start, stop
from test_service import _error, _free_port, _stop, _wait

import ragate
from ragate.errors import ArgumentTypeError, RagateError
from ragate.learning.store import FeedbackStore, StoreWriteError
from ragate.state.shared import StoreUnavailable

KEY = "store-key-3"
FILE_LIMIT = 128 * 1024  # bytes any file of the served process may reach: the store's log fills after a few answers
WIKI = Path(__file__).parent / "data" / "wiki_passages.jsonl"


@pytest.fixture(scope="module")
def model_server() -> Iterator[str]:
    proc, url = start()
    yield url
    stop(proc)


@pytest.fixture(scope="module")
def bm25(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ragate.retrieval.corpus import read_passages
    from ragate.retrieval.index import build_index

    return Path(build_index(read_passages(WIKI), tmp_path_factory.mktemp("index") / "bm25", "bm25", progress=False))


def _serve_args(model_server: str, bm25: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "ragate.cli.main", "serve", "--backend", "openai", "--base-url", model_server,
            "--model", MODEL, "--index", str(bm25), "--log-level", "warning", *extra]  # fmt: skip


@pytest.fixture(scope="module")
def keyed(
    model_server: str, bm25: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    """A server with a key, the learned gate in force from a file, and a feedback store on a disk that fills."""
    from ragate.gates.learned import LearnedGateFile, Probe, save_learned

    if not hasattr(resource, "prlimit"):
        pytest.skip("no resource.prlimit here (Linux sets a running process's file size limit)")
    folder = tmp_path_factory.mktemp("keyed")
    probe = Probe(("words",), np.array([8.0]), np.array([4.0]), np.array([1.0]), 0.0)
    meta = {"label": "closed-wrong", "model": {"model": MODEL, "engine": "openai"}}
    gate = save_learned(LearnedGateFile(probe, meta=meta), folder / "gate.json")
    store = folder / "feedback.db"
    FeedbackStore(store).close()  # its tables made here: the server's writes are its answers and labels
    port = _free_port()
    args = _serve_args(model_server, bm25, "--port", str(port), "--method", "learned", "--gate-weights", str(gate),
                       "--feedback-store", str(store))  # fmt: skip
    log = folder / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "RAGATE_API_KEY": KEY})
    resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))  # before it has answered anything
    url = f"http://127.0.0.1:{port}"
    _wait(f"{url}/healthz", proc, log, 120)
    yield url, folder
    _stop(proc)


def _side_failures(http: httpx.Client) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith('ragate_side_channel_failures_total{channel="feedback_store"}'):
            return float(line.split()[-1])
    return 0.0


def test_a_full_disk_under_the_store_is_a_503_counted_and_the_answers_go_on(keyed: tuple[str, Path]) -> None:
    """It used to be a 400 invalid_request_error blaming the client for the server's disk."""
    url, _ = keyed
    with httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {KEY}"}) as http:
        ids = []
        for i in range(60):  # each answer kept grows the store's log; then the disk is full for it
            r = http.post("/v1/answer", json={"question": f"Who wrote Hamlet, act {i}?", "options": {"max_tokens": 4}})
            assert r.status_code == 200 and r.json()["answer"], r.text  # the store never costs an answer
            if "id" not in r.json():
                break
            ids.append(r.json()["id"])
        assert ids and len(ids) < 60, f"the store's disk did not fill after {len(ids)} answers"
        assert _side_failures(http) == 1.0  # the answer kept without its id
        for i in range(20):  # a label is smaller than an answer: the log may hold a few more
            r = http.post("/v1/feedback", json={"id": ids[i % len(ids)], "correct": False})
            if r.status_code != 200:
                break
        _error(r, 503, "the feedback store", "could not be written", "check the disk")
        assert r.headers["Retry-After"] == "5"
        assert _side_failures(http) == 2.0
        r = http.post("/v1/answer", json={"question": "Who wrote Hamlet?", "options": {"max_tokens": 4}})
        assert r.status_code == 200 and r.json()["answer"] and _side_failures(http) == 3.0


def test_healthz_without_the_key_names_no_path(keyed: tuple[str, Path]) -> None:
    """It used to show the feedback store's path and the learned gate file's, while hiding the model's and index's."""
    url, folder = keyed
    bare = httpx.get(f"{url}/healthz", timeout=30)
    assert bare.status_code == 200
    assert str(folder) not in bare.text and "/tmp" not in bare.text and "bm25" not in bare.text, bare.text
    learning = bare.json()["learning"]
    assert learning["gate_file"]["path"] == learning["store"]["path"] == "(send the API key to see it)"
    assert isinstance(learning["store"]["answers"], int)  # the counts stay: they name nothing on disk
    full = httpx.get(f"{url}/healthz", headers={"Authorization": f"Bearer {KEY}"}, timeout=30).json()
    assert full["learning"]["store"]["path"] == str(folder / "feedback.db")
    assert full["learning"]["gate_file"]["path"] == str(folder / "gate.json")


def test_a_store_write_on_a_full_disk_is_a_store_fault_and_writes_resume_with_room(tmp_path: Path) -> None:
    """SQLite's own page limit on the connection: the disk as full as the database may grow."""
    store = FeedbackStore(tmp_path / "feedback.db")
    keep: dict[str, Any] = {"method": "targ-margin", "prompts": "default", "answer": "x", "retrieved": False,
                            "features": {}, "hidden": None, "model": {"model": MODEL}}  # fmt: skip
    store.record_answer("a1", question="Who wrote Hamlet?", **keep)
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(StoreWriteError, match="could not be written \\(database or disk is full\\)") as err:
        store.record_answer("a2", question="Who painted the Mona Lisa? " * 400, **keep)
    assert isinstance(err.value, StoreUnavailable) and isinstance(err.value, RagateError)
    store._db.execute(f"PRAGMA max_page_count = {pages * 100}")  # room again: the failed write left nothing open
    store.record_answer("a3", question="Who painted the Mona Lisa? " * 400, **keep)
    store.add_label("a1", source="feedback", kind="closed-wrong", value=True)
    assert store.get("a2") is None and store.get("a3") is not None and store.counts()["answers"] == 2
    store.close()


@pytest.mark.parametrize(
    ("case", "said"),
    [
        ("home", "cannot be written (Not a directory): name a file in a folder this process can write"),
        ("url", "ragate keeps no feedback at http:// URLs; give a redis://, rediss://, valkey:// or valkeys:// URL"),
    ],
)
def test_serve_refuses_a_store_it_cannot_keep_at_start(
    case: str, said: str, model_server: str, bm25: Path, tmp_path: Path
) -> None:
    """It used to be a traceback from mkdir (a home that cannot be written, with --shadow), or a server that
    started with a SQLite file at ./http:/127.0.0.1:18999/0 (a URL typo)."""
    (tmp_path / "file").write_text("not a folder")
    home = tmp_path / "file" / "home"
    extra = ["--shadow", "0.5"] if case == "home" else ["--feedback-store", "http://127.0.0.1:18999/0"]
    args = _serve_args(model_server, bm25, "--method", "targ-margin", "--port", str(_free_port()), *extra)
    out = subprocess.run(
        args, cwd=tmp_path, env={**os.environ, "RAGATE_HOME": str(home), "RAGATE_API_KEY": ""},
        check=False, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith("ragate: error:") and said in out.stderr, out.stderr
    if case == "home":
        assert str(home / "feedback.db") in out.stderr and "--feedback-store FILE" in out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing made at ./http:/...


def test_a_pipeline_is_told_what_a_feedback_store_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bm25: Path
) -> None:
    """``Pipeline(feedback_store=123)`` used to be a TypeError from pathlib; a home that cannot be written an
    OSError. Each is refused naming what to give, the first two before anything loads."""
    from ragate.backends.scripted import ScriptedBackend
    from ragate.retrieval.index import open_index

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ArgumentTypeError, match="feedback_store must be a SQLite file's path") as err:
        ragate.Pipeline("targ-margin", feedback_store=123)
    assert "a redis://HOST:PORT/DB URL" in str(err.value) and "a store object" in str(err.value)
    assert str(err.value).endswith("not int") and isinstance(err.value, TypeError)
    with pytest.raises(RagateError, match=re.escape("'http://127.0.0.1:18999/0': ragate keeps no feedback at")) as bad:
        ragate.Pipeline("targ-margin", feedback_store="http://user:secret@127.0.0.1:18999/0")
    assert "secret" not in str(bad.value)  # the URL is named without its password
    (tmp_path / "file").write_text("not a folder")
    unwritable = tmp_path / "file" / "home"
    lm = ScriptedBackend([])
    with open_index(bm25) as index:
        with pytest.raises(RagateError, match=re.escape(f"the feedback store {unwritable / 'f.db'} cannot be")):
            ragate.Pipeline("targ-margin", lm=lm, retriever=index, feedback_store=unwritable / "f.db")
        monkeypatch.setenv("RAGATE_HOME", str(unwritable))
        with pytest.raises(RagateError, match="set RAGATE_HOME to one"):
            ragate.Pipeline("targ-margin", lm=lm, retriever=index, shadow=0.5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
