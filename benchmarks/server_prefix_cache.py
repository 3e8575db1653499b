"""Time to first token of the answer after TARG's draft, on llama-cpp-python's OpenAI-compatible server with its
prompt cache on: the reader with the question first (x = B(q) + C, TARG Eq. 5: the draft's prompt is a prefix of
it) against the documents first (only the system message is shared).

    .venv/bin/python benchmarks/server_prefix_cache.py [--model qwen2.5-coder-1.5b] [--index DIR] \
        [--questions 20] [--k 5] [--threads 2]

The script starts ``python -m llama_cpp.server --cache true`` with ``--model`` on 127.0.0.1 and, per question
(NQ-open dev from ../shared/data, else the demo questions), for each layout in turn: sends the draft as
ragate's TARG gate sends it (system message and question, greedy, 20 tokens), then the reading prompt with the
question's top ``--k`` passages, streamed, and times the first token of the answer. The layouts alternate which
goes first from one question to the next. Prints the mean and median time to first token per layout, their
paired difference with its bootstrap interval, and the prompt lengths; the server evaluates whatever its cache does not hold.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from concurrency import start_llama_server, stop

from ragate.eval.metrics import paired_bootstrap_diff
from ragate.methods.prompts import TARG, TARG_CONTEXT_FIRST, PromptSet
from ragate.models import resolve_model
from ragate.retrieval.demo import demo_dir, demo_index
from ragate.retrieval.index import open_index

NQ = Path("../shared/data/nq_open/NQ-open.dev.jsonl")
LAYOUTS: dict[str, PromptSet] = {"question first (TARG)": TARG, "documents first": TARG_CONTEXT_FIRST}


def _messages(prompts: PromptSet, user: str) -> list[dict[str, str]]:
    system = [{"role": "system", "content": prompts.system}] if prompts.system else []
    return [*system, {"role": "user", "content": user}]


def draft(client: httpx.Client, prompts: PromptSet, question: str) -> None:
    body = {"messages": _messages(prompts, prompts.direct.format(question=question)), "max_tokens": 20,
            "temperature": 0.0, "repeat_penalty": 1.0, "logprobs": True, "top_logprobs": 5}  # fmt: skip
    client.post("/chat/completions", json=body).raise_for_status()


def first_token(client: httpx.Client, prompts: PromptSet, question: str, context: str) -> tuple[float, int]:
    """Seconds to the first streamed token of the answer, and the prompt's length in characters."""
    user = prompts.with_context.format(question=question, context=context)
    body = {"messages": _messages(prompts, user), "max_tokens": 8, "temperature": 0.0, "repeat_penalty": 1.0,
            "stream": True}  # fmt: skip
    start = time.perf_counter()
    with client.stream("POST", "/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"][0].get("delta", {})
            if delta.get("content"):
                return time.perf_counter() - start, len(user)
    return time.perf_counter() - start, len(user)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--index", default=None, help="index directory (default: the demo index)")
    ap.add_argument("--questions", type=int, default=20)
    ap.add_argument("--k", type=int, default=5, help="passages read (TARG: 5)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    source = NQ if NQ.exists() else demo_dir() / "questions.jsonl"
    lines = source.read_text().splitlines()[: args.questions]
    questions = [json.loads(line)["question"] for line in lines]
    with open_index(args.index or demo_index()) as index:
        hits = index.search(questions, args.k)
    log = Path(tempfile.mkdtemp(prefix="prefix-cache-")) / "server.log"
    threads = ("--n_threads", str(args.threads), "--n_threads_batch", str(args.threads))
    proc, base = start_llama_server(
        resolve_model(args.model), log, ("--n_ctx", "4096", "--cache", "true", *threads), 300
    )
    times: dict[str, list[float]] = {name: [] for name in LAYOUTS}
    chars: dict[str, list[int]] = {name: [] for name in LAYOUTS}
    try:
        with httpx.Client(base_url=base, timeout=900) as client:
            draft(client, TARG, "What is the capital of France?")  # warm: the system message and the template
            for i, (question, found) in enumerate(zip(questions, hits, strict=True)):
                order = list(LAYOUTS) if i % 2 == 0 else list(reversed(LAYOUTS))
                for name in order:
                    prompts = LAYOUTS[name]
                    draft(client, prompts, question)
                    seconds, n = first_token(
                        client, prompts, question, prompts.format_passages([h.passage for h in found])
                    )
                    times[name].append(seconds)
                    chars[name].append(n)
                print(f"{i + 1}/{len(questions)}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()),
                      file=sys.stderr, flush=True)  # fmt: skip
    finally:
        stop(proc)
    a, b = LAYOUTS
    diff = [x - y for x, y in zip(times[a], times[b], strict=True)]
    print(f"{len(questions)} questions from {source.name}; {args.model} on llama-cpp-python's server (--cache true, "
          f"{args.threads} threads); top-{args.k} passages of {args.index or 'the demo index'}\n")  # fmt: skip
    print("| reader layout | mean TTFT s | median TTFT s | prompt chars (mean) |")
    print("|---|---:|---:|---:|")
    for name in LAYOUTS:
        print(f"| {name} | {statistics.mean(times[name]):.2f} | {statistics.median(times[name]):.2f} | "
              f"{statistics.mean(chars[name]):.0f} |")  # fmt: skip
    rel = statistics.mean(diff) / statistics.mean(times[b])
    lo, hi = paired_bootstrap_diff(times[a], times[b])
    print(
        f"\npaired difference (question first - documents first): mean {statistics.mean(diff):+.2f} s "
        f"({rel:+.1%}), 95% bootstrap interval [{lo:+.2f}, {hi:+.2f}] s, median {statistics.median(diff):+.2f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
