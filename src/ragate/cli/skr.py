"""``ragate skr fit``: label training questions for SKR from a sweep (see ragate.learning.sweeps, ragate.gates.skr)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "skr", help="SKR's labelled training questions", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="skr_command", metavar="ACTION", required=True)
    fit = commands.add_parser(
        "fit",
        help="label a sweep's questions (retrieval answer better than closed-book) and embed them",
        description="Label every question of a `ragate sweep` run (retrieve iff its retrieval answer scored "
        "higher than its closed-book answer), embed it with the index's encoder and save the set as one .npz "
        "file (plain arrays, no pickle) that records the encoder, the model and the dataset file.",
    )
    fit.add_argument("--sweep", type=Path, required=True, help="a sweep run directory (a training split)")
    fit.add_argument("--out", type=Path, required=True, help="the label set to write (.npz)")
    fit.add_argument("--index", default=None, help="index whose encoder embeds (default: the sweep's index)")
    fit.add_argument("--family", default=None, help="the method family whose answers label (default: skr's)")
    fit.add_argument("--metric", choices=("em", "f1", "acc"), default="em")
    fit.set_defaults(run=_fit)


def _fit(args: argparse.Namespace) -> int:
    from ragate.errors import RagateError
    from ragate.gates.skr import save_labels
    from ragate.learning.sweeps import fit_labels

    if args.out.suffix != ".npz":
        raise RagateError(f"--out {args.out}: name the label set FILE.npz")
    labels = fit_labels(args.sweep, index=args.index, family=args.family, metric=args.metric)
    save_labels(labels, args.out)
    n, positive = len(labels.ids), int(labels.retrieve.sum())
    print(
        f"wrote {args.out}: {n} training questions of {labels.meta['dataset']}, {positive} ({100 * positive / n:.1f}%) "
        f"labelled 'retrieve'; encoder {labels.meta['encoder']['name']}, model {labels.meta['model'].get('model')}"
    )
    return 0
