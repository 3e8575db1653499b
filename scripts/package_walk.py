"""The packages two learning paths pass through, traced as they run (docs/architecture.md's layers):

1. a labelled sweep to a learned gate (``ragate.learning.fit.sweep_labelled`` then ``learn_labelled``, what
   ``ragate gate learn --sweep`` runs), on the committed demo sweep with SmolLM2's hidden states;
2. ``POST /v1/feedback`` (a user's "wrong" and a user's reference answer) to the refitted gate in force, in the
   service app of ``ragate serve --feedback-store FILE --refit-every 1`` over the demo index.

    RAGATE_HOME=... .venv/bin/python scripts/package_walk.py

Each path prints the ragate packages whose functions ran (the core modules at the top of ``src/ragate`` aside; code
run by an import is not the walk) and every call from a package into one higher in the layer table: an object or
callback the caller handed down (the only way up, since no module imports upward).
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any, Self

ROOT = Path(__file__).resolve().parents[1]
LAYERS = (
    "core", "extensions", "models", "backends", "retrieval", "gates", "selection", "methods", "dynamic", "eval",
    "tuning", "report", "answers", "state", "learning", "pipeline", "integrations", "service", "cli",
)  # fmt: skip
CORE = {"errors", "version", "types", "uncertainty", "text", "fileio"}
AT_TOP = {"plugins": "extensions", "models": "models", "tracing": "answers", "arguments": "pipeline"}
DEMO_SWEEP = ROOT / "docs/results/runs/sweep-demo-smollm2-135m-80"
DEMO_FAMILY = "targ|question|k=5|n=5|cos|hyde=1|rep=5|ce=None|max=64"


def package(frame: FrameType) -> str | None:
    name = str(frame.f_globals.get("__name__", ""))
    if not name.startswith("ragate."):
        return None
    top = name.split(".")[1]
    return "core" if top in CORE else AT_TOP.get(top, top)


def importing(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") != "__main__":
            return True
        frame = frame.f_back
    return False


class Walk:
    """Packages entered and calls up the table while it is the active walk (every thread is profiled)."""

    active: Walk | None = None

    def __init__(self) -> None:
        self.packages: set[str] = set()
        self.up: set[tuple[str, str]] = set()

    def __enter__(self) -> Self:
        Walk.active = self
        return self

    def __exit__(self, *exc: object) -> None:
        Walk.active = None

    def call(self, frame: FrameType) -> None:
        callee = package(frame)
        if callee is None or importing(frame):
            return
        back = frame.f_back
        while back is not None and package(back) is None:
            back = back.f_back
        self.packages.add(callee)
        caller = package(back) if back is not None else None
        if back is not None and caller is not None and LAYERS.index(callee) > LAYERS.index(caller):
            where = lambda f: f"{f.f_globals['__name__']}.{f.f_code.co_name}"
            self.up.add((where(back), where(frame)))

    def show(self, name: str) -> None:
        found = sorted(p for p in self.packages if p != "core")
        print(f"{name}: {len(found)} packages: {', '.join(found)}")
        print(f"{name}: {len(self.up)} call(s) up the layer table" + ("" if self.up else "."))
        for a, b in sorted(self.up):
            print(f"    {a} -> {b}")


def _profile(frame: FrameType, event: str, arg: Any) -> None:
    if event == "call" and Walk.active is not None:
        Walk.active.call(frame)


def main() -> None:
    from fastapi.testclient import TestClient

    from ragate.backends import load_backend
    from ragate.eval.calls import CallCache
    from ragate.learning.fit import import_sweep, learn_labelled, sweep_labelled
    from ragate.learning.store import FeedbackStore
    from ragate.retrieval.demo import demo_index
    from ragate.retrieval.index import open_index
    from ragate.service.app import create_app
    from ragate.service.settings import ServiceSettings

    sys.setprofile(_profile)
    threading.setprofile(_profile)
    tmp = Path(tempfile.mkdtemp(prefix="ragate-walk-"))
    lm = load_backend("smollm2", "llama.cpp", n_ctx=2048)
    cached = CallCache(lm, None, "smollm2", exact_prefixes=True)
    with Walk() as walk:
        data, questions = sweep_labelled(DEMO_SWEEP, cached, label="retrieval-changed", family=DEMO_FAMILY)
        learn_labelled(data, tmp / "gate.json", label="retrieval-changed", model={"model": lm.model}, questions=questions)
    walk.show("a labelled sweep -> a learned gate")

    with FeedbackStore(tmp / "fb.db") as store:  # labels to refit on
        import_sweep(store, DEMO_SWEEP, lm, family=DEMO_FAMILY, limit=50)
    settings = ServiceSettings(
        method="targ-entropy", feedback_store=str(tmp / "fb.db"), refit_every=1, learned_gate=str(tmp / "refit.json")
    )
    app = create_app(settings, lm, open_index(demo_index()))
    demo = ROOT / "src/ragate/data/demo/questions.jsonl"
    asked = [json.loads(line)["question"] for line in demo.open()][:2]
    with TestClient(app) as http:
        ids = [http.post("/v1/answer", json={"question": q}).json()["id"] for q in asked]
        refit = app.state.runtime.refit
        refit.wait(300)
        before = refit.fits
        with Walk() as walk:
            for said in ({"id": ids[0], "correct": False}, {"id": ids[1], "reference": "Paris"}):
                reply = http.post("/v1/feedback", json=said)
                if reply.status_code != 200:
                    raise SystemExit(f"POST /v1/feedback: {reply.status_code} {reply.text}")
            deadline = time.monotonic() + 300
            while refit.fits == before and time.monotonic() < deadline:
                time.sleep(0.2)
            refit.wait(300)
        in_force = app.state.runtime.pipeline.learner.gate_file == str(tmp / "refit.json")
        print(f"refits {before} -> {refit.fits}; the refitted gate in force: {in_force}")
    walk.show("POST /v1/feedback -> the refitted gate in force")
    lm.close()


if __name__ == "__main__":
    main()
