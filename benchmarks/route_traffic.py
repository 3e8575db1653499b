"""A route policy learned from traffic against the cascade in force, replayed from route runs' records (issue 78:
labels per route from traffic); no model call.

    .venv/bin/python benchmarks/route_traffic.py RUN [RUN ...] [--routes wo-rag,single-rag] [--budget 0.5]
        [--seeds 0,1,2] [--resamples 1000] [--interval-seed 0]

On each seed the questions both routes answered in the runs are split in halves (seeded). The NLL cascade in force
is tuned on the first half for ``--budget`` mean retrievals per question (what ``ragate calibrate --gate route
--from-sweep RUN --budget B`` saves); the second half is the traffic it then answered: its stops there are the
decisions in force, and each answer has both paths labelled, as references with shadow work label them
(:mod:`ragate.learning.route_traffic`). The learned policy fitted on that traffic is compared with those decisions
as ``Pipeline.learn_routes(use=True)`` and ``ragate serve --refit-every`` compare it
(:func:`ragate.learning.route_traffic.compare_with_in_force`): cross-fitted on halves of the traffic, stopping as
many answers closed-book as the cascade did, scored by the paths each ends on. Per seed it prints the traffic's
size, the answers stopped, each one's score, the paired difference with its bootstrap 95% interval and whether the
new policy would go in force.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ragate.learning.fit import gap_verdict
from ragate.learning.route_traffic import compare_with_in_force
from ragate.report.routes import cascade, halves, read_route_table, tune_stops


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="eval runs of both routes (one per dataset)")
    p.add_argument("--routes", default="wo-rag,single-rag", help="the closed-book route and the one-retrieval route")
    p.add_argument("--budget", type=float, default=0.5, help="the cascade's mean retrievals per question")
    p.add_argument("--seeds", default="0,1,2,3,4,5,6,7,8,9")
    p.add_argument("--metric", choices=("em",), default="em", help="the comparison scores EM, as the store's labels")
    p.add_argument("--resamples", type=int, default=1000, help="the bootstrap's resamples")
    p.add_argument("--interval-seed", type=int, default=0, help="the bootstrap's seed")
    args = p.parse_args(argv)
    routes = tuple(args.routes.split(","))
    if len(routes) != 2:
        p.error("traffic labels two routes: --routes CLOSED-BOOK,ONE-RETRIEVAL")
    table = read_route_table(args.runs, routes)
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"{len(table)} questions answered by {' and '.join(routes)}; per seed, the cascade in force tuned on one "
          f"half for {args.budget:g} retrievals per question, the other half its traffic; EM x 100; intervals: seed "
          f"{args.interval_seed}, {args.resamples} resamples")  # fmt: skip
    print()
    print("| seed | traffic | stopped closed-book | in force (NLL cascade) | learned from the traffic | learned minus in "
          "force (paired 95%) | goes in force |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    went = 0
    for seed in seeds:
        (traffic, tuning), _ = halves(len(table), seed)
        stops = tune_stops(table.take(tuning), args.budget, args.metric, agree=False)
        served = table.take(traffic)
        stopped = cascade(served, stops, agree=False) == 0
        compared = compare_with_in_force(served, stopped, seed=seed, samples=args.resamples,
                                         interval_seed=args.interval_seed)  # fmt: skip
        if compared is None:
            print(f"| {seed} | {len(served)} | {int(stopped.sum())} | – | – | too few stopped or not to compare | yes |")
            went += 1
            continue
        g = compared.gap
        verdict = gap_verdict(g).replace(" either way", "")
        went += compared.earns
        print(f"| {seed} | {compared.n} | {compared.stopped} | {100 * compared.in_force:.1f} | "
              f"{100 * compared.learned:.1f} | {100 * g[0]:+.1f} [{100 * g[1]:+.1f}, {100 * g[2]:+.1f}] ({verdict}) | "
              f"{'yes' if compared.earns else 'no'} |")  # fmt: skip
    print()
    print(f"the learned policy would go in force on {went} of {len(seeds)} seeds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
