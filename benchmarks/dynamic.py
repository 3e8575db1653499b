"""Dynamic RAG on HotpotQA: accuracy, retrievals and seconds per method, and what the cached loop saves.

    # accuracy, retrievals/q, s/q of ETC, DRAGIN, FLARE, IRCoT, RALM, Single RAG and w/o RAG (a `ragate eval` run)
    .venv/bin/python benchmarks/dynamic.py quality --questions 100 --model qwen2.5-coder-1.5b \
        --index ~/.cache/ragate/indexes/pooled-dense --out benchmarks/results/dynamic-qwen
    .venv/bin/python benchmarks/dynamic.py quality --questions 20 --engine transformers --out ...   # attention forms

    # ETC and DRAGIN with the cached loop and with the naive one (the whole sequence re-run at every token)
    .venv/bin/python benchmarks/dynamic.py speed --questions 3 --engine transformers --out benchmarks/results/dynamic_speed.jsonl

    # a quality run stopped part-way: its tables over the questions every method has answered
    .venv/bin/python benchmarks/dynamic.py table benchmarks/results/dynamic-qwen

    # two processes on two cores: the second takes questions 78-100 into its own folder; `table` joins folders
    .venv/bin/python benchmarks/dynamic.py quality --questions 100 --start 77 ... --out benchmarks/results/dynamic-qwen-b
    .venv/bin/python benchmarks/dynamic.py table benchmarks/results/dynamic-qwen benchmarks/results/dynamic-qwen-b

    # ETC's questions split by whether it retrieved: each method's EM, paired intervals, recall@3, query words
    .venv/bin/python benchmarks/dynamic.py split docs/results/runs/dynamic-hotpotqa-qwen2.5-coder-1.5b-300

``quality`` is ``ragate eval`` on the ``hotpotqa`` split with the dynamic methods (resumable: rerun with the same
``--out``); it prints the run's tables (EM/F1/acc, retrieval rate, retrievals per question, seconds per question,
and where the first retrieval happened). ``speed`` runs each question through each method twice in the same
process, once with the backends' key/value cache (the loop of :mod:`ragate.dynamic.loop`) and once with
``recompute=True`` (every token re-runs the whole prompt and answer so far, as a loop without a cache would), and
prints CPU seconds per question for both, their ratio, and whether the retrieval positions and outputs are the
same. CPU seconds (time.process_time, all threads) are the figure, since this machine is shared; wall seconds are
kept in the JSONL too. Rows are written as they finish; rerunning with the same ``--out`` resumes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

QUALITY_METHODS = ("etc", "dragin", "flare", "ircot", "ralm", "single-rag", "wo-rag")
SPEED_METHODS = ("etc", "dragin")


def quality(args: argparse.Namespace) -> int:
    from ragate.eval.datasets import load_dataset
    from ragate.eval.run import EvalConfig, run_eval
    from ragate.eval.summary import dynamic_table, summary_table

    if not 0 <= args.start < args.questions:
        print(
            f"--start must be in [0, --questions); got {args.start} with --questions {args.questions}",
            file=sys.stderr,
        )
        return 2
    config = EvalConfig(
        dataset=args.dataset,
        methods=tuple(args.methods.split(",")) if args.methods else QUALITY_METHODS,
        model=args.model,
        engine=args.engine,
        index=str(Path(args.index).expanduser()) if args.index else None,
        limit=args.questions,
        seed=args.start,  # question i of the slice gets seed start + i, as in an unsliced run
        extra={"start": args.start} if args.start else {},
    )
    out = Path(args.out)
    # the examples keep their dataset name, so the dataset's few-shot prompts apply as in an unsliced run
    examples = load_dataset(args.dataset, limit=args.questions)[args.start :]
    results = run_eval(
        config, out, resume=(out / "config.json").exists(), examples=examples, workers=args.workers
    )
    print(
        f"{args.dataset}, questions {args.start + 1}-{args.questions}, model {args.model or 'smollm2-135m'} "
        f"on {args.engine}"
    )
    print(summary_table(results["summary"]))
    print(dynamic_table(results["summary"]))
    return 0


def _records(outs: list[Path]) -> list[dict[str, Any]] | None:
    """The latest answer per (question, method) of the ``quality`` folders ``outs``, errors left out, in file
    (question) order; None, with a message, where a folder has no ``questions.jsonl``."""
    from ragate.eval.records import latest, read_records

    if missing := [str(o) for o in outs if not (o / "questions.jsonl").is_file()]:
        print(f"no questions.jsonl in {', '.join(missing)}: give a `quality --out` folder", file=sys.stderr)
        return None
    return [
        r
        for r in latest(r for out in outs for r in read_records(out / "questions.jsonl"))
        if "error" not in r
    ]


def _split_fault(row: dict[str, Any]) -> str | None:
    """What is wrong with one line of the speed run's ``--out`` (one loop on one question), else None."""
    missing = [k for k in ("id", "method", "loop", "cpu", "wall", "positions", "generated_tokens") if k not in row]
    return f"no {', '.join(missing)} in this line (not a dynamic.py speed file?)" if missing else None


