"""Every generated block of the README and docs is what its command prints from the committed records alone
(scripts/render_docs.py --check; no command reads ../shared, so a bare clone checks them too), and a number edited
by hand inside a block fails the check."""

from __future__ import annotations

import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "docs" / "results" / "runs"
# benchmarks/learned_gate.py's blocks, the costliest to compute (its fits), checked in a test of their own; the
# questions' texts they read are in the sweeps' records (scripts/record_questions.py), not in ../shared/data
LEARNED = frozenset({"learned-gate", "learned-gate-summary"})


def _render_docs():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("render_docs", ROOT / "scripts" / "render_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("render_docs", module)  # its dataclass looks its module up
    spec.loader.exec_module(sys.modules["render_docs"])
    module = sys.modules["render_docs"]
    return module


def test_every_generated_block_is_what_its_command_prints(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Every block but the learned gate's (the next test), with the QA data folder out of reach (as on a user's
    machine: ragate.eval.datasets.data_dir refuses a $RAGATE_DATA_DIR that does not exist)."""
    monkeypatch.setenv("RAGATE_DATA_DIR", str(tmp_path / "absent"))
    render = _render_docs()
    names = {b.name for p in render.doc_files() for b in render.blocks(p)}
    assert {"learned-gate", "learned-gate-summary", "gate-table", "shadow-latency"} <= names
    only = [arg for name in sorted(names - LEARNED) for arg in ("--only", name)]
    figures = {p: p.stat().st_mtime_ns for p in (ROOT / "docs" / "img").glob("*.png")}
    assert render.main(["--check", *only]) == 0, capsys.readouterr().out  # the diff of each stale block
    assert {p: p.stat().st_mtime_ns for p in figures} == figures  # a check draws its figures elsewhere


def test_the_learned_gate_blocks_are_what_their_command_prints(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The learned gate's tables, with the QA data folder out of reach (the questions' texts are in the records)."""
    monkeypatch.chdir(ROOT)  # the commands run from the repository root
    monkeypatch.setenv("RAGATE_DATA_DIR", str(tmp_path / "absent"))
    render = _render_docs()
    only = [arg for name in sorted(LEARNED) for arg in ("--only", name)]
    assert render.main(["--check", *only]) == 0, capsys.readouterr().out


def test_a_number_edited_by_hand_fails_the_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    render = _render_docs()
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "service.md", tmp_path / "docs" / "service.md")
    (tmp_path / "README.md").write_text("# no blocks here\n")
    shutil.copytree(ROOT / "benchmarks", tmp_path / "benchmarks", ignore=shutil.ignore_patterns("*.jsonl"))
    assert render.main(["--check", "--root", str(tmp_path), "--only", "shadow-latency"]) == 0
    page = tmp_path / "docs" / "service.md"
    text = page.read_text()
    block = text[text.index("<!-- begin generated: shadow-latency") :]
    row = next(line for line in block.splitlines() if line.startswith("| 10 s |"))
    edited = row.replace(row.split(" | ")[1], "0.999")  # the p50 ratio, by hand
    page.write_text(text.replace(row, edited))
    capsys.readouterr()
    assert render.main(["--check", "--root", str(tmp_path), "--only", "shadow-latency"]) == 1
    printed = capsys.readouterr()
    assert f"-{edited}" in printed.out and f"+{row}" in printed.out
    assert "0 of 1 generated blocks match their commands" in printed.err
    # re-rendering puts the command's numbers back
    assert render.main(["--root", str(tmp_path), "--only", "shadow-latency"]) == 0
    assert page.read_text() == text


def test_no_measured_table_is_typed_by_hand(capsys: pytest.CaptureFixture[str]) -> None:
    """Every table with numbers in README.md and docs/ (the archive and the run records aside) is a generated block
    or a reference table (scripts/render_docs.py --list names any other)."""
    render = _render_docs()
    tables = render.measured_by_hand()
    rows = sum(t.numeric_rows for t in tables)
    with capsys.disabled():
        print(f"\n{rows} rows with numbers in {len(tables)} measured tables typed by hand")
    assert rows == 0, "\n".join(f"{t.path}:{t.line}: {t.numeric_rows} rows" for t in tables)


def test_a_table_counts_as_typed_by_hand_outside_blocks_fences_and_reference_marks(tmp_path: Path) -> None:
    render = _render_docs()
    page = tmp_path / "page.md"
    page.write_text(
        "| measured | acc |\n|---|---|\n| gate | 31.2 |\n| label only | – |\n\n"
        "<!-- reference table: the paper's own numbers -->\n\n| paper | EM |\n|---|---|\n| DTR | 40.1 |\n\n"
        "<!-- begin generated: x (python -c 1) -->\n| a | b |\n|---|---|\n| c | 1.0 |\n<!-- end generated: x -->\n\n"
        "```\n| in | code |\n|---|---|\n| d | 2 |\n```\n"
    )
    tables = render.hand_tables(page)
    assert [(t.line, t.numeric_rows, t.reference) for t in tables] == [(1, 1, None), (8, 1, "the paper's own numbers")]


