"""Issue O: runs against model servers at full concurrency, spread over a fleet, split across machines.

Every test talks to real HTTP servers on 127.0.0.1: ``benchmarks/latency_server.py`` processes, which answer each
call after a fixed latency with text and logprobs that depend on the request alone (a GPU server with many slots,
without the model), so that records must be identical whatever the concurrency, the server or the shard.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ragate.cli.main import main
from ragate.errors import BackendError, RagateError
from ragate.eval.records import latest, read_records
from ragate.eval.sweep import compact

SERVER = Path(__file__).resolve().parents[1] / "benchmarks" / "latency_server.py"
MODEL = "latency-stub"
SWEEP = ["--dataset", "demo", "--limit", "10", "--methods", "targ-margin,targ-variance,dtr", "--quiet"]
KEEP = ("prediction", "scores", "doc_ids")  # of an answer; times differ from run to run


def start(*args: str, model: str = MODEL, port: int = 0) -> tuple[subprocess.Popen[bytes], str]:
    """A latency server on 127.0.0.1 (``port`` 0: any free one; a given port restarts a stopped server at its URL)."""
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "--latency", "0.05", "--model", model, "--port", str(port), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().decode().strip()
    if not url.startswith("http://127.0.0.1:"):
        proc.kill()
        pytest.fail(f"the latency server did not start: {url!r}")
    return proc, url


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture
def server() -> Iterator[str]:
    proc, url = start()
    yield url
    stop(proc)


def sweep(out: Path, *urls: str, extra: tuple[str, ...] = ()) -> int:
    flags = [f for url in urls for f in ("--base-url", url)]
    argv = [
        "sweep",
        *SWEEP,
        "--backend",
        "openai",
        "--model",
        MODEL,
        *flags,
        "--no-call-cache",
        "--out",
        str(out),
    ]
    return main([*argv, *extra])


def sweep_rows(out: Path) -> dict[tuple[str, str], Any]:
    """What a sweep record says, without its times: both answers and every gate's score and decision."""
    rows = {}
    for r in compact(out / "sweep.jsonl"):
        answers = [{k: r[side][k] for k in KEEP} for side in ("closed", "open")]
        gates = {m: (g["score"], g["retrieve"]) for m, g in r["gates"].items()}
        rows[r["id"], r["family"]] = (answers, gates)
    return rows


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Any]:
    """The sweep at --concurrency 1 on one server: what every other arrangement must reproduce."""
    proc, url = start()
    try:
        out = tmp_path_factory.mktemp("reference") / "sweep"
        assert sweep(out, url) == 0
    finally:
        stop(proc)
    rows = sweep_rows(out)
    assert len(rows) == 20  # 10 questions x 2 families (targ, dtr)
    return rows


def test_sweep_concurrency_8_gives_the_records_of_1(server: str, tmp_path: Path, reference: Any) -> None:
    assert sweep(tmp_path / "c8", server, extra=("--concurrency", "8")) == 0
    assert sweep_rows(tmp_path / "c8") == reference
    stats = json.loads(_get(f"{server}/stats"))
    assert stats["most_in_flight"] >= 4, stats  # calls really were in flight together
    # with the call store on: its one connection serves every thread, and a second sweep computes no call
    argv = [
        "sweep",
        *SWEEP,
        "--backend",
        "openai",
        "--model",
        MODEL,
        "--base-url",
        server,
        "--concurrency",
        "8",
    ]
    argv += ["--call-cache", str(tmp_path / "calls.sqlite")]
    assert main([*argv, "--out", str(tmp_path / "cached")]) == 0
    posts = json.loads(_get(f"{server}/stats"))["posts"]
    assert main([*argv, "--out", str(tmp_path / "cached-again")]) == 0
    assert json.loads(_get(f"{server}/stats"))["posts"] - posts <= 2  # the probe (and one warm-up) only
    assert sweep_rows(tmp_path / "cached") == sweep_rows(tmp_path / "cached-again") == reference


def test_concurrency_needs_a_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sweep", *SWEEP, "--concurrency", "4", "--out", str(tmp_path / "x")]
    assert main(argv) == 2
    assert "--concurrency above 1 needs --backend openai" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()  # refused before anything was written


def test_a_burst_of_429_and_503_is_retried(tmp_path: Path, reference: Any) -> None:
    for status in ("429", "503"):
        proc, url = start("--fail", f"{status}:3")
        try:
            assert sweep(tmp_path / status, url, extra=("--concurrency", "4")) == 0
        finally:
            stop(proc)
        assert sweep_rows(tmp_path / status) == reference


