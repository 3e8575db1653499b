"""Which (gate, prompt layout) pairs let the reading prompt start from the gate's prompt state, and by how many tokens.

    .venv/bin/python benchmarks/prompt_layouts.py [--model qwen2.5-coder-1.5b] [--index DIR] [--questions 100]

For each prompt set and each gate family, the prompts the gate sends before it decides (UGT's and TARG's draft:
the direct prompt; the LLM judge: DTR's Fig. 15; PAIRS: its direct prompt, its pseudo-context prompt and the answer
over the pseudo-context) and the reading prompt over the question's top 3 documents are tokenised with the model's
own chat template, on the first ``--questions`` NQ-open dev questions. A reading prompt computed through
:class:`ragate.Pipeline` starts from the kept state of the gate's prompt with the longest common prefix, cut down to
a multiple of 16 tokens and leaving at least 32 to evaluate (:func:`ragate.backends.prompt_states.reusable`); the
table gives that length beside the raw common prefix and the prompts' lengths (means over the questions). Only
tokenisation runs (no generation), so it takes seconds; the pseudo-context's text does not matter here, as the
reading prompt and the answer over the pseudo-context part where the context starts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from ragate.backends import load_backend
from ragate.backends.decoding import common_prefix_len
from ragate.backends.prompt_states import reusable
from ragate.gates.judge import JUDGE_PROMPT
from ragate.methods import GateSpec, MethodSpec, SelectorSpec
from ragate.methods.prompts import PROMPT_SETS, PromptSet
from ragate.methods.runner import QuestionRun
from ragate.retrieval.demo import demo_index
from ragate.retrieval.index import open_index

NQ = Path("../shared/data/nq_open/NQ-open.dev.jsonl")
# A candidate layout, not shipped: PAIRS's prompts with the question moved in front of each instruction. It shares
# less than the paper's own layout (see docs/methods.md, "What deciding costs"), so it stays here as the evidence.
PAIRS_QUESTION_FIRST = PromptSet(
    name="pairs-question-first",
    direct=(
        "Question: {question}\nYour task is to answer the given question. Please directly provide the concise answer "
        "inside <answer> and </answer> without detailed description, e.g., <answer>Beijing</answer>."
    ),
    with_context=(
        "Question: {question}\nContext: {context}\nYour task is to answer the given question based on the Context. "
        "Please directly provide the answer inside <answer> and </answer> without detailed description, e.g., "
        "<answer>Beijing</answer>."
    ),
    pseudo_context="Question: {question}\nYour task is to write a detailed passage to answer the given question.",
    tagged_answers=True,
)
LAYOUTS = {**PROMPT_SETS, PAIRS_QUESTION_FIRST.name: PAIRS_QUESTION_FIRST}
PSEUDO = "(a pseudo-context the model wrote)"
# the prompts each gate family sends before its decision, by template attribute or literal template
GATE_PROMPTS = {
    "ugt / targ-entropy / targ-margin / targ-variance": ("direct",),
    "llm-judge": (JUDGE_PROMPT,),
    "pairs": ("direct", "pseudo_context", "with_context"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--data", type=Path, default=NQ, help="NQ-open JSONL ({'question', 'answer'})")
    parser.add_argument("--index", default=None, help="index directory (default: the demo index)")
    parser.add_argument("--model", default=None)
    parser.add_argument("--sets", default=",".join(LAYOUTS), help="comma-separated prompt sets")
    args = parser.parse_args()
    if not args.data.exists():
        sys.exit(f"{args.data} not found: pass --data with NQ-open's NQ-open.dev.jsonl")
    lines = args.data.read_text().splitlines()[: args.questions]
    questions = [json.loads(line)["question"] for line in lines]
    with open_index(args.index or demo_index()) as index, load_backend(args.model, "llama.cpp") as lm:
        hits = index.search(questions, 3)
        print(f"{len(questions)} NQ-open questions; model {lm.model}; top-3 of {args.index or 'the demo index'}\n")
        print("| prompt set | gate | gate's prompt tokens | reading prompt tokens | common prefix | reusable |")
        print("|---|---|---|---|---|---|")
        for name in args.sets.split(","):
            prompts = LAYOUTS[name]
            spec = MethodSpec(name, name, GateSpec("always"), SelectorSpec("question"), prompts=prompts)
            runs = [QuestionRun(spec, q, lm, index) for q in questions]
            readers = [
                lm.tokenize(run.messages(prompts.with_context, context=prompts.format_passages([h.passage for h in found])))
                for run, found in zip(runs, hits, strict=True)
            ]  # each question's reading prompt, tokenised once for every gate family
            for gate, templates in GATE_PROMPTS.items():
                cells: list[tuple[int, int, int, int]] = []
                for run, reader in zip(runs, readers, strict=True):
                    kept = [
                        lm.tokenize(run.messages(getattr(prompts, t, t), context=PSEUDO)) for t in templates
                    ]
                    common = max(common_prefix_len(k, reader) for k in kept)
                    reuse = max(reusable(k, reader) for k in kept)
                    cells.append((sum(len(k) for k in kept), len(reader), common, reuse))
                means = [statistics.mean(c[i] for c in cells) for i in range(4)]
                print(f"| {name} | {gate} | " + " | ".join(f"{m:.1f}" for m in means) + " |")


if __name__ == "__main__":
    main()
