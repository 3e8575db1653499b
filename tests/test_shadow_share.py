"""Shadow work under steady traffic, as a real ``ragate serve`` on 127.0.0.1 with SmolLM2: two clients keep two
requests in flight (each sends its next question as soon as its last returns), so a request always waits for the
model. Shadow work (``--shadow 1.0``) still finishes jobs, at about its ``--shadow-share`` of the model's time; no
request waits for it longer than one model step (the server records every such wait), and none times out."""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

import httpx
import pytest

for _module in ("fastapi", "uvicorn"):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"{_module} is not installed: pip install 'ragate[service]'", allow_module_level=True)

from test_learning_service import _serve, _stop

SHARE = 0.3
QUESTIONS = [
    "Who wrote Hamlet?", "What is the capital of France?", "Who painted the Mona Lisa?",
    "where do the greasers live in the outsiders", "what is the main mineral in lithium batteries",
    "Who discovered penicillin?", "What is the largest planet?", "When did World War II end?",
]  # fmt: skip


def test_shadow_work_takes_its_share_of_steady_traffic_and_no_request_waits_more_than_a_step(
    tmp_path: Path, smollm2_path: Path
) -> None:
    proc, url = _serve(
        ["--method", "targ-entropy", "--feedback-store", str(tmp_path / "fb.db"), "--shadow", "1.0",
         "--shadow-share", str(SHARE)],
        tmp_path / "serve.log",
    )  # fmt: skip
    statuses: list[int] = []
    todo = [QUESTIONS[i % len(QUESTIONS)] for i in range(10)]
    lock = threading.Lock()
    try:
        with httpx.Client(base_url=url, timeout=300) as http:

            def client() -> None:
                while True:
                    with lock:
                        if not todo:
                            return
                        question = todo.pop(0)
                    r = http.post("/v1/answer", json={"question": question})
                    with lock:
                        statuses.append(r.status_code)

            clients = [threading.Thread(target=client) for _ in range(2)]
            for c in clients:
                c.start()
            for c in clients:
                c.join(600)
            shadow = http.get("/healthz").json()["learning"]["shadow"]
    finally:
        _stop(proc)
    assert statuses == [200] * 10, statuses  # no 504, no 429
    turns = shadow["turns"]
    assert shadow["done"] >= 1 and shadow["failed"] == 0, shadow  # labels accrue while requests keep coming
    assert turns["shadow_steps"] > 0 and turns["request_steps"] > 0, turns
    # about its share, never much more: the share counts all the time requests were in flight, the first answer's
    # too (no shadow job exists yet), and on a machine loaded by other processes the shadow thread is slower to ask
    # for its steps (0.1485 of 0.3 with two test suites on two cores): the lower bound leaves room for both
    assert SHARE * 0.4 <= turns["share_taken"] <= SHARE * 1.25, turns
    assert turns["waits_on_shadow"] >= 1 and turns["max_shadow_steps_waited"] == 1, turns
    assert turns["max_wait_on_shadow_seconds"] <= turns["max_shadow_step_seconds"] + 1.0, turns
