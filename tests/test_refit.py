"""The service's refit check (``ragate serve --refit-every N``, ragate.service.refit) never makes its caller wait on
the feedback store: the caller is the event loop after each answer, and a shared store that hangs (Valkey paused,
a network that drops packets) must not hold every request of the replica. A scripted store gives the exact control
this needs: its reads block until the test lets them go."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ragate.service.refit import Refit


class _Store:
    """A feedback store whose label count blocks until ``go`` is set (once ``held`` says a read is waiting)."""

    def __init__(self) -> None:
        self.rows, self.reads = 0, 0
        self.go, self.held = threading.Event(), threading.Event()
        self.go.set()

    def label_rows(self) -> int:
        self.reads += 1
        self.held.set()
        self.go.wait()
        return self.rows

    def counts(self) -> dict[str, Any]:
        return {"closed-wrong": {"retrieve": 0, "no_retrieve": 0}}


class _Pipeline:
    def __init__(self) -> None:
        self.learner, self.fitted = SimpleNamespace(store=_Store()), []
        self.spec = SimpleNamespace(route=None)  # a gate method: the refit learns its gate

    def learn(self, out: Any, *, label: str | None, cascade: Any, use: bool) -> Any:
        self.fitted.append(label)

        class _Learned:
            comparison = None  # no comparison could be made: it goes in force

            def summary(self) -> str:
                return f"fitted on {label}"

        return _Learned()


def test_a_refit_check_returns_while_the_store_hangs_and_looks_again_afterwards(tmp_path: Path) -> None:
    pipeline = _Pipeline()
    refit = Refit(pipeline, 2, tmp_path / "gate.json")  # reads the count once, at start
    store = pipeline.learner.store
    store.go.clear()
    store.held.clear()
    caller = threading.Thread(target=refit.check)  # the event loop, after an answer
    caller.start()
    assert store.held.wait(30), "the look never reached the store"
    caller.join(30)
    hung = caller.is_alive()
    if hung:
        store.go.set()  # let the old, blocking check go before failing
    assert not hung, "the caller waited on the hanging store"
    pipeline.learner.store.rows = 2  # labels came meanwhile; this check is kept for when the hanging look ends
    refit.check()
    refit.check()
    assert store.reads == 2 and pipeline.fitted == []  # one look at a time
    assert refit.describe()["looking_since"] is not None and not refit.describe()["running"]  # /healthz shows it
    store.go.set()
    refit.wait(30)  # the first look (now due: a fit), then the one asked for while it hung (not due)
    assert pipeline.fitted == [None] and store.reads == 3  # the label: the one the store can fit (learning.choose_label)
    assert refit.describe() | {"last_at": None} == {
        "every": 2, "fits": 1, "labels_at_last_fit": 2, "running": False, "looking_since": None, "last_error": None,
        "last_summary": "fitted on None", "last_in_force": True, "last_at": None,
    }  # fmt: skip


def test_a_failing_store_costs_the_look_and_the_next_check_starts_afresh(tmp_path: Path) -> None:
    pipeline = _Pipeline()
    refit = Refit(pipeline, 1, tmp_path / "gate.json")

    def down() -> int:
        raise ConnectionError("the store is gone")

    pipeline.learner.store.label_rows = down  # type: ignore[method-assign]
    refit.check()
    refit.wait(30)
    assert refit.describe()["last_error"] == "ConnectionError: the store is gone" and pipeline.fitted == []
    pipeline.learner.store.label_rows = lambda: 1  # type: ignore[method-assign]
    refit.check()  # the store is back: the next check looks again, and fits
    refit.wait(30)
    assert pipeline.fitted == [None]
