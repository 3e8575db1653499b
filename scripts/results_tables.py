"""Every table of docs/results.md and the README's headline, printed from the committed run records by one spec.

    .venv/bin/python scripts/results_tables.py docs/results/spec.toml            # every table, framed as blocks
    .venv/bin/python scripts/results_tables.py docs/results/spec.toml --only NAME

The spec (TOML) names the runs, and per table what to compute; nothing in a table is typed by hand but the paper's
own numbers and the row labels. Each block is framed with ``<!-- block: NAME -->`` so scripts/render_docs.py
writes it between the page's ``begin generated`` / ``end generated`` markers (tests/test_generated_docs.py checks
that the pages equal this output).

A *side* of a comparison is ``RUN:WHAT`` where RUN is a name from the spec's ``[runs]`` and WHAT is

- ``METHOD``: an eval run's answers of that method, or a sweep's method at its default threshold (as
  ``ragate report --sweep`` takes it);
- ``never@FAMILY`` / ``always@FAMILY``: a sweep family's closed-book or retrieval answers (FAMILY: the family key
  or its first field, e.g. ``targ-question-first``);
- ``GATE@rho=R``: a swept gate retrieving where its score exceeds tau = F^-1(1 - R) of its own scores (TARG §3.3,
  blind to the answers), the closed-book answer elsewhere;
- ``GATE@top=R``: the same gate retrieving for exactly round(n R) questions, those it scores highest (a matched
  rate: two gates then differ only in which questions they pick);
- ``random@GATE@rho=R``: a random gate at the rate that ``GATE@rho=R`` reaches, with the same reader: its expected
  score on a question is rate x retrieval + (1 - rate) x closed-book.

Intervals are paired percentile bootstraps over the questions both sides answered
(:func:`ragate.eval.metrics.paired_bootstrap_diff`) with the spec's ``samples`` and ``seed``. Verdicts follow one
rule. A plain difference is "higher" or "lower" when its interval excludes 0, else "not established". A claim row
has the paper's direction (``expect``): "holds" when the interval excludes 0 on that side, "against" when it
excludes 0 on the other, "not established" when it reaches 0; ``expect = "not lower"`` (a paper's "at no cost")
can only be "against" (the interval below 0) or "not established" (equivalence would need a margin the papers do
not give), and "not higher" the mirror. A claim's verdict is also taken under the spec's ``stability_seeds``
bootstrap seeds from ``seed`` on; where some give another verdict, it reads "holds (fragile: k of N seeds)". A row on a score's ranking (AUROC) is "too few (N of n ...)" when the rarer
class has fewer than 10 questions. Where the paper gives a number, the row says whether it lies inside the
interval.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ragate.eval.metrics import Resampling, bootstrap_ci, paired_bootstrap_diff
from ragate.eval.records import by_method, latest, read_records
from ragate.eval.sweep import compact, default_records, method_records
from ragate.eval.thresholds import threshold_for_budget
from ragate.report.matched import (
    matched_markdown,
    point_label,
    references,
    single_point,
    swept_point,
)

ROOT = Path(__file__).resolve().parents[1]
METRIC_NAME = {"em": "EM", "f1": "F1", "acc": "acc"}
EXPECT = ("higher", "lower", "not lower", "not higher")


class SpecError(SystemExit):
    def __init__(self, message: str) -> None:
        super().__init__(f"error: {message}")


class Results:
    """The spec's runs, each read once."""

    def __init__(self, spec: Mapping[str, Any], root: Path = ROOT) -> None:
        self.spec = spec
        self.runs_dir = root / spec.get("runs_dir", "docs/results/runs")
        self.runs: dict[str, str] = dict(spec.get("runs", {}))
        self.seed = int(spec.get("seed", 0))
        self.samples = int(spec.get("samples", 1000))
        self.boot = Resampling(self.samples, self.seed)  # the budget tables' too
        self.stability = int(spec.get("stability_seeds", 1))
        self._bounds: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
        self._sweeps: dict[str, list[dict[str, Any]]] = {}
        self._records: dict[str, list[dict[str, Any]]] = {}

    def path(self, run: str) -> Path:
        if run not in self.runs:
            raise SpecError(f"run {run!r} is not in the spec's [runs] ({', '.join(self.runs)})")
        path = self.runs_dir / self.runs[run]
        if not path.is_dir():
            raise SpecError(f"run {run!r}: {path} is not a directory of run records")
        return path

    def sweep(self, run: str) -> list[dict[str, Any]]:
        """A sweep's records, read once."""
        if run not in self._sweeps:
            path = self.path(run) / "sweep.jsonl"
            if not path.is_file():
                raise SpecError(f"run {run!r} is not a sweep (no {path})")
            self._sweeps[run] = compact(path)
        return self._sweeps[run]

    def records(self, run: str) -> list[dict[str, Any]]:
        """Answers in the shape of eval records (an eval run's, or a sweep's methods at their defaults), read once."""
        if run not in self._records:
            path = self.path(run)
            if (path / "sweep.jsonl").is_file():
                self._records[run] = default_records(self.sweep(run))
            elif (path / "questions.jsonl").is_file():
                rows = latest(read_records(path / "questions.jsonl", repair=False))
                self._records[run] = [r for r in rows if "error" not in r]
            else:
                raise SpecError(f"run {run!r}: {path} holds no questions.jsonl or sweep.jsonl")
        return self._records[run]

    def family(self, run: str, name: str) -> list[dict[str, Any]]:
        rows = [r for r in self.sweep(run) if name in (r["family"], r["family"].split("|")[0])]
        families = sorted({r["family"] for r in rows})
        if len(families) != 1:
            raise SpecError(f"{name!r} names {len(families)} families of run {run!r}: {families or 'none'}")
        return rows

    def side(self, text: str, metric: str) -> dict[str, float]:
        """Per question id, the side's score in ``metric`` (0 or 1 for EM/acc; an expectation for random@)."""
        run, sep, what = text.partition(":")
        if not sep or not what:
            raise SpecError(f"{text!r} is not RUN:WHAT")
        head, at, rest = what.partition("@")
        if at and head in ("never", "always"):
            side = "closed" if head == "never" else "open"
            return {r["id"]: r[side]["scores"][metric] for r in self.family(run, rest)}
        if at and head == "random":
            gate, _, rule = rest.partition("@")
            rows, retrieve = self._gate(run, gate, rule)
            rate = float(np.mean(retrieve))
            return {
                r["id"]: rate * r["open"]["scores"][metric] + (1 - rate) * r["closed"]["scores"][metric]
                for r in rows
            }
        if at:
            rows, retrieve = self._gate(run, head, rest)
            return {
                r["id"]: (r["open"] if x else r["closed"])["scores"][metric]
                for r, x in zip(rows, retrieve, strict=True)
            }
        for name, rows in by_method(self.records(run)):
            if name == what:
                return {r["id"]: r["scores"][metric] for r in rows if "scores" in r}
        raise SpecError(f"run {run!r} has no answers of method {what!r}")

    def _gate(self, run: str, gate: str, rule: str) -> tuple[list[dict[str, Any]], np.ndarray]:
        rows = method_records(self.sweep(run), gate)
        if not rows:
            raise SpecError(f"sweep {run!r} has no gate {gate!r}")
        scores = np.array([r["gates"][gate]["score"] for r in rows], dtype=float)
        kind, eq, value = rule.partition("=")
        if not eq or kind not in ("rho", "top"):
            raise SpecError(f"{gate}@{rule}: give @rho=R (tau from the budget) or @top=R (a matched rate)")
        rho = float(value)
        if kind == "rho":
            return rows, scores > threshold_for_budget(scores.tolist(), rho)
        order = np.argsort(-scores, kind="stable")
        retrieve = np.zeros(len(rows), dtype=bool)
        retrieve[order[: round(len(rows) * rho)]] = True
        return rows, retrieve

    def rate(self, text: str) -> float:
        """The retrieval rate of a side (a gate rule's, or a method's recorded ``retrieved``)."""
        run, _, what = text.partition(":")
        head, at, rest = what.partition("@")
        if at and head not in ("never", "always", "random"):
            return float(np.mean(self._gate(run, head, rest)[1]))
        if at:
            return {"never": 0.0, "always": 1.0}.get(head, float("nan"))
        rows = [r for r in self.records(run) if r["method"] == what]
        return statistics.fmean(float(bool(r.get("retrieved"))) for r in rows)

    def diff(self, new: str, old: str, metric: str) -> dict[str, Any]:
        a, b = self.side(new, metric), self.side(old, metric)
        ids = [i for i in a if i in b]
        if not ids:
            raise SpecError(f"{new} and {old} share no question")
        x = [100.0 * a[i] for i in ids]
        y = [100.0 * b[i] for i in ids]
        d = [p - q for p, q in zip(x, y, strict=True)]
        mean = statistics.fmean(d)
        sd = statistics.stdev(d) if len(d) > 1 else 0.0
        lo, hi = paired_bootstrap_diff(x, y, samples=self.samples, seed=self.seed)
        return {"n": len(ids), "delta": mean, "lo": lo, "hi": hi, "smallest": 1.96 * sd / math.sqrt(len(d))}

    def seed_bounds(self, new: str, old: str, metric: str) -> list[tuple[float, float]]:
        """The paired interval of ``new`` minus ``old`` under each of the ``stability`` seeds from ``seed`` on."""
        key = (new, old, metric)
        if key not in self._bounds:
            a, b = self.side(new, metric), self.side(old, metric)
            ids = [i for i in a if i in b]
            x, y = [100.0 * a[i] for i in ids], [100.0 * b[i] for i in ids]
            self._bounds[key] = [
                paired_bootstrap_diff(x, y, samples=self.samples, seed=self.seed + k) for k in range(self.stability)
            ]
        return self._bounds[key]


