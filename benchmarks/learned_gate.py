"""The learned gate against TARG's entropy gate and DTR's UGT on the same held-out questions.

    .venv/bin/python benchmarks/learned_gate.py [--out FILE.md] [--blocks] [--write-gates DIR] [--seed N] [--resamples N]

For each dataset it fits :mod:`ragate.learning.scores`'s probe on the training sweep's questions only (labels from
their records; hidden states from ``benchmarks/hidden_states.py``) and scores the test sweep's 300 questions,
which it never saw. Two label sources: **gold** (the closed-book answer is wrong: acc = 0, as the cost-quality
table's AUROC) and **silver** (retrieval changed the answer: the closed-book and the retrieval answers' token F1 is
below 0.5, what a shadow answer gives without a reference). Every AUROC on the test questions is against the gold
label. Features: the question-side signals (length, question word, digit, date) and the hidden state (PCA
components); "question only" drops the hidden state, "hidden only" the signals. Paired bootstrap 95% intervals over
the same test questions (``--seed``, default 0; ``--resamples``, default 1000); "not established" where an interval reaches 0, else "higher" or
"lower". Accuracy at a budget: retrieve for the top share of scores, against a random choice at the same rate (its
expectation). The cascade's band is set on the training questions' cross-fitted probabilities.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hidden_states import read_hidden

from ragate.errors import RagateError
from ragate.eval.metrics import Resampling, paired_bootstrap_diff
from ragate.gates.learned import DRAFT_FEATURES, LearnedGateFile, save_learned
from ragate.gates.signals import QUESTION_FEATURES
from ragate.learning.fit import question_digests
from ragate.learning.scores import (
    Labelled,
    cascade_probabilities,
    choose_band,
    cross_fitted_logits,
    fit_probe,
    label_curve,
)
from ragate.learning.scores import tune as _tune
from ragate.learning.sweeps import sweep_questions
from ragate.text import f1
from ragate.uncertainty import auroc_interval, paired_auroc_gap

RUNS = Path("docs/results/runs")
MODEL = "qwen2.5-coder-1.5b"
NQ_TRAIN_FAMILY = (
    "targ|question|k=5|n=5|cos|hyde=1|rep=5|ce=None|max=64"  # the TARG reader's older name, same prompt
)
DATASETS: dict[str, tuple[tuple[tuple[str, str | None], ...], str]] = {
    "nq-open-oracle": (
        (("sweep-nq-open-oracle-qwen2.5-coder-1.5b-train-300-300", NQ_TRAIN_FAMILY),),
        "sweep-gates-nq-open-oracle-qwen2.5-coder-1.5b-300",
    ),
    "hotpotqa": (
        (
            (
                "sweep-hotpotqa-qwen2.5-coder-1.5b-train-300-50",
                None,
            ),  # dev 300-349: all the dev file holds past 300
            (
                "sweep-hotpotqa-train-raw-qwen2.5-coder-1.5b-100",
                None,
            ),  # 100 HotpotQA train questions (HippoRAG's)
        ),
        "sweep-gates-hotpotqa-qwen2.5-coder-1.5b-300",
    ),
}
NAMES = tuple(n for n in QUESTION_FEATURES if n != "rarity")  # rarity needs the index's document frequencies
BUDGETS = (0.3, 0.5)
SILVER_F1 = 0.5
_TUNED: dict[str, tuple[int, float, float]] = {}


def tune(data: Labelled) -> tuple[int, float, float]:
    """:func:`ragate.learning.scores.tune` of ``data``, computed once per process for the same features and labels
    (the tables tune the gold hidden + question probe three times: its row, the cascade and the label curve)."""
    key = hashlib.sha256()
    for part in (json.dumps([data.ids, data.names]).encode(), data.scalars.tobytes(), data.y.tobytes()):
        key.update(part)
    key.update(b"-" if data.hidden is None else data.hidden.tobytes())
    digest = key.hexdigest()
    if digest not in _TUNED:
        _TUNED[digest] = _tune(data)
    return _TUNED[digest]


def _records(sweep: str, family: str | None) -> tuple[list[dict], dict[str, str]]:
    found = sweep_questions(RUNS / sweep, family=family, metric="acc", method="targ-entropy", what="labels")
    return found.records, found.questions


def labelled(sweep: str, family: str | None, label: str) -> tuple[Labelled, list[dict]]:
    records, questions = _records(sweep, family)
    ids, hidden, _ = read_hidden(RUNS / sweep / f"hidden-{MODEL}.npz")
    row = {rid: i for i, rid in enumerate(ids)}
    missing = [r["id"] for r in records if r["id"] not in row]
    if missing:
        raise SystemExit(
            f"{sweep}: {len(missing)} questions have no hidden state: run benchmarks/hidden_states.py"
        )
    scalars = np.array([question_signals_vector(questions[r["id"]]) for r in records])
    if label == "gold":
        y = np.array([float(r["closed"]["scores"]["acc"]) == 0.0 for r in records])
    else:
        y = np.array([f1(r["closed"]["prediction"], [r["open"]["prediction"]]) < SILVER_F1 for r in records])
    h = np.vstack([hidden[row[r["id"]]] for r in records])
    return Labelled(tuple(r["id"] for r in records), NAMES, scalars, h, y), records


def labelled_train(train: tuple[tuple[str, str | None], ...], label: str) -> Labelled:
    """The training sweeps' questions, one after another."""
    parts = [labelled(sweep, family, label)[0] for sweep, family in train if (RUNS / sweep).is_dir()]
    hidden = [p.hidden for p in parts]
    return Labelled(
        tuple(i for p in parts for i in p.ids),
        parts[0].names,
        np.vstack([p.scalars for p in parts]),
        np.vstack(hidden) if all(h is not None for h in hidden) else None,
        np.concatenate([p.y for p in parts]),
    )


