"""The report's figures, as PNG bytes (matplotlib, drawn off-screen): the accuracy-cost frontiers, the operating
points with their paired intervals, and closed-book accuracy by score decile."""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from typing import Any

from ragate.errors import RagateError
from ragate.report.analysis import (
    FrontierPlot,
    Metric,
    accuracy_by_decile,
)

METRIC_LABEL = {"em": "EM", "f1": "F1", "acc": "acc (contains)"}


def figure_data(series: dict[str, Sequence[Any]]) -> str:
    """A line that stands for the data a figure plots, ``series`` (a name for each curve and its values: arrays or
    sequences of numbers, rounded to 6 decimals): how many curves and points, and the sha256 of the values. A docs
    block prints it under its table, so ``scripts/render_docs.py --check`` compares a figure by the data behind it,
    not its pixels."""
    import hashlib
    import json

    import numpy as np

    rows = {name: np.round(np.asarray(values, dtype=np.float64), 6).ravel().tolist() for name, values in series.items()}
    digest = hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16]
    points = sum(len(v) for v in rows.values())
    return f"The figure's data: {len(rows)} series, {points} values; sha256 {digest}."


def canvas() -> Callable[[Any], bytes]:
    """A function from a matplotlib Figure to PNG bytes; the error names the extra when matplotlib is missing."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError as err:
        raise RagateError("report plots need matplotlib: pip install 'ragate[eval]'") from err

    def render(fig: Any) -> bytes:
        FigureCanvasAgg(fig)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=120)
        return buf.getvalue()

    return render


def _new_figure() -> tuple[Any, Any]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.0, 4.6), layout="constrained")
    return fig, fig.add_subplot()


def plot_frontiers(plots: Sequence[FrontierPlot], metric: Metric = "em") -> bytes:
    """EM vs retrieval rate: one step line per gate over its thresholds, its default point as a star, and per
    family Never-RAG, Always-RAG and the random gate's expected line between them."""
    render = canvas()
    fig, ax = _new_figure()
    for i, p in enumerate(plots):
        color = f"C{i % 10}"
        xs, ys = zip(*p["curve"], strict=True)
        ax.plot(xs, [100 * y for y in ys], drawstyle="steps-post", marker=".", ms=4, lw=1.2, color=color)
        ax.plot([], [], color=color, marker=".", label=p["method"])
        dx, dy = p["default"]
        _error_bar(ax, dx, dy, p["intervals"]["default"], color)
        ax.plot([dx], [100 * dy], marker="*", ms=13, color=color, markeredgecolor="black", ls="none")
    families = {(p["never"][1], p["always"][1]): p for p in plots}  # one baseline per family
    for j, ((never, always), p) in enumerate(families.items()):
        rx, ry = zip(*p["random"], strict=True)
        labels = ("random gate", "Never-RAG", "Always-RAG") if j == 0 else (None, None, None)
        ax.plot(rx, [100 * y for y in ry], ls="--", lw=1, color="grey", label=labels[0])
        _error_bar(ax, 0.0, never, p["intervals"]["never"], "black")
        _error_bar(ax, 1.0, always, p["intervals"]["always"], "black")
        ax.plot([0], [100 * never], marker="s", color="black", ls="none", label=labels[1])
        ax.plot([1], [100 * always], marker="^", color="black", ls="none", label=labels[2])
    ax.plot([], [], marker="*", ms=10, color="white", markeredgecolor="black", ls="none", label="default")
    ax.errorbar([], [], yerr=[], color="grey", capsize=3, ls="none", label="bootstrap 95% interval")
    ax.set(
        xlabel="retrieval rate",
        ylabel=f"{METRIC_LABEL[metric]} (%)",
        xlim=(-0.03, 1.03),
        title="accuracy / retrieval frontier",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="best")
    return render(fig)


def _error_bar(ax: Any, x: float, y: float, interval: tuple[float, float], color: str) -> None:
    """A vertical bar over the interval (accuracy in [0, 1], drawn in %) at the point (x, y)."""
    lo, hi = interval
    ax.errorbar(
        [x], [100 * y], yerr=[[100 * (y - lo)], [100 * (hi - y)]], color=color, capsize=3, lw=1, ls="none"
    )


