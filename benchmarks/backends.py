"""Speed of each local backend on the default model: load, prompt and generation throughput, top-5 cost.

    .venv/bin/python benchmarks/backends.py [--model smollm2-135m] [--repeats 3] [--engines llama.cpp,transformers]

For each engine it prints: seconds to load; prompt tokens/s (a ~400-token prompt, cache defeated); generated
tokens/s with top_logprobs=0 and with top_logprobs=5, and the extra cost of the top-5 lists; and, as a reference,
the engine's own generation loop (``Llama.create_completion`` / ``model.generate``) on the same prompt, so the
cost of ragate's per-token bookkeeping (logprob, entropy, offsets) is visible. Medians over ``--repeats`` runs;
this machine is shared and noisy, so compare ratios within one run rather than absolute numbers across runs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from ragate.backends import load_backend
from ragate.types import GenerationRequest

PARAGRAPH = (
    "The Loire is the longest river in France. It rises in the southeastern quarter of the Massif Central "
    "and flows north through Nevers to Orleans, then west through Tours and Nantes to the Bay of Biscay. "
)
GEN_PROMPT = "Write a long story about a lighthouse keeper and a storm.\n\nOnce upon a time,"
GEN_TOKENS = 64


def median_time(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def bench_engine(engine: str, model: str | None, repeats: int) -> dict[str, float]:
    t0 = time.perf_counter()
    backend = load_backend(model, engine)
    load_s = time.perf_counter() - t0
    row: dict[str, float] = {"load_s": load_s}

    counter = iter(range(10**6))

    def prompt_run() -> Any:  # a different first word each time, so no prefix is cached
        text = f"Run {next(counter)}. " + PARAGRAPH * 8 + "\nSummary:"
        return backend.generate([GenerationRequest(text, max_tokens=1, top_logprobs=0)])[0]

    prompt_run()  # warm-up
    secs, gen = median_time(prompt_run, repeats)
    row["prompt_tokens"] = gen.prompt_tokens
    row["prompt_tok_s"] = gen.prompt_tokens / secs

    def gen_run(k: int) -> Callable[[], Any]:
        # a fresh prompt prefix per call would add prompt cost; the cache keeps it at one re-evaluated token
        return lambda: backend.generate(
            [GenerationRequest(GEN_PROMPT, max_tokens=GEN_TOKENS, top_logprobs=k)]
        )[0]

    for k in (0, 5):
        secs, gen = median_time(gen_run(k), repeats)
        row[f"gen_tok_s_top{k}"] = gen.completion_tokens / secs
    row["top5_extra_pct"] = 100.0 * (row["gen_tok_s_top0"] / row["gen_tok_s_top5"] - 1.0)
    row["engine_own_tok_s"] = engine_reference(engine, backend, repeats)
    backend.close()
    return row


def engine_reference(engine: str, backend: Any, repeats: int) -> float:
    """Tokens/s of the engine's own greedy loop on the same prompt and model (no per-token logprobs)."""
    if engine == "llama.cpp":
        llm = backend._llm

        def run() -> int:
            llm.reset()
            out = llm.create_completion(
                GEN_PROMPT, max_tokens=GEN_TOKENS, temperature=0.0, repeat_penalty=1.0
            )
            return int(out["usage"]["completion_tokens"])

    else:
        import torch

        ids = torch.tensor([backend.tokenize(GEN_PROMPT)])

        def run() -> int:
            with torch.inference_mode():
                out = backend.hf_model.generate(
                    ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=GEN_TOKENS
                )
            return int(out.shape[1] - ids.shape[1])

    secs, n = median_time(run, repeats)
    return n / secs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model name or path (default: smollm2-135m)")
    parser.add_argument("--engines", default="llama.cpp,transformers")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = {engine: bench_engine(engine, args.model, args.repeats) for engine in args.engines.split(",")}
    print(
        f"model: {args.model or 'smollm2-135m'}; medians of {args.repeats} runs; {GEN_TOKENS} generated tokens\n"
    )
    print(
        "| engine | load s | prompt tok/s | gen tok/s (top-0) | gen tok/s (top-5) | top-5 extra | engine's own loop tok/s |"
    )
    print("|---|---|---|---|---|---|---|")
    for engine, r in rows.items():
        print(
            f"| {engine} | {r['load_s']:.2f} | {r['prompt_tok_s']:.0f} ({r['prompt_tokens']:.0f}-token prompt) | "
            f"{r['gen_tok_s_top0']:.1f} | {r['gen_tok_s_top5']:.1f} | {r['top5_extra_pct']:+.1f}% | "
            f"{r['engine_own_tok_s']:.1f} |"
        )


if __name__ == "__main__":
    main()
