"""Issue H: the drift replay of benchmarks/budget.py on sweep records whose score distribution shifts (hand-built
records: the test needs exact control of the shift)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from script_loader import load_script

BENCH = Path(__file__).parent.parent / "benchmarks" / "budget.py"


def _budget() -> Any:
    return load_script(BENCH, "budget_bench")


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


def test_rate_feedback_holds_every_window_where_the_plain_quantile_strays() -> None:
    """Right after a shift the plain windowed quantile's tau lags, and its windowed rate leaves rho +- 0.05; the
    default gain corrects the quantile level by the rate error and keeps every window inside the band."""
    rng = np.random.default_rng(1)
    phases = [_records(rng.random(400)), _records(rng.random(400) + 0.6), _records(rng.random(400) - 0.4)]
    got = _budget().replay(phases, "targ-margin", 0.3, 100, "acc")
    after = slice(100, None)  # windows that begin after the first W requests
    plain = np.abs(got["quantile_rates"][after] - 0.3)
    held = np.abs(got["controller_rates"][after] - 0.3)
    assert plain.max() > 0.1 and held.max() <= 0.05
    # still a gate: it retrieves for the higher scores of its phase, not at random
    scores = np.concatenate([[r["gates"]["targ-margin"]["score"] for r in p] for p in phases])
    retrieved = np.array([d[0] for d in got["controller"]])
    assert scores[retrieved].mean() > scores[~retrieved].mean() + 0.3


def test_control_level_and_bad_gains() -> None:
    import pytest

    from ragate.errors import RagateError
    from ragate.methods import get_method
    from ragate.service.budget import BudgetController, control_level

    assert control_level(0.3, 0.3, 16) == pytest.approx(0.3)
    assert control_level(0.3, 0.35, 16) == 0.001  # 0.3 - 16 x 0.05 < 0: clipped
    assert control_level(0.3, 0.29, 16) == pytest.approx(0.46)
    assert control_level(0.3, 0.0, 0) == 0.3  # gain 0: the plain quantile
    for bad in (-1.0, float("nan")):
        with pytest.raises(RagateError, match="--budget-gain"):
            BudgetController(0.3, 50, get_method("targ-margin"), None, gain=bad)


def test_the_transfer_share_over_budget_matches_the_exact_batch_tail() -> None:
    """Random dev/test splits of one pool of distinct scores are an exchangeable draw, so the batch bound's share
    of splits over budget is the beta-binomial tail of its k (at most 1 - confidence), up to Monte-Carlo noise;
    the plain quantile is over budget about half the time."""
    rng = np.random.default_rng(2)
    rows = _records(rng.random(200))
    (row,) = _budget().transfer_rows(
        rows, "targ-margin", [0.3], splits=3000, dev_share=0.5, confidence=0.95, metric="acc", seed=3
    )
    exact = row["batch"]["exact_over"]
    assert 0.02 < exact <= 0.05
    assert abs(row["batch"]["over"] - exact) < 3 * (exact * (1 - exact) / 3000) ** 0.5
    assert row["plain"]["over"] > 0.3
