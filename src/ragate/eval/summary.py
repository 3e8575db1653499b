"""One summary row per method from a run's per-question records, and the Markdown table of a run.

Accuracy columns carry percentile-bootstrap 95% intervals over questions; Δlatency is paired: the mean over the
questions both ran of seconds(method) - seconds(baseline), with a paired bootstrap interval, measured in
the same run (DESIGN.md section 4). The baseline is ``no-retrieval``, or for a run of dynamic methods without it
``wo-rag`` (the same chain of thought, never retrieving).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from ragate.errors import RagateError
from ragate.eval.metrics import DEFAULT_BOOT, Resampling, bootstrap_ci, paired_bootstrap_diff
from ragate.eval.records import by_method

BASELINE = "no-retrieval"
BASELINES = (BASELINE, "wo-rag")  # the first one present in a run is what Δlatency is measured against


def summarize(
    records: Sequence[dict[str, Any]], methods: Sequence[str] | None = None, boot: Resampling = DEFAULT_BOOT
) -> list[dict[str, Any]]:
    """Rows in ``methods`` order (default: first-seen order), intervals drawn as ``boot`` says. Error records are
    counted, not scored."""
    groups = dict(by_method(records))
    order = list(methods) if methods else list(groups)
    baseline = next((b for b in BASELINES if b in groups), BASELINE)
    base = {r["id"]: r["seconds"] for r in groups.get(baseline, []) if "error" not in r}
    return [_row(m, groups.get(m, []), base, baseline, boot) for m in order]


def _row(
    method: str, records: list[dict[str, Any]], base: dict[str, float], baseline: str, boot: Resampling
) -> dict[str, Any]:
    ok = [r for r in records if "error" not in r]
    row: dict[str, Any] = {
        "method": method,
        "n": len(ok),
        "errors": len(records) - len(ok),
        "baseline": baseline,
    }
    if not ok:
        return row
    for key in ("em", "f1", "acc"):
        values = [r["scores"][key] for r in ok]
        row[key] = statistics.fmean(values)
        row[f"{key}_ci"] = bootstrap_ci(values, samples=boot.samples, seed=boot.seed)
    row["retrieval_rate"] = statistics.fmean(float(r["retrieved"]) for r in ok)
    row["retrievals_per_q"] = statistics.fmean(r["retrievals"] for r in ok)
    for key in ("prompt_tokens", "completion_tokens", "overhead_tokens", "seconds"):
        row[f"{key}_per_q"] = statistics.fmean(r[key] for r in ok)
    row["cut_at_cap"] = cut_at_cap(ok)
    recalls = [r[k] for r in ok for k in r if k.startswith("recall@") and r[k] is not None]
    row["recall"] = statistics.fmean(recalls) if recalls else None
    if any("generated_tokens" in r for r in ok):  # dynamic methods (ragate.dynamic)
        fired = [r for r in ok if r.get("first_retrieval_token") is not None]
        row["triggered_rate"] = len(fired) / len(ok)
        row["first_retrieval_token"] = (
            statistics.fmean(r["first_retrieval_token"] for r in fired) if fired else None
        )
        row["tokens_before_first"] = (
            statistics.fmean(r["tokens_before_first_retrieval"] for r in fired) if fired else None
        )
        row["generated_per_q"] = statistics.fmean(r["generated_tokens"] for r in ok)
    paired = [(r["seconds"], base[r["id"]]) for r in ok if r["id"] in base]
    if paired and method != baseline:
        a, b = [p[0] for p in paired], [p[1] for p in paired]
        row["delta_latency"] = statistics.fmean(a) - statistics.fmean(b)
        row["delta_latency_ci"] = paired_bootstrap_diff(a, b, samples=boot.samples, seed=boot.seed)
    return row


def _ci(row: dict[str, Any], key: str, scale: float = 100.0) -> str:
    if key not in row:
        return "–"
    lo, hi = row[f"{key}_ci"]
    return f"{scale * row[key]:.1f} [{scale * lo:.1f}, {scale * hi:.1f}]"


def summary_table(rows: Sequence[dict[str, Any]]) -> str:
    """The Markdown table: EM, F1, contains-accuracy (with 95% CIs), retrieval, tokens, seconds, Δlatency."""
    baseline = rows[0].get("baseline", BASELINE) if rows else BASELINE
    head = (
        "| method | n | EM | F1 | acc (contains) | retrieval rate | retrievals/q | recall@3 | tokens/q "
        f"| overhead tokens/q | s/q | Δlatency vs {baseline} (s) |"
    )
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        if not r.get("n"):
            lines.append(f"| {r['method']} | 0 | – | – | – | – | – | – | – | – | – | – |")
            continue
        recall = "–" if r["recall"] is None else f"{100 * r['recall']:.1f}"
        if "delta_latency" in r:
            lo, hi = r["delta_latency_ci"]
            delta = f"{r['delta_latency']:+.2f} [{lo:+.2f}, {hi:+.2f}]"
        else:
            delta = "–"
        tokens = r["prompt_tokens_per_q"] + r["completion_tokens_per_q"]
        errors = f" ({r['errors']} errors)" if r["errors"] else ""
        lines.append(
            f"| {r['method']} | {r['n']}{errors} | {_ci(r, 'em')} | {_ci(r, 'f1')} | {_ci(r, 'acc')} "
            f"| {r['retrieval_rate']:.2f} | {r['retrievals_per_q']:.2f} | {recall} | {tokens:.0f} "
            f"| {r['overhead_tokens_per_q']:.0f} | {r['seconds_per_q']:.2f} | {delta} |"
        )
    return "\n".join(lines) + "\n"


def dynamic_table(rows: Sequence[dict[str, Any]]) -> str:
    """Dynamic methods only: how often the trigger fired, where the first triggered retrieval was (answer tokens
    kept before it, all tokens generated before it) and tokens generated per question ("" if none ran)."""
    dynamic = [r for r in rows if "generated_per_q" in r]
    if not dynamic:
        return ""

    def num(v: float | None) -> str:
        return "–" if v is None else f"{v:.1f}"

    lines = [
        (
            "| method | triggered (share of questions) | retrievals/q | first retrieval at answer token "
            "| tokens generated before it | tokens generated/q | s/q |"
        ),
        "|" + "---|" * 7,
    ]
    lines += [
        f"| {r['method']} | {r['triggered_rate']:.2f} | {r['retrievals_per_q']:.2f} "
        f"| {num(r['first_retrieval_token'])} | {num(r['tokens_before_first'])} | {r['generated_per_q']:.1f} "
        f"| {r['seconds_per_q']:.2f} |"
        for r in dynamic
    ]
    return "\n".join(lines) + "\n"


def derived_table(records: Sequence[dict[str, Any]], boot: Resampling = DEFAULT_BOOT) -> str:
    """The table of records a sweep already answered (:func:`ragate.eval.sweep.default_records`): accuracy with
    95% intervals, retrieval rate, tokens and seconds per question (the sweep keeps no prompt/completion split)."""
    lines = [
        "| method | n | EM | F1 | acc (contains) | retrieval rate | tokens/q | s/q |",
        "|" + "---|" * 8,
    ]
    for method, rows in by_method(records):
        row: dict[str, Any] = {}
        for key in ("em", "f1", "acc"):
            values = [r["scores"][key] for r in rows]
            row[key], row[f"{key}_ci"] = statistics.fmean(values), bootstrap_ci(values, samples=boot.samples, seed=boot.seed)
        rate = statistics.fmean(float(r["retrieved"]) for r in rows)
        tokens = statistics.fmean(r["tokens"] for r in rows)
        seconds = statistics.fmean(r["seconds"] for r in rows)
        lines.append(
            f"| {method} | {len(rows)} | {_ci(row, 'em')} | {_ci(row, 'f1')} | {_ci(row, 'acc')} | {rate:.2f} "
            f"| {tokens:.0f} | {seconds:.2f} |"
        )
    return "\n".join(lines) + "\n"


def cut_at_cap(records: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Per LM stage name, how many questions had that call stop at its ``max_tokens`` (``finish_reason``
    "length"): a pseudo-context or an answer cut short. Read from each record's trace."""
    counts: dict[str, int] = {}
    for r in records:
        names = {
            s["name"] for s in r.get("trace", {}).get("stages", []) if s.get("finish_reason") == "length"
        }
        for name in names:
            counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


