"""Replay a first-format ``benchmarks/gate_overhead.py`` output (one line per question and gate, no arm) as a table.

    .venv/bin/python scripts/gate_overhead_v1.py benchmarks/results/gate_overhead_nq100.jsonl

The files of 2026-11-22 predate the arms that ``gate_overhead.py --report`` reads. For each gate it prints the
retrieval rate, CPU seconds per question, the paired floor (an oracle gate that costs nothing and retrieves for
the same questions: the mean over questions of t(never, q) + [retrieved q] * (t(always, q) - t(never, q))) and the
overhead over it in CPU seconds, wall seconds and tokens. Questions missing a gate, never or always are left out.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: gate_overhead_v1.py FILE.jsonl", file=sys.stderr)
        return 2
    rows: dict[str, dict[int, dict]] = defaultdict(dict)  # type: ignore[type-arg]
    for line in Path(argv[0]).read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if "thresholds" in record:
            print("thresholds: " + ", ".join(f"{g} {t:.4g}" for g, t in record["thresholds"].items()))
        elif "q" in record and "gate" in record:
            rows[record["gate"]][record["q"]] = record
    never, always = rows["never"], rows["always"]
    t_never = sum(r["cpu"] for r in never.values()) / len(never)
    t_read = sum(always[q]["cpu"] - never[q]["cpu"] for q in always if q in never) / len(always)
    print(f"t(never) = {t_never:.3f} CPU-s/question; t(retrieval + context decode) = {t_read:.3f} CPU-s ({len(never)} q)")
    print()
    print("| gate | retrieval rate | CPU-s / question | paired floor | overhead (CPU) | overhead (wall) | overhead (tokens) |")
    print("|---|---|---|---|---|---|---|")
    for gate, by_q in rows.items():
        qs = [q for q in by_q if q in never and q in always]
        n = len(qs)
        sums = {}
        for key in ("cpu", "seconds", "tokens"):
            cost = sum(by_q[q][key] for q in qs)
            floor = sum(
                never[q][key] + (always[q][key] - never[q][key]) * bool(by_q[q]["retrieved"]) for q in qs
            )
            sums[key] = (cost / n, floor / n, 100 * (cost - floor) / floor)
        rate = sum(bool(by_q[q]["retrieved"]) for q in qs) / n
        cpu, wall, tokens = sums["cpu"], sums["seconds"], sums["tokens"]
        print(
            f"| {gate} | {rate:.2f} | {cpu[0]:.3f} | {cpu[1]:.3f} | {cpu[2]:+.1f}% | {wall[2]:+.1f}% | "
            f"{tokens[2]:+.1f}% |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
