"""``ragate gate fit``: fit a trained gate that reads no model from a sweep (see ragate.eval.gatefit,
ragate.gates.nomodel)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "gate", help="trained gates that read no model", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="gate_command", metavar="ACTION", required=True)
    fit = commands.add_parser(
        "fit",
        help="fit no-model-lr (retrieval- and question-side signals) on a sweep's records",
        description="Label every question of a `ragate sweep` run (--label closed-wrong: its closed-book answer "
        "is wrong; retrieval-fixed: its retrieval answer scored higher), compute its signals (top-5 search scores, "
        "question length, question word, digits and dates, its rarest term's corpus frequency) over the index, fit "
        "a standardised logistic regression with scikit-learn and save it as plain JSON (means, scales, "
        "coefficients, intercept; no pickle) that records the model, the index's corpus and the encoder.",
    )
    fit.add_argument("--sweep", type=Path, required=True, help="a sweep run directory (a training split)")
    fit.add_argument("--out", type=Path, required=True, help="the weights file to write (.json)")
    fit.add_argument("--gate", default="no-model-lr", help="the trained gate to fit (default no-model-lr)")
    fit.add_argument("--index", default=None, help="the index the signals read (default: the sweep's index)")
    fit.add_argument(
        "--family", default=None, help="the method family whose answers label (default: the gate's, TARG's reader)"
    )
    fit.add_argument("--metric", choices=("em", "f1", "acc"), default="em")
    fit.add_argument(
        "--label",
        choices=("closed-wrong", "retrieval-fixed"),
        default="closed-wrong",
        help="what the score predicts: the closed-book answer is wrong (metric 0; default), or the retrieval "
        "answer scored higher than the closed-book one (SKR's label)",
    )
    fit.add_argument(
        "--features",
        choices=("all", "retrieval", "question"),
        default="all",
        help="the signals it reads: all (default), retrieval (top-5 search scores) or question (text and corpus "
        "frequency: no search before deciding)",
    )
    fit.add_argument("--C", dest="c", type=float, default=1.0, help="inverse L2 strength (default 1.0)")
    fit.set_defaults(run=_fit)


def _fit(args: argparse.Namespace) -> int:
    from ragate.errors import RagateError
    from ragate.eval.gatefit import fit_gate
    from ragate.gates.weights import save_weights

    if args.out.suffix != ".json":
        raise RagateError(f"--out {args.out}: name the weights file FILE.json")
    weights = fit_gate(
        args.sweep, gate=args.gate, index=args.index, family=args.family, metric=args.metric, label=args.label,
        features=args.features, c=args.c,
    )  # fmt: skip
    save_weights(weights, args.out)
    meta = weights.meta
    n, positive, score = meta["n"], meta["positives"], meta["auroc"]
    cross = "n/a" if score["cross_validated"] is None else f"{score['cross_validated']:.3f}"
    print(
        f"wrote {args.out}: {args.gate} over {len(weights.features)} signals ({meta['feature_set']}), {n} questions of "
        f"{meta['dataset']}, {positive} ({100 * positive / n:.1f}%) labelled {meta['label']!r} by {meta['metric']}; "
        f"AUROC {score['training']:.3f} on them, {cross} cross-validated ({score['folds']} folds); model "
        f"{meta['model'].get('model')}, index of {meta['index'].get('passages')} passages"
    )
    return 0