def fmt(v: float) -> str:
    """A signed value in points, one decimal, with a true minus sign; a nonzero bound that would round to 0.0
    keeps two decimals (an interval's bound never reads +0.0 while its verdict says it excludes 0)."""
    text = f"{v:+.2f}" if v != 0 and round(v, 1) == 0 else f"{v:+.1f}"
    return text.replace("-", "−")


def interval(d: Mapping[str, float]) -> str:
    return f"{fmt(d['delta'])} [{fmt(d['lo'])}, {fmt(d['hi'])}]"


def difference_verdict(lo: float, hi: float) -> str:
    return "higher" if lo > 0 else "lower" if hi < 0 else "not established"


def claim_verdict(lo: float, hi: float, expect: str) -> str:
    """The rule of the module docstring: the paper's direction against the paired interval."""
    if expect not in EXPECT:
        raise SpecError(f"expect = {expect!r}: one of {', '.join(EXPECT)}")
    above, below = lo > 0, hi < 0
    if expect == "higher":
        return "holds" if above else "against" if below else "not established"
    if expect == "lower":
        return "holds" if below else "against" if above else "not established"
    if expect == "not lower":
        return "against" if below else "not established"
    return "against" if above else "not established"


def paper_note(paper: float | None, d: Mapping[str, float]) -> str:
    if paper is None:
        return ""
    inside = d["lo"] <= paper <= d["hi"]
    return f"; the paper's {paper:+g} lies {'inside' if inside else 'outside'} the interval".replace("-", "−")


