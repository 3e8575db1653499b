"""How well the gates that read no model rank "the closed-book answer is wrong", next to the gates a sweep scored
(targ-margin, ...), on the same questions.

    .venv/bin/python benchmarks/nomodel_auroc.py [SWEEP_DIR] [--family KEY] [--metric acc] [--index DIR]

Default: the demo sweep (docs/results/runs/sweep-demo-smollm2-135m-80: SmolLM2-135M-Instruct, the 80 demo
questions, the demo index), its TARG family. The labels are the sweep's closed-book answers (wrong: ``--metric``
is 0; ``acc`` by default, since SmolLM2 answers in sentences and gets no exact match); the swept gates' scores are
the sweep's own; the no-model gates' scores are computed here over the index, exactly as the gates compute them
(``ragate.gates.nomodel.signals``). The trained gate ``no-model-lr`` is scored out of fold (stratified folds,
seeded: each question's score comes from a fit that did not see it), once per feature set. Every AUROC is for the
score as the gate orients it (higher: retrieve); below 0.5 means the other direction ranks better. Also printed:
the AUROC for "retrieval fixed it" (the retrieval answer scored higher), and seconds per question to decide (the
swept gates' from the sweep's record, the others measured here: one top-5 search, or nothing).

With SmolLM2 these numbers show the mechanics only (80 questions, 4 answered right closed-book by acc). The real
comparison is issue 51's item 5 (Qwen2.5-Coder-1.5B, NQ-open and HotpotQA, 300 questions each).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from ragate.gates import nomodel as nm
from ragate.learning.gatefit import _cross_validated, record_label
from ragate.learning.sweeps import sweep_questions
from ragate.retrieval.demo import demo_index
from ragate.retrieval.index import open_index
from ragate.uncertainty import auroc

DEMO_SWEEP = Path(__file__).parents[1] / "docs" / "results" / "runs" / "sweep-demo-smollm2-135m-80"
DEMO_FAMILY = "targ|question|k=5|n=5|cos|hyde=1|rep=5|ce=None|max=64"  # the demo sweep's TARG family
SIGNAL_GATES = {  # gate -> the feature its score is
    "retrieval-top1": "top1",
    "retrieval-gap": "gap",
    "retrieval-dispersion": "dispersion",
    "question-length": "words",
    "question-rarity": "rarity",
}


def _fmt(value: float | None, digits: int = 3) -> str:
    return "  n/a" if value is None else f"{value:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("sweep", nargs="?", type=Path, default=DEMO_SWEEP)
    parser.add_argument(
        "--family", default=None, help=f"the sweep family (default for the demo sweep: {DEMO_FAMILY})"
    )
    parser.add_argument("--metric", choices=("em", "f1", "acc"), default="acc")
    parser.add_argument(
        "--index", default=None, help="the index the signals read (default: the sweep's, or the demo)"
    )
    args = parser.parse_args(argv)
    family = args.family or (DEMO_FAMILY if args.sweep.resolve() == DEMO_SWEEP.resolve() else None)
    found = sweep_questions(args.sweep, family=family, metric=args.metric, method="no-model-lr")
    records = found.records
    texts = [found.questions[r["id"]] for r in records]
    wrong = np.array([record_label(r, "closed-wrong", args.metric) for r in records])
    fixed = np.array([record_label(r, "retrieval-fixed", args.metric) for r in records])
    index = args.index or found.saved.get("index") or demo_index()
    rows: list[tuple[str, float | None, float | None, float | None, str]] = []
    swept = sorted({m for r in records for m in r["gates"]})
    for gate in swept:
        have = [r for r in records if gate in r["gates"]]
        if len(have) != len(records):
            continue
        scores = [r["gates"][gate]["score"] for r in records]
        seconds = float(np.mean([r["gates"][gate]["seconds"] for r in records]))
        rows.append(
            (gate, auroc(scores, wrong.tolist()), auroc(scores, fixed.tolist()), seconds, "the sweep's record")
        )
    with open_index(index) as retriever:
        x, kind, cost = _features(texts, retriever)
    parts = {"retrieval-top1": "search", "retrieval-gap": "search", "retrieval-dispersion": "search",
             "question-length": "text", "question-rarity": "rarity"}  # fmt: skip
    for gate, feature in SIGNAL_GATES.items():
        column = x[:, nm.FEATURES.index(feature)].tolist()
        rows.append(
            (
                gate,
                auroc(column, wrong.tolist()),
                auroc(column, fixed.tolist()),
                cost[parts[gate]],
                "measured",
            )
        )
    numeric = np.maximum(x[:, nm.FEATURES.index("digit")], x[:, nm.FEATURES.index("date")]).tolist()
    rows.append(("question-numeric", auroc(numeric, wrong.tolist()), auroc(numeric, fixed.tolist()), cost["text"],
                 "measured"))  # fmt: skip
    set_cost = {
        "all": sum(cost.values()),
        "retrieval": cost["search"],
        "question": cost["text"] + cost["rarity"],
    }
    for name, names in nm.FEATURE_SETS.items():
        columns = [nm.FEATURES.index(f) for f in names]
        cv_wrong, folds = _cross_validated(x[:, columns], wrong, 1.0)
        cv_fixed, _ = _cross_validated(x[:, columns], fixed, 1.0)
        label = f"no-model-lr ({name}, out of fold)"
        rows.append((label, cv_wrong, cv_fixed, set_cost[name], f"measured, {folds} folds"))
    print(f"sweep {args.sweep} ({found.family}), {len(records)} questions, index {index} ({kind} scores)")
    print(f"labels by {args.metric}: closed-book wrong {int(wrong.sum())}/{len(wrong)}, "
          f"retrieval fixed it {int(fixed.sum())}/{len(fixed)}")  # fmt: skip
    print(
        "\n| gate | AUROC closed-book wrong | AUROC retrieval fixed it | s/question to decide | |\n|---|---|---|---|---|"
    )
    for gate, a_wrong, a_fixed, seconds, where in rows:
        print(f"| {gate} | {_fmt(a_wrong)} | {_fmt(a_fixed)} | {_fmt(seconds, 5)} | {where} |")
    print(
        "\nSmolLM2-135M numbers show the mechanics only; the real comparison is issue 51 item 5 (1.5B model)."
    )
    return 0


def _features(texts: list[str], retriever: object) -> tuple[np.ndarray, str, dict[str, float]]:
    """Every signal of each question as the gates compute them, and the mean seconds per question of each part: the
    top-5 search and its signals ("search"), the question's text alone ("text"), its rarest term's corpus frequency
    ("rarity"; the document frequencies read once before, from the index's BM25 side or its cached pass)."""
    freqs = nm.doc_frequencies(retriever)
    rows, kinds = [], set()
    seconds = {"search": 0.0, "text": 0.0, "rarity": 0.0}
    for text in texts:
        start = time.perf_counter()
        hits = retriever.scored_search([text], nm.SIGNAL_K)[0]  # type: ignore[attr-defined]
        found = nm.retrieval_signals(hits.scores, hits.kind)
        seconds["search"] += time.perf_counter() - start
        start = time.perf_counter()
        question = nm.question_signals(text)
        seconds["text"] += time.perf_counter() - start
        start = time.perf_counter()
        rare = nm.rarity(text, freqs)
        seconds["rarity"] += time.perf_counter() - start
        rows.append(nm.Signals(found, question, rare).vector(nm.FEATURES))
        kinds.add(hits.kind)
    return np.vstack(rows), "/".join(sorted(kinds)), {k: v / len(texts) for k, v in seconds.items()}


if __name__ == "__main__":
    sys.exit(main())
