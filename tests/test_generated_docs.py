"""Every generated block of the README and docs is what its command prints from the committed records alone
(scripts/render_docs.py --check; no command reads ../shared, so a bare clone checks them too), and a number edited
by hand inside a block fails the check."""

from __future__ import annotations

import importlib.util
import shutil
import sys
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
