"""Write each question's text into the records of sweeps made before ``ragate sweep`` recorded it, so that what reads
them (the learned gate's fit, the generated docs) needs no dataset file: a bare clone checks the docs too.

    .venv/bin/python scripts/record_questions.py docs/results/runs/sweep-*/

Each sweep's dataset is read as its ``config.json`` names it and must have the sha256 the sweep recorded (else the
sweep is left as it is and named); ``sweep.jsonl`` is rewritten atomically with ``"question"`` after each record's
``"id"`` and every other byte as it was. A sweep whose records hold their questions already is left alone.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ragate.errors import RagateError
from ragate.eval.config import EvalConfig
from ragate.eval.datasets import dataset_files
from ragate.eval.rundir import read_run_config
from ragate.fileio import atomic_writer


def add_questions(sweep_dir: Path) -> str:
    """What was done to ``sweep_dir``, in words."""
    path = sweep_dir / "sweep.jsonl"
    saved = read_run_config(sweep_dir)
    if saved.get("kind") != "sweep" or not path.is_file():
        return "not a sweep: left alone"
    lines = path.read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    if all(isinstance(r.get("question"), str) for r in records):
        return "its records hold their questions already"
    was = [f.get("sha256") for f in saved.get("dataset_files") or []]
    now = [f["sha256"] for f in dataset_files(saved["dataset"])]
    if not was or was != now:
        return f"the dataset's files have sha256 {now}, the sweep read {was}: left alone"
    config = EvalConfig(
        dataset=saved["dataset"], methods=tuple(saved["methods"]), limit=saved.get("limit"),
        offset=saved.get("offset", 0),
    )  # fmt: skip
    texts = {ex.id: ex.question for ex in config.examples()}
    if missing := sorted({r["id"] for r in records} - set(texts)):
        return f"{len(missing)} record ids are not in {saved['dataset']!r} (e.g. {missing[0]!r}): left alone"
    with atomic_writer(path) as f:
        for r in records:
            out = {"id": r["id"], "question": texts[r["id"]], **{k: v for k, v in r.items() if k != "id"}}
            f.write((json.dumps(out, ensure_ascii=False) + "\n").encode("utf-8"))
    return f"{len(records)} records given their questions"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweeps", nargs="+", type=Path, help="sweep directories")
    args = ap.parse_args(argv)
    failed = 0
    for sweep_dir in args.sweeps:
        try:
            print(f"{sweep_dir}: {add_questions(sweep_dir)}")
        except (RagateError, OSError, ValueError) as err:
            failed += 1
            print(f"{sweep_dir}: {err}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
