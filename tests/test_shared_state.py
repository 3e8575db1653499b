"""Service state shared by replicas in a real Valkey/Redis server started by the tests on 127.0.0.1 (issue 67):
the budget controllers of two replicas hold one window and one rate; the store killed and restarted costs no
request, only a degraded /healthz until it is back; a wrong --state fails at start naming it.

The server is Debian's valkey-server or redis-server (``make`` installs it, like the browser); without one the
tests skip saying so, except under CI, where they fail."""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ragate.errors import RagateError
from ragate.methods import get_method
from ragate.state.budget import BudgetController
from ragate.state.shared import SharedWindow, parse_state_url

pytest.importorskip("valkey", reason="the shared-state tests need the valkey client: pip install valkey")
IN_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
SERVER = shutil.which("valkey-server") or shutil.which("redis-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Store:
    """A Valkey/Redis server this test started on 127.0.0.1 (no persistence), which it can kill and restart."""

    port: int
    workdir: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert SERVER is not None
        self.proc = subprocess.Popen(
            [SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"{SERVER} did not start on port {self.port}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None


def spawn(workdir: Path, *options: str) -> Store:
    """A server with more options (a password, cluster mode), once its port accepts connections."""
    assert SERVER is not None
    port = free_port()
    while port > 55000:  # cluster mode also listens on port + 10000
        port = free_port()
    s = Store(port, workdir)
    s.proc = subprocess.Popen(
        [SERVER, "--port", str(s.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(workdir), *options],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", s.port), timeout=0.2).close()
            return s
        except OSError:
            if time.monotonic() > deadline:
                s.stop()
                raise RuntimeError(f"{SERVER} did not start on port {s.port}") from None
            time.sleep(0.05)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    if SERVER is None:
        reason = "no valkey-server or redis-server: `make` installs one (apt-get install redis-server)"
        if IN_CI:
            pytest.fail(f"the shared-state tests cannot run under CI: {reason}", pytrace=False)
        pytest.skip(reason)
    s = Store(free_port(), tmp_path)
    s.start()
    yield s
    s.stop()


def controller(url: str, budget: float = 0.3, window: int = 50) -> BudgetController:
    spec = get_method("targ-margin")
    shared = SharedWindow(parse_state_url(url), method=spec.name, model="m", budget=budget, window=window)
    return BudgetController(budget, window, spec, None, model="m", shared=shared)


def interleaved(a: BudgetController, b: BudgetController) -> tuple[float, float]:
    """1,000 requests spread at random over two controllers, the harder questions (scores +0.5) reaching ``a``;
    after the first 200, the realised rate and the share decided as the fleet's 70th percentile would."""
    rng = random.Random(0)
    seen = []
    for _ in range(1000):
        replica = (a, b)[rng.random() < 0.5]
        score = rng.random() + (0.5 if replica is a else 0.0)
        decision = score > replica.tau
        seen.append((score, decision))
        replica.observe(score, decision)
    after = seen[200:]
    cut = sorted(s for s, _ in after)[int(0.7 * len(after))]
    return sum(d for _, d in after) / len(after), sum(d == (s > cut) for s, d in after) / len(after)


def test_two_controllers_share_one_window_and_hold_one_rate(store: Store) -> None:
    """With one window between two replicas' controllers the fleet retrieves for its most uncertain 30% wherever
    they arrive, at a realised rate within 0.03 of the budget. Two controllers each with its own window each
    retrieve for 30% of their own traffic: the same score decided two ways."""
    a, b = controller(store.url, window=200), controller(store.url, window=200)
    rate, agree = interleaved(a, b)
    assert abs(rate - 0.3) <= 0.03, rate
    assert a.tau == b.tau  # read from the store by each
    rates = (a.rate(), b.rate())  # each one's copy of the window, as of its own last request
    assert rates[0] is not None and rates[1] is not None and abs(rates[0] - rates[1]) <= 1 / 200
    assert a.shared_error is None and b.shared_error is None
    spec = get_method("targ-margin")
    alone = interleaved(*(BudgetController(0.3, 200, spec, None, model="m") for _ in range(2)))
    assert agree >= 0.85 and alone[1] <= agree - 0.1, (agree, alone)


def test_tau_from_an_older_window_never_replaces_one_from_a_newer(store: Store) -> None:
    """Two replicas push, then set tau in the other order: the tau of the newer window stays (each push and each
    tau are one call to the store, so without the check the older replica's tau would win until the next answer)."""
    a, b = (SharedWindow(parse_state_url(store.url), method="targ-margin", model="m", budget=0.3, window=50) for _ in "ab")
    a.push([(0.1, False)])
    b.push([(0.9, True)])  # b's view includes a's observation
    b.set_tau(0.7)
    a.set_tau(0.2)  # computed from the window before b's push: kept out
    assert a.tau() == b.tau() == 0.7 and (a.seen, b.seen) == (1, 2)
    a.push([(0.5, False), (0.6, True)])
    a.set_tau(0.55)  # from the newest window
    assert b.tau() == 0.55 and a.read()[:2] == ([0.1, 0.9, 0.5, 0.6], [False, True, False, True])
    a._client.delete(a.prefix + "seen")  # the count lost (evicted, deleted by hand): tau is not frozen behind it
    b.push([(0.3, False)])
    b.set_tau(0.4)
    assert a.tau() == 0.4 and b.seen == 1
    a.close()
    b.close()


def test_a_store_that_refuses_scripts_is_refused_at_start(store: Store) -> None:
    """An ACL without scripting (some managed stores): refused when the replica starts, not degraded for ever."""
    import valkey

    admin = valkey.Valkey(host="127.0.0.1", port=store.port)
    admin.execute_command("ACL", "SETUSER", "noscripts", "on", ">secret", "~*", "&*", "+@all", "-@scripting")
    admin.close()
    url = f"redis://noscripts:secret@127.0.0.1:{store.port}/0"
    with pytest.raises(RagateError, match="noscripts|NOPERM|permission"):
        SharedWindow(parse_state_url(url), method="targ-margin", model="m", budget=0.3, window=50)


def test_the_store_killed_and_restarted_costs_no_request(store: Store) -> None:
    a = controller(store.url)
    for i in range(20):
        a.observe(i / 20, i % 3 == 0)
    store.stop()
    taus = [a.tau]  # no exception: the replica decides alone
    for i in range(10):
        taus.append(a.observe(i / 10, i % 2 == 0))
    assert a.shared_error is not None and "127.0.0.1" in a.shared_error
    assert all(isinstance(t, float) for t in taus)
    store.start()
    time.sleep(1.1)  # past the retry interval
    a.observe(0.5, True)
    assert a.shared_error is None
    fresh = controller(store.url)  # what the restarted (empty) store holds now: what was pushed on re-joining
    assert fresh.rate() is not None and len(fresh.snapshot()["history"]) == 0
    # the empty store took the replica's window (20 before the outage, 10 while it was down), then the one after;
    # before, it held only the 11 since the outage, and tau jumped to what a handful of requests said
    assert fresh.snapshot()["window_requests"] == 31 and fresh.tau == a.tau


def test_a_watched_store_is_seen_down_and_back_without_a_request(store: Store) -> None:
    """After the store was killed /healthz stayed "ok" until a request touched it; restarted empty, tau jumped from
    0.63 to 0.26 (the window restarted from the few requests since) before it recovered."""
    a = controller(store.url)
    rng = random.Random(3)
    for _ in range(300):  # the rate settles at the budget
        score = rng.random()
        a.observe(score, score > a.tau)
    before = a.tau
    a.watch(every=0.2)
    try:
        store.stop()
        start = time.monotonic()
        while a.shared_error is None and time.monotonic() - start < 5:
            time.sleep(0.05)
        assert a.shared_error is not None and time.monotonic() - start < 2.0  # seen with no request
        store.start()
        start = time.monotonic()
        while a.shared_error is not None and time.monotonic() - start < 5:
            time.sleep(0.05)
        assert a.shared_error is None and time.monotonic() - start < 2.5  # back (RETRY_SECONDS), unasked
        fresh = controller(store.url)  # the store holds the replica's window and its tau, not an empty one
        assert fresh.snapshot()["window_requests"] == 50 and fresh.tau == a.tau == before
        score = rng.random()
        a.observe(score, score > a.tau)  # the next request's tau comes from 50 scores, not from 1
        assert fresh.tau == a.tau  # set from the seeded window
    finally:
        a.close()
    assert not any(t.name == "ragate-state-watch" and t.is_alive() for t in threading.enumerate())


def test_a_store_with_a_password_takes_it_from_the_url_and_shows_it_nowhere(tmp_path: Path) -> None:
    if SERVER is None:
        pytest.skip("no valkey-server or redis-server: `make` installs one (apt-get install redis-server)")
    locked = spawn(tmp_path, "--requirepass", "s3cret-Pw")
    try:
        with pytest.raises(RagateError, match=f"127.0.0.1:{locked.port}/0: the store refused the credentials"):
            controller(f"redis://127.0.0.1:{locked.port}/0")  # no password
        ok = controller(f"redis://:s3cret-Pw@127.0.0.1:{locked.port}/0?timeout=2")
        ok.observe(0.5, True)
        assert ok.shared_error is None and "s3cret" not in json.dumps(ok.snapshot())
        ok.close()
        with pytest.raises(RagateError) as wrong:
            controller(f"redis://:wrong-Pw@127.0.0.1:{locked.port}/0")
        assert f"127.0.0.1:{locked.port}/0: the store refused the credentials" in str(wrong.value)
        assert "wrong-Pw" not in str(wrong.value)
    finally:
        locked.stop()


def test_the_store_timeout_is_the_urls_and_a_cluster_node_is_refused(tmp_path: Path) -> None:
    url = parse_state_url("redis://127.0.0.1:6379/0?timeout=2.5")
    assert url.timeout == 2.5 and "?" not in url.url and parse_state_url("redis://h:1/0").timeout == 0.5
    for bad, said in (
        ("redis://h:1/0?timeout=0", r"timeout must be seconds in \(0, 60\]"),
        ("redis://h:1/0?timeout=soon", "timeout must be seconds"),
        ("redis://h:1/0?db=2", "the one query read is"),
        ("redis://h:1/0#x", "no fragment"),
    ):
        with pytest.raises(RagateError, match=said):
            parse_state_url(bad)
    if SERVER is None:
        pytest.skip("no valkey-server or redis-server: `make` installs one (apt-get install redis-server)")
    node = spawn(tmp_path, "--cluster-enabled", "yes", "--cluster-config-file", str(tmp_path / "nodes.conf"))
    try:
        with pytest.raises(RagateError, match="is a node of a Valkey/Redis cluster: .* give a single primary"):
            controller(node.url)
    finally:
        node.stop()


def test_a_wrong_state_url_or_a_dead_store_is_refused_naming_it() -> None:
    for bad, said in (
        ("http://127.0.0.1:6379/0", "scheme must be one of"),
        ("redis://127.0.0.1:6379/x", "database must be a number"),
        ("redis:///0", "names no host"),
        ("", "--state is empty"),
    ):
        with pytest.raises(RagateError, match=said):
            parse_state_url(bad)
    port = free_port()  # nothing listens there
    with pytest.raises(RagateError, match=rf"--state redis://127.0.0.1:{port}/0: the store does not answer"):
        controller(f"redis://127.0.0.1:{port}/0")


def test_replicas_with_another_budget_are_refused(store: Store) -> None:
    controller(store.url, budget=0.3)
    with pytest.raises(RagateError, match="must share --budget, --window and --budget-gain"):
        controller(store.url, budget=0.5)


def test_two_serve_replicas_share_one_budget_through_the_store(store: Store, demo_bm25: Path, tmp_path: Path) -> None:
    """Two `ragate serve --budget 0.3 --state URL` processes over one LM server (a latency server on 127.0.0.1),
    requests spread over both at random: the realised rate over all of them is within 0.03 of 0.3 and both serve
    one tau. The store killed: /healthz says degraded within 2 s with no request, and every request is still
    answered; restarted empty: ok again unasked, and tau within 0.05 of the fleet's before the outage (the store was
    seeded with a replica's window; it jumped from 0.63 to 0.26 when it restarted from the few requests since).
    A wrong --state stops serve at start, naming it."""
    import sys

    import httpx

    sys.path.insert(0, str(Path(__file__).parent))
    from test_fleet import MODEL, start, stop
    from test_service import _serve, _stop

    lm, lm_url = start("--latency", "0.005")  # the stand-in's sleep is not what this test measures (time)
    common = ["--base-url", lm_url, "--model", MODEL, "--method", "targ-margin", "--budget", "0.3",
              "--window", "100", "--index", str(demo_bm25), "--state", store.url]  # fmt: skip (bm25: no encoder)
    replicas = []
    try:
        for name in ("a", "b"):
            replicas.append(_serve([*common, "--budget-state", str(tmp_path / f"{name}.json")], tmp_path / name))
        rng = random.Random(1)
        with httpx.Client(timeout=60) as client:

            def ask(i: int) -> tuple[bool, str]:
                url = replicas[rng.random() < 0.5][1]
                r = client.post(f"{url}/v1/answer", json={"question": f"Which river is number {i}?"})
                assert r.status_code == 200, r.text
                return bool(r.json()["retrieved"]), url

            decisions = [ask(i)[0] for i in range(400)]
            rate = sum(decisions[100:]) / 300
            assert abs(rate - 0.3) <= 0.03, rate
            taus = {client.get(f"{url}/v1/budget").json()["tau"] for _, url in replicas}
            assert len(taus) == 1, taus

            def healthy(want: bool) -> float:
                """Seconds until every replica's /healthz says ok (or degraded), asking nothing else."""
                start = time.monotonic()
                while time.monotonic() - start < 10:
                    said = [client.get(f"{url}/healthz").json()["status"] for _, url in replicas]
                    if all((s == "ok") == want for s in said):
                        return time.monotonic() - start
                    time.sleep(0.1)
                pytest.fail(f"/healthz still says {said}")

            store.stop()
            assert healthy(False) < 2.0  # seen by the store's timer, no request needed
            store.start()  # empty: no persistence
            assert healthy(True) < 3.0  # re-joined unasked: the first one back seeds the store with its window
            time.sleep(1.2)  # each replica's view of the fleet's tau is one check of the store old at most
            after = {client.get(f"{url}/v1/budget").json()["tau"] for _, url in replicas}
            assert len(after) == 1 and abs(after.pop() - taus.pop()) <= 0.05
            store.stop()  # again, with requests while it is down
            for i in range(400, 410):
                ask(i)  # answered without the store
            health = client.get(f"{replicas[0][1]}/healthz").json()
            assert health["status"].startswith("degraded: shared state: redis://127.0.0.1:"), health["status"]
            store.start()
            time.sleep(1.1)
            for i in range(410, 420):
                ask(i)
            assert all(client.get(f"{url}/healthz").json()["status"] == "ok" for _, url in replicas)
        bad = subprocess.run(
            [sys.executable, "-m", "ragate.cli.main", "serve", *common[:-1], "redis://127.0.0.1:1/0"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert bad.returncode != 0 and "--state redis://127.0.0.1:1/0: the store does not answer" in bad.stderr
    finally:
        for proc, _ in replicas:
            _stop(proc)
        stop(lm)


def test_the_shared_feedback_store_keeps_what_the_sqlite_store_keeps(store: Store, tmp_path: Path) -> None:
    """The same answers, twins, labels and feedback, in the SQLite file and in the shared store: the same gate
    labels, rows, counts and bound."""
    import numpy as np

    from ragate.learning.shared_store import SharedFeedbackStore, open_feedback_store
    from ragate.learning.store import FeedbackStore, UnknownAnswer

    def fill(s: Any) -> Any:
        for i in range(5):
            s.record_answer(
                f"a{i}", question=f"question {i}?", method="targ-entropy", prompts="targ-question-first",
                answer="Paris", retrieved=i % 2 == 1, features={"words": 2.0 + i},
                hidden=np.arange(4, dtype=np.float32) + i, model={"model": "m.gguf", "engine": "llama.cpp"},
            )  # fmt: skip
        with pytest.raises(UnknownAnswer, match="no answer 'a0'"):
            s.feedback("a0", correct=True)  # the oldest went
        said = [s.feedback("a4", correct=False), s.feedback("a3", correct=True)]
        s.set_twin("a3", closed="London")
        said.append(s.feedback("a3", reference="Paris"))
        s.add_label("a2", source="shadow", kind="retrieval-changed", value=False)
        s.add_label("a2", source="shadow", kind="retrieval-changed", value=True)  # the latest counts
        rows = [s.labelled(kind) for kind in ("closed-wrong", "retrieval-changed")]
        return said, [(r.ids, r.y.tolist(), r.sources, r.models, r.features, [h.tolist() for h in r.hidden])
                      for r in rows], s.counts(), s.label_rows()  # fmt: skip

    with FeedbackStore(tmp_path / "fb.db", max_answers=3) as local:
        expected = fill(local)
    shared = open_feedback_store(store.url, max_answers=3)
    assert isinstance(shared, SharedFeedbackStore)
    with shared:
        assert fill(shared) == expected
        assert shared.get("a4") is not None and shared.get("a4").closed_answer == "Paris"  # type: ignore[union-attr]
    assert expected[2]["answers"] == 3 and expected[3] == 6  # a route label (retrieved-wrong) counts like a gate label


def test_labels_posted_to_one_replica_are_seen_through_the_other_and_by_gate_learn(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two `ragate serve --feedback-store redis://...` replicas: an answer given by one is judged through the other
    (its id is known there), both report the labels, and `ragate gate learn --store URL` reads them."""
    import sys

    import httpx

    sys.path.insert(0, str(Path(__file__).parent))
    from test_fleet import MODEL, start, stop
    from test_service import _serve, _stop

    from ragate.cli.main import main

    lm, lm_url = start()
    common = ["--base-url", lm_url, "--model", MODEL, "--method", "targ-margin", "--feedback-store", store.url]
    replicas = []
    try:
        for name in ("a", "b"):
            replicas.append(_serve(common, tmp_path / name))
        (_, url_a), (_, url_b) = replicas
        with httpx.Client(timeout=60) as client:
            ids = []
            for i in range(6):
                r = client.post(f"{url_a}/v1/answer", json={  # a high threshold: answered closed-book
                    "question": f"Which lake is number {i}?", "options": {"threshold": 100.0}})
                assert r.status_code == 200, r.text
                ids.append(r.json()["id"])
            for answer_id in ids:  # judged through the other replica
                r = client.post(f"{url_b}/v1/feedback", json={"id": answer_id, "reference": "Lake Baikal"})
                assert r.status_code == 200, r.text
                assert r.json()["labels"] == [{"kind": "closed-wrong", "retrieve": True}]
            counts = r.json()["counts"]
            assert counts["answers"] == 6 and counts["closed-wrong"] == {"retrieve": 6, "no_retrieve": 0}
        assert main(["gate", "learn", "--store", store.url, "--out", str(tmp_path / "gate.json")]) != 0
        printed = capsys.readouterr()  # six labels of one value are too few to fit a gate: it says so
        assert f"{store.url}: 6 answers; labels" in printed.out, printed
        store.stop()  # the store gone: answers go on, feedback says the store is unavailable (not the client's fault)
        with httpx.Client(timeout=60) as client:
            r = client.post(f"{url_a}/v1/answer", json={"question": "Which lake is the deepest?"})
            assert r.status_code == 200 and r.json().get("id") is None, r.text
            r = client.post(f"{url_b}/v1/feedback", json={"id": ids[0], "correct": True})
            assert r.status_code == 503 and "could not be used" in r.text, r.text
    finally:
        for proc, _ in replicas:
            _stop(proc)
        stop(lm)