def test_a_fleet_spreads_calls_and_answers_as_one_server(tmp_path: Path, reference: Any) -> None:
    procs = [start() for _ in range(2)]
    try:
        urls = [url for _, url in procs]
        assert sweep(tmp_path / "fleet", *urls, extra=("--concurrency", "8")) == 0
        served = [int(json.loads(_get(f"{url}/stats"))["posts"]) for url in urls]
    finally:
        for proc, _ in procs:
            stop(proc)
    assert sweep_rows(tmp_path / "fleet") == reference
    assert all(n > 10 for n in served), served  # both servers answered a share


def test_a_fleet_goes_on_without_a_dead_server_and_refuses_mixed_models(
    tmp_path: Path, reference: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from ragate.backends.openai_compat import OpenAICompatBackend

    proc, url = start()
    dead_proc, dead = start()
    other_proc, other = start(model="another-model")
    try:
        with pytest.raises(BackendError, match="serve different models.*another-model"):
            OpenAICompatBackend([url, other], logprobs="on")
        stop(dead_proc)
        assert sweep(tmp_path / "one-dead", dead, url, extra=("--concurrency", "4")) == 0
    finally:
        stop(proc)
        stop(other_proc)
    assert sweep_rows(tmp_path / "one-dead") == reference
    assert f"the server at {dead} is down" in caplog.text


def test_a_dead_server_is_a_clear_error_and_the_run_resumes(
    tmp_path: Path, reference: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "killed"
    proc, url = start()

    def kill_after_three_answers() -> None:  # mid-run, whatever the machine's speed
        while proc.poll() is None and _lines(out / "sweep.jsonl") < 3:
            time.sleep(0.02)
        stop(proc)

    killer = threading.Thread(target=kill_after_three_answers, daemon=True)
    killer.start()
    try:
        assert sweep(out, url) == 2
    finally:
        stop(proc)
        killer.join(timeout=10)
    err = capsys.readouterr().err
    assert f"OpenAI-compatible server at {url}" in err and "is it running?" in err
    kept = len(compact(out / "sweep.jsonl"))
    assert 0 < kept < 20  # what was answered before the kill is kept
    proc, url = start()  # restarted, on another port: the named model lets the run go on there
    try:
        assert sweep(out, url, extra=("--resume",)) == 0
    finally:
        stop(proc)
    assert sweep_rows(out) == reference


def test_resuming_on_other_servers_needs_the_model_named(tmp_path: Path, server: str) -> None:
    from ragate.eval.run import EvalConfig, check_config

    saved = EvalConfig("demo", ("dtr",), None, "openai", base_url="http://127.0.0.1:1/v1")
    (tmp_path / "config.json").write_text(json.dumps(saved.to_json()))
    moved = EvalConfig("demo", ("dtr",), None, "openai", base_url=server)
    with pytest.raises(RagateError, match="without --model, so nothing says the new servers serve"):
        check_config(moved, tmp_path, resume=True)


def eval_rows(out: Path) -> dict[tuple[str, str], Any]:
    records = latest(read_records(out / "questions.jsonl"))
    assert not [r["error"] for r in records if "error" in r]
    return {
        (r["id"], r["method"]): ({k: r[k] for k in KEEP}, r["gate_score"], r["retrieved"]) for r in records
    }


def test_two_shards_folded_equal_the_unsharded_run(
    server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["eval", "--dataset", "demo", "--limit", "9", "--methods", "random,pairs", "--backend", "openai"]
    base += ["--base-url", server, "--model", MODEL, "--quiet", "--no-call-cache", "--concurrency", "4"]
    assert main([*base, "--out", str(tmp_path / "whole")]) == 0
    for i in (0, 1):
        assert main([*base, "--shard", f"{i}/2", "--out", str(tmp_path / f"s{i}")]) == 0
    assert len(eval_rows(tmp_path / "s0")) == 10 and len(eval_rows(tmp_path / "s1")) == 8  # 5 and 4 questions
    shards = [str(tmp_path / "s0"), str(tmp_path / "s1")]
    assert main(["eval", "--fold", *shards, "--out", str(tmp_path / "folded")]) == 0
    assert eval_rows(tmp_path / "folded") == eval_rows(tmp_path / "whole")
    folded = json.loads((tmp_path / "folded" / "results.json").read_text())
    whole = json.loads((tmp_path / "whole" / "results.json").read_text())
    assert [(r["method"], r["n"], r["em"]) for r in folded["summary"]] == [
        (r["method"], r["n"], r["em"]) for r in whole["summary"]
    ]
    assert [f["shard"] for f in folded["folded_from"]] == ["0/2", "1/2"]
    # the folded run reads as the unsharded one: a resume of the whole command computes nothing
    assert main([*base, "--out", str(tmp_path / "folded"), "--resume"]) == 0
    capsys.readouterr()
    # not one run: a missing shard, a shard given twice, another setting
    assert main(["eval", "--fold", shards[0], shards[0], "--out", str(tmp_path / "f2")]) == 2
    assert "both shard 0/2" in capsys.readouterr().err
    assert main(["eval", "--fold", shards[0], str(tmp_path / "whole"), "--out", str(tmp_path / "f3")]) == 2
    assert "is not a shard" in capsys.readouterr().err
    assert main([*base, "--shard", "1/2", "--seed", "7", "--out", str(tmp_path / "s1-seed7")]) == 0
    assert main(["eval", "--fold", shards[0], str(tmp_path / "s1-seed7"), "--out", str(tmp_path / "f4")]) == 2
    assert "was run with seed=7" in capsys.readouterr().err
    assert main(["eval", "--shard", "2/2", *base[1:], "--out", str(tmp_path / "bad")]) == 2
    assert "write I/N with 0 <= I < N" in capsys.readouterr().err


def test_calibrate_with_concurrency_finds_the_same_tau(server: str, tmp_path: Path) -> None:
    questions = tmp_path / "questions.txt"
    questions.write_text("".join(f"Who wrote book number {i}?\n" for i in range(24)))
    taus = []
    for n in ("1", "8"):
        out = tmp_path / f"cal{n}.json"
        argv = ["calibrate", "--gate", "targ-margin", "--budget", "0.25", "--questions", str(questions)]
        argv += ["--backend", "openai", "--base-url", server, "--model", MODEL, "--concurrency", n, "--quiet"]
        assert main([*argv, "--out", str(out)]) == 0
        taus.append(json.loads(out.read_text())["tau"])
    assert taus[0] == taus[1]


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


def _get(url: str) -> str:
    import httpx

    return httpx.get(url, timeout=10).text


def test_over_a_server_drafts_are_answered_whole_and_dynamic_methods_refused_first(
    server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["eval", "--dataset", "demo", "--limit", "6", "--backend", "openai", "--base-url", server]
    base += ["--model", MODEL, "--quiet", "--no-call-cache"]
    assert main([*base, "--methods", "targ-margin,targ-variance", "--out", str(tmp_path / "targ")]) == 0
    records = latest(read_records(tmp_path / "targ" / "questions.jsonl"))
    assert len(records) == 12 and not [r["error"] for r in records if "error" in r]
    whole = [
        r for r in records if not r["retrieved"] and "answer" in [s["name"] for s in r["trace"]["stages"]]
    ]
    assert whole, "no draft was cut short: the fallback went untested"
    assert main([*base, "--methods", "targ-margin,etc", "--out", str(tmp_path / "etc")]) == 2
    assert "cannot continue the model's own text" in capsys.readouterr().err
    assert not (tmp_path / "etc" / "questions.jsonl").exists() or not read_records(
        tmp_path / "etc" / "questions.jsonl"
    )


def test_every_pack_names_real_methods_and_datasets() -> None:
    from ragate.eval.datasets import DATASETS
    from ragate.methods import get_method
    from ragate.report.reproduce import load_pack, pack_names

    assert pack_names() == ["dtr-table2", "etc-table2", "pairs-table2", "targ-table1"]
    for name in pack_names():
        pack = load_pack(name)
        for d in pack["datasets"]:
            assert d["ragate"] is None and d["why_missing"] or d["ragate"] in DATASETS, (name, d)
        papers = {d["paper"] for d in pack["datasets"]}
        for row in pack["rows"]:
            assert row["dataset"] in papers, (name, row)
            if row["method"]:
                get_method(row["method"])
            assert any(v is not None for v in row["paper"].values()), (name, row)
    with pytest.raises(RagateError, match="no reproduction pack 'targ-table9'.*targ-table1"):
        load_pack("targ-table9")


def test_reproduce_puts_the_paper_beside_ragate(server: str, tmp_path: Path, capsys: Any) -> None:
    from ragate.eval.datasets import load_dataset

    try:
        load_dataset("nq-open", limit=1)
    except RagateError as err:
        pytest.skip(f"NQ-open is not here ({err}): ../shared/data is absent")
    argv = ["reproduce", "targ-table1", "--limit", "4", "--datasets", "nq-open", "--backend", "openai"]
    argv += ["--base-url", server, "--model", MODEL, "--concurrency", "4", "--quiet", "--no-call-cache"]
    assert main([*argv, "--out", str(tmp_path / "r")]) == 0
    printed = capsys.readouterr().out
    table = json.loads((tmp_path / "r" / "reproduce.json").read_text())
    rows = {r["label"]: r for r in table["rows"]}
    assert set(rows) == {"NEVER", "ALWAYS", "ENTROPY", "MARGIN", "VARIANCE"}
    assert (
        rows["NEVER"]["method"] == "never@targ-question-first"
        and rows["ALWAYS"]["ours"]["retrieval_rate"] == 1.0
    )
    assert rows["MARGIN"]["paper"]["em"] == 39.6 and rows["MARGIN"]["n"] == 4
    assert "at the paper's rate 0.304" in rows["MARGIN"]["note"]
    # tau is cross-fitted: each half of the 4 questions is decided at the tau the other half's scores give
    assert "each half of the questions decided at the tau of the other half's scores" in rows["MARGIN"]["note"]
    from ragate.eval.sweep import compact
    from ragate.tuning.calibrate import cross_fitted_taus, halves

    sweep = [r for r in compact(tmp_path / "r" / "nq-open-sweep" / "sweep.jsonl") if "targ-margin" in r["gates"]]
    scores, half = [r["gates"]["targ-margin"]["score"] for r in sweep], halves([r["id"] for r in sweep])
    taus = cross_fitted_taus(scores, 0.304, half)
    for i in range(len(scores)):  # no question's own score moves the tau it was decided with
        assert cross_fitted_taus([*scores[:i], 1e9, *scores[i + 1 :]], 0.304, half)[i] == taus[i]
    assert rows["MARGIN"]["ours"]["retrieval_rate"] == sum(s > t for s, t in zip(scores, taus)) / len(scores)
    assert "| NQ-Open | MARGIN | targ-margin | 4 | 39.6 |" in printed
    assert "| model | Qwen2.5-7B-Instruct | latency-stub (openai) |" in printed
    # the runs are ordinary run directories: a rerun computes nothing and prints the same table
    assert main([*argv, "--out", str(tmp_path / "r")]) == 0
    assert json.loads((tmp_path / "r" / "reproduce.json").read_text())["rows"] == table["rows"]


def test_server_specific_fields_go_with_every_request_and_are_compared_on_resume(
    server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["eval", "--dataset", "demo", "--limit", "2", "--methods", "no-retrieval", "--backend", "openai"]
    base += [
        "--base-url",
        server,
        "--model",
        MODEL,
        "--quiet",
        "--no-call-cache",
        "--out",
        str(tmp_path / "r"),
    ]
    assert main([*base, "--extra-body", '{"repeat_penalty": 1.0}']) == 0
    assert json.loads((tmp_path / "r" / "config.json").read_text())["extra_body"] == {"repeat_penalty": 1.0}
    capsys.readouterr()
    assert main([*base, "--resume", "--extra-body", '{"repeat_penalty": 1.1}']) == 2
    assert "it was run with extra_body={'repeat_penalty': 1.0}" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*base, "--extra-body", "[1]"])
    assert "not a JSON object" in capsys.readouterr().err


def test_a_pipeline_takes_a_fleet() -> None:
    import ragate

    procs = [start() for _ in range(2)]
    try:
        urls = [url for _, url in procs]
        docs = ["Paris is the capital of France.", "Rome is the capital of Italy."]
        with ragate.Pipeline("targ-margin", base_url=urls, model=MODEL, search=lambda q, k: docs[:k]) as rag:
            answers = [rag.answer(f"What is the capital of country number {i}?") for i in range(6)]
        served = [int(json.loads(_get(f"{url}/stats"))["posts"]) for url in urls]
    finally:
        for proc, _ in procs:
            stop(proc)
    assert all(a.text for a in answers)
    assert all(n > 0 for n in served), served


def posts(url: str) -> int:
    """The POSTs a latency server has answered (its ``GET /v1/stats``)."""
    return int(json.loads(_get(f"{url}/stats"))["posts"])


def set_mode(url: str, mode: str) -> None:
    """Make a latency server answer POSTs another way (``--mode``: ok, slow-headers, flood, not-json, ...)."""
    import httpx

    assert httpx.post(f"{url}/mode", json={"mode": mode}, timeout=5).status_code == 200


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def until(condition: Callable[[], bool], seconds: float, what: str, tick: Callable[[], object]) -> None:
    """Call ``tick`` until ``condition()`` holds; fail saying ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {seconds} s")
        tick()
        time.sleep(0.05)


def test_a_service_over_a_fleet_heals(tmp_path: Path) -> None:
    """``ragate serve --base-url A --base-url B``: both servers answer its requests. B answering 200 with a body
    that is not JSON is failed over (every request answered) and down; fixed, it is back. A killed is left out;
    restarted at its URL it gets requests again, and with B killed it answers every one. ``/healthz`` says what
    the balancer believes: 200 while one server is up, 503 when none is, and no URL or reason without the key."""
    import httpx

    sys.path.insert(0, str(Path(__file__).parent))
    from test_service import _serve, _stop

    ports = [free_port(), free_port()]
    procs = [start(port=port) for port in ports]
    url_a, url_b = (url for _, url in procs)
    args = ["--base-url", url_a, "--base-url", url_b, "--model", MODEL, "--method", "targ-margin"]
    service, url = _serve(args, tmp_path / "serve.log", env={"RAGATE_API_KEY": "fleet-key"})
    auth = {"Authorization": "Bearer fleet-key"}
    numbers = iter(range(10**6))
    try:
        with (
            httpx.Client(base_url=url, timeout=60, headers=auth) as client,
            httpx.Client(base_url=url) as bare,
        ):

            def answered() -> None:
                r = client.post("/v1/answer", json={"question": f"What is country number {next(numbers)}?"})
                assert r.status_code == 200, r.text

            def servers() -> dict[str, Any]:
                return dict(client.get("/healthz").json()["servers"])

            for _ in range(6):
                answered()
            assert posts(url_a) > 0 and posts(url_b) > 0
            set_mode(url_b, "not-json")
            for _ in range(6):
                answered()
            down = servers()[url_b]
            assert down["state"] == "down" and "not JSON" in down["problem"] and "next_probe_in_s" in down
            set_mode(url_b, "ok")
            until(lambda: servers()[url_b]["state"] == "up", 20, "B did not come back", answered)
            stop(procs[0][0])
            until(lambda: servers()[url_a]["state"] == "down", 10, "killed A was not marked down", answered)
            assert "could not connect" in servers()[url_a]["problem"]
            hidden = bare.get("/healthz")
            assert hidden.status_code == 200 and set(hidden.json()["servers"]) == {"server 1", "server 2"}
            assert url_a not in hidden.text and "problem" not in hidden.text
            procs[0] = start(port=ports[0])
            until(lambda: posts(url_a) > 0, 20, "restarted A got no request", answered)
            stop(procs[1][0])
            for _ in range(6):
                answered()  # by A, which came back
            stop(procs[0][0])
            health = client.get("/healthz")
            assert (
                health.status_code == 503 and "servers are unavailable" in health.json()["error"]["message"]
            )
            assert url_a in health.json()["error"]["message"] and url_b in health.json()["error"]["message"]
            hidden = bare.get("/healthz")
            assert hidden.status_code == 503 and "127.0.0.1" not in hidden.text
            procs[0] = start(port=ports[0])
            until(lambda: client.get("/healthz").status_code == 200, 20, "healthz stayed 503", lambda: None)
            answered()
    finally:
        for proc, _ in procs:
            stop(proc)
        _stop(service)


def test_the_client_timeout_is_a_run_option(
    server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["eval", "--dataset", "demo", "--limit", "1", "--methods", "no-retrieval", "--backend", "openai"]
    base += ["--base-url", server, "--model", MODEL, "--quiet", "--no-call-cache"]
    assert (
        main([*base, "--openai-timeout", "0.01", "--out", str(tmp_path / "short")]) == 2
    )  # the server takes 0.05 s
    assert "timed out after 0.01 s" in capsys.readouterr().err
    assert main([*base, "--openai-timeout", "30", "--out", str(tmp_path / "long")]) == 0
    saved = json.loads((tmp_path / "long" / "config.json").read_text())
    assert saved["extra"] == {
        "openai_timeout": 30.0
    }  # recorded, and not an answer setting: a resume may change it
    assert main([*base, "--out", str(tmp_path / "long"), "--resume"]) == 0
