"""Fuzz: the live budget's state file (``ragate serve --budget-state``), the one file a server both reads at start
and rewrites after every answer (issue N)."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

from fuzzing import byte_mutation, dumps, fuzz_settings, json_mutation, refused_or_accepted
from hypothesis import given
from hypothesis import strategies as st

from ragate.methods import get_method
from ragate.service.budget import BudgetController

STATE = {
    "method": "targ-margin",
    "model": "m",
    "budget": 0.3,
    "window": 10,
    "tau": 0.42,
    "scores": [0.1, 0.9, 0.42, 2.5],
    "decisions": [False, True, False, True],
}
_names = itertools.count()


def _check(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / f"state-{next(_names)}.json"
    path.write_bytes(data)
    controller = refused_or_accepted(
        lambda: BudgetController(0.3, 10, get_method("targ-margin"), path, model="m"), path
    )
    if controller is None:
        return
    assert math.isfinite(controller.tau)
    rate = controller.rate()
    assert rate is None or 0.0 <= rate <= 1.0
    controller.observe(0.5, retrieved=True)  # an accepted state keeps working: the next answer is kept
    assert json.loads(path.read_text())["scores"][-1] == 0.5


@fuzz_settings
@given(st.data())
def test_fuzz_budget_state_values(tmp_path: Path, data: st.DataObject) -> None:
    _check(tmp_path, dumps(data.draw(json_mutation(STATE))))


@fuzz_settings
@given(st.data())
def test_fuzz_budget_state_bytes(tmp_path: Path, data: st.DataObject) -> None:
    _check(tmp_path, data.draw(byte_mutation(dumps(STATE))))
