"""``ragate serve`` learning its traffic, as real processes on 127.0.0.1 with SmolLM2: shadow answers label the
requests, POST /v1/feedback adds a user's word (and refuses what it cannot use, naming why), an acknowledged label
survives kill -9, and a learned gate file rewritten while the server runs is the gate in force at the next request.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

for _module in ("fastapi", "uvicorn", "prometheus_client"):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"{_module} is not installed: pip install 'ragate[service]'", allow_module_level=True)

QUESTIONS = ("Who wrote Hamlet?", "What is the capital of France?", "Who painted the Mona Lisa?")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(args: list[str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "ragate.cli.main",
        "serve",
        "--port",
        str(port),
        "--log-level",
        "warning",
        *args,
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "RAGATE_API_KEY": ""}
        )
    url = f"http://127.0.0.1:{port}"
    for _ in range(800):  # bounded: up to ~240 s for the model and the demo index to load
        if proc.poll() is not None:
            break
        try:
            httpx.get(f"{url}/healthz", timeout=3)
            return proc, url
        except httpx.TransportError:
            time.sleep(0.3)
    proc.kill()
    pytest.fail(f"the server did not start:\n{log.read_text(errors='replace')[-3000:]}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _learning(http: httpx.Client) -> dict:
    return dict(http.get("/healthz").json()["learning"])


@pytest.fixture(scope="module")
def shadow_server(
    tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path
) -> Iterator[tuple[str, Path, subprocess.Popen[bytes]]]:
    folder = tmp_path_factory.mktemp("shadow")
    store = folder / "feedback.db"
    proc, url = _serve(
        [
            "--method",
            "targ-entropy",
            "--feedback-store",
            str(store),
            "--shadow",
            "1.0",
            "--max-body-bytes",
            "8192",
        ],
        folder / "serve.log",
    )
    yield url, store, proc
    _stop(proc)


def test_shadow_answers_label_requests_and_feedback_is_checked(
    shadow_server: tuple[str, Path, subprocess.Popen[bytes]],
) -> None:
    url, _, _ = shadow_server
    with httpx.Client(base_url=url, timeout=120) as http:
        bodies = [http.post("/v1/answer", json={"question": q}).json() for q in QUESTIONS[:2]]
        ids = [b["id"] for b in bodies]
        assert all(len(i) == 32 for i in ids) and ids[0] != ids[1]
        for _ in range(600):  # bounded wait for the shadow work (each job: one more answer from the model)
            info = _learning(http)
            if info["shadow"]["done"] >= 2:
                break
            time.sleep(0.2)
        assert info["shadow"]["done"] == 2 and info["shadow"]["failed"] == 0, info
        changed = info["store"]["retrieval-changed"]
        assert changed["retrieve"] + changed["no_retrieve"] == 2

        closed = next((b for b in bodies if not b["retrieved"]), None)
        if closed is not None:
            r = http.post("/v1/feedback", json={"id": closed["id"], "correct": False})
            assert r.status_code == 200 and r.json()["labels"] == [{"kind": "closed-wrong", "retrieve": True}]
        r = http.post("/v1/feedback", json={"id": ids[0], "reference": "Shakespeare"})
        assert r.status_code == 200, r.text  # scored against the closed-book twin the shadow answer gave

        def error(r: httpx.Response, status: int, *words: str) -> None:
            assert r.status_code == status, r.text
            message = r.json()["error"]["message"]
            assert "Traceback" not in r.text
            for w in words:
                assert w in message, message

        error(http.post("/v1/feedback", json={"correct": True}), 422, "id")
        error(http.post("/v1/feedback", json={"id": ids[0], "correct": "yes"}), 422, "correct")
        error(http.post("/v1/feedback", json={"id": ids[0]}), 400, "correct", "reference")
        error(http.post("/v1/feedback", json={"id": "f" * 32, "correct": True}), 404, "no answer")
        error(http.post("/v1/feedback", json={"id": ids[0], "reference": "x" * 3000}), 422, "reference")
        error(
            http.post("/v1/feedback", content=b"{", headers={"content-type": "application/json"}), 400, "JSON"
        )
        r = http.post("/v1/feedback", json={"id": ids[0], "reference": "x" * 20000})
        assert r.status_code == 413, r.text


def test_an_acknowledged_label_survives_kill_9_during_shadow_work(
    shadow_server: tuple[str, Path, subprocess.Popen[bytes]],
) -> None:
    from ragate.learning.store import FeedbackStore

    url, store, proc = shadow_server
    with httpx.Client(base_url=url, timeout=120) as http:
        body = http.post("/v1/answer", json={"question": QUESTIONS[2]}).json()
        r = http.post("/v1/feedback", json={"id": body["id"], "reference": "Leonardo da Vinci"})
        assert r.status_code == 200  # acknowledged: on disk now
        acknowledged = r.json()["counts"]
    proc.send_signal(signal.SIGKILL)  # the shadow job for this answer may be running now
    proc.wait(30)
    with FeedbackStore(store) as s:
        assert s.get(body["id"]) is not None
        after = s.counts()
    for kind in ("closed-wrong", "retrieval-changed"):
        for side in ("retrieve", "no_retrieve"):
            assert after[kind][side] >= acknowledged[kind][side]


def test_a_learned_gate_rewritten_while_serving_is_the_gate_in_force(
    tmp_path: Path, demo_gate: Path, smollm2_path: Path
) -> None:
    from ragate.gates.learned import load_learned, save_learned

    gate = tmp_path / "gate.json"
    shutil.copy(demo_gate, gate)
    proc, url = _serve(["--method", "learned", "--gate-weights", str(gate)], tmp_path / "serve.log")
    try:
        with httpx.Client(base_url=url, timeout=120) as http:
            assert _learning(http)["gate_file"]["path"] == str(gate)
            before = [http.post("/v1/answer", json={"question": q}).json()["gate"] for q in QUESTIONS]
            assert all("cheap stage" in g["reason"] for g in before)
            old = load_learned(gate)  # the same gate with its probe turned round: every decision flips
            flipped = type(old.cheap)(
                old.cheap.features, old.cheap.mean, old.cheap.scale, -old.cheap.coef, -old.cheap.intercept,
                (old.cheap.platt[0], -old.cheap.platt[1]), old.cheap.hidden_mean, old.cheap.components,
            )  # fmt: skip
            save_learned(
                type(old)(flipped, None, None, dict(old.meta)), gate
            )  # atomic: a new file renamed over
            after = [http.post("/v1/answer", json={"question": q}).json()["gate"] for q in QUESTIONS]
            assert np.allclose([a["score"] for a in after], [1 - b["score"] for b in before], atol=1e-3)
            assert [a["retrieve"] for a in after] != [b["retrieve"] for b in before] or all(
                abs(b["score"] - 0.5) < 1e-3 for b in before
            )
    finally:
        _stop(proc)


def test_sigterm_stops_serve_with_shadow_work_queued(tmp_path: Path, smollm2_path: Path) -> None:
    """SIGTERM while shadow jobs are queued, one runs and a long request is being answered: the server exits 0
    within 10 s (the request gets the shutdown's grace, then stops at its next model step; the shadow jobs are
    dropped), and the feedback store opens afterwards with every answer it gave."""
    import threading

    from ragate.learning.store import FeedbackStore

    store = tmp_path / "feedback.db"
    log = tmp_path / "serve.log"
    args = ["--method", "targ-entropy", "--feedback-store", str(store), "--shadow", "1.0", "--log-level", "info"]
    proc, url = _serve([*args, "--max-tokens-limit", "1500"], log)
    try:
        with httpx.Client(base_url=url, timeout=120) as http:
            ids = [http.post("/v1/answer", json={"question": q}).json()["id"] for q in QUESTIONS * 2]
            shadow = _learning(http)["shadow"]
            assert shadow["sampled"] == len(ids) and shadow["done"] < len(ids), shadow  # shadow work left to do

            def long_request() -> None:  # up to 1,500 tokens: longer than the grace a stopping server gives
                with contextlib.suppress(httpx.HTTPError):  # cut off by the shutdown, or answered within it
                    http.post(
                        "/v1/answer",
                        json={"question": "Tell me a very long story about a dragon.", "options": {"max_tokens": 1500}},
                    )

            talking = threading.Thread(target=long_request)
            talking.start()
            for _ in range(100):  # bounded: until the request holds its slot
                if http.get("/healthz").json()["in_progress"] >= 1:
                    break
                time.sleep(0.05)
            start = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            try:
                status = proc.wait(10)
            except subprocess.TimeoutExpired:
                pytest.fail(f"ragate serve did not stop within 10 s of SIGTERM:\n{log.read_text(errors='replace')[-3000:]}")
            took = time.monotonic() - start
            talking.join(30)
    finally:
        _stop(proc)
    said = log.read_text(errors="replace")
    assert status == 0, f"exit status {status} after {took:.1f} s:\n{said[-3000:]}"
    cut = said.count("CancelledError: Task cancelled, timeout graceful shutdown exceeded")  # uvicorn's, past the grace
    assert said.count("Traceback") == cut <= 1, said[-3000:]
    with FeedbackStore(store) as s:  # closed cleanly: it opens, and holds every answer it acknowledged
        assert all(s.get(i) is not None for i in ids)
        assert s.counts()["answers"] >= len(ids)
