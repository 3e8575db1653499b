"""Fuzz: calibration files (``ragate calibrate`` writes them; ``ragate ask|eval|serve --calibration`` and
``Pipeline(calibration=)`` read them; issue N). Each starts as the calibration that ships with the demo, or one set
with a confidence bound (``Pipeline.calibrate`` / ``ragate calibrate --confidence``). A mutated file is either
read as a method name and a finite tau (what the threshold becomes) with its shares in [0, 1], or refused with a
RagateError naming it: never NaN, infinity, a string or ``true`` taken for tau."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest
from fuzzing import byte_mutation, dumps, fuzz_settings, json_mutation, refused_or_accepted
from hypothesis import given
from hypothesis import strategies as st

from ragate.errors import RagateError
from ragate.pipeline import Calibration
from ragate.retrieval.corpus import demo_dir
from ragate.tuning.calibrate import check_calibration, read_calibration

DEMO = json.loads((demo_dir() / "targ-margin-smollm2-135m-budget-0.5.json").read_text())
BOUNDED = Calibration(
    method="targ-margin",
    gate="targ-margin",
    tau=0.6412,
    budget=0.3,
    n=200,
    retrieval_rate=0.255,
    model="smollm2-135m",
    engine="llama.cpp",
    confidence=0.95,
    bound="order statistic (exact binomial)",
    k=150,
    expected_rate=0.2537,
    rate_interval=(0.196, 0.316),
).to_json()
_names = itertools.count()


def _read(tmp_path: Path, data: bytes) -> dict[str, Any] | None:
    path = tmp_path / f"calibration-{next(_names)}.json"
    path.write_bytes(data)
    cal = refused_or_accepted(lambda: read_calibration(path), path)
    if cal is None:
        return None
    assert isinstance(cal["method"], str) and cal["method"]
    assert not isinstance(cal["tau"], bool) and math.isfinite(float(cal["tau"]))
    for key in ("budget", "confidence", "dev_retrieval_rate", "dev_em", "expected_rate"):
        assert cal.get(key) is None or 0 <= cal[key] <= 1
    json.dumps(cal, allow_nan=False).encode("utf-8")  # the service reports it: strict JSON, encodable
    try:  # what --calibration does next: belongs to this method and model, or a named refusal
        check_calibration(cal, path, cal["method"], cal.get("model"), cal.get("engine", "llama.cpp"))
        check_calibration(cal, path, None, "another-model", "llama.cpp")
    except RagateError as err:
        assert path.name in str(err) and "rerun ragate calibrate" in str(err)
    return cal


@fuzz_settings
@given(st.data())
def test_fuzz_calibration_values(tmp_path: Path, data: st.DataObject) -> None:
    original = data.draw(st.sampled_from([DEMO, BOUNDED]))
    _read(tmp_path, dumps(data.draw(json_mutation(original))))


@fuzz_settings
@given(st.data())
def test_fuzz_calibration_bytes(tmp_path: Path, data: st.DataObject) -> None:
    original = data.draw(st.sampled_from([DEMO, BOUNDED]))
    raw = json.dumps(original, indent=2).encode()
    mutated = data.draw(byte_mutation(raw))
    cal = _read(tmp_path, mutated)
    if mutated == b"\xef\xbb\xbf" + raw:
        assert cal == original  # a BOM in front reads as the same file


def test_the_shipped_calibrations_read_back(tmp_path: Path) -> None:
    assert _read(tmp_path, dumps(DEMO)) == DEMO
    assert _read(tmp_path, dumps(BOUNDED)) == BOUNDED


# ------------------------------------------------------------------------------------- faults the fuzzing found


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tau": 10**400}, r"'tau' must be a finite number, not 1000"),  # used to raise OverflowError
        ({"tau": math.nan}, r"'tau' must be a finite number, not nan"),
        ({"tau": math.inf}, r"'tau' must be a finite number, not inf"),
        ({"tau": "0.7"}, r"'tau' must be a finite number, not '0.7'"),
        ({"tau": True}, r"'tau' must be a finite number, not True"),
        ({"method": ""}, r"'method' must be a method name"),
        ({"dev_retrieval_rate": math.nan}, r"'dev_retrieval_rate' cannot be nan"),
        ({"n": True}, r"'n' cannot be True"),
        ({"rate_interval": "ab"}, r"'rate_interval' cannot be 'ab'"),
        ({"model": ["m"]}, r"'model' cannot be \['m'\]"),
        ({"engine": "llama\udc80cpp"}, r"the text .*holds a lone surrogate"),
    ],
)
def test_a_calibration_that_cannot_set_a_threshold_is_refused(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    """``"tau": 1e400`` written as an integer used to escape as OverflowError (math.isfinite); NaN shares, a
    list for the model and a lone surrogate (which the service then fails to encode) used to be accepted."""
    path = tmp_path / "cal.json"
    path.write_bytes(dumps(BOUNDED | change))
    with pytest.raises(RagateError, match=r"cal\.json is not a usable `ragate calibrate` file: " + message):
        read_calibration(path)


def test_a_calibration_that_is_not_json_or_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "cal.json"
    path.write_bytes(b'{"method": "targ-margin", "tau": 0.5, "model": "caf\xe9"}')
    with pytest.raises(RagateError, match=r"cal\.json:1: not valid UTF-8; rerun ragate calibrate"):
        read_calibration(path)
    path.write_bytes(b'{"method": "targ-margin", "tau": ' + b"[" * 100_000)
    with pytest.raises(RagateError, match=r"cal\.json is not a `ragate calibrate` file: not valid JSON"):
        read_calibration(path)
