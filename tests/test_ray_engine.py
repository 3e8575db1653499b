"""``ragate eval --engine ray`` on a real local Ray cluster of 2 CPUs (issue 67): the records equal a local run's,
timings aside; a worker killed mid-run is restarted and its batch answered again, every record written once; a
wrong --ray-address is refused before anything starts; sweep, tune, calibrate and gate learn compute on Ray what
they compute here."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ragate.errors import RagateError
from ragate.eval.config import EvalConfig
from ragate.eval.ray_engine import check_address
from ragate.eval.records import read_records
from ragate.eval.run import run_eval

ray = pytest.importorskip("ray", reason="the Ray engine's tests need Ray: pip install 'ragate[ray]'")
psutil = pytest.importorskip("psutil")

DEMO_SWEEP = Path(__file__).parent.parent / "docs" / "results" / "runs" / "sweep-demo-smollm2-135m-80"
DEMO_FAMILY = "targ|question|k=5|n=5|cos|hyde=1|rep=5|ce=None|max=64"


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    """One local cluster for the module (starting one takes seconds); run_eval joins it and leaves it running."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield
    ray.shutdown()


def timeless(record: dict[str, Any]) -> Any:
    """A record without what the clock measured (wall and CPU seconds, anywhere in it)."""
    if isinstance(record, dict):
        return {k: timeless(v) for k, v in record.items() if "second" not in k and "latency" not in k}
    if isinstance(record, list):
        return [timeless(v) for v in record]
    return record


def records(out: Path) -> dict[tuple[str, str], Any]:
    found = [timeless(r) for r in read_records(out / "questions.jsonl")]
    assert len({(r["id"], r["method"]) for r in found}) == len(found)  # none written twice
    return {(r["id"], r["method"]): r for r in found}


def config(limit: int, methods: tuple[str, ...], index: Path | None = None) -> EvalConfig:
    return EvalConfig(dataset="demo", methods=methods, limit=limit, index=None if index is None else str(index))


def test_a_ray_run_gives_the_records_of_a_local_run(cluster: None, demo_bm25: Path, tmp_path: Path) -> None:
    c = config(4, ("no-retrieval", "targ-margin"), demo_bm25)  # bm25: no worker loads an encoder (seconds each)
    local = run_eval(c, tmp_path / "local", progress=False, cache=False)
    far = run_eval(c, tmp_path / "ray", progress=False, cache=False, engine="ray", ray_workers=2)
    assert records(tmp_path / "ray") == records(tmp_path / "local")
    assert len(records(tmp_path / "ray")) == 8
    assert timeless(far["summary"]) == timeless(local["summary"])
    assert far["calls"]["engine"] == "ray"
    again = run_eval(c, tmp_path / "ray", resume=True, progress=False, cache=False, engine="ray", ray_workers=2)
    assert len(records(tmp_path / "ray")) == 8 and again["questions"] == 4  # a resume finds nothing to do


def test_a_ray_sweep_gives_the_records_of_a_local_sweep(cluster: None, tmp_path: Path) -> None:
    from ragate.eval.sweep import compact, sweep_pass

    c = config(2, ("targ-margin", "dtr"))  # two questions, two families: four jobs over two workers (time)
    sweep_pass(c, tmp_path / "local", progress=False, cache=False)
    sweep_pass(c, tmp_path / "ray", progress=False, cache=False, engine="ray", ray_workers=2)

    def rows(out: Path) -> dict[tuple[str, str], Any]:
        return {(r["id"], r["family"]): timeless(r) for r in compact(out / "sweep.jsonl")}

    assert rows(tmp_path / "ray") == rows(tmp_path / "local") and len(rows(tmp_path / "local")) == 4


def workers() -> list[Any]:
    return [p for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [""])[0].startswith("ray::_Worker")]


