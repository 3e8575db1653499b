"""The learning loop as a user meets it, on the private-documents benchmark (benchmarks/private_docs/: 43 questions
over 25 files nobody here wrote): ``ragate serve`` answers every question, feedback with a reference goes to 30 of
them, ``ragate gate learn`` fits a gate on the store's labels and says whether it beats the gate in force, and the
gate is judged on the other 13.

    taskset -c 1 .venv/bin/python benchmarks/learn_private_docs.py --out DIR [--model qwen2.5-coder-1.5b]
    .venv/bin/python benchmarks/learn_private_docs.py --report DIR      # the tables, from DIR's records only

1. **Serve** (resumable: ``DIR/answers.jsonl`` gets a line per question as it is answered): ``ragate serve`` on
   127.0.0.1 with the documents' hybrid index, ``--method targ-entropy --no-early-exit`` (every draft whole, so its
   score is TARG's Eq. 1 exactly), ``--feedback-store DIR/fb.db --shadow 1.0``. The questions go one at a time in a
   seeded order; for the first 30 of that order the client posts ``/v1/feedback`` with a reference answer (the
   shortest plain form of the question's gold pattern, as a user would type it). Then it waits for the shadow
   work to finish, so every answer has its other route.
2. **Learn**: ``ragate gate learn --store DIR/fb.db --out DIR/gate.json`` as a user runs it (its output is kept in
   ``DIR/learn.txt``): the fit on the 30 questions' labels and its comparison with the gate in force.
3. **Judge** (``DIR/judged.jsonl``, one line per question): each question's label (its closed-book answer, the
   store's, judged by the gold pattern: closed-book wrong means retrieval was needed), whether it was one of the
   30, the learned gate's probability (for the 13: the gate fitted on the 30; for all 43: cross-fitted, each
   question scored by a fit that did not see it), and every fixed gate's score: targ-entropy as served, targ-margin
   of the same draft, and the committed private-docs sweep's gates (dtr, retrieval-top1, corpus-coverage,
   corpus-or-margin).

``--report`` prints, from ``judged.jsonl`` and ``gate.json`` alone: the best fixed gate (chosen by AUROC on the 30,
never on the 13), the learned gate's AUROC beside it on the 13 and cross-fitted over the 43 with paired bootstrap
intervals, and the label-efficiency curve: AUROC on the 13 of gates fitted, as ``gate learn`` fits (its PCA size
and L2 strength), on the first 10, 20 and 30 of the 30 labelled questions with the labels their feedback gave
(fewer than 3 of a class is "too few"; ``gate learn`` itself asks for 10 of each). The 13 are judged by the gold
patterns, the 30 were labelled by the user's references (whole words), which can differ.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from ragate.eval.metrics import DEFAULT_BOOT, Resampling

ROOT = Path(__file__).resolve().parent / "private_docs"
QUESTIONS = ROOT / "questions.jsonl"
SWEEP = Path(__file__).resolve().parents[1] / "docs" / "results" / "runs" / "sweep-private-docs-qwen2.5-coder-1.5b-43"
FEEDBACK = 30
SWEEP_GATES = ("dtr", "retrieval-top1", "corpus-coverage", "corpus-or-margin")
CURVE = (10, 20, 30)
CURVE_MIN_CLASS = 3


def reference(patterns: Sequence[str]) -> str:
    """The shortest plain form of a gold pattern (``(?<!\\w)8\\s*MB(?!\\w)`` -> ``8 MB``): what a user types."""
    plain = [
        re.sub(r"\\(.)", r"\1", p.replace(r"(?<!\w)", "").replace(r"(?!\w)", "").replace(r"\s*", " "))
        for p in patterns
    ]
    return min(plain, key=len)


def order(questions: Sequence[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    out = list(questions)
    random.Random(seed).shuffle(out)
    return out


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_and_feed(out: Path, model: str, seed: int) -> None:
    from private_docs import build_index  # benchmarks/private_docs.py

    questions = order([json.loads(line) for line in QUESTIONS.read_text().splitlines() if line.strip()], seed)
    done_path = out / "answers.jsonl"
    done = {json.loads(line)["qid"] for line in done_path.read_text().splitlines()} if done_path.is_file() else set()
    home = Path(os.environ.get("RAGATE_HOME", Path.home() / ".ragate"))
    index = build_index(home / "indexes" / "private-docs")
    port = _port()
    cmd = [
        sys.executable, "-m", "ragate.cli.main", "serve", "--port", str(port), "--model", model, "--index",
        str(index), "--method", "targ-entropy", "--no-early-exit", "--feedback-store", str(out / "fb.db"),
        "--shadow", "1.0", "--log-level", "warning", "--timeout", "1800",
    ]  # fmt: skip
    log = (out / "serve.log").open("ab")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "RAGATE_API_KEY": ""})
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=1800) as http:
            for _ in range(2400):
                try:
                    http.get("/healthz", timeout=3)
                    break
                except httpx.TransportError:
                    if proc.poll() is not None:
                        raise SystemExit((out / "serve.log").read_text()[-3000:]) from None
                    time.sleep(0.5)
            for i, q in enumerate(questions):
                if q["id"] in done:
                    continue
                t = time.perf_counter()
                r = http.post("/v1/answer", json={"question": q["question"]})
                r.raise_for_status()
                body = r.json()
                row: dict[str, Any] = {
                    "qid": q["id"], "position": i, "answer_id": body["id"], "retrieved": body["retrieved"],
                    "answer": body["answer"], "score": body["gate"]["score"], "seconds": time.perf_counter() - t,
                }  # fmt: skip
                if i < FEEDBACK:
                    ref = reference(q["answers"])
                    f = http.post("/v1/feedback", json={"id": body["id"], "reference": ref})
                    f.raise_for_status()
                    row["feedback"] = {"reference": ref, **{k: f.json()[k] for k in ("labels", "pending")}}
                with done_path.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
                print(f"{i + 1}/{len(questions)} {q['id']} retrieved={row['retrieved']} {row['seconds']:.0f}s",
                      flush=True)  # fmt: skip
            for _ in range(7200):  # the shadow work of the last answers
                shadow = http.get("/healthz").json()["learning"]["shadow"]
                if shadow["queued"] == 0 and shadow["done"] + shadow["failed"] >= shadow["sampled"]:
                    break
                time.sleep(1)
            (out / "healthz.json").write_text(json.dumps(http.get("/healthz").json(), indent=1))
    finally:
        proc.terminate()
        proc.wait(60)


def learn(out: Path) -> None:
    ragate = Path(sys.executable).parent / "ragate"
    cmd = [str(ragate), "gate", "learn", "--store", str(out / "fb.db"), "--out", str(out / "gate.json")]
    run = subprocess.run(cmd, capture_output=True, text=True, check=False)
    (out / "learn.txt").write_text("$ ragate gate learn --store fb.db --out gate.json\n" + run.stdout + run.stderr)
    print(run.stdout + run.stderr)


def judge(out: Path, seed: int) -> None:
    from ragate.eval.metrics import regex_match
    from ragate.gates.learned import load_learned
    from ragate.learning.fit import _labelled
    from ragate.learning.scores import fit_probe
    from ragate.learning.store import FeedbackStore

    questions = {q["id"]: q for q in (json.loads(x) for x in QUESTIONS.read_text().splitlines() if x.strip())}
    answers = [json.loads(line) for line in (out / "answers.jsonl").read_text().splitlines()]
    sweep = {str(r["id"]): r for r in (json.loads(x) for x in (SWEEP / "sweep.jsonl").read_text().splitlines())}
    gate = load_learned(out / "gate.json")
    rows, features, hidden, labels = [], [], [], []
    store_labels: list[bool | None] = []  # the closed-wrong label the user's reference gave (the 30 only)
    with FeedbackStore(out / "fb.db") as store:
        for a in sorted(answers, key=lambda r: r["position"]):
            stored = store.get(a["answer_id"])
            if stored is None or stored.closed_answer is None:
                raise SystemExit(f"{a['qid']}: no closed-book answer in the store (did the shadow work finish?)")
            wrong = regex_match(stored.closed_answer, questions[a["qid"]]["answers"]) == 0.0
            said = [x for x in a.get("feedback", {}).get("labels", []) if x["kind"] == "closed-wrong"]
            store_labels.append(bool(said[0]["retrieve"]) if said else None)
            rows.append(a)
            features.append(stored.features)
            hidden.append(stored.hidden)
            labels.append(wrong)
    y = np.array(labels)
    data = _labelled([r["qid"] for r in rows], features, hidden, y, use_hidden=True, draft=False)
    cheap = gate.cheap
    p_fit = cheap.probabilities(data.select(list(cheap.features)).scalars, data.hidden)
    _, p_oof = fit_probe(data, seed=seed)
    with (out / "judged.jsonl").open("w") as fh:
        for i, r in enumerate(rows):
            s = sweep.get(r["qid"], {}).get("gates", {})
            line = {
                "qid": r["qid"], "category": questions[r["qid"]]["category"], "trained": r["position"] < FEEDBACK,
                "closed_wrong": bool(y[i]), "feedback_label": store_labels[i], "learned": round(float(p_fit[i]), 6),
                "learned_cross_fitted": round(float(p_oof[i]), 6),
                "fixed": {"targ-entropy": r["score"], "targ-margin": features[i].get("targ-margin"),
                          **{g: s[g]["score"] for g in SWEEP_GATES if g in s}},
                "hidden": None if hidden[i] is None else [round(float(v), 5) for v in hidden[i]],
                "features": {k: round(float(v), 6) for k, v in sorted(features[i].items())},
            }  # fmt: skip
            fh.write(json.dumps(line) + "\n")


def report(out: Path, seed: int = 0, boot: Resampling | None = None) -> str:
    """The tables, from ``DIR/judged.jsonl`` alone (the docs' generated block): ``seed`` the run's (its fits),
    ``boot`` the intervals' (default: eval's resamples with ``seed``)."""
    from ragate.learning.scores import Labelled, _raw_probe
    from ragate.uncertainty import auroc, auroc_interval, paired_auroc_gap

    boot = Resampling(DEFAULT_BOOT.samples, seed) if boot is None else boot

    judged = [json.loads(x) for x in (out / "judged.jsonl").read_text().splitlines()]
    y = np.array([j["closed_wrong"] for j in judged])
    train = np.array([j["trained"] for j in judged])
    fixed = sorted({g for j in judged for g in j["fixed"] if j["fixed"][g] is not None})
    fixed = [g for g in fixed if all(j["fixed"].get(g) is not None for j in judged)]

    def scores(g: str) -> np.ndarray:
        return np.array([float(j["fixed"][g]) for j in judged])

    on_train = {g: auroc(list(scores(g)[train]), list(y[train])) or 0.0 for g in fixed}
    best = max(fixed, key=lambda g: (on_train[g], g))
    test = ~train
    learned = np.array([j["learned"] for j in judged])
    oof = np.array([j["learned_cross_fitted"] for j in judged])
    lines = [
        (f"{len(judged)} questions ({int(train.sum())} with feedback, {int(test.sum())} held out); closed-book wrong: "
        f"{int(y.sum())} of {len(y)} ({int(y[train].sum())} of the {int(train.sum())}, {int(y[test].sum())} of the "
        f"{int(test.sum())})"),
        "",
        "| gate | AUROC on the 30 (chooses) | AUROC on the 13 held out | cross-fitted over the 43 |",
        "|---|---|---|---|",
    ]

    def cell(p: np.ndarray, mask: np.ndarray) -> str:
        point, lo, hi = auroc_interval(p[mask], y[mask], seed=boot.seed, resamples=boot.samples)
        return f"{point:.3f} [{lo:.3f}, {hi:.3f}]"

    everyone = np.ones(len(y), dtype=bool)
    for g in fixed:
        mark = " (best fixed)" if g == best else ""
        lines.append(f"| {g}{mark} | {on_train[g]:.3f} | {cell(scores(g), test)} | {cell(scores(g), everyone)} |")
    lines.append(f"| learned (ragate gate learn on the 30) | - | {cell(learned, test)} | {cell(oof, everyone)} |")
    gap13 = paired_auroc_gap(learned[test], scores(best)[test], y[test], seed=boot.seed, resamples=boot.samples)
    gap43 = paired_auroc_gap(oof, scores(best), y, seed=boot.seed, resamples=boot.samples)

    def verdict(g: tuple[float, float, float]) -> str:
        word = "higher" if g[1] > 0 else ("lower" if g[2] < 0 else "not established")
        return f"{g[0]:+.3f} [{g[1]:+.3f}, {g[2]:+.3f}] ({word})"

    lines += [
        "",
        f"learned minus {best}, paired: on the 13 {verdict(gap13)}; cross-fitted over the 43 {verdict(gap43)}",
        "",
        "| labels the gate was fitted on | " + " | ".join(str(n) for n in CURVE) + " |",
        "|---|" + "---|" * len(CURVE),
    ]
    hidden = np.array([j["hidden"] for j in judged], dtype=np.float64)
    names = sorted(judged[0]["features"])
    names = [n for n in names if all(n in j["features"] for j in judged) and n not in ("targ-entropy", "targ-margin")]
    names = [n for n in names if not n.startswith("gate:")]
    scalars = np.array([[j["features"][n] for n in names] for j in judged], dtype=np.float64)
    data = Labelled(tuple(j["qid"] for j in judged), tuple(names), scalars, hidden, y)
    params = json.loads((out / "gate.json").read_text())["report"]["params"]
    components, c = int(params["components"]), float(params["C"])  # as `ragate gate learn` chose them
    taught = np.array([bool(j["feedback_label"]) if j["trained"] else bool(j["closed_wrong"]) for j in judged])
    trained_rows = Labelled(data.ids, data.names, data.scalars, data.hidden, taught).take(np.flatnonzero(train))
    held = data.take(np.flatnonzero(test))
    cells = []
    for n in CURVE:
        part = trained_rows.take(np.arange(min(n, len(trained_rows))))
        if min(int(part.y.sum()), int((~part.y).sum())) < CURVE_MIN_CLASS:
            cells.append("too few")
            continue
        probe = _raw_probe(part, components, c, seed)  # the learned gate's fit without its 10-per-class floor
        p = probe.logits(held.scalars, held.hidden)
        cells.append(f"{auroc(list(map(float, p)), list(map(bool, held.y))):.3f}")
    lines.append("| AUROC on the 13 held out | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="the run directory (resumable)")
    ap.add_argument("--report", type=Path, help="only print the tables of this run directory's records")
    ap.add_argument("--judge", type=Path, help="only judge a finished run directory again (its store and gate), then report")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--seed", type=int, default=0, help="the run's seed: the order questions are fed in, the fits")
    ap.add_argument("--interval-seed", type=int, default=None, help="the bootstrap intervals' seed (default: --seed)")
    ap.add_argument("--resamples", type=int, default=DEFAULT_BOOT.samples, help="the bootstrap intervals' resamples")
    args = ap.parse_args(argv)
    boot = Resampling(args.resamples, args.seed if args.interval_seed is None else args.interval_seed)
    if args.report is not None:
        print(report(args.report, args.seed, boot), end="")
        return 0
    if args.judge is not None:
        judge(args.judge, args.seed)
        print(report(args.judge, args.seed, boot), end="")
        return 0
    if args.out is None:
        ap.error("give --out DIR (or --report DIR)")
    args.out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    serve_and_feed(args.out, args.model, args.seed)
    learn(args.out)
    judge(args.out, args.seed)
    print(report(args.out, args.seed, boot), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
