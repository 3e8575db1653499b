"""Exact prefix reuse on llama.cpp: where a prompt may be split without changing its logits, and what reuse saves.

    .venv/bin/python benchmarks/prefix_reuse.py [--model qwen2.5-coder-1.5b] [--prompts 12]

Part 1, the check behind :data:`ragate.backends.prompt_states.PREFIX_ALIGN`: two real reading prompts (demo
passages, one shared) are built; the second is evaluated from an empty cache, and again after the first with the
cache cut at each of a list of split points, then the rest evaluated. It prints, per split point, whether the last
logits are bit-identical and the largest difference. Identical at every multiple of the kernels' row group and
different elsewhere is what ragate relies on (it reuses multiples of 16); then the same prompt cut a few tokens
before its end, since a batch of fewer than 8 tokens takes another kernel (ragate always evaluates at least 32).

Part 2, the saving: ``--prompts`` reading prompts of the kind an eval makes for one question (3 passages, then
the same passages under another instruction, a fourth passage added, ...), each generated (8 tokens) from a
cleared cache and again inside ``exact_prefix_reuse``: CPU seconds both ways, prompt tokens reused, and whether
every generation is the same bit for bit. One thread (pin it with ``taskset -c N`` beside other work); CPU seconds
are the figure on this shared machine.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

from ragate.backends.llamacpp import LlamaCppBackend
from ragate.models import resolve_model
from ragate.retrieval.corpus import demo_dir
from ragate.types import GenerationRequest, Message

SPLITS = (1, 2, 3, 4, 5, 8, 15, 16, 17, 32, 33, 63, 64, 100, 101, 128, 255, 256, 300, 302)


def _passages() -> list[str]:
    with (demo_dir() / "passages.jsonl").open() as f:
        return [json.loads(line)["text"] for line in f]


def _messages(texts: list[str], instruction: str, question: str) -> tuple[Message, ...]:
    body = f"{instruction}\n\n" + "\n\n".join(f"[{i + 1}] {t}" for i, t in enumerate(texts))
    return (Message("user", f"{body}\n\nQuestion: {question}\nAnswer:"),)


def split_check(lm: LlamaCppBackend, texts: list[str]) -> None:
    llm: Any = lm._llm  # the engine itself: this check is about llama.cpp, below ragate's loop
    first = lm.tokenize(_messages(texts[:3], "Answer from the passages.", "Who is it about?"))
    second = lm.tokenize(_messages(texts[:2] + texts[3:4], "Answer from the passages.", "When was it?"))
    shared = next((i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b), len(second))

    llm.reset()
    llm.eval(second)
    fresh = lm._last_logits()
    print(f"Part 1: prompt of {len(second)} tokens, {shared} shared with the one evaluated before it")
    print("| split at | multiple of 4 | of 16 | logits identical | largest difference |")
    print("|---:|---|---|---|---:|")
    for k in [s for s in SPLITS if s < shared] + [shared]:
        llm.reset()
        llm.eval(first)
        llm.n_tokens = k
        llm.eval(second[k:])
        got = lm._last_logits()
        same = bool(np.array_equal(fresh, got))
        print(f"| {k} | {k % 4 == 0} | {k % 16 == 0} | {same} | {float(np.abs(fresh - got).max()):.2e} |")
    print("\nThe same prompt restored whole but for its last tokens (split at a multiple of 4):")
    print("| tokens evaluated after the split | logits identical |")
    print("|---:|---|")
    llm.reset()
    llm.eval(second)  # once: the split points only move back, so what stays before each is this evaluation's
    for k in [len(second) - s for s in range(1, 37) if (len(second) - s) % 4 == 0]:
        llm.n_tokens = k
        llm.eval(second[k:])
        print(f"| {len(second) - k} | {bool(np.array_equal(fresh, lm._last_logits()))} |")


def saving(lm: LlamaCppBackend, texts: list[str], n: int) -> None:
    instructions = ("Answer from the passages.", "Answer the question in a few words, using the passages.")
    requests = []
    for i in range(n):
        chosen = texts[: 3 + (i // 4) % 2]  # 3 passages, then a fourth added
        requests.append(
            GenerationRequest(
                _messages(chosen, instructions[(i // 2) % 2], f"Question number {i}: who or what?"),
                max_tokens=8,
                top_logprobs=3,
            )
        )
    results: dict[str, tuple[float, list[Any], int]] = {}
    for arm in ("cleared", "reuse"):
        lm.drop_prompt_states()
        gens, reused = [], 0
        cpu = time.process_time()
        for r in requests:
            lm.clear_cache()
            if arm == "reuse":
                with lm.exact_prefix_reuse() as reuse:
                    gens.append(lm.generate([r])[0])
                reused += reuse.tokens
            else:
                gens.append(lm.generate([r])[0])
        results[arm] = (time.process_time() - cpu, gens, reused)
    fields = ("token_ids", "logprobs", "entropies", "top_logprobs")
    same = all(
        all(getattr(a, f) == getattr(b, f) for f in fields)
        for a, b in zip(results["cleared"][1], results["reuse"][1], strict=True)
    )
    tokens = sum(g.prompt_tokens for g in results["cleared"][1])
    (c_cpu, _, _), (r_cpu, _, reused) = results["cleared"], results["reuse"]
    print(f"\nPart 2: {n} prompts, {tokens} prompt tokens, 8 tokens generated each")
    print("| arm | CPU s | prompt tokens from a kept state | generations identical to cleared |")
    print("|---|---:|---:|---|")
    print(f"| cleared cache before every call | {c_cpu:.1f} | 0 | - |")
    print(f"| exact_prefix_reuse | {r_cpu:.1f} | {reused} ({reused / tokens:.0%}) | {same} |")
    print(f"CPU ratio cleared / reuse: {c_cpu / r_cpu:.2f}x")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--prompts", type=int, default=12)
    args = p.parse_args(argv)
    lm = LlamaCppBackend(resolve_model(args.model), name=args.model, n_threads=1)
    try:
        texts = _passages()
        print(f"{args.model}, llama.cpp, one thread\n")
        split_check(lm, texts)
        saving(lm, texts, args.prompts)
    finally:
        lm.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
