"""Issue 51, item 5: benchmarks/gate_table.py's paired AUROC gap against the margin gate, on hand-built sweep
records (the test needs exact control of which questions each gate ranks right)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from script_loader import load_script

from ragate.uncertainty import auroc

BENCH = Path(__file__).parent.parent / "benchmarks" / "gate_table.py"
FAMILY = "targ-question-first|question|k=5|n=5|cos|hyde=1|rep=5|ce=None|max=64"


def _table() -> Any:
    return load_script(BENCH, "gate_table_bench")


def _answer(correct: bool) -> dict[str, Any]:
    score = float(correct)
    return {
        "prediction": "x",
        "scores": {"em": score, "f1": score, "acc": score},
        "seconds": 0.1,
        "tokens": 3,
    }


def _sweep(tmp_path: Path, wrong: np.ndarray, gates: dict[str, np.ndarray]) -> Path:
    lines = []
    for i, w in enumerate(wrong):
        scored = {g: {"score": float(s[i]), "threshold": 0.5, "retrieve": bool(s[i] > 0.5), "seconds": 0.0}
                  for g, s in gates.items()}  # fmt: skip
        answers = {"closed": _answer(not w), "open": _answer(True)}
        lines.append({"id": f"q{i}", "family": FAMILY, "methods": list(gates), "gates": scored} | answers)
    (tmp_path / "sweep.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (tmp_path / "config.json").write_text(
        json.dumps({"dataset": "hand-built", "model": "m", "limit": len(lines)})
    )
    return tmp_path


def test_the_gap_is_the_difference_of_the_two_aurocs_with_a_paired_interval(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    wrong = rng.random(80) < 0.6
    noisy = wrong + rng.normal(0, 1.0, 80)  # ranks the errors somewhat
    exact = wrong + rng.normal(0, 0.01, 80)  # ranks them perfectly
    run = _sweep(tmp_path, wrong, {"targ-margin": noisy, "oracle": exact, "copy": noisy.copy()})
    rows = {r["gate"]: r for r in _table().gate_rows(run, "acc")}
    base = auroc(noisy.tolist(), wrong.tolist())
    assert base is not None and 0.55 < base < 0.95
    gap, low, high = rows["oracle"]["gap"]
    assert rows["oracle"]["wrong"][0] == 1.0
    assert gap is not None and abs(gap - (1.0 - base)) < 1e-12
    assert 0 < low <= gap <= high  # a perfect ranker beats a noisy one on every resample
    assert rows["copy"]["gap"] == (0.0, 0.0, 0.0)  # the same scores: zero on every resample (paired)
    assert rows["targ-margin"]["gap"][0] is None  # not against itself
    text = _table().table([run], "acc")
    assert "minus targ-margin's (paired)" in text and "+0.000 [+0.000, +0.000]" in text
