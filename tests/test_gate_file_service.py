"""A fitted gate file in force under ``ragate serve``, as real processes on 127.0.0.1 over the stand-in model server
(``benchmarks/latency_server.py``, model ``latency-stub``) and a BM25 index of one document: a file no answer could
use (fitted on another model, numbers that overflow) is refused at start with a ``ragate: error:`` line naming it;
a file that goes bad while serving (half-written, damaged, deleted) leaves the last good gate deciding, ``/healthz``
degraded naming the file and why (to a client with the key), a metric counting it, until a good file is back."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

for _module in ("fastapi", "uvicorn", "prometheus_client"):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"{_module} is not installed: pip install 'ragate[service]'", allow_module_level=True)

from test_fleet import MODEL, start, stop
from test_learned_gate import _synthetic
from test_service import _free_port, _serve, _stop

from ragate.cli.main import main
from ragate.errors import RagateError
from ragate.gates.learned import LearnedGateFile, load_learned, save_learned
from ragate.gates.weights import GateWeights, load_weights, save_weights
from ragate.learning.scores import learn_gate

KEY = "gate-file-key"
QUESTIONS = ("Who wrote Hamlet?", "What is the capital of France?", "Which river runs through Paris in 1999?")


@pytest.fixture(scope="module")
def stub() -> Iterator[str]:
    proc, url = start()
    yield url
    stop(proc)


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("index")
    (folder / "doc.txt").write_text(
        "Paris is the capital of France. Hamlet was written by William Shakespeare.\n"
    )
    out = folder / "bm25"
    built = main(
        ["index", "build", "--docs", str(folder / "doc.txt"), "--kind", "bm25", "--out", str(out), "--quiet"]
    )
    assert built == 0
    return out


def _gate(model: str) -> LearnedGateFile:
    """A learned gate on the question's own signals (no hidden state, no draft: a server can serve it)."""
    gate, _, _p = learn_gate(_synthetic().select(["words", "digit"], hidden=False), label="closed-wrong")
    return LearnedGateFile(gate.cheap, None, None, {**gate.meta, "model": {"model": model}})


def _flipped(gate: LearnedGateFile) -> LearnedGateFile:
    """The same gate with its probe turned round: P becomes 1 - P."""
    c = gate.cheap
    probe = type(c)(c.features, c.mean, c.scale, -c.coef, -c.intercept, (c.platt[0], -c.platt[1]))
    return LearnedGateFile(probe, None, None, dict(gate.meta))


def _refused(stub: str, index: Path, *args: str) -> str:
    """``ragate serve`` over the stand-in with ``args``: it must exit 2 at start, before listening; its stderr."""
    cmd = [sys.executable, "-m", "ragate.cli.main", "serve", "--port", str(_free_port()), "--base-url", stub,
           "--model", MODEL, "--index", str(index), *args]  # fmt: skip
    done = subprocess.run(
        cmd,
        check=False,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "RAGATE_API_KEY": ""},
    )
    said = done.stderr
    assert done.returncode == 2, said[-3000:]
    assert "Traceback" not in said and "listening on" not in done.stdout + said, said[-3000:]
    return said


def test_a_gate_file_fitted_on_another_model_is_refused_at_start(
    stub: str, index: Path, tmp_path: Path
) -> None:
    learned = save_learned(_gate("other-stub"), tmp_path / "learned.json")
    said = _refused(stub, index, "--method", "learned", "--gate-weights", str(learned))
    line = next(x for x in said.splitlines() if x.startswith("ragate: error:"))
    for word in (str(learned), "'other-stub'", f"'{MODEL}'", "ragate gate learn"):
        assert word in line, line
    weights = GateWeights(
        ("words", "digit"), np.array([10.0, 0.2]), np.array([4.0, 0.4]), np.array([0.2, -0.1]), -0.5,
        {"label": "closed-wrong", "model": {"engine": "openai", "model": "other-stub"}},
    )  # fmt: skip
    lr = save_weights(weights, tmp_path / "lr.json")
    said = _refused(stub, index, "--method", "no-model-lr", "--gate-weights", str(lr))
    line = next(x for x in said.splitlines() if x.startswith("ragate: error:"))
    for word in (str(lr), "'other-stub'", f"'{MODEL}'", "ragate gate fit"):
        assert word in line, line


