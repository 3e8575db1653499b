"""Evaluation throughput (issue G): questions per hour of `ragate eval` before and after the call cache and workers.

    .venv/bin/python benchmarks/eval_throughput.py [--questions 20] [--model qwen2.5-coder-1.5b] \
        [--dataset nq-open-oracle] [--index ~/.cache/ragate/indexes/pooled-dense] [--out DIR] [--methods M1,M2]

Runs the 17 single-shot methods of docs/results.md (or ``--methods``: the routes ``wo-rag,single-rag,ircot``, whose
dynamic loops start each question's first prompt from a kept state since 2026-12-06) on the first ``--questions``
questions three times, one arm after the other, each a real ``ragate eval`` process with its own fresh call store:

- ``before``: ``--no-call-cache``, one process (the engine on every core): every call a method makes is computed;
- ``after-1``: the call cache, one process: each distinct call computed once and charged to every method making it,
  and a computed prompt started from an earlier prompt's state where that gives the same logits bit for bit;
- ``after-2``: the call cache and ``--workers 2``: the questions sharded over two processes, each pinned to its own
  core with a one-thread engine.

It prints each arm's wall time, questions per hour (a question = all the methods answering it), the CPU seconds
its LM calls took (a figure other load on this shared machine moves less than wall time), LM calls charged and
computed, and how many (question, method) predictions differ from ``before`` (prediction, retrieval decision,
documents read, gate score and token counts), naming each difference. With one worker that number must be 0:
every call is computed from a cleared engine cache, so the store returns exactly what computing it again would.

``--out`` keeps the three run directories and ``timings.json``; an arm whose run finished is not run again (its
measured time is kept), an arm cut off is started over from nothing, so the figures always come from whole runs.
This machine is shared: compare the arms of one invocation, not figures across invocations.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ragate.eval.records import latest, read_records
from ragate.fileio import atomic_writer

METHODS = (
    "no-retrieval,standard-rag,llm-judge,hyde,q2d,cot,dtr,dtr-no-ugt,dpr-ais,dpr-ais-dynamic,dpr-ais-rerank,"
    "pairs,pairs-exclude-num,targ-entropy,targ-margin,targ-variance,random"
)
ARMS = {
    "before": ["--no-call-cache"],
    "after-1": [],
    "after-2": ["--workers", "2"],
}


def run_arm(name: str, flags: list[str], args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """One whole `ragate eval` run into ``out/name``; returns its wall seconds and call counts."""
    run_dir, store = out / name, out / f"{name}.calls.sqlite"
    for stale in (run_dir, store, store.with_name(store.name + "-wal"), store.with_name(store.name + "-shm")):
        if stale.is_dir():
            shutil.rmtree(stale)
        else:
            stale.unlink(missing_ok=True)
    cmd = [
        str(Path(sys.executable).with_name("ragate")), "eval", "--dataset", args.dataset,
        "--model", args.model, "--index", str(args.index), "--limit", str(args.questions), "--out", str(run_dir),
        "--methods", args.methods,
        "--call-cache", str(store), *flags,
    ]  # fmt: skip
    print(f"[{name}] {' '.join(cmd)}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    wall = time.perf_counter() - start
    calls = json.loads((run_dir / "results.json").read_text())["calls"]
    return {"seconds": wall, "charged_calls": calls["charged"]["calls"], "paid_calls": calls["paid"]["calls"]}


def _calls(run_dir: Path) -> dict[str, Any]:
    """The run's LM call totals: "paid" CPU seconds (all threads and workers) are less moved by other load on a
    shared machine than wall time; "charged" CPU seconds estimate what every call would take alone."""
    return json.loads((run_dir / "results.json").read_text())["calls"]  # type: ignore[no-any-return]


COMPARED = ("prediction", "retrieved", "doc_ids", "gate_score", "prompt_tokens", "completion_tokens")


def answers(run_dir: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (question, method), the fields that must not depend on the arm: the answer, the retrieval decision, the
    documents read, the gate's score and the (charged) token counts."""
    return {
        (r["id"], r["method"]): {k: r.get(k) for k in COMPARED}
        for r in latest(read_records(run_dir / "questions.jsonl"))
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--questions", type=int, default=20)
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--dataset", default="nq-open-oracle")
    p.add_argument("--index", type=Path, default=Path("~/.cache/ragate/indexes/pooled-dense").expanduser())
    p.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temporary folder)")
    p.add_argument("--arms", default=",".join(ARMS), help=f"which arms, of {','.join(ARMS)}")
    p.add_argument("--methods", default=METHODS, help="the methods each arm runs (default: the 17 single-shot ones)")
    args = p.parse_args(argv)
    if not (args.index / "manifest.json").is_file():
        print(
            f"no index at {args.index}: build it with `ragate corpus build && ragate index build --corpus "
            "~/.cache/ragate/corpora/pooled/passages.jsonl --kind dense --out DIR` and pass --index DIR",
            file=sys.stderr,
        )
        return 2
    arms = [a for a in args.arms.split(",") if a]
    if unknown := [a for a in arms if a not in ARMS]:
        print(f"unknown arm(s) {unknown}: choose from {list(ARMS)}", file=sys.stderr)
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="ragate-throughput-"))
    out.mkdir(parents=True, exist_ok=True)
    timings_path = out / "timings.json"
    timings: dict[str, Any] = json.loads(timings_path.read_text()) if timings_path.exists() else {}
    setup = {
        "questions": args.questions,
        "model": args.model,
        "dataset": args.dataset,
        "index": str(args.index),
        **({"methods": args.methods} if args.methods != METHODS else {}),  # earlier timings.json files have none
    }
    if timings.get("setup") not in (None, setup):
        print(f"{out} holds runs of another setup {timings['setup']}: use another --out", file=sys.stderr)
        return 2
    timings["setup"] = setup
    for name in arms:
        if name in timings.get("arms", {}):
            print(f"[{name}] kept from an earlier invocation: {timings['arms'][name]}", file=sys.stderr)
            continue
        timings.setdefault("arms", {})[name] = run_arm(name, ARMS[name], args, out)
        with atomic_writer(timings_path) as f:
            f.write(json.dumps(timings, indent=2).encode())

    reference = answers(out / "before") if "before" in timings.get("arms", {}) else None
    named = "17 single-shot methods" if args.methods == METHODS else f"methods {args.methods}"
    print(f"\n{args.questions} {args.dataset} questions x {named}, {args.model} ({out})\n")
    print(
        "| arm | wall s | questions/hour | vs before | LM CPU s paid | vs before | LM CPU s charged | LM calls "
        "charged | computed | prompt tokens computed | of them from a kept state | predictions differing |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    calls = {name: _calls(out / name) for name in timings["arms"]}
    cpu = {name: float(c["paid"]["cpu_seconds"]) for name, c in calls.items()}
    base = timings["arms"].get("before", {}).get("seconds")
    diffs: dict[str, list[tuple[Any, ...]]] = {}
    for name, t in timings["arms"].items():
        qph = args.questions / (t["seconds"] / 3600)
        ratio = f"{base / t['seconds']:.2f}x" if base else "-"
        differing = "-"
        if reference is not None:
            mine = answers(out / name)
            diffs[name] = [(k, reference.get(k), mine.get(k)) for k in sorted(reference.keys() | mine.keys())
                           if reference.get(k) != mine.get(k)]  # fmt: skip
            differing = str(len(diffs[name]))
        cpu_ratio = f"{cpu['before'] / cpu[name]:.2f}x" if cpu.get("before") and cpu[name] else "-"
        paid = calls[name]["paid"]
        print(
            f"| {name} | {t['seconds']:.0f} | {qph:.1f} | {ratio} | {cpu[name]:.0f} | {cpu_ratio} | "
            f"{calls[name]['charged']['cpu_seconds']:.0f} | {t['charged_calls']:.0f} | {t['paid_calls']:.0f} | "
            f"{paid['prompt_tokens']:.0f} | {paid.get('reused_prompt_tokens', 0):.0f} | {differing} |"
        )
    for name, rows in diffs.items():
        for key, was, now in rows:
            fields = {k: ((was or {}).get(k), (now or {}).get(k)) for k in COMPARED}
            changed = {k: v for k, v in fields.items() if v[0] != v[1]}
            print(
                f"  {name} differs on {key}: "
                + ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changed.items())
            )
    return 1 if diffs.get("after-1") else 0


if __name__ == "__main__":
    sys.exit(main())
