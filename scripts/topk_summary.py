"""A short summary of benchmarks/topk_fidelity.py's committed table, for the README.

    .venv/bin/python scripts/topk_summary.py [benchmarks/results/topk_fidelity.txt]

Reads the output ``topk_fidelity.py table`` printed (committed in benchmarks/results/topk_fidelity.txt) and prints,
per gate, NQ-open and HotpotQA side by side: the AUROC from the full distribution ("exact"), the change in AUROC
with only the top 20 logprobs (with its paired bootstrap 95% interval; TARG's entropy with the capped estimator),
and the AUROC with no logprobs at all ("unavailable" where the gate cannot run without them).
"""

from __future__ import annotations

import sys
from pathlib import Path

TOP20 = {"targ-entropy": "top-20/capped"}


def parse(text: str) -> dict[str, dict[tuple[str, str], list[str]]]:
    """dataset -> (gate, form) -> the row's cells."""
    out: dict[str, dict[tuple[str, str], list[str]]] = {}
    dataset = None
    for line in text.splitlines():
        if line.startswith("### "):
            dataset = line[4:].split(":")[0].strip()
            out[dataset] = {}
        elif (
            dataset
            and line.startswith("|")
            and not line.startswith("|---")
            and not line.startswith("| gate ")
        ):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            out[dataset][(cells[0], cells[1])] = cells
    return out


def main(argv: list[str]) -> int:
    path = Path(argv[0] if argv else "benchmarks/results/topk_fidelity.txt")
    data = parse(path.read_text(encoding="utf-8"))
    datasets = list(data)
    gates = list(dict.fromkeys(g for rows in data.values() for g, _ in rows))

    def cell(gate: str, form: str, column: int, empty: str = "-") -> str:
        values = []
        for d in datasets:
            row = data[d].get((gate, form))
            values.append((row[column] or empty) if row and len(row) > column else empty)
        return " / ".join(values)

    names = " / ".join("NQ" if d.startswith("nq") else "HotpotQA" if d == "hotpotqa" else d for d in datasets)
    print(
        f"| gate | AUROC, full distribution ({names}) | Δ AUROC at top-20 [95% CI] | AUROC with no logprobs |"
    )
    print("|---|---|---|---|")
    for g in gates:
        top20 = TOP20.get(g, "top-20")
        label = f"{g} ({top20.split('/')[1]})" if "/" in top20 else g
        print(f"| {label} | {cell(g, 'exact', 2)} | {cell(g, top20, 3)} | {cell(g, 'none', 2)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
