"""``ragate gate fit``: fit a trained gate that reads no model from a sweep (see ragate.learning.gatefit,
ragate.gates.nomodel). ``ragate gate learn``: learn the gate from labelled traffic (a feedback store) or a sweep
(ragate.learning.fit, ragate.gates.learned)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "gate", help="trained and learned gates", description=__doc__.split("\n")[0]
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
        "--family",
        default=None,
        help="the method family whose answers label (default: the gate's, TARG's reader)",
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
    learn = commands.add_parser(
        "learn",
        help="learn the gate from labelled traffic (a feedback store) or a sweep",
        description="Fit the learned gate (a calibrated logistic regression over the question's signals, the "
        "model's hidden state and, for a cascade, the draft's TARG scores) on the labels of a feedback store "
        "(`ragate serve --shadow`, POST /v1/feedback, Pipeline.feedback) or of a sweep's records, print its "
        "cross-fitted AUROC with a bootstrap interval, calibration error and AUROC against the number of labels, "
        "and write it as plain JSON (no pickle) that `--method learned --gate-weights FILE` reads.",
    )
    source = learn.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--store", help="a feedback store to learn from: a SQLite file, or redis://HOST:PORT/DB (the replicas' shared one)"
    )
    source.add_argument("--sweep", type=Path, help="a sweep run directory whose records label its questions")
    learn.add_argument("--out", type=Path, required=True, help="the gate file to write (.json)")
    learn.add_argument(
        "--label", choices=("closed-wrong", "retrieval-changed"), default=None,
        help="closed-wrong: the closed-book answer is wrong (gold: references, feedback); retrieval-changed: "
        "retrieval changed the answer (shadow answers' silver label). Default with --store: closed-wrong where it has "
        "10 labels of each class, else retrieval-changed where that has (the choice is printed); with --sweep: "
        "closed-wrong",
    )  # fmt: skip
    learn.add_argument(
        "--cascade", type=float, default=None, metavar="SHARE",
        help="a cascade that drafts (TARG's 20 tokens) for this share of questions, those the cheap gate is least "
        "sure of (needs answers with draft scores)",
    )  # fmt: skip
    learn.add_argument(
        "--no-hidden", action="store_true", help="leave the model's hidden state out (a server backend)"
    )
    learn.add_argument(
        "--prompts",
        default=None,
        help="the prompt set of the answers to learn from (default: learned's, TARG's)",
    )
    learn.add_argument(
        "--model",
        default=None,
        help="with --sweep: the model whose hidden states to compute (default: the sweep's)",
    )
    learn.add_argument(
        "--family", default=None, help="with --sweep: the records' method family (default: learned's)"
    )
    learn.add_argument(
        "--metric", choices=("em", "f1", "acc"), default="acc", help="with --sweep: the gold label's metric"
    )
    learn.add_argument(
        "--components", type=int, default=None,
        help="PCA components of the hidden state (default: chosen with --C by cross-fitted AUROC on the labels, from "
        "4, 8, 16, 32, 64)",
    )  # fmt: skip
    learn.add_argument(
        "--C",
        dest="c",
        type=float,
        default=None,
        help="inverse L2 strength (default: chosen, from 0.01, 0.1, 1)",
    )
    from ragate.cli.options import engine_options

    engine_options(learn)  # with --sweep: the hidden states on Ray workers
    learn.set_defaults(run=_learn)
    fb = commands.add_parser(
        "feedback",
        help="a user's word on an answer a feedback store holds (what POST /v1/feedback and Pipeline.feedback do)",
        description="Record that an answer (its id, as `ragate serve --feedback-store` returned it) was correct or "
        "wrong, or give its reference answer; prints the gate labels that gave and the store's counts.",
    )
    fb.add_argument(
        "--store", required=True, help="the feedback store: a SQLite file, or redis://HOST:PORT/DB (shared by replicas)"
    )
    fb.add_argument("--id", required=True, help="the answer's id")
    verdict = fb.add_mutually_exclusive_group()
    verdict.add_argument("--correct", action="store_true", help="the answer was right")
    verdict.add_argument("--wrong", action="store_true", help="the answer was wrong")
    fb.add_argument("--reference", default=None, help="the reference answer")
    fb.set_defaults(run=_feedback)


def _fit(args: argparse.Namespace) -> int:
    from ragate.errors import RagateError
    from ragate.gates.weights import save_weights
    from ragate.learning.gatefit import fit_gate

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


def _learn(args: argparse.Namespace) -> int:
    from ragate.cli.options import check_engine_args
    from ragate.errors import RagateError
    from ragate.learning.fit import (
        choose_label,
        label_counts,
        learn_from_store,
        learn_labelled,
        sweep_labelled,
    )
    from ragate.learning.scores import DEFAULT_C, DEFAULT_COMPONENTS

    if args.out.suffix != ".json":
        raise RagateError(f"--out {args.out}: name the gate file FILE.json")
    if args.cascade is not None and not 0.0 <= args.cascade <= 1.0:
        raise RagateError(f"--cascade is a share of questions in [0, 1], not {args.cascade}")
    check_engine_args(args)
    if args.run_engine == "ray" and (args.store is not None or args.no_hidden):
        raise RagateError(
            "--engine ray computes the hidden states of a sweep's questions: it goes with --sweep, without --no-hidden "
            "(a feedback store holds the hidden states its answers recorded)"
        )
    tuned = args.components is None and args.c is None  # neither fixed: chosen by cross-fitting on the labels
    components = DEFAULT_COMPONENTS if args.components is None else args.components
    c = DEFAULT_C if args.c is None else args.c
    if args.store is not None:
        from ragate.methods import get_method

        prompts = args.prompts or get_method("learned").prompts.name
        with _open_store(args.store) as store:
            counts = label_counts(store, prompts)
            print(
                f"{args.store}: {store.counts()['answers']} answers; labels of prompt set {prompts}: "
                + "; ".join(
                    f"{kind} {n['retrieve']} 'retrieve', {n['no_retrieve']} 'no-retrieve'"
                    for kind, n in counts.items()
                )
            )
            label = args.label
            if label is None:
                label, why = choose_label(counts)  # refuses, naming both kinds' counts, where neither fits
                print(f"learning {label!r} (the default: {why})")
            else:
                print(f"learning {label!r}")
            learned = learn_from_store(
                store, args.out, label=label, prompts=prompts, cascade=args.cascade, hidden=not args.no_hidden,
                components=components, c=c, tuned=tuned,
            )  # fmt: skip
    else:
        from ragate.eval.config import read_run_config
        from ragate.learning.fit import HiddenStates

        saved = read_run_config(args.sweep)
        model = args.model or saved.get("model")
        label = args.label or "closed-wrong"
        names: list[str] = []

        def on_ray(questions: list[str]) -> list[Any]:
            from ragate.eval.ray_engine import map_ray, worker_threads

            found = map_ray(
                list(enumerate(questions)), HiddenStates, (model, "learned", worker_threads(None, "llama.cpp")),
                address=args.ray_address, workers=args.ray_workers, desc="hidden states",
                start_timeout=args.ray_start_timeout,
            )  # fmt: skip
            names.extend(name for _, name in found[:1])
            return [state for state, _ in found]

        local = None if args.no_hidden or args.run_engine == "ray" else HiddenStates(model)

        def here(questions: list[str]) -> list[Any]:
            from tqdm.auto import tqdm

            assert local is not None
            jobs = tqdm(list(enumerate(questions)), desc="hidden states", unit="q")
            return [local.record(job)[0] for job in jobs]

        try:
            data, questions = sweep_labelled(
                args.sweep, None, label=label, family=args.family, metric=args.metric, hidden=not args.no_hidden,
                states_of=on_ray if args.run_engine == "ray" else here,
            )  # fmt: skip
            name = local.model if local is not None else (names[0] if names else model)
            learned = learn_labelled(
                data, args.out, label=label, cascade=None, components=components, c=c,
                model={"model": name, "engine": "llama.cpp"}, questions=questions, source=f"sweep {args.sweep}", tuned=tuned,
            )  # fmt: skip
        finally:
            if local is not None:
                local.close()
    print(learned.summary())
    params = learned.report.get("params") or {}
    print(
        f"PCA components {params.get('components')}, C {params.get('C')}"
        + (" (chosen by cross-fitting)" if params.get("tuned") else "")
    )
    curve = learned.report.get("curve") or []
    if curve:
        print(
            "AUROC (cross-fitted) against labels: "
            + ", ".join(f"{n}: {'-' if v is None else f'{v:.3f}'}" for n, v in curve)
        )
    return 0


def _feedback(args: argparse.Namespace) -> int:
    import json

    from ragate.learning.store import label_json

    correct = True if args.correct else (False if args.wrong else None)
    with _open_store(args.store) as store:
        labels = store.feedback(args.id, correct=correct, reference=args.reference)
        print(
            json.dumps(
                {
                    "id": args.id,
                    "labels": [label_json(k, v) for k, v in labels],
                    "counts": store.counts(),
                }
            )
        )
    return 0


def _open_store(where: str) -> Any:
    """A feedback store to read: a SQLite file that exists (never a new empty one), or a shared store's URL."""
    from ragate.errors import RagateError
    from ragate.learning.shared_store import open_feedback_store

    scheme = where.split("://", 1)[0] if "://" in where else None
    if scheme is not None and scheme not in ("redis", "rediss", "valkey", "valkeys"):
        raise RagateError(f"--store {where!r}: a feedback store is a SQLite file or a redis:// / valkey:// URL")
    if scheme is None and not Path(where).is_file():
        raise RagateError(
            f"no feedback store at {where}: `ragate serve --feedback-store FILE` (or --shadow) fills one"
        )
    return open_feedback_store(where)
