"""A sweep whose reader changed since pass 1, re-read from an eval run made with today's reader.

``ragate.eval.reread.reread_sweep``: the closed-book answers and gate scores of SWEEP are kept (they are decided
before anything is read); each family whose retrieval side changed takes its retrieval answers from RUN's
always-retrieving method of that family in today's form (``targ-always`` for the TARG gates, ``dtr-no-ugt`` for
DTR). Checked: the same dataset file, offset, model file and indexed passages. Then pass 2 as ``ragate sweep``
writes it, so ``ragate report OUT --budgets ...`` reads OUT like any sweep.

Run: ``.venv/bin/python scripts/reread_sweep.py SWEEP_DIR RUN_DIR --out NEW_SWEEP_DIR``

Check: ``.venv/bin/python scripts/reread_sweep.py --compare FRESH_SWEEP_DIR NEW_SWEEP_DIR`` compares a sweep of
some of the same questions made afresh at today's code with the re-read one, record by record (closed-book and
retrieval predictions, passages, every gate score to 1e-6), and exits 1 on any difference.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ragate.errors import RagateError
from ragate.eval.reread import reread_sweep
from ragate.eval.sweep import compact


def compare(fresh_dir: Path, reread_dir: Path) -> int:
    """Print how many of ``fresh_dir``'s records the re-read sweep matches; 1 on any difference."""
    reread = {(r["id"], r["family"]): r for r in compact(reread_dir / "sweep.jsonl")}
    compared, differences = 0, []
    for f in compact(fresh_dir / "sweep.jsonl"):
        r = reread.get((f["id"], f["family"]))
        if r is None:
            differences.append(f"{f['id']} {f['family']}: not in {reread_dir}")
            continue
        compared += 1
        for side in ("closed", "open"):
            for field in ("prediction", "doc_ids"):
                if f[side][field] != r[side][field]:
                    differences.append(
                        f"{f['id']} {f['family']}: {side} {field} {f[side][field]!r} vs {r[side][field]!r}"
                    )
        for method, gate in f["gates"].items():
            theirs = r["gates"].get(method, {}).get("score")
            if theirs is None or abs(gate["score"] - theirs) >= 1e-6:
                differences.append(f"{f['id']} {method}: score {gate['score']!r} vs {theirs!r}")
    for line in differences:
        print(line)
    print(f"{compared} records compared, {len(differences)} differences")
    return 1 if differences or not compared else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "sweep", type=Path, help="the sweep directory whose reader changed (or, with --compare, a fresh one)"
    )
    parser.add_argument(
        "run",
        type=Path,
        help="an eval run over the same questions with today's reader (or, with --compare, the re-read sweep)",
    )
    parser.add_argument("--out", type=Path, help="the new sweep directory")
    parser.add_argument(
        "--compare", action="store_true", help="compare a fresh sweep (first) with a re-read one"
    )
    parser.add_argument("--metric", choices=("em", "f1", "acc"), default="acc")
    args = parser.parse_args(argv)
    if args.compare:
        return compare(args.sweep, args.run)
    if args.out is None:
        parser.error("--out is required")
    try:
        reread = reread_sweep(args.sweep, args.run, args.out, args.metric)
    except RagateError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for r in reread:
        print(
            f"{r['family_was']} -> {r['family']}: {r['questions']} retrieval answers from {r['method']} "
            f"(commit {str(r['run_commit'])[:7]}); {r['other_passages']} questions read other passages"
        )
    print(f"wrote {args.out}; pass 2 is in {args.out / 'sweep.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