def test_a_figure_is_drawn_into_the_tree_when_rendering_and_elsewhere_when_checking(tmp_path: Path) -> None:
    render = _render_docs()
    argv = ["--plot", "{figure:docs/img/x.png}", "--metric", "acc"]
    assert render.figure_args(argv, tmp_path, None) == ["--plot", str(tmp_path / "docs/img/x.png"), "--metric", "acc"]
    assert render.figure_args(argv, tmp_path, tmp_path / "scratch")[1] == str(tmp_path / "scratch" / "x.png")


# Blocks that show a benchmark's committed output as it printed it: their intervals were drawn when the benchmark ran
# (from timings or answers kept only as that output), so no seed given now can redraw them.
AS_PRINTED = ("scripts/show_result.py", "scripts/show_table.py", "scripts/topk_summary.py")
INTERVAL = r"\[\s*[-+−]?\d+(?:\.\d+)?\s*,\s*[-+−]?\d+(?:\.\d+)?\s*\]"


def _interval_blocks(render):  # type: ignore[no-untyped-def]
    import re

    return [b for p in render.doc_files() for b in render.blocks(p) if re.search(INTERVAL, b.text)]


def test_every_block_that_draws_intervals_takes_the_specs_seed_and_resamples() -> None:
    """A block with a bootstrap interval names the results spec in its command ({spec}, or {spec:seed} and
    {spec:samples}), unless it shows a benchmark's output as that run printed it."""
    render = _render_docs()
    found = _interval_blocks(render)
    assert len(found) > 30
    for b in found:
        if any(tool in b.command for tool in AS_PRINTED):
            continue
        takes = "{spec}" in b.command.split() or {"{spec:seed}", "{spec:samples}"} <= set(b.command.split())
        assert takes, f"{b.path.name}: {b.name} draws intervals with a seed of its own: `{b.command}`"


def test_editing_the_seed_in_the_spec_changes_every_block_that_draws_intervals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checked against a spec with another seed (and fewer resamples, for time), every block that takes the spec's
    seed prints other intervals (the intervals compared, not the captions that print the seed), but for a block whose intervals are all of zero width (every answer scored alike:
    no seed can move them). The learned gate's blocks (45 s of fits on one core for the same digits but the
    intervals') are held by the next test."""
    import re
    import tomllib

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("RAGATE_DATA_DIR", str(tmp_path / "absent"))
    render = _render_docs()
    spec = ROOT / "docs" / "results" / "spec.toml"
    values = tomllib.loads(spec.read_text())
    other = tmp_path / "spec.toml"
    text = spec.read_text()
    for key, value in (("seed", values["seed"] + 1), ("samples", 300), ("stability_seeds", 3)):
        text, n = re.subn(rf"(?m)^{key} = \S+", f"{key} = {value}", text)
        assert n == 1, key
    other.write_text(text)
    taking = [b for b in _interval_blocks(render) if "{spec" in b.command and b.name not in LEARNED]
    assert len(taking) > 30
    with tempfile.TemporaryDirectory() as scratch:
        redrawn = render.expected(taking, ROOT, figures=Path(scratch), spec=other)
    for b in taking:  # the intervals themselves, not a caption that prints the seed
        before, after = re.findall(INTERVAL, b.text), re.findall(INTERVAL, redrawn[b.path, b.name])
        degenerate = all(lo == hi for lo, hi in re.findall(r"\[\s*([-+−]?[\d.]+)\s*,\s*([-+−]?[\d.]+)\s*\]", b.text))
        assert before != after or degenerate, f"{b.path.name}: {b.name} kept its intervals under another seed"


def test_the_learned_gate_draws_every_interval_with_the_seed_it_is_given() -> None:
    """benchmarks/learned_gate.py's intervals all go through one Resampling (its --seed and --resamples): its
    cross-fitted private-documents rows, whose fits take a second, print other intervals under another seed and
    the same numbers under the same one."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import learned_gate
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from ragate.eval.metrics import Resampling

    first = learned_gate.private_docs_rows(Resampling(300, 1))
    assert first == learned_gate.private_docs_rows(Resampling(300, 1))
    assert first != learned_gate.private_docs_rows(Resampling(300, 2))


def test_every_figure_is_checked_by_the_data_it_plots() -> None:
    """A block whose command draws a figure prints the line that stands for the figure's data, and that line moves
    with any plotted value (so a check fails where a figure would be redrawn from other data)."""
    from ragate.report.plots import figure_data

    render = _render_docs()
    drawing = [b for p in render.doc_files() for b in render.blocks(p) if "{figure:" in b.command]
    assert len(drawing) >= 4
    for b in drawing:
        assert "The figure's data: " in b.text, f"{b.path.name}: {b.name} draws a figure but prints none of its data"
    series = {"a": [0.25, 0.5, 0.75], "b": [1.0, 2.0]}
    line = figure_data(series)
    assert line.startswith("The figure's data: 2 series, 5 values; sha256 ")
    assert figure_data({"a": [0.25, 0.5, 0.75], "b": [1.0, 2.0000001]}) == line  # below the 6 decimals kept
    assert figure_data({"a": [0.25, 0.5, 0.751], "b": [1.0, 2.0]}) != line
    assert figure_data({"b": [1.0, 2.0], "a": [0.25, 0.5, 0.75]}) == line