def test_a_gate_file_whose_numbers_overflow_is_refused_at_start(
    stub: str, index: Path, tmp_path: Path
) -> None:
    good = _gate(MODEL).to_json()
    # finite numbers, each one allowed, that score a question NaN: coef 1e308 over scale 1e-308
    huge = {**good, "cheap": {**good["cheap"], "features": ["digit", "words"], "mean": [0.175, 10.7],
                              "coef": [-1e308, 1e308], "scale": [1e-308, 1e-308]}}  # fmt: skip
    path = tmp_path / "overflow.json"
    path.write_text(json.dumps(huge))
    with pytest.raises(RagateError, match="overflow") as err:
        load_learned(path)
    assert str(path) in str(err.value)
    said = _refused(stub, index, "--method", "learned", "--gate-weights", str(path))
    line = next(x for x in said.splitlines() if x.startswith("ragate: error:"))
    assert str(path) in line and "overflow" in line and "learn it again" in line, line
    weights = GateWeights(
        ("words",), np.array([10.0]), np.array([1.0]), np.array([0.2]), -0.5, {"label": "closed-wrong"}
    )
    lr = weights.to_json() | {
        "coef": [1e308],
        "scale": [1e-300],
        "model": {"engine": "openai", "model": MODEL},
    }
    (tmp_path / "lr.json").write_text(json.dumps(lr))
    with pytest.raises(RagateError, match="overflow"):
        load_weights(tmp_path / "lr.json")
    assert (
        load_learned(save_learned(_gate(MODEL), tmp_path / "fitted.json")).cheap is not None
    )  # a fit passes


def test_a_gate_file_that_goes_bad_while_serving_leaves_the_last_good_gate_in_force(
    stub: str, index: Path, tmp_path: Path
) -> None:
    gate = tmp_path / "gate.json"
    good = _gate(MODEL)
    save_learned(good, gate)
    args = [
        "--base-url",
        stub,
        "--model",
        MODEL,
        "--index",
        str(index),
        "--method",
        "learned",
        "--gate-weights",
        str(gate),
    ]
    proc, url = _serve(args, tmp_path / "serve.log", env={"RAGATE_API_KEY": KEY})
    auth = {"Authorization": f"Bearer {KEY}"}

    def scores(http: httpx.Client) -> list[float]:
        out = []
        for q in QUESTIONS:
            r = http.post("/v1/answer", json={"question": q})
            assert r.status_code == 200, r.text
            out.append(r.json()["gate"]["score"])
        return out

    def status(http: httpx.Client, bare: httpx.Client) -> tuple[str, str]:
        keyed, hidden = http.get("/healthz"), bare.get("/healthz")
        assert keyed.status_code == 200 and hidden.status_code == 200
        return keyed.json()["status"], hidden.json()["status"]

    def refusals(http: httpx.Client) -> float:
        for line in http.get("/metrics").text.splitlines():
            if line.startswith("ragate_gate_file_refusals_total "):
                return float(line.split()[1])
        raise AssertionError("no ragate_gate_file_refusals_total")

    try:
        with httpx.Client(base_url=url, timeout=60, headers=auth) as http, httpx.Client(base_url=url) as bare:
            before = scores(http)
            assert status(http, bare) == ("ok", "ok") and refusals(http) == 0
            text = gate.read_text()
            with gate.open("w") as f:  # rewritten in place: requests arrive while half of it is written
                f.write(text[: len(text) // 2])
                f.flush()
                assert scores(http) == before
                keyed, hidden = status(http, bare)
                assert keyed.startswith("degraded: learned gate file:") and str(gate) in keyed, keyed
                assert "not valid JSON" in keyed and "decides until" in keyed, keyed
                assert str(gate) not in hidden and str(tmp_path) not in hidden and "refused" in hidden, hidden
                f.write(text[len(text) // 2 :])
            assert scores(http) == before and status(http, bare) == ("ok", "ok")
            damaged = tmp_path / "damaged.json"  # swapped in whole, and damaged
            damaged.write_text(
                json.dumps({**json.loads(text), "cheap": {**json.loads(text)["cheap"], "coef": [1.0]}})
            )
            os.replace(damaged, gate)
            assert scores(http) == before
            keyed, _ = status(http, bare)
            assert str(gate) in keyed and "damaged learned gate" in keyed, keyed
            gate.unlink()
            assert scores(http) == before
            keyed, _ = status(http, bare)
            assert str(gate) in keyed and "not found" in keyed, keyed
            other = tmp_path / "other.json"  # a whole file, learned on another model
            save_learned(_gate("other-stub"), other)
            os.replace(other, gate)
            assert scores(http) == before
            keyed, _ = status(http, bare)
            assert "'other-stub'" in keyed and "learn one on this model's traffic" in keyed, keyed
            assert refusals(http) >= 4
            save_learned(_flipped(good), gate)  # a good file back: in force at the next request
            after = scores(http)
            assert np.allclose(after, [1 - b for b in before], atol=1e-6), (before, after)
            assert status(http, bare) == ("ok", "ok")
    finally:
        _stop(proc)
    said = (tmp_path / "serve.log").read_text(errors="replace")
    assert "Traceback" not in said and "stays in force" in said, said[-3000:]