# --- tables -------------------------------------------------------------------------------------------------


def claims_table(res: Results, table: Mapping[str, Any], only_headline: bool = False) -> str:
    lines = [
        "| claim (paper) | paper | here (n, paired 95% interval) | smallest Δ n can establish | verdict |",
        "|---|---|---|---|---|",
    ]
    for row in table["rows"]:
        if only_headline and not row.get("headline"):
            continue
        metric = row.get("metric", "em")
        name = METRIC_NAME[metric]
        if "skips" in row:
            share = res.rate(row["skips"])
            n = len(res.side(row["skips"], metric))
            skipped = round((1 - share) * n)
            here = f"skips {skipped} of {n} ({100 * (1 - share):.0f}%)"
            verdict = "not testable: it never skips" if skipped == 0 else "skips"
            lines.append(f"| {row['claim']} | {row['paper']} | {here} | – | {verdict} |")
            continue
        d = res.diff(row["new"], row["old"], metric)
        at = f" at {100 * res.rate(row['new']):.0f}% retrieval" if row.get("show_rate") else ""
        here = f"{name} {interval(d)}{at}, n = {d['n']}"
        verdict = claim_verdict(d["lo"], d["hi"], row["expect"])
        bounds = res.seed_bounds(row["new"], row["old"], metric)
        agree = sum(claim_verdict(lo, hi, row["expect"]) == verdict for lo, hi in bounds)
        if agree < len(bounds):
            verdict += f" (fragile: {agree} of {len(bounds)} seeds)"
        verdict += paper_note(row.get("paper_value"), d)
        lines.append(f"| {row['claim']} | {row['paper']} | {here} | ±{d['smallest']:.1f} | {verdict} |")
    return "\n".join(lines)


