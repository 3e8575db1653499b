"""How long a pseudo-context is when nothing cuts it: the evidence for ``MethodSpec.pseudo_max_tokens``.

DTR and PAIRS retrieve with a passage the model writes for the question. Until issue M ragate cut it at 128
tokens (most hit the cap); the authors' code allows 1024. This writes the pseudo-context of the first N
questions of a dataset with each prompt set (PAIRS's, which DPR-AIS and PAIRS use, and DTR's) under a cap of
1024 tokens, greedy, through the evaluation's call cache (so an eval at the same cap reuses every call), and
prints the length distribution, the share each cap would cut, and the smallest cap that lets at least 90% of
them end by themselves.

Run: ``.venv/bin/python benchmarks/pseudo_length.py --dataset nq-open-oracle --limit 50 --model qwen2.5-coder-1.5b``
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from tqdm.auto import tqdm

from ragate.backends import load_backend
from ragate.eval.datasets import load_dataset
from ragate.eval.run import EvalConfig, default_call_cache, open_call_cache
from ragate.methods import get_method
from ragate.methods.runner import QuestionRun

CAPS = (128, 256, 384, 512, 768, 1024)
PROMPT_SETS = {"pairs": "dpr-ais", "dtr": "dtr-no-ugt"}  # prompt set -> a method that writes with it


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="nq-open-oracle")
    ap.add_argument("--limit", type=int, default=50)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--cap", type=int, default=1024)
    ap.add_argument("--prompts", default="pairs,dtr", help="comma-separated: pairs, dtr")
    args = ap.parse_args(argv)
    examples = load_dataset(args.dataset, limit=args.limit)
    lm = load_backend(args.model, "llama.cpp")
    config = EvalConfig(dataset=args.dataset, methods=tuple(PROMPT_SETS.values()), model=args.model)
    cached, _ = open_call_cache(lm, default_call_cache(), config, own=True)  # the key an eval run uses
    print(f"{args.dataset}, first {len(examples)} questions, {args.model}, greedy, cap {args.cap} tokens\n")
    print(
        "| prompts | n | median | p75 | p90 | max | mean | ended by themselves | "
        + " | ".join(f"cut at {c}" for c in CAPS)
        + " | smallest cap ending ≥ 90% |"
    )
    print("|---|---|---|---|---|---|---|---|" + "---|" * len(CAPS) + "---|")
    for name in args.prompts.split(","):
        spec = get_method(PROMPT_SETS[name]).with_(pseudo_max_tokens=args.cap)
        lengths, ended = [], []
        for ex in tqdm(examples, desc=f"pseudo-contexts ({name})", file=sys.stderr):
            run = QuestionRun(spec, ex.question, cached, None)
            run.pseudo_context()
            stage = run.stages[-1]
            lengths.append(stage.completion_tokens)
            ended.append(stage.finish_reason != "length")
        x = np.asarray(lengths)
        cut = [f"{100 * np.mean(x >= c):.0f}%" for c in CAPS]
        cover = next((c for c in CAPS if np.mean(x < c) >= 0.9), None)
        print(
            f"| {name} | {len(x)} | {np.median(x):.0f} | {np.percentile(x, 75):.0f} | {np.percentile(x, 90):.0f} | "
            f"{x.max()} | {x.mean():.0f} | {sum(ended)} of {len(x)} | "
            + " | ".join(cut)
            + f" | {cover or '> ' + str(CAPS[-1])} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