def split(args: argparse.Namespace) -> int:
    """Where a trigger method gains or loses: the questions where it retrieved and those where it did not, each
    method's EM on both halves, paired intervals of the trigger method against the others (question order, as
    ``ragate report``), recall@3 on each half, and every method's mean query length in words."""
    from ragate.eval.metrics import Resampling
    from ragate.eval.summary import differences_table, paired_differences

    boot = Resampling(args.resamples, args.seed)

    records = _records([Path(o) for o in args.out])
    if records is None:
        return 2
    by: dict[str, dict[str, dict[str, Any]]] = {}
    for r in records:
        by.setdefault(r["method"], {})[r["id"]] = r
    if args.method not in by:
        print(f"no answers from {args.method}; the run's methods are {', '.join(by)}", file=sys.stderr)
        return 2
    ids = [i for i in by[args.method] if all(i in answers for answers in by.values())]
    for fired in (True, False):
        half = {i for i in ids if bool(by[args.method][i]["retrieved"]) is fired}
        rows = [r for r in records if r["id"] in half]
        print(
            f"\n{args.method} {'retrieved' if fired else 'did not retrieve'} on {len(half)} of {len(ids)} questions"
        )
        for m, answers in by.items():
            em = statistics.fmean(answers[i]["scores"]["em"] for i in half) if half else float("nan")
            recall = [answers[i]["recall@3"] for i in half if answers[i].get("recall@3") is not None]
            line = f"  {m}: EM {100 * em:.1f}"
            if recall:
                line += f", recall@3 {100 * statistics.fmean(recall):.1f} (on {len(recall)})"
            print(line)
        compare = [(args.method, m) for m in by if m != args.method]
        print(differences_table(paired_differences(rows, "em", against=(), compare=compare, boot=boot), "em"))
    print()
    for m, answers in by.items():
        queries = [q for i in ids for q in answers[i].get("trace", {}).get("queries", [])]
        if queries:
            words = statistics.fmean(len(q.split()) for q in queries)
            print(f"{m}: {len(queries)} queries, {words:.1f} words on average")
    return 0


def table(args: argparse.Namespace) -> int:
    """The tables of a ``quality`` run so far, over the questions that every method has answered (a run stopped
    mid-way has answered the first questions with some methods only, since methods rotate per question)."""
    from ragate.eval.summary import dynamic_table, summarize, summary_table

    outs = [Path(o) for o in args.out]
    label = " + ".join(map(str, outs))
    records = _records(outs)
    if records is None:
        return 2
    methods = list(dict.fromkeys(r["method"] for r in records))
    if args.methods:
        methods = [m for m in args.methods.split(",") if m in methods]
    answered: dict[str, set[str]] = {}
    for r in records:
        answered.setdefault(r["id"], set()).add(r["method"])
    common = {q for q, ms in answered.items() if ms >= set(methods)}
    if not common:
        print(f"{label}: no question has been answered by all of {', '.join(methods)} yet", file=sys.stderr)
        return 1
    rows = summarize([r for r in records if r["id"] in common], methods)
    print(f"{label}: {len(common)} questions answered by all {len(methods)} methods")
    print(summary_table(rows))
    print(dynamic_table(rows))
    return 0