def test_a_worker_killed_mid_run_is_retried_and_every_record_is_written_once(cluster: None, tmp_path: Path) -> None:
    out = tmp_path / "killed"
    c = config(16, ("no-retrieval",))
    done: dict[str, Any] = {}

    def run() -> None:
        try:
            done["results"] = run_eval(c, out, progress=False, cache=False, engine="ray", ray_workers=2)
        except BaseException as err:  # noqa: BLE001 - the test reports it
            done["error"] = err

    thread = threading.Thread(target=run)
    thread.start()
    path = out / "questions.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not (path.exists() and path.read_text().count("\n") >= 1):
        time.sleep(0.1)
    assert path.exists(), "no record arrived"
    assert path.read_text().count("\n") < 16, "the run ended before a worker could be killed"
    victims = workers()
    assert victims, "no Ray worker process found"
    os.kill(victims[0].pid, signal.SIGKILL)
    killed = victims[0].pid
    thread.join(300)
    assert not thread.is_alive() and "error" not in done, done.get("error")
    got = Counter((r["id"], r["method"]) for r in read_records(path))
    assert set(got.values()) == {1} and len(got) == 16  # every record present, once
    assert killed not in {p.pid for p in workers()}
    assert done["results"]["summary"][0]["n"] == 16


def test_a_wrong_ray_address_is_refused_naming_it(tmp_path: Path) -> None:
    for bad in ("not an address", "nohost"):
        with pytest.raises(RagateError, match="is not a Ray cluster address"):
            check_address(bad)
    from ragate.cli.main import main

    for kind in ("eval", "sweep"):
        assert main([kind, "--dataset", "demo", "--methods", "targ-margin", "--engine", "ray", "--ray-address",
                     "nohost", "--out", str(tmp_path / kind)]) == 2  # fmt: skip
        assert not (tmp_path / kind).exists()
    out = tmp_path / "cal.json"
    assert main(["calibrate", "--gate", "targ-margin", "--budget", "0.3", "--dev", "demo", "--engine", "ray",
                 "--ray-address", "nohost", "--out", str(out)]) == 2  # fmt: skip
    assert main(["gate", "learn", "--sweep", str(DEMO_SWEEP), "--engine", "ray", "--ray-address", "nohost", "--out",
                 str(out)]) == 2  # fmt: skip
    assert not out.exists()
    with pytest.raises(RagateError, match="with --engine ray give --ray-workers"):
        run_eval(config(1, ("no-retrieval",)), tmp_path / "z", progress=False, engine="ray", workers=2)
    with pytest.raises(RagateError, match="--ray-address and --ray-workers go with --engine ray"):
        run_eval(config(1, ("no-retrieval",)), tmp_path / "y", progress=False, ray_address="auto")