def operating_intervals(
    rows: Sequence[dict[str, Any]], metric: Metric = "em"
) -> dict[tuple[float, float], tuple[float, float]]:
    """The bootstrap 95% interval of each point of :func:`operating_points` (methods sharing a point: the span of
    their intervals), keyed by (retrieval rate, accuracy in %)."""
    out: dict[tuple[float, float], tuple[float, float]] = {}
    for r in rows:
        if r.get("n") and f"{metric}_ci" in r:
            key = (round(r["retrieval_rate"], 6), round(100 * r[metric], 6))
            lo, hi = r[f"{metric}_ci"]
            old = out.get(key, (lo, hi))
            out[key] = (min(lo, old[0]), max(hi, old[1]))
    return out


def operating_points(rows: Sequence[dict[str, Any]], metric: Metric = "em") -> list[tuple[float, float, str]]:
    """Each distinct (retrieval rate, accuracy in %) of the summary rows, with the methods there joined by ", "
    (variants that read the same documents often share a point, and separate labels would overprint)."""
    points: dict[tuple[float, float], list[str]] = {}
    for r in rows:
        if r.get("n"):
            key = (round(r["retrieval_rate"], 6), round(100 * r[metric], 6))
            points.setdefault(key, []).append(r["method"])
    return [(x, y, ", ".join(names)) for (x, y), names in points.items()]


def plot_operating_points(rows: Sequence[dict[str, Any]], metric: Metric = "em") -> bytes:
    """Without a sweep: each evaluated method's (retrieval rate, accuracy) from the run's summary, with its bootstrap
    95% interval as a bar. Each label takes the first of a few vertical offsets where it overlaps no label drawn
    before it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    render = canvas()
    fig, ax = _new_figure()
    points = operating_points(rows, metric)
    intervals = operating_intervals(rows, metric)
    for i, (x, y, _) in enumerate(points):
        interval = intervals.get((round(x, 6), round(y, 6)))
        if interval is not None:
            _error_bar(ax, x, y / 100, interval, f"C{i % 10}")
        ax.plot([x], [y], marker="o", color=f"C{i % 10}", ls="none")
    ax.set(
        xlabel="retrieval rate",
        ylabel=f"{METRIC_LABEL[metric]} (%)",
        xlim=(-0.05, 1.05),
        title="methods' operating points (bars: bootstrap 95% intervals)",
    )
    ax.grid(alpha=0.3)
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw_without_rendering()  # lays the axes out, so that label extents are real
    placed: list[Any] = []  # label boxes already drawn, in display coordinates
    offsets = (4, -11, 14, -21, 24, -31)
    for i, (x, y, label) in enumerate(points):
        right = x > 0.6  # labels of points near rate 1 go to their left, inside the axes
        for dy in offsets:
            text = ax.annotate(
                label,
                (x, y),
                fontsize="small",
                color=f"C{i % 10}",  # the point's colour, so that a label set off from its point still reads
                xytext=(-6 if right else 6, dy),
                textcoords="offset points",
                ha="right" if right else "left",
            )
            box = text.get_window_extent(renderer)
            if dy == offsets[-1] or not any(box.overlaps(other) for other in placed):
                placed.append(box)
                break
            text.remove()
    return render(fig)


def plot_deciles(
    sweep_records: Sequence[dict[str, Any]], methods: Sequence[str], metric: Metric = "em"
) -> bytes:
    """Closed-book accuracy per gate-score decile, one line per gate (TARG Fig. S1), each point with its bootstrap
    95% interval (set a little apart per gate, so that the bars do not overprint)."""
    render = canvas()
    fig, ax = _new_figure()
    for i, m in enumerate(methods):
        rows = accuracy_by_decile(sweep_records, m, metric)
        shift = 0.08 * (i - (len(methods) - 1) / 2)
        xs, ys = [r["decile"] + shift for r in rows], [100 * r["closed_acc"] for r in rows]
        lows = [100 * (r["closed_acc"] - r["closed_ci"][0]) for r in rows]
        highs = [100 * (r["closed_ci"][1] - r["closed_acc"]) for r in rows]
        ax.errorbar(xs, ys, yerr=[lows, highs], marker="o", color=f"C{i % 10}", capsize=2, lw=1.2, label=m)
    ax.set(
        xlabel="gate score decile (1 = most confident)",
        ylabel=f"closed-book {METRIC_LABEL[metric]} (%)",
        xticks=range(1, 11),
    )
    ax.set_title("base-model accuracy by gate score (bars: bootstrap 95% intervals)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="best")
    return render(fig)