def train_drafts(train: tuple[tuple[str, str | None], ...], ids: tuple[str, ...]) -> np.ndarray:
    rows: dict[str, np.ndarray] = {}
    for sweep, _ in train:
        if (RUNS / sweep).is_dir():
            found, matrix, _ = read_hidden(RUNS / sweep / f"drafts-{MODEL}.npz")
            rows |= dict(zip(found, matrix, strict=True))
    return np.vstack([rows[i] for i in ids])


def question_signals_vector(question: str) -> list[float]:
    from ragate.gates.signals import signals

    return list(signals(question, NAMES, None, None).vector(NAMES))


@functools.cache  # one read of a sweep's records per gate (callers do not change the dict)
def gate_scores(sweep: str, gate: str) -> dict[str, float]:
    out = {}
    for line in (RUNS / sweep / "sweep.jsonl").read_text().splitlines():
        r = json.loads(line)
        if gate in r.get("gates", {}):
            out[r["id"]] = float(r["gates"][gate]["score"])
    return out


def _iv(boot: Resampling, p: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    return auroc_interval(p, y, seed=boot.seed, resamples=boot.samples)


def _gap(boot: Resampling, a: np.ndarray, b: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    return paired_auroc_gap(a, b, y, seed=boot.seed, resamples=boot.samples)


def _ci(v: tuple[float, float, float], digits: int = 3) -> str:
    word = " (higher)" if v[1] > 0 else (" (lower)" if v[2] < 0 else " (not established)")
    return f"{v[0]:+.{digits}f} [{v[1]:+.{digits}f}, {v[2]:+.{digits}f}]{word}"


def accuracy_at(scores: np.ndarray, closed: np.ndarray, opened: np.ndarray, rho: float) -> np.ndarray:
    """Per-question accuracy when the top ``rho`` share of scores retrieve (ties broken by order)."""
    n = len(scores)
    top = np.argsort(-scores, kind="stable")[: round(rho * n)]
    retrieve = np.zeros(n, dtype=bool)
    retrieve[top] = True
    return np.where(retrieve, opened, closed)


SUMMARY: list[str] = []


def run(out: Path | None, boot: Resampling) -> str:
    """Each dataset's tables (the two computed side by side, one process each: every fit is single-threaded, so
    the digits do not depend on the machine), then the private documents'."""
    SUMMARY.clear()
    lines: list[str] = []
    with ProcessPoolExecutor(max_workers=max(1, min(len(DATASETS), os.cpu_count() or 1))) as pool:
        for part, summary_rows, gates in pool.map(functools.partial(dataset_tables, boot=boot), DATASETS):
            lines += part
            SUMMARY.extend(summary_rows)
            GATES.update(gates)
    lines += private_docs_rows(boot)
    text = "\n".join(lines) + "\n"
    if out is not None:
        out.write_text(text)
    return text


def dataset_tables(dataset: str, boot: Resampling) -> tuple[list[str], list[str], dict[str, LearnedGateFile]]:
    """One dataset's lines, its rows of the summary and its cascade gate file (see :func:`cascade_rows`)."""
    SUMMARY.clear()
    GATES.clear()
    lines: list[str] = []
    train, test_sweep = DATASETS[dataset]
    train_name = " + ".join(sweep for sweep, _ in train if (RUNS / sweep).is_dir())
    test, test_records = labelled(test_sweep, None, "gold")
    closed = np.array([float(r["closed"]["scores"]["acc"]) for r in test_records])
    opened = np.array([float(r["open"]["scores"]["acc"]) for r in test_records])
    targ = gate_scores(test_sweep, "targ-entropy")
    dtr = gate_scores(test_sweep, "dtr")
    p_targ = np.array([targ[i] for i in test.ids])
    p_dtr = np.array([dtr[i] for i in test.ids])
    lines += [f"### {dataset}: trained on {train_name}, scored on {test_sweep} (n = {len(test)})", ""]
    lines += [
        (
            f"targ-entropy AUROC {_plain(_iv(boot, p_targ, test.y))}; dtr AUROC "
            f"{_plain(_iv(boot, p_dtr, test.y))}; closed-book wrong on {int(test.y.sum())} of {len(test)}."
        ),
        "",
        "| labels | features | n train (retrieve) | PCA, C (tuned on train) | AUROC (gold, test) | minus targ-entropy's | minus dtr's | "
        + " | ".join(f"ACC at {b:g}: Δ vs random" for b in BUDGETS)
        + " |",
        "|---|---|---|---|---|---|---|" + "---|" * len(BUDGETS),
    ]
    probs = {}
    for label in ("gold", "silver"):
        rows = labelled_train(train, label)
        for feats, name in (
            (True, "hidden + question"),
            (False, "question only"),
            ("hidden", "hidden only"),
        ):
            if feats == "hidden":
                tr, te = rows.select([], hidden=True), test.select([], hidden=True)
            else:
                tr, te = rows.select(NAMES, hidden=bool(feats)), test.select(NAMES, hidden=bool(feats))
            try:
                k, c, _ = tune(tr)
                probe, _ = fit_probe(tr, components=k or 1, c=c)
            except RagateError as err:  # too few labels of a class
                lines.append(
                    f"| {label} | {name} | {len(tr)} ({int(tr.y.sum())}) | | {err} | | |"
                    + " |" * len(BUDGETS)
                )
                continue
            p = probe.probabilities(te.scalars, te.hidden)
            probs[(label, name)] = p
            if name == "hidden + question":
                gap = _gap(boot, p, p_targ, te.y)
                SUMMARY.append(
                    f"| {dataset} | {label} ({len(tr)} training questions) | {_plain(_iv(boot, p_targ, te.y))} | "
                    f"{_plain(_iv(boot, p, te.y))} | {_ci(gap)} |"
                )
            cells = []
            for b in BUDGETS:
                acc = accuracy_at(p, closed, opened, b)
                rand = b * opened + (1 - b) * closed
                lo, hi = paired_bootstrap_diff(acc, rand, samples=boot.samples, seed=boot.seed)
                d = float(np.mean(acc - rand))
                cells.append(f"{100 * acc.mean():.1f}: {_ci((100 * d, 100 * lo, 100 * hi), 1)}")
            lines.append(
                f"| {label} | {name} | {len(tr)} ({int(tr.y.sum())}) | {k or '–'}, {c:g} | {_plain(_iv(boot, p, te.y))} | "
                f"{_ci(_gap(boot, p, p_targ, te.y))} | {_ci(_gap(boot, p, p_dtr, te.y))} | "
                + " | ".join(cells)
                + " |"
            )
    if ("gold", "hidden + question") in probs and ("gold", "question only") in probs:
        gap = _gap(boot, probs[("gold", "hidden + question")], probs[("gold", "question only")], test.y)
        lines += ["", f"Hidden state's worth (gold labels; with minus without, paired): {_ci(gap)}."]
    lines += cascade_rows(train, test_sweep, test, boot)
    curves = {}
    for label in ("gold", "silver"):
        rows = labelled_train(train, label)
        k, c, _ = tune(rows)
        curves[label] = label_curve(rows, test, (50, 100, 200, 400), components=k, c=c)
    curve_g, curve_s = curves["gold"], curves["silver"]
    lines += [
        "",
        (
            "Labels against AUROC on the test questions (hidden + question; the first n of a seeded shuffle of "
            "the training questions; – : more labels than the training split holds, or fewer than 10 of a class):"
        ),
        "",
        "| labels | " + " | ".join(str(n) for n, _ in curve_g) + " |",
        "|---|" + "---|" * len(curve_g),
        "| gold | " + " | ".join("–" if v is None else f"{v:.3f}" for _, v in curve_g) + " |",
        "| silver | " + " | ".join("–" if v is None else f"{v:.3f}" for _, v in curve_s) + " |",
        "",
    ]
    return lines, list(SUMMARY), dict(GATES)


PRIVATE = "sweep-private-docs-qwen2.5-coder-1.5b-43"


def private_docs_rows(boot: Resampling) -> list[str]:
    """The private-documents benchmark (libffi's manual, the AWS CLI's guides): too few questions to hold a test
    split apart, so every learned score is cross-fitted (5 stratified folds, seed 0; default PCA size and C)."""
    data, _ = labelled(PRIVATE, None, "gold")
    out = [
        f"### private documents ({PRIVATE}, n = {len(data)}; cross-fitted)",
        "",
        f"Closed-book wrong on {int(data.y.sum())} of {len(data)}.",
        "",
        "| gate | AUROC (gold) | learned (hidden + question) minus it (paired) |",
        "|---|---|---|",
    ]
    learned = cross_fitted_logits(data)
    others = {
        "learned (hidden + question)": learned,
        "learned (question only)": cross_fitted_logits(data.select(NAMES, hidden=False)),
    }
    for gate in ("targ-margin", "dtr", "corpus-coverage"):
        scores = gate_scores(PRIVATE, gate)
        others[gate] = np.array([scores[i] for i in data.ids])
    for name, p in others.items():
        gap = "–" if name.startswith("learned (hidden") else _ci(_gap(boot, learned, p, data.y))
        out.append(f"| {name} | {_plain(_iv(boot, p, data.y))} | {gap} |")
    return [*out, ""]


CASCADE_SHARES = (0.2, 0.3, 0.5)


def with_drafts(data: Labelled, scores: dict[str, np.ndarray]) -> Labelled:
    cols = np.column_stack([scores[n] for n in DRAFT_FEATURES])
    return Labelled(
        data.ids, (*data.names, *DRAFT_FEATURES), np.hstack([data.scalars, cols]), data.hidden, data.y
    )


GATES: dict[str, LearnedGateFile] = {}  # the cascade of each dataset at WRITE_SHARE, for --write-gates
WRITE_SHARE = 0.3


def cascade_rows(
    sweeps: tuple[tuple[str, str | None], ...], test_sweep: str, test: Labelled, boot: Resampling
) -> list[str]:
    """The cascade on the test questions: the cheap probe (hidden state and question) decides where it is sure;
    inside the band, chosen on the training questions' cross-fitted probabilities to draft a share of them, the
    full probe (and TARG's draft scores) decides. The cascade drafting ``WRITE_SHARE`` is kept in ``GATES`` (the
    gate file benchmarks/gate_overhead.py runs)."""
    train = labelled_train(sweeps, "gold")
    drafts = train_drafts(sweeps, train.ids)
    train_full = with_drafts(train, {n: drafts[:, j] for j, n in enumerate(DRAFT_FEATURES)})
    test_full = with_drafts(
        test, {n: np.array([gate_scores(test_sweep, n)[i] for i in test.ids]) for n in DRAFT_FEATURES}
    )
    k, c, _ = tune(train)
    cheap, p_train = fit_probe(train, components=k, c=c)
    kf, cf, _ = tune(train_full)
    full, _ = fit_probe(train_full, components=kf, c=cf)
    p_cheap = cheap.probabilities(test.scalars, test.hidden)
    p_full = full.probabilities(test_full.scalars, test_full.hidden)
    out = [
        "",
        (
            f"Cascade (gold labels; cheap: hidden + question, PCA {k}, C {c:g}; full: + TARG's draft scores, PCA "
            f"{kf}, C {cf:g}; the band set on the training questions' cross-fitted probabilities). Full gate AUROC "
            f"{_plain(_iv(boot, p_full, test.y))}; cheap alone {_plain(_iv(boot, p_cheap, test.y))}."
        ),
        "",
        "| share drafted (train) | band | share drafted (test) | cascade AUROC | minus the full gate's | minus targ-entropy's |",
        "|---|---|---|---|---|---|",
    ]
    p_targ = np.array([gate_scores(test_sweep, "targ-entropy")[i] for i in test.ids])
    for share in CASCADE_SHARES:
        band = choose_band(p_train, share)
        p_cas, drafted = cascade_probabilities(p_cheap, p_full, band)
        if share == WRITE_SHARE:
            GATES[test_sweep] = LearnedGateFile(
                cheap, full, band,
                {
                    "label": "closed-wrong", "model": {"model": MODEL, "engine": "llama.cpp"},
                    "source": "benchmarks/learned_gate.py: " + " + ".join(s for s, _ in sweeps if (RUNS / s).is_dir()),
                    "questions": question_digests(training_questions(train.ids, sweeps)),
                    "report": {"cascade_auroc_test": round(_iv(boot, p_cas, test.y)[0], 4),
                               "full_auroc_test": round(_iv(boot, p_full, test.y)[0], 4),
                               "drafted_share_test": round(float(drafted.mean()), 4)},
                },
            )  # fmt: skip
        out.append(
            f"| {share:g} | {band[0]:.3f}–{band[1]:.3f} | {drafted.mean():.2f} | {_plain(_iv(boot, p_cas, test.y))} | "
            f"{_ci(_gap(boot, p_cas, p_full, test.y))} | {_ci(_gap(boot, p_cas, p_targ, test.y))} |"
        )
    return out


def training_questions(ids: tuple[str, ...], sweeps: tuple[tuple[str, str | None], ...]) -> list[str]:
    """The training questions' text, by id, from their sweeps' records."""
    texts: dict[str, str] = {}
    for sweep, family in sweeps:
        if (RUNS / sweep).is_dir():
            texts |= _records(sweep, family)[1]
    return [texts[i] for i in ids]


def _plain(v: tuple[float, float, float]) -> str:
    return f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]"


def summary() -> str:
    return "\n".join(
        [
            (
                "| dataset | labels | targ-entropy AUROC | learned gate AUROC (hidden state + question) | learned "
                "minus targ-entropy (paired) |"
            ),
            "|---|---|---|---|---|",
            *SUMMARY,
        ]
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument(
        "--blocks",
        action="store_true",
        help="print the tables framed as the generated blocks of docs/methods.md (learned-gate) and README.md "
        "(learned-gate-summary), which scripts/render_docs.py writes",
    )
    ap.add_argument(
        "--write-gates",
        type=Path,
        default=None,
        metavar="DIR",
        help=f"write each dataset's cascade (drafting {WRITE_SHARE:g} of the training questions) as a gate file "
        "DIR/learned-DATASET.json, for benchmarks/gate_overhead.py --gate-weights",
    )
    ap.add_argument("--seed", type=int, default=0, help="the bootstrap intervals' numpy seed (not the fits')")
    ap.add_argument("--resamples", type=int, default=1000, help="the bootstrap intervals' resamples")
    args = ap.parse_args(argv)
    text = run(args.out, Resampling(args.resamples, args.seed))
    if args.blocks:
        print(f"<!-- block: learned-gate -->\n{text.rstrip()}\n<!-- block: learned-gate-summary -->\n{summary()}")
    else:
        print(text, end="")
    if args.write_gates is not None:
        args.write_gates.mkdir(parents=True, exist_ok=True)
        for dataset, (_, test_sweep) in DATASETS.items():
            path = save_learned(GATES[test_sweep], args.write_gates / f"learned-{dataset}.json")
            print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