def test_a_ray_address_where_nothing_answers_fails_within_the_start_timeout(tmp_path: Path) -> None:
    """``--ray-start-timeout 1`` and an address where nothing listens: a ragate error naming the address and the
    timeout within seconds (not minutes of Ray's own warnings), no traceback, and no run directory."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        out = tmp_path / "run"
        cmd = [sys.executable, "-m", "ragate.cli.main", "eval", "--dataset", "demo", "--limit", "1", "--methods",
               "no-retrieval", "--engine", "ray", "--ray-address", address, "--ray-start-timeout", "1", "--out",
               str(out), "--quiet"]  # fmt: skip
        start = time.monotonic()
        done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
        took = time.monotonic() - start
        assert done.returncode == 2, done.stderr[-3000:]
        said = done.stderr.strip().splitlines()
        assert len(said) == 1 and said[0].startswith(f"ragate: error: --ray-address {address}:"), said
        assert "within 1 s" in said[0] and "--ray-start-timeout" in said[0], said
        assert "Traceback" not in done.stderr and "GCS" not in done.stderr
        assert took < 30, took  # the interpreter's start included
        assert not out.exists()
    one = config(1, ("no-retrieval",))
    with pytest.raises(RagateError, match=f"127.0.0.1:{port}: no Ray cluster answered there within 0.5 s"):
        run_eval(one, tmp_path / "api", progress=False, engine="ray", ray_address=f"127.0.0.1:{port}",
                 ray_start_timeout=0.5)  # fmt: skip
    assert not (tmp_path / "api").exists()
    with pytest.raises(RagateError, match="--ray-start-timeout is a positive number of seconds"):
        run_eval(one, tmp_path / "zero", progress=False, engine="ray", ray_start_timeout=0)


def test_tune_runs_each_value_on_ray(cluster: None, tmp_path: Path) -> None:
    from ragate.tuning.tune import tune

    result = tune(method="flare", dataset="demo", out=tmp_path / "tune", limit=2, grid=[0.5], test_limit=0,
                  progress=False, cache=False, run_engine="ray", ray_workers=1)  # fmt: skip
    run = json.loads((tmp_path / "tune" / "theta-0.5" / "results.json").read_text())
    assert run["calls"]["engine"] == "ray" and run["questions"] == 2
    assert result["method"] == "flare"


def test_calibrate_and_gate_learn_compute_on_ray_what_they_compute_here(
    cluster: None, tmp_path: Path, demo_gate: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The gate's scores (calibrate --dev, --questions and --check) and the hidden states gate learn fits on come
    from Ray workers; the calibration files, and the learned gate, equal the ones computed in this process."""
    from ragate.cli.main import main

    questions = tmp_path / "questions.txt"
    questions.write_text("who wrote hamlet\nwhat is the capital of peru\nwhen did the berlin wall fall\nhow tall is everest\n")
    for source in (["--dev", "demo", "--limit", "6"], ["--questions", str(questions), "--check", str(questions)]):
        files = {}
        for name, engine in (("here", []), ("ray", ["--engine", "ray", "--ray-workers", "2"])):
            files[name] = tmp_path / f"{name}.json"
            assert main(["calibrate", "--gate", "targ-margin", "--budget", "0.5", "--quiet", "--out",
                         str(files[name]), *source, *engine]) == 0  # fmt: skip
        assert json.loads(files["ray"].read_text()) == json.loads(files["here"].read_text())
    assert capsys.readouterr().out.count("retrieves for 50.0% (within the budget of 50%)") == 2  # --check, twice
    # over a server (a stand-in latency server): each worker's client, no local threads to set
    from test_fleet import MODEL, start, stop

    proc, url = start()
    try:
        served = ["--backend", "openai", "--base-url", url, "--model", MODEL, "--questions", str(questions)]
        for name, engine in (("here", []), ("ray", ["--engine", "ray", "--ray-workers", "1"])):
            assert main(["calibrate", "--gate", "targ-margin", "--budget", "0.5", "--quiet", "--out",
                         str(tmp_path / f"served-{name}.json"), *served, *engine]) == 0  # fmt: skip
    finally:
        stop(proc)
    assert json.loads((tmp_path / "served-ray.json").read_text()) == json.loads((tmp_path / "served-here.json").read_text())
    assert main(["calibrate", "--gate", "targ-margin", "--budget", "0.5", "--from-sweep", str(DEMO_SWEEP),
                 "--engine", "ray", "--out", str(tmp_path / "x.json")]) == 2  # fmt: skip
    # the demo gate (tests/conftest.py) is fitted on the same sweep's silver labels, with hidden states computed here
    far = tmp_path / "learned.json"
    assert main(["gate", "learn", "--sweep", str(DEMO_SWEEP), "--family", DEMO_FAMILY, "--label", "retrieval-changed",
                 "--components", "16", "--C", "0.1", "--out", str(far), "--engine", "ray", "--ray-workers", "2"]) == 0  # fmt: skip
    got, want = json.loads(far.read_text()), json.loads(demo_gate.read_text())
    assert got.pop("source") == f"sweep {DEMO_SWEEP}" and want.pop("source") == ""
    assert got == want | {"model": {"model": "smollm2-135m", "engine": "llama.cpp"}}  # the name the workers report
