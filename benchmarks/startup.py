"""What `ragate ask --method M` spends before its first LM call, and on the whole command.

    taskset -c 0 .venv/bin/python benchmarks/startup.py [--rounds 3] [--methods targ-margin,dtr]

Each round runs in fresh processes (imports are what is measured, so nothing may be warm in this one):

- ``phases``: a child process times the steps `ragate ask` takes in order: importing the CLI and building its
  parser, constructing the :class:`ragate.Pipeline` (the model loaded), then the answer: what came before its first
  LM call (opening the demo index, where the method retrieves) and the whole answer;
- ``ask``: the wall time of the whole `ragate ask QUESTION --method M --quiet` command.

Three cases: DTR on "Who wrote Hamlet?" (the issue's command), and TARG's margin gate at the demo's calibrated
threshold on `make demo`'s two questions, one it answers without retrieval and one it retrieves for. Two arms, run
back to back in every round so that both meet the same load: ``after`` is ragate as it is (an index's encoder
loads when a text is first embedded, issue 51) and ``before`` loads it when the index opens, as ragate did before
(the child replaces ``ragate.retrieval.index._load_index_encoder`` with a version that loads at once).

Prints the median of the rounds. The demo index must exist already (`make demo` or any `ragate ask --method`
builds it on first use): building it is not start-up.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

CALIBRATION = "src/ragate/data/demo/targ-margin-smollm2-135m-budget-0.5.json"
CASES = (
    ("dtr", "Who wrote Hamlet?", None),
    ("targ-margin", "what is the main mineral in lithium batteries", CALIBRATION),  # make demo: skipped
    ("targ-margin", "where do the greasers live in the outsiders", CALIBRATION),  # make demo: retrieved
)

EAGER = r"""
import ragate.retrieval.index as _index
_deferred = _index._load_index_encoder
def _eager(index_dir, manifest):
    encoder = _deferred(index_dir, manifest)
    once = getattr(encoder, "_once", None)
    if once is not None:
        once.get()  # the model loads as the index opens, as before issue 51
    return encoder
_index._load_index_encoder = _eager
"""

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
if sys.argv[4] == "before":
    exec(sys.argv[5])
from ragate.cli.main import build_parser
build_parser()
t1 = time.perf_counter()
from ragate.pipeline import Pipeline
rag = Pipeline(sys.argv[1], calibration=sys.argv[3] or None)
t3 = t2 = time.perf_counter()
first = []
def progress(stage):
    if not first:
        first.append(time.perf_counter())
answer = rag.answer(sys.argv[2], progress=progress)
t4 = time.perf_counter()
mods = sorted({m.split(".")[0] for m in sys.modules})
print(json.dumps({
    "imports": t1 - t0, "pipeline": t2 - t1, "to_first_call": first[0] - t3 if first else None,
    "answer": t4 - t3, "retrieved": answer.retrieved,
    "heavy": [m for m in ("torch", "transformers", "sentence_transformers", "sklearn", "scipy") if m in mods],
}))
"""


ASK = r"""
import sys
if sys.argv[1] == "before":
    exec(sys.argv[2])
from ragate.cli.main import main
sys.exit(main(sys.argv[3:]))
"""


def phases(method: str, question: str, calibration: str | None, arm: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, method, question, calibration or "", arm, EAGER],
        capture_output=True, text=True, check=True, timeout=1800,
    )  # fmt: skip
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def ask(method: str, question: str, calibration: str | None, arm: str) -> float:
    extra = ["--calibration", calibration] if calibration else []
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", ASK, arm, EAGER, "ask", question, "--method", method, "--quiet", *extra],
        capture_output=True, text=True, check=True, timeout=1800,
    )  # fmt: skip
    return time.perf_counter() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    arms = ("before", "after")
    rows: dict[tuple[int, str], list[dict[str, object]]] = {}
    walls: dict[tuple[int, str], list[float]] = {}
    for r in range(args.rounds):
        for i, case in enumerate(CASES):
            for arm in arms if r % 2 == 0 else arms[::-1]:
                rows.setdefault((i, arm), []).append(phases(*case, arm))
                walls.setdefault((i, arm), []).append(ask(*case, arm))
    print(f"`ragate ask QUESTION --method M`, median of {args.rounds} rounds, seconds")
    print("| method | question | arm | imports + parser | Pipeline() (model) | answer: to first LM call | answer | "
          "whole `ragate ask` | retrieved | heavy modules imported |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for i, (method, question, _) in enumerate(CASES):
        for arm in arms:
            got = rows[(i, arm)]

            def med(key: str, got: list[dict[str, object]] = got) -> float:
                return statistics.median(float(r[key] or 0.0) for r in got)  # type: ignore[arg-type]

            heavy = ", ".join(got[-1]["heavy"]) or "none"  # type: ignore[arg-type]
            print(
                f"| {method} | {question} | {arm} | {med('imports'):.2f} | {med('pipeline'):.2f} | "
                f"{med('to_first_call'):.2f} | {med('answer'):.2f} | {statistics.median(walls[(i, arm)]):.2f} | "
                f"{got[-1]['retrieved']} | {heavy} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