def cut_at_cap_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One line per method with LM calls cut at their token cap, e.g. "pseudo-context 12 of 300"."""
    lines = [
        f"- {r['method']}: " + ", ".join(f"{name} {n} of {r['n']}" for name, n in r["cut_at_cap"].items())
        for r in rows
        if r.get("cut_at_cap")
    ]
    if not lines:
        return []
    return ["Questions whose LM call stopped at its token cap (finish_reason length), per stage:", "", *lines, ""]


def summary_markdown(results: dict[str, Any]) -> str:
    config, prov = results["config"], results.get("provenance", {})
    model = prov.get("model", {})
    git = prov.get("git", {})
    commit = (git.get("commit") or "unknown")[:12] + (" (uncommitted changes)" if git.get("dirty") else "")
    lines = [
        f"# {config['dataset']}: {', '.join(config['methods'])}",
        "",
        f"- questions: {results['questions']}; model: {config['model'] or 'default'} ({config['engine']}"
        + (f", sha256 {model['sha256'][:12]}" if model.get("sha256") else "")
        + f"); index: {config['index'] or 'demo'}; ragate commit {commit}",
        (
            "- EM/F1 on the extracted answer (SQuAD normalisation), acc = a gold alias occurs in the "
            "prediction; [95% bootstrap intervals]"
        ),
        "",
        summary_table(results["summary"]),
    ]
    if dynamic := dynamic_table(results["summary"]):
        lines += ["Dynamic methods (retrievals during generation):", "", dynamic]
    if cut := cut_at_cap_lines(results["summary"]):
        lines += ["", *cut]
    return "\n".join(lines)


COMPARE_AGAINST = (
    "no-retrieval",
    "standard-rag",
)  # never retrieve, always retrieve (the single-shot anchors)


def parse_pair(text: str) -> tuple[str, str]:
    """``"dpr-ais:dtr-no-ugt"`` -> ``("dpr-ais", "dtr-no-ugt")``: a method and the one it is compared against."""
    method, sep, against = (part.strip() for part in text.partition(":"))
    if not sep or not method or not against or ":" in against:
        raise RagateError(f"--compare takes METHOD:AGAINST, e.g. dpr-ais:dtr-no-ugt; got {text!r}")
    if method == against:
        raise RagateError(f"--compare {text!r} pairs a method with itself; name two different methods")
    return method, against


def verdict(lo: float, hi: float) -> str:
    """A paired interval's reading: "higher" or "lower" when it excludes 0, else "not established"."""
    return "higher" if lo > 0 else "lower" if hi < 0 else "not established"


