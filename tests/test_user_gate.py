"""A user's gate, defined outside ragate (tests/plugin_gate.py), runs through the Python API and through every
command: ``ask``, ``eval --methods``, ``sweep``, ``calibrate`` and ``serve --method`` with its budget controller.

The commands find it as an installed package would declare it: an entry point in the group ``ragate.gates``
(a ``.dist-info`` folder on the path, which is what ``pip install`` writes), with no file of ``src/`` touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ragate
from ragate.errors import RagateError

TESTS = Path(__file__).parent
RAGATE = Path(sys.executable).with_name("ragate")
QUESTIONS = ("Who discovered penicillin?", "What is the capital of France?", "Who painted the Mona Lisa?")


@pytest.fixture(scope="module")
def bm25_index(wiki_passages: list[Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ragate.retrieval.index import build_index

    return build_index(wiki_passages, tmp_path_factory.mktemp("user-gate") / "bm25", "bm25", progress=False)


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An environment in which ``tests/plugin_gate.py`` is an installed plugin: a dist-info with its entry point."""
    site = tmp_path_factory.mktemp("site")
    info = site / "ragate_user_gates-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ragate-user-gates\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[ragate.gates]\nmin-prob = plugin_gate:MinProb\nfaulty = plugin_gate:Faulty\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(TESTS), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _ragate(args: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    if not RAGATE.exists():
        pytest.skip("the ragate command is not installed in this environment (pip install -e .)")
    return subprocess.run(
        [str(RAGATE), *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )


def test_the_gate_registers_from_user_code_and_runs_in_a_pipeline(
    smollm2_path: Path, bm25_index: Path
) -> None:
    import plugin_gate

    assert "min-prob" in ragate.all_methods()
    spec = ragate.get_method("min-prob")
    assert spec.gate.kind == "min-prob" and spec.selector == ragate.get_method("standard-rag").selector
    with ragate.Pipeline(method="min-prob", index=bm25_index) as rag:
        always = rag.answer(QUESTIONS[0], threshold=-1.0)  # any score is above: retrieve
        never = rag.answer(QUESTIONS[0], threshold=1.0)  # no score is above: the draft is the answer
    assert always.retrieved and always.documents and "min-prob score" in always.decision.reason
    assert not never.retrieved and [s.name for s in never.stages] == ["draft"]  # the draft, reused
    assert never.decision.score == always.decision.score  # the same greedy draft scored the same
    assert isinstance(plugin_gate.MinProb(), ragate.Gate)
    with pytest.raises(RagateError, match="built into ragate"):
        ragate.register_gate("ugt")(plugin_gate.MinProb)
    with pytest.raises(RagateError, match="one of ragate's methods"):
        ragate.register_gate("dtr")


def test_the_installed_gate_runs_through_ask_eval_sweep_and_calibrate(
    smollm2_path: Path, bm25_index: Path, plugin_env: dict[str, str], tmp_path: Path
) -> None:
    env = plugin_env
    ask = _ragate(["ask", QUESTIONS[0], "--method", "min-prob", "--index", str(bm25_index), "--json"], env)
    assert ask.returncode == 0, ask.stderr
    answer = json.loads(ask.stdout)
    assert answer["method"] == "min-prob" and "min-prob score" in answer["gate"]["reason"]

    gate_swap = _ragate(["ask", QUESTIONS[1], "--method", "targ-margin", "--gate", "min-prob", "--index",
                         str(bm25_index), "--json", "--quiet"], env)  # fmt: skip
    assert gate_swap.returncode == 0, gate_swap.stderr
    assert json.loads(gate_swap.stdout)["gate"]["reason"].startswith("min-prob score")

    run = tmp_path / "eval"
    ev = _ragate(["eval", "--dataset", "demo", "--methods", "min-prob,no-retrieval", "--limit", "2", "--index",
                  str(bm25_index), "--out", str(run), "--quiet", "--no-call-cache"], env)  # fmt: skip
    assert ev.returncode == 0, ev.stderr
    records = [json.loads(line) for line in (run / "questions.jsonl").read_text().splitlines()]
    mine = [r for r in records if r["method"] == "min-prob"]
    assert len(mine) == 2 and all("error" not in r and 0 <= r["gate_score"] <= 1 for r in mine)

    sw = _ragate(["sweep", "--dataset", "demo", "--methods", "min-prob", "--limit", "2", "--index",
                  str(bm25_index), "--out", str(tmp_path / "sweep"), "--quiet", "--no-call-cache"], env)  # fmt: skip
    assert sw.returncode == 0, sw.stderr
    assert [f["method"] for f in json.loads((tmp_path / "sweep" / "sweep.json").read_text())] == ["min-prob"]

    questions = tmp_path / "questions.txt"
    questions.write_text("\n".join(QUESTIONS) + "\n")
    cal = _ragate(["calibrate", "--gate", "min-prob", "--questions", str(questions), "--budget", "0.5",
                   "--out", str(tmp_path / "cal.json"), "--quiet"], env)  # fmt: skip
    assert cal.returncode == 0, cal.stderr
    tau = json.loads((tmp_path / "cal.json").read_text())["tau"]
    used = _ragate(["ask", QUESTIONS[2], "--method", "min-prob", "--index", str(bm25_index), "--calibration",
                    str(tmp_path / "cal.json"), "--json", "--quiet"], env)  # fmt: skip
    assert used.returncode == 0, used.stderr
    assert json.loads(used.stdout)["gate"]["threshold"] == tau


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _serving(method: str, index: Path, env: dict[str, str], *extra: str) -> Iterator[str]:
    """``ragate serve --method METHOD`` on a free port of 127.0.0.1, until the block ends."""
    if not RAGATE.exists():
        pytest.skip("the ragate command is not installed in this environment (pip install -e .)")
    port = _free_port()
    args = [str(RAGATE), "serve", "--method", method, "--index", str(index), "--port", str(port),
            "--log-level", "warning", *extra]  # fmt: skip
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        import httpx

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"ragate serve exited: {proc.stderr.read() if proc.stderr else ''}")
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture()
def served(smollm2_path: Path, bm25_index: Path, plugin_env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    budget = ["--budget", "0.5", "--window", "10", "--budget-state", str(tmp_path / "budget.json")]
    with _serving("min-prob", bm25_index, plugin_env, *budget) as url:
        yield url


def test_the_installed_gate_is_served_with_its_budget(served: str) -> None:
    import httpx

    with httpx.Client(base_url=served, timeout=120) as client:
        health = client.get("/healthz").json()
        assert health["method"] == "min-prob" and health["capabilities"]["gates"]["min-prob"] == "exact"
        body = client.post("/v1/answer", json={"question": QUESTIONS[1]}).json()
        assert body["method"] == "min-prob" and body["gate"]["reason"].startswith("min-prob score")
        assert body["budget"]["budget"] == 0.5 and body["budget"]["window_rate"] in (0.0, 1.0)
        models = [m["id"] for m in client.get("/v1/models").json()["data"]]
        assert "min-prob" in models


def test_a_trigger_registers_and_runs_in_the_dynamic_loop(smollm2_path: Path, wiki_dense: Any) -> None:
    @ragate.register_trigger("after-8-tokens")
    class After8(ragate.Trigger):
        """Retrieve once 8 tokens have been written since the last retrieval (nothing is cut)."""

        need = ragate.Need(token_logprobs=True)

        @classmethod
        def build(cls, spec: Any, lm: Any, stop_words: frozenset[str]) -> After8:
            return cls()

        def check(self, block: Any, done: bool) -> ragate.Fire | None:
            n = len(block.tokens)
            if done or n < 8:
                return None
            return ragate.Fire(n, float(n), 8.0, "after-8-tokens: 8 tokens written", (0, n), (0, n))

    spec = ragate.get_method("after-8-tokens")
    assert spec.dynamic is not None and spec.dynamic.trigger == "after-8-tokens"
    assert spec.dynamic.query == ragate.get_method("flare").dynamic.query  # type: ignore[union-attr]
    with ragate.Pipeline(method="after-8-tokens", retriever=wiki_dense) as rag:
        ans = rag.answer("Who discovered penicillin?")
    assert ans.trace.dynamic is not None
    fired = [e for e in ans.trace.dynamic.retrievals if e.reason.startswith("after-8-tokens")]
    assert fired and ans.retrieved and ans.documents


BUGS = {  # a question naming the bug -> what ragate says of it
    "raise: who wrote hamlet": "the gate 'faulty' failed: ValueError: my gate's bug",
    "word: who wrote hamlet": "the gate 'faulty' scored 'high' (str); score() must return a number",
    "none: who wrote hamlet": "the gate 'faulty' scored None (NoneType)",
    "nan: who wrote hamlet": "the gate 'faulty' gave a NaN score",
}


def test_a_users_gate_that_fails_is_named_in_the_pipeline(smollm2_path: Path, bm25_index: Path) -> None:
    import plugin_gate  # noqa: F401  (registers "faulty")

    from ragate.errors import GateError

    with ragate.Pipeline(method="faulty", index=bm25_index, max_tokens=4) as rag:
        for question, said in BUGS.items():
            with pytest.raises(GateError) as err:
                rag.answer(question)
            assert said in str(err.value), str(err.value)
            with pytest.raises(GateError, match="'faulty'"):
                rag.decide(question)  # calibration and sweeps see the same error
        assert not rag.answer("who wrote hamlet").retrieved  # a score of 0 <= tau: the gate works otherwise


def test_a_users_gate_that_fails_is_named_by_ask_eval_and_serve(
    smollm2_path: Path, bm25_index: Path, plugin_env: dict[str, str], tmp_path: Path
) -> None:
    env = plugin_env
    for question, said in BUGS.items():
        ask = _ragate(
            ["ask", question, "--method", "faulty", "--index", str(bm25_index), "--json", "--quiet"], env
        )
        assert ask.returncode == 2 and said in ask.stderr and "Traceback" not in ask.stderr, ask.stderr
        assert "NaN" not in ask.stdout  # never an invalid JSON score

    data = tmp_path / "bugs.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "question": q, "answers": ["x"]}) + "\n"
                            for i, q in enumerate(BUGS)))  # fmt: skip
    run = tmp_path / "eval"
    ev = _ragate(["eval", "--dataset", str(data), "--methods", "faulty,no-retrieval", "--index", str(bm25_index),
                  "--out", str(run), "--quiet", "--no-call-cache"], env)  # fmt: skip
    assert ev.returncode == 1, ev.stdout + ev.stderr  # every answer of faulty failed: not a success
    assert "ragate eval: 4 of 4 answers of faulty failed" in ev.stderr and "the gate 'faulty'" in ev.stderr
    records = [json.loads(line) for line in (run / "questions.jsonl").read_text().splitlines()]
    assert sum("error" in r for r in records if r["method"] == "faulty") == 4
    assert all("error" not in r for r in records if r["method"] == "no-retrieval")

    import httpx

    with _serving("faulty", bm25_index, env) as url, httpx.Client(base_url=url, timeout=120) as client:
        for question, said in BUGS.items():
            r = client.post("/v1/answer", json={"question": question, "options": {"max_tokens": 4}})
            assert r.status_code == 500 and said in r.json()["error"]["message"], r.text  # the server's fault
        assert client.post(
            "/v1/answer", json={"question": "who wrote hamlet", "options": {"max_tokens": 4}}
        ).is_success