def paired_table(res: Results, table: Mapping[str, Any]) -> str:
    lines = [
        "| new | against | n | ΔEM [95%] | verdict | Δacc [95%] | verdict (acc) | smallest ΔEM n can establish |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for new, old in table["pairs"]:
        em, acc = res.diff(new, old, "em"), res.diff(new, old, "acc")
        lines.append(
            f"| {new} | {old} | {em['n']} | {interval(em)} | {difference_verdict(em['lo'], em['hi'])} | "
            f"{interval(acc)} | {difference_verdict(acc['lo'], acc['hi'])} | ±{em['smallest']:.1f} |"
        )
    return "\n".join(lines)


def _ci(values: Sequence[float], res: Results) -> str:
    lo, hi = bootstrap_ci([100.0 * v for v in values], samples=res.samples, seed=res.seed)
    return f"{100.0 * statistics.fmean(values):.1f} [{lo:.1f}, {hi:.1f}]"


def methods_table(res: Results, table: Mapping[str, Any]) -> str:
    lines = [
        "| method | readers | n | EM [95%] | acc [95%] | retrieval rate | tokens/q |",
        "|---|---|---|---|---|---|---|",
    ]
    for entry in table["rows"]:
        run, _, method = entry["side"].partition(":")
        rows = [r for r in res.records(run) if r["method"] == method and "scores" in r]
        if not rows:
            raise SpecError(f"run {run!r} has no answers of method {method!r}")
        tokens = [
            r.get("tokens") or (r.get("prompt_tokens") or 0) + (r.get("completion_tokens") or 0) for r in rows
        ]
        lines.append(
            f"| {entry.get('label', method)} | {entry['readers']} | {len(rows)} | "
            f"{_ci([r['scores']['em'] for r in rows], res)} | {_ci([r['scores']['acc'] for r in rows], res)} | "
            f"{statistics.fmean(float(bool(r.get('retrieved'))) for r in rows):.2f} | "
            f"{statistics.fmean(tokens):.0f} |"
        )
    return "\n".join(lines)


def budget_table(res: Results, table: Mapping[str, Any]) -> str:
    """TARG Tables 3-4 at tau = F^-1(1 - rho): each gate against Always-RAG of its reader and a random gate at the
    same rate (ragate.report.matched), with the spec's labels; single-point runs (FLARE) enter at their own rate."""
    metric = table.get("metric", "acc")
    sweep = res.sweep(table["sweep"])
    labels: dict[str, str] = dict(table.get("labels", {}))
    gates = list(table.get("gates", []))
    rows: list[dict[str, Any]] = []
    extra: list[dict[str, Any]] = []
    families: dict[str, str] = {}
    for item in table.get("with", []):
        run, label = item["run"], item.get("label")
        mine = [r | ({"label": label} if label else {}) for r in res.records(run)]
        extra += mine
        if "family" in item:  # a run whose reader is another family's than today's key names (a pre-fix one)
            families |= {point_label(r): item["family"] for r in mine}
    from ragate.eval.sweep import family_key
    from ragate.methods import get_method

    for budget in table["budgets"]:
        for gate in gates:
            point = swept_point(method_records(sweep, gate), gate, budget, metric, "quantile", res.boot)
            rows.append(point | {"method": labels.get(gate, gate)})
        for label in dict.fromkeys(point_label(r) for r in extra):
            mine = [r for r in extra if point_label(r) == label]
            if label in families:
                reference = {r["id"]: r for r in res.family(table["sweep"], families[label])}
            else:
                family = family_key(get_method(mine[0]["method"]))
                reference = {r["id"]: r for r in sweep if r["family"] == family}
            rows.append(single_point(mine, mine[0]["method"], budget, reference, metric, res.boot) | {"method": label})
    used = {res.family(table["sweep"], name)[0]["family"] for name in families.values()}
    refs = [r for r in references(sweep, metric) if set(r["methods"]) & set(gates) or r["family"] in used]
    for r in refs:
        r["methods"] = [labels.get(m, m) for m in r["methods"] if m in gates] or [
            table.get("reference_label", "(the single-point runs below)")
        ]
    return matched_markdown(rows, refs, metric).rstrip()


def direct_table(res: Results, table: Mapping[str, Any]) -> str:
    """PAIRS Fig. 3: the questions a method answered without retrieval, its EM on them and on the rest, and the
    always-retrieving method's EM on the same questions."""
    lines = [
        "| run | answered directly | EM on those | EM on the rest | always-retrieving EM on those |",
        "|---|---|---|---|---|",
    ]
    for entry in table["rows"]:
        run = entry["run"]
        by = {m: {r["id"]: r for r in rows} for m, rows in by_method(res.records(run))}
        gated, always = by[entry["method"]], by[entry["always"]]
        direct = [i for i, r in gated.items() if not r["retrieved"]]
        rest = [i for i in gated if i not in set(direct)]
        em = lambda ids, m: 100 * statistics.fmean(m[i]["scores"]["em"] for i in ids) if ids else float("nan")
        lines.append(
            f"| {entry.get('label', run)} | {len(direct)} of {len(gated)} | {em(direct, gated):.1f} | "
            f"{em(rest, gated):.1f} | {em(direct, always):.1f} |"
        )
    return "\n".join(lines)


KINDS = {
    "claims": claims_table,
    "paired": paired_table,
    "methods": methods_table,
    "budget": budget_table,
    "direct": direct_table,
}


def render(spec: Mapping[str, Any], only: str | None = None, root: Path = ROOT) -> list[tuple[str, str]]:
    res = Results(spec, root)
    caption = {
        "methods": f"Percentile bootstrap 95% intervals: {res.samples} resamples, seed {res.seed}.",
        "direct": "Counts and EM from the run's records (no interval).",
    }
    paired = (
        f"Paired bootstrap 95% intervals over the same questions: {res.samples} resamples, seed {res.seed}; "
        "verdicts by the rule of scripts/results_tables.py."
    )
    out = []
    for table in spec.get("table", []):
        name, kind = table["name"], table["kind"]
        if only and name != only and table.get("headline_block") != only:
            continue
        if kind not in KINDS:
            raise SpecError(f"table {name!r}: kind {kind!r} is not one of {', '.join(KINDS)}")
        if not only or only == name:
            out.append((name, KINDS[kind](res, table) + "\n\n" + caption.get(kind, paired)))
        if kind == "claims" and (headline := table.get("headline_block")) and (not only or only == headline):
            out.append((headline, claims_table(res, table, only_headline=True) + "\n\n" + paired))
    if only and not out:
        raise SpecError(f"the spec has no table {only!r}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec", type=Path)
    ap.add_argument("--only", default=None, help="print one table, unframed")
    ap.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        spec = tomllib.loads(args.spec.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SpecError(f"cannot read the spec {args.spec}: {exc}") from None
    tables = render(spec, args.only, args.root)
    if args.only:
        print(tables[0][1])
        return 0
    for name, text in tables:
        print(f"<!-- block: {name} -->\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
