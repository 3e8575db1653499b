"""The service's periodic refit (``ragate serve --refit-every N``): after N new labels in the feedback store
(shadow answers and feedback together), the learned gate is fitted again in a background thread (on gold labels
where there are enough of both classes, else shadow's silver ones: :func:`ragate.learning.fit.choose_label`) and put in
force only when it ranks the store's labels at least as well as the gate in force (``Pipeline.learn``: the gate
file is written atomically, then the pipeline's gate is swapped under its lock, so a request is decided wholly by
the old gate or wholly by the new; a new gate that ranks worse stays a candidate file and ``/healthz`` says why). A
fit that cannot be made yet (too few labels of a class) is reported in ``/healthz`` and tried again after the next
N labels.

On a route method (``--method route`` over a closed-book and a one-retrieval route) the refit fits the learned route
policy on the store's labelled route answers instead (``Pipeline.learn_routes(use=True)``, for the live route
budget's B, else the calibration file's), in force only when it picks at least as well as the policy in force on
them (:func:`ragate.learning.route_traffic.compare_with_in_force`)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragate.errors import RagateError

if TYPE_CHECKING:
    from ragate.pipeline import Pipeline


class Refit:
    def __init__(
        self, pipeline: Pipeline, every: int, out: str | Path | None, *, cascade: float | None = None
    ) -> None:
        if pipeline.learner.store is None:
            raise RagateError("a refit learns from a feedback store: give the pipeline feedback_store= (serve --feedback-store)")
        if every and pipeline.spec.route is not None:
            pipeline.learner.route_plan(None, use=True)  # refused now, naming the fix, rather than at every refit
        self.pipeline, self.store, self.every, self.cascade = pipeline, pipeline.learner.store, every, cascade
        self.out = Path(out) if out is not None else None
        self._lock = threading.Lock()
        self._running: threading.Thread | None = None  # the look (and fit) in progress
        self._again = False  # a look was asked for while one ran
        self._fitting = False
        self._looking_since: float | None = None
        self.last_fit_labels = self.store.label_rows() if every else 0
        self.fits = 0
        self.last_error: str | None = None
        self.last_summary: str | None = None
        self.last_in_force: bool | None = None  # whether the last fit went in force (it ranked at least as well)
        self.last_at: float | None = None

    def check(self) -> None:
        """Look, in a background thread, whether ``every`` labels came since the last fit, and refit if so. The
        caller (the event loop after an answer or a label) never waits on the store: a look asked for while one
        runs is made again when it ends."""
        if not self.every:
            return
        with self._lock:
            if self._running is not None:
                self._again = True
                return
            self._again = False
            self._running = threading.Thread(target=self._work, name="ragate-refit", daemon=True)
            self._running.start()

    def _work(self) -> None:
        done = False
        try:
            while not done:
                self._look()
                with self._lock:
                    done, self._again = not self._again, False
                    if done:
                        self._running = None  # under the lock: a check from now on starts a new look
        finally:
            if not done:  # the look failed past its own handling: the next check starts afresh
                with self._lock:
                    self._running = None

    def _look(self) -> None:
        self._looking_since = time.time()  # /healthz shows a look that hangs on the store
        try:  # a store that fails (a shared one that is down) costs this look, never an answer
            rows = self.store.label_rows()
            if rows - self.last_fit_labels < self.every:
                return
        except Exception as err:  # noqa: BLE001  # reported in /healthz
            self.last_error = f"{type(err).__name__}: {err}"[:500]
            return
        finally:
            self._looking_since = None
        self.last_fit_labels = rows
        self._fitting = True
        try:
            self._fit()
        finally:
            self._fitting = False

    def _fit(self) -> None:
        try:
            if self.pipeline.spec.route is not None:  # the route policy (see the module docstring)
                found = self.pipeline.learn_routes(None, self.out, use=True)
                in_force, summary = bool(found["in_force"]), f"route policy {found['path']}: {found['compared']['summary']}"
            else:
                learned = self.pipeline.learn(self.out, label=None, cascade=self.cascade, use=True)
                in_force = learned.comparison is None or learned.comparison.earns
                summary = learned.summary()
            self.fits += 1
            self.last_in_force, self.last_error, self.last_summary = in_force, None, summary
        except Exception as err:  # noqa: BLE001  # reported in /healthz; answers go on with the gate in force
            self.last_error = f"{type(err).__name__}: {err}"[:500]
        self.last_at = time.time()

    def wait(self, timeout: float | None = None) -> None:
        thread = self._running
        if thread is not None:
            thread.join(timeout)

    def describe(self) -> dict[str, Any]:
        return {
            "every": self.every, "fits": self.fits, "labels_at_last_fit": self.last_fit_labels,
            "running": self._fitting, "looking_since": self._looking_since,
            "last_error": self.last_error, "last_summary": self.last_summary, "last_in_force": self.last_in_force,
            "last_at": self.last_at,
        }  # fmt: skip
