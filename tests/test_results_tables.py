"""docs/results.md, the README's headline and docs/results/gate_table.md hold no table outside a generated block;
the results spec's TARG rows rest on scores divided by k (Eqs. 1-2); the verdict rule; a hand-edited number in the
results page fails the check (scripts/results_tables.py, scripts/render_docs.py)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "docs" / "results" / "spec.toml"


def _script(name: str) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # a dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def _tables_outside_blocks(text: str) -> list[str]:
    inside, stray = False, []
    for line in text.splitlines():
        if line.startswith("<!-- begin generated:"):
            inside = True
        elif line.startswith("<!-- end generated:"):
            inside = False
        elif line.startswith("|") and not inside:
            stray.append(line)
    return stray


def test_no_results_table_is_typed_by_hand() -> None:
    for page in (ROOT / "docs" / "results.md", ROOT / "docs" / "results" / "gate_table.md"):
        assert _tables_outside_blocks(page.read_text(encoding="utf-8")) == [], page
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    headline = readme[readme.index("## Headline results") :]
    headline = headline[: headline.index("\n## ", 1)]
    assert "<!-- begin generated: results-headline" in headline
    assert _tables_outside_blocks(headline) == []
    assert _tables_outside_blocks("| a |\n<!-- begin generated: x (y) -->\n| b |\n<!-- end generated: x -->") == [
        "| a |"
    ]


def test_targ_rows_rest_on_scores_divided_by_k() -> None:
    """A sweep whose TARG entropy or margin rows the spec reports was scored with TARG's mean over k (Eqs. 1-2),
    not over the tokens present; a pre-fix sweep is used only for rows without those gates."""
    spec = tomllib.loads(SPEC.read_text(encoding="utf-8"))
    runs = spec["runs"]
    targ = ("targ-entropy", "targ-margin")
    used: set[str] = set()
    for table in spec["table"]:
        if table["kind"] == "budget" and any(g in targ for g in table.get("gates", [])):
            used.add(table["sweep"])
        for row in table.get("rows", []):
            for side in (row.get("new"), row.get("old")) if isinstance(row, dict) else ():
                if side and any(f":{g}@" in side or f"@{g}@" in side for g in targ):
                    used.add(side.partition(":")[0])
    assert used, "the spec reports no TARG entropy or margin row"
    for run in sorted(used):
        config = json.loads((ROOT / spec["runs_dir"] / runs[run] / "config.json").read_text())
        assert config.get("targ_mean") == "k", f"{run} ({runs[run]}) scores TARG over the tokens present"


def test_the_verdict_rule() -> None:
    tables = _script("results_tables")
    verdict = tables.claim_verdict
    assert verdict(0.1, 2.0, "higher") == "holds"
    assert verdict(-2.0, -0.1, "higher") == "against"
    assert verdict(-0.1, 2.0, "higher") == "not established"
    assert verdict(0.0, 2.0, "higher") == "not established"  # an interval that reaches 0
    assert verdict(-2.0, -0.1, "lower") == "holds"
    assert verdict(-2.0, -0.1, "not lower") == "against"
    assert verdict(0.1, 2.0, "not lower") == "not established"  # no margin: equivalence is never "holds"
    assert verdict(0.1, 2.0, "not higher") == "against"
    with pytest.raises(SystemExit, match="expect = 'better'"):
        verdict(0.1, 2.0, "better")
    assert tables.paper_note(3.7, {"lo": -4.3, "hi": 2.3}) == "; the paper's +3.7 lies outside the interval"
    assert tables.difference_verdict(-0.2, -0.1) == "lower"


def test_a_spec_naming_an_unknown_run_is_refused() -> None:
    tables = _script("results_tables")
    spec = {"runs": {"A": "no-such-run"}, "table": [{"name": "t", "kind": "paired", "pairs": [["A:x", "B:y"]]}]}
    with pytest.raises(SystemExit, match="no-such-run is not a directory of run records"):
        tables.render(spec)
    spec["runs"] = {}
    with pytest.raises(SystemExit, match="run 'A' is not in the spec's"):
        tables.render(spec)


def test_a_number_edited_by_hand_in_the_results_page_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    render = _script("render_docs")
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "scripts").symlink_to(ROOT / "scripts")
    shutil.copy(ROOT / "docs" / "results.md", tmp_path / "docs" / "results.md")
    shutil.copy(SPEC, tmp_path / "docs" / "results" / "spec.toml")
    (tmp_path / "README.md").write_text("# no blocks here\n")
    args = ["--root", str(tmp_path), "--only", "results-summary"]
    assert render.main(["--check", *args]) == 0
    page = tmp_path / "docs" / "results.md"
    text = page.read_text()
    block = text[text.index("<!-- begin generated: results-summary") :]
    row = next(line for line in block.splitlines() if "HotpotQA (TARG) | implied | acc" in line)
    edited = row.replace("against", "not established", 1)  # a verdict typed by hand
    page.write_text(text.replace(row, edited, 1))
    capsys.readouterr()
    assert render.main(["--check", *args]) == 1
    printed = capsys.readouterr()
    assert f"-{edited}" in printed.out and f"+{row}" in printed.out
    assert render.main(args) == 0
    assert page.read_text() == text
