"""Re-reading a sweep whose reader changed (ragate.eval.reread) on the shipped 1.5B runs of docs/results/runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ragate.errors import RagateError
from ragate.eval.records import latest, read_records
from ragate.eval.reread import reading_side_only, reread_sweep
from ragate.eval.sweep import compact

RUNS = Path(__file__).resolve().parents[1] / "docs" / "results" / "runs"
SWEEP = RUNS / "sweep-nq-open-oracle-qwen2.5-coder-1.5b-300"
RUN = RUNS / "nq-open-oracle-m-qwen2.5-coder-1.5b-300"


def test_reading_side_only() -> None:
    old_targ = "targ|question|k=5|n=5|cos|hyde=1|rep=5|ce=None|max=64"
    assert reading_side_only(old_targ, old_targ.replace("targ|", "targ-question-first|")) is None
    dtr = "dtr|dpr-ais|k=3|n=5|cos|hyde=1|rep=5|ce=None|max=64|pseudo=128"
    assert reading_side_only(dtr, dtr.replace("pseudo=128", "pseudo=1024")) is None
    assert "k" in (reading_side_only(old_targ, old_targ.replace("k=5", "k=3")) or "")
    assert "closed-book" in (reading_side_only(old_targ, old_targ.replace("targ|", "dtr|")) or "")
    assert "not known" in (reading_side_only(old_targ, old_targ.replace("targ|", "nope|")) or "")


def test_reread_replaces_only_the_retrieval_answers(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    reread = reread_sweep(SWEEP, RUN, out)
    assert {(r["method"], r["family"].split("|")[0]) for r in reread} == {
        ("dtr-no-ugt", "dtr"),
        ("targ-always", "targ-question-first"),
    }
    before = {(r["id"], r["family"]): r for r in compact(SWEEP / "sweep.jsonl")}
    after = compact(out / "sweep.jsonl")
    assert len(after) == len(before) == 900
    answers = {(r["method"], r["id"]): r for r in latest(read_records(RUN / "questions.jsonl", repair=False))}
    by_family = {r["family"]: r for r in reread}
    changed = 0
    for r in after:
        entry = by_family.get(r["family"])
        old = before[r["id"], entry["family_was"] if entry else r["family"]]
        assert r["closed"] == old["closed"] and r["gates"] == old["gates"]  # decided before reading: kept
        if entry is None:
            assert r["open"] == old["open"]  # the judge/random family is in today's form already
        else:
            assert r["open"]["prediction"] == answers[entry["method"], r["id"]]["prediction"]
            changed += r["open"]["prediction"] != old["open"]["prediction"]
    assert changed > 100  # the reader order moved most TARG answers (it is why the rows were stale)
    saved = json.loads((out / "config.json").read_text())
    assert saved["reread"] == reread and saved["reread_from"] == str(SWEEP)
    assert (out / "sweep.json").exists() and (out / "results.json").exists()


def test_reread_refuses_what_it_cannot_vouch_for(tmp_path: Path) -> None:
    with pytest.raises(RagateError, match="new directory"):
        reread_sweep(SWEEP, RUN, SWEEP)
    with pytest.raises(RagateError, match="a sweep .* and then an eval run"):
        reread_sweep(RUN, SWEEP, tmp_path / "a")
    other = tmp_path / "other-model"
    other.mkdir()
    for name in ("config.json", "questions.jsonl"):
        shutil.copy(RUN / name, other / name)
    results = json.loads((RUN / "results.json").read_text())
    results["provenance"]["model"]["sha256"] = "0" * 64
    (other / "results.json").write_text(json.dumps(results))
    with pytest.raises(RagateError, match="same model"):
        reread_sweep(SWEEP, other, tmp_path / "b")
    short = tmp_path / "short"
    shutil.copytree(other, short)
    (short / "results.json").write_text((RUN / "results.json").read_text())
    rows = [json.loads(line) for line in (RUN / "questions.jsonl").read_text().splitlines()]
    kept = [r for r in rows if not (r["method"] == "targ-always" and r["id"] == "nq-open-oracle-7")]
    (short / "questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    with pytest.raises(RagateError, match="targ-always has no answer for 1 questions"):
        reread_sweep(SWEEP, short, tmp_path / "c")
    reread_sweep(SWEEP, RUN, tmp_path / "d")
    with pytest.raises(RagateError, match="already holds a sweep"):
        reread_sweep(SWEEP, RUN, tmp_path / "d")
    with pytest.raises(RagateError, match="already in today's form"):
        reread_sweep(tmp_path / "d", RUN, tmp_path / "e")