def _paired_row(
    groups: Mapping[str, Mapping[str, dict[str, Any]]], method: str, base: str, metric: str, boot: Resampling
) -> dict[str, Any] | None:
    ids = [i for i in groups[method] if i in groups[base]]
    if not ids:
        return None
    a = [groups[method][i]["scores"][metric] for i in ids]
    b = [groups[base][i]["scores"][metric] for i in ids]
    lo, hi = paired_bootstrap_diff(a, b, samples=boot.samples, seed=boot.seed)
    return {
        "method": method,
        "against": base,
        "n": len(ids),
        "delta": statistics.fmean(a) - statistics.fmean(b),
        "ci": (lo, hi),
        "verdict": verdict(lo, hi),
    }


def paired_differences(
    records: Sequence[dict[str, Any]],
    metric: str = "acc",
    against: Sequence[str] = COMPARE_AGAINST,
    methods: Sequence[str] | None = None,
    compare: Sequence[tuple[str, str]] = (),
    boot: Resampling = DEFAULT_BOOT,
) -> list[dict[str, Any]]:
    """Each method's ``metric`` minus each baseline's on the questions both answered, with the paired bootstrap
    95% interval (:func:`~ragate.eval.metrics.paired_bootstrap_diff`) and a verdict: "higher" or "lower" when the
    interval excludes 0, else "not established" (whichever way the mean points). ``compare`` adds named
    (method, against) pairs after those rows, e.g. ("dpr-ais", "dtr-no-ugt"); a pair naming a method the records
    do not hold is an error that lists the methods they do."""
    groups = {m: {r["id"]: r for r in rs if "error" not in r} for m, rs in by_method(records)}
    order = list(methods) if methods else list(groups)
    pairs = [(m, base) for base in against if base in groups for m in order if m != base and m in groups]
    for m, base in compare:
        if missing := [x for x in (m, base) if x not in groups]:
            raise RagateError(
                f"cannot compare {m} with {base}: no answers from {', '.join(missing)} in this run; "
                f"its methods are {', '.join(groups) or 'none'}"
            )
        if (m, base) not in pairs:
            pairs.append((m, base))
    return [row for m, base in pairs if (row := _paired_row(groups, m, base, metric, boot)) is not None]


def points(value: float) -> str:
    """A signed share in points, one decimal; a nonzero one that would round to 0.0 keeps two, so an interval's
    bound never reads "+0.0" while its verdict says the interval excludes 0."""
    pts = 100 * value
    return f"{pts:+.2f}" if pts != 0 and round(pts, 1) == 0 else f"{pts:+.1f}"


def interval_points(lo: float, hi: float) -> str:
    """A paired interval in points: "[lo, hi]" with :func:`points`."""
    return f"[{points(lo)}, {points(hi)}]"


def differences_table(rows: Sequence[dict[str, Any]], metric: str = "acc") -> str:
    """The Markdown table of :func:`paired_differences`, in points."""
    if not rows:
        return ""
    lines = [
        f"| method | vs | n | Δ{metric} (points) | paired 95% interval | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lo, hi = r["ci"]
        lines.append(
            f"| {r['method']} | {r['against']} | {r['n']} | {points(r['delta'])} | "
            f"{interval_points(lo, hi)} | {r['verdict']} |"
        )
    return "\n".join(lines) + "\n"
