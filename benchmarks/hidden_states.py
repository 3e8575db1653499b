"""The answering model's last-layer hidden state at the last token of each swept question's direct prompt (the
draft's and the closed-book answer's prompt), the feature the learned gate reads (:mod:`ragate.gates.learned`).

    taskset -c 1 .venv/bin/python benchmarks/hidden_states.py docs/results/runs/SWEEP --model qwen2.5-coder-1.5b

It writes ``SWEEP/hidden-MODEL.npz`` (``ids``: the sweep's record ids of the method's family, in order;
``hidden``: float32, one row each; ``model``: the model file's sha256), atomically every 25 questions, and a rerun
resumes where a killed one stopped. Each question costs one prompt evaluation (no decoding), computed as
``ragate.Pipeline`` computes it (:meth:`ragate.methods.question.QuestionRun.hidden_state`). With ``--draft`` it
writes ``SWEEP/drafts-MODEL.npz`` too: TARG's entropy and margin scores (Eqs. 1-2, k = 20) of each question's
20-token greedy draft, which starts from that prompt's kept state (for a training sweep that scored no TARG gate).
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from ragate.backends import load_backend
from ragate.eval.calls import CallCache
from ragate.fileio import atomic_writer
from ragate.gates.learned import DRAFT_TOKENS, draft_scores
from ragate.learning.sweeps import sweep_questions
from ragate.methods import get_method
from ragate.methods.question import QuestionRun
from ragate.models import model_identity


def hidden_path(sweep: Path, model: str) -> Path:
    return sweep / f"hidden-{Path(model).name.removesuffix('.gguf')}.npz"


def drafts_path(sweep: Path, model: str) -> Path:
    return sweep / f"drafts-{Path(model).name.removesuffix('.gguf')}.npz"


def read_hidden(path: Path) -> tuple[list[str], np.ndarray, str]:
    """The ids, rows and model sha256 of a hidden-state file (numbers and text only: no pickle)."""
    with np.load(path, allow_pickle=False) as data:
        return [str(i) for i in data["ids"]], np.asarray(data["hidden"], dtype=np.float32), str(data["model"])


def _save(path: Path, ids: list[str], rows: list[np.ndarray], sha: str) -> None:
    buf = io.BytesIO()
    np.savez_compressed(
        buf, ids=np.array(ids), hidden=np.vstack(rows).astype(np.float32), model=np.array(sha)
    )
    with atomic_writer(path) as f:
        f.write(buf.getvalue())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep", type=Path)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument(
        "--method", default="targ-entropy", help="the method whose family's records and prompt to use"
    )
    ap.add_argument(
        "--family",
        default=None,
        help="the records' family when it is not the method's (an older sweep's name)",
    )
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--draft", action="store_true", help="also the 20-token draft's TARG scores (drafts-MODEL.npz)"
    )
    args = ap.parse_args(argv)
    found = sweep_questions(
        args.sweep, family=args.family, metric="acc", method=args.method, what="the questions"
    )
    sha = str(model_identity(args.model, "llama.cpp").get("sha256") or "")
    out = hidden_path(args.sweep, args.model)
    ids: list[str] = []
    rows: list[np.ndarray] = []
    if out.is_file():
        ids, matrix, was = read_hidden(out)
        if was != sha:
            print(
                f"{out} was computed with another model file ({was[:12]}); delete it to recompute",
                file=sys.stderr,
            )
            return 1
        rows = list(matrix)
    dids: list[str] = []
    drows: list[np.ndarray] = []
    dout = drafts_path(args.sweep, args.model)
    if args.draft and dout.is_file():
        dids, dmatrix, _ = read_hidden(dout)
        drows = list(dmatrix)
    done = set(ids) & set(dids) if args.draft else set(ids)
    todo = [r["id"] for r in found.records if r["id"] not in done]
    spec = get_method(args.method)
    lm = load_backend(args.model, "llama.cpp", n_threads=args.threads, n_threads_batch=args.threads)
    cached = CallCache(lm, None, f"llama.cpp:{lm.model}", exact_prefixes=True)
    try:
        for n, rid in enumerate(tqdm(todo, desc=f"hidden states {args.sweep.name}", unit="q"), 1):
            run = QuestionRun(spec, found.questions[rid], cached, None)
            hidden = run.hidden_state()
            assert hidden is not None
            if rid not in set(ids):
                ids.append(rid)
                rows.append(hidden)
            if args.draft:
                scores = draft_scores(run.draft(DRAFT_TOKENS))
                dids.append(rid)
                drows.append(np.array([scores["targ-entropy"], scores["targ-margin"]], dtype=np.float32))
            if n % 25 == 0 or n == len(todo):
                _save(out, ids, rows, sha)
                if args.draft:
                    _save(dout, dids, drows, sha)
    finally:
        lm.close()
    print(f"{out}: {len(ids)} questions")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
