"""What a route cascade's stop checks cost against the routes it runs (issue 78's target: at most 5% CPU).

    taskset -c 0 .venv/bin/python benchmarks/route_checks.py [--model smollm2-135m] [--questions 10] \
        [--routes wo-rag,single-rag,ircot] [--threshold TAU] [--repeats 200]

The route method (``ragate.methods.route``) answers each of the first ``--questions`` demo questions over the demo
index, cheapest route first. The paired floor is what the cascade cannot avoid on the same questions: the CPU
seconds of the routes it ran (each route's call timed by the process's CPU time, all threads). The checks are
:func:`ragate.methods.route.check_answer`, the code the cascade runs after each route but the last (the answer's
normalised NLL from its stages, agreement with the route before, the answer found in the passages it read): on the
same traces, each stage's checks are run ``--repeats`` times and the median CPU time is taken (one run is below
the clock's resolution). Overhead = checks / floor. No model call is in the checks, so their cost does not grow
with the model while the routes' does: the small default model is the hard case for the target.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from ragate.backends import load_backend
from ragate.eval.datasets import load_dataset
from ragate.methods import get_method, run_method
from ragate.methods.configure import configure_method
from ragate.methods.route import check_answer, route_specs, run_route, stop_thresholds
from ragate.methods.spec import MethodSpec
from ragate.methods.trace import Trace
from ragate.retrieval.demo import demo_index
from ragate.retrieval.index import open_index


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="default: smollm2-135m")
    p.add_argument("--questions", type=int, default=10, help="the first N demo questions (default 10)")
    p.add_argument("--routes", default="wo-rag,single-rag,ircot")
    p.add_argument("--threshold", type=float, default=None, help="every stage's NLL stop threshold (default DTR's)")
    p.add_argument("--repeats", type=int, default=200, help="runs of each stage's checks to time (median)")
    args = p.parse_args()
    spec = configure_method(get_method("route"), None, None, None, None, None, routes=args.routes.split(","))
    spec = spec.with_threshold(args.threshold)
    assert spec.route is not None
    route = spec.route
    stops = stop_thresholds(route)
    questions = [ex.question for ex in load_dataset("demo")][: args.questions]
    started = time.perf_counter()
    floor, checks_cpu, stages = 0.0, 0.0, 0
    per_kind: dict[str, float] = {}
    with load_backend(args.model, "llama.cpp") as lm, open_index(demo_index(progress=False)) as retriever:
        print(f"{len(questions)} demo questions, routes {', '.join(route.routes)}, {lm.model} on llama.cpp "
              f"({lm.thread_counts}); stop thresholds {', '.join(f'{s:g}' for s in stops)}; checks timed "
              f"{args.repeats} times each (median)")  # fmt: skip
        print("| question | route taken | routes run | routes' CPU s (floor) | checks' CPU ms | overhead |")
        print("|---|---|---|---|---|---|")
        for i, question in enumerate(questions, 1):
            ran: list[tuple[MethodSpec, Trace]] = []
            cpu = 0.0

            def one(s: MethodSpec, question: str = question, ran: list[tuple[MethodSpec, Trace]] = ran) -> Trace:
                nonlocal cpu
                t0 = time.process_time()
                trace = run_method(s, question, lm, retriever, dataset="demo")
                cpu += time.process_time() - t0
                ran.append((s, trace))
                return trace

            trace = run_route(spec, question, one)
            assert trace.route is not None
            spent = 0.0
            for j, (s, t) in enumerate(ran[: len(route_specs(route)) - 1]):
                before = ran[j - 1][1] if j else None
                times = []
                for _ in range(args.repeats):
                    t0 = time.process_time()
                    _, met = check_answer(route, s.name, t, before, stops[j])
                    times.append(time.process_time() - t0)
                spent += statistics.median(times)
                stages += 1
                for c in met:
                    per_kind[c.kind] = per_kind.get(c.kind, 0) + 1
            floor += cpu
            checks_cpu += spent
            print(f"| {i} | {trace.route.taken} | {len(ran)} | {cpu:.2f} | {1000 * spent:.3f} | "
                  f"{100 * spent / cpu:.4f}% |", flush=True)  # fmt: skip
    kinds = ", ".join(f"{k} {n}" for k, n in per_kind.items())
    print(f"\nover {len(questions)} questions: routes' CPU {floor:.2f} s (the paired floor), the checks' "
          f"{1000 * checks_cpu:.3f} ms at {stages} stages ({kinds} checks read): overhead "
          f"{100 * checks_cpu / floor:.4f}% of the floor (target: at most 5%)")  # fmt: skip
    print(f"({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
