"""Issue H: the drift replay of benchmarks/budget.py on sweep records whose score distribution shifts (hand-built
records: the test needs exact control of the shift)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).parent.parent / "benchmarks" / "budget.py"


def _budget() -> Any:
    spec = importlib.util.spec_from_file_location("budget_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["budget_bench"] = module
    spec.loader.exec_module(module)
    return module


def _records(scores: np.ndarray) -> list[dict[str, Any]]:
    return [
        {
            "id": f"q{i}", "methods": ["targ-margin"], "gates": {"targ-margin": {"score": float(s)}},
            "closed": {"scores": {"acc": 0.0}}, "open": {"scores": {"acc": 1.0}},
        }
        for i, s in enumerate(scores)
    ]  # fmt: skip


def test_the_controller_follows_a_shift_that_a_fixed_tau_misses() -> None:
    rng = np.random.default_rng(0)
    phases = [_records(rng.random(600)), _records(rng.random(600) + 0.5)]  # the second phase scores higher
    got = _budget().replay(phases, "targ-margin", 0.3, 100, "acc")
    second = slice(700, 1200)  # after the controller's window has filled with phase-2 scores
    fixed = np.mean([d[0] for d in got["fixed"][second]])
    controlled = np.mean([d[0] for d in got["controller"][second]])
    assert fixed > 0.75  # tau from phase 1 (about 0.7) is exceeded by about 80% of phase 2
    assert abs(controlled - 0.3) < 0.05
    # accuracy follows the decisions: here retrieving is always right
    assert np.mean([d[1] for d in got["controller"][second]]) == controlled
    late = slice(700, None)
    assert np.abs(got["controller_rates"][late] - 0.3).max() < np.abs(got["fixed_rates"][late] - 0.3).max()