def speed(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from ragate.backends import load_backend
    from ragate.dynamic.etc import load_stop_words
    from ragate.dynamic.loop import run_dynamic
    from ragate.eval.datasets import load_dataset
    from ragate.eval.records import RecordWriter, read_records
    from ragate.methods import get_method
    from ragate.retrieval.demo import demo_index
    from ragate.retrieval.index import open_index

    out = Path(args.out)
    done = {(r["id"], r["method"], r["loop"]) for r in read_records(out, fault=_split_fault)}
    examples = load_dataset(args.dataset, limit=args.questions)
    methods = args.methods.split(",") if args.methods else list(SPEED_METHODS)
    stop_words = load_stop_words()
    jobs = [(ex, m, loop) for ex in examples for m in methods for loop in ("cached", "naive")]
    todo = [j for j in jobs if (j[0].id, j[1], j[2]) not in done]
    with (
        open_index(Path(args.index).expanduser() if args.index else demo_index()) as retriever,
        load_backend(args.model, args.engine) as lm,
        RecordWriter(out) as writer,
    ):
        for ex, method, loop in tqdm(todo, desc="dynamic speed", unit="run"):
            spec = get_method(method)
            lm.clear_cache()
            cpu, wall = time.process_time(), time.perf_counter()
            trace = run_dynamic(
                spec,
                ex.question,
                lm,
                retriever,
                dataset=ex.dataset,
                recompute=loop == "naive",
                stop_words=stop_words,
            )
            info = trace.dynamic
            assert info is not None
            writer.append(
                {
                    "id": ex.id,
                    "method": method,
                    "loop": loop,
                    "engine": args.engine,
                    "cpu": time.process_time() - cpu,
                    "wall": time.perf_counter() - wall,
                    "positions": [[e.at_token, e.generated] for e in info.retrievals],
                    "generated_tokens": info.generated_tokens,
                    "output": info.output,
                }
            )
    rows = [r for r in read_records(out, fault=_split_fault) if r["method"] in methods]
    print(f"{args.dataset}: cached loop vs naive loop, model {args.model or 'smollm2-135m'} on {args.engine}")
    print(
        "| method | questions | cached CPU s/q | naive CPU s/q | naive / cached | same positions | same output |"
    )
    print("|---|---|---|---|---|---|---|")
    for method in methods:
        if (cells := speed_cells(rows, method)) is not None:
            print(f"| {method} | {cells} |")
    return 0


def speed_cells(rows: list[dict[str, Any]], method: str) -> str | None:
    """The cached-against-naive cells of one method's row (questions, CPU s/q each way, their ratio, and how many
    questions retrieved at the same positions and wrote the same output); None where no question has both."""
    cached = {r["id"]: r for r in rows if r["method"] == method and r["loop"] == "cached"}
    naive = {r["id"]: r for r in rows if r["method"] == method and r["loop"] == "naive"}
    ids = sorted(cached.keys() & naive.keys())
    if not ids:
        return None
    c = statistics.fmean(cached[i]["cpu"] for i in ids)
    n = statistics.fmean(naive[i]["cpu"] for i in ids)
    same_pos = sum(cached[i]["positions"] == naive[i]["positions"] for i in ids)
    same_out = sum(cached[i]["output"] == naive[i]["output"] for i in ids)
    return f"{len(ids)} | {c:.2f} | {n:.2f} | {n / c:.1f}x | {same_pos}/{len(ids)} | {same_out}/{len(ids)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="mode", required=True)
    for name, default_out in (
        ("quality", "benchmarks/results/dynamic-hotpotqa"),
        ("speed", "benchmarks/results/dynamic_speed.jsonl"),
    ):
        p = sub.add_parser(name)
        p.add_argument("--questions", type=int, default=100 if name == "quality" else 3)
        p.add_argument("--dataset", default="hotpotqa")
        p.add_argument("--methods", default=None, help="comma-separated (default: the issue's list)")
        p.add_argument("--model", default=None, help="a known model name or GGUF path (default SmolLM2-135M)")
        p.add_argument("--engine", default="llama.cpp", choices=["llama.cpp", "transformers"])
        p.add_argument("--index", default=None, help="index directory (default: the demo index)")
        p.add_argument("--out", default=default_out)
    sub.choices["quality"].add_argument(
        "--start",
        type=int,
        default=0,
        help="skip the first START of the --questions (a second process's share)",
    )
    sub.choices["quality"].add_argument(
        "--workers",
        type=int,
        default=1,
        help="shard the questions over N processes, each pinned to its own core (ragate eval --workers)",
    )
    t = sub.add_parser("table", help="a quality run's tables so far, on the questions every method answered")
    t.add_argument("out", nargs="+", help="the quality run's --out folder(s); several are joined")
    t.add_argument("--methods", default=None, help="comma-separated subset (default: all in the run)")
    sp = sub.add_parser(
        "split", help="where a trigger method gains or loses: the questions it retrieved on or not"
    )
    sp.add_argument("out", nargs="+", help="the run's folder(s); several are joined")
    sp.add_argument("--method", default="etc", help="the trigger method whose retrievals split the questions")
    sp.add_argument("--seed", type=int, default=0, help="the paired intervals' numpy seed")
    sp.add_argument("--resamples", type=int, default=1000, help="the paired intervals' resamples")
    args = parser.parse_args(argv)
    return {"quality": quality, "speed": speed, "table": table, "split": split}[args.mode](args)


if __name__ == "__main__":
    sys.exit(main())
