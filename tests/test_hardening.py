"""Issue K: what a careless user or a damaged file must get is a `ragate: error:` naming the problem and the fix
(exit 2), never a traceback; a kill that cuts a line anywhere, even inside a multi-byte character, loses only that
line. Each test here failed on main before the fix (see the issue's closing note)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragate.cli.main import main
from ragate.errors import DatasetFormatError, RunFormatError
from ragate.eval.datasets import load_dataset
from ragate.eval.records import read_records

RECORD = {"id": "q1", "method": "no-retrieval", "prediction": "Wilhelm Röntgen"}


def test_a_last_line_cut_inside_a_multibyte_character_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "questions.jsonl"
    whole = (json.dumps(RECORD, ensure_ascii=False) + "\n").encode()
    cut = json.dumps(RECORD | {"id": "q2"}, ensure_ascii=False).encode()
    cut = cut[: cut.index("ö".encode()) + 1]  # ...R\xc3: the kill came between the two bytes of "ö"
    path.write_bytes(whole + cut)
    assert read_records(path) == [RECORD]
    assert path.read_bytes() == whole  # rewritten without the cut line, so appending goes on


def test_a_damaged_line_in_the_middle_is_a_named_error(tmp_path: Path) -> None:
    path = tmp_path / "questions.jsonl"
    good = json.dumps(RECORD, ensure_ascii=False).encode()
    for bad in (b'{"id": "q2", "meth', b'{"id": "q2", "prediction": "R\xc3"}'):
        path.write_bytes(good + b"\n" + bad + b"\n" + good + b"\n")
        with pytest.raises(RunFormatError, match=r"line 2: not a JSON record .*--resume"):
            read_records(path)


def test_resume_over_a_damaged_run_is_an_error_not_a_traceback(
    smollm2_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    args = [
        "eval",
        "--dataset",
        "demo",
        "--methods",
        "no-retrieval",
        "--limit",
        "2",
        "--out",
        str(out),
        "--quiet",
    ]
    assert main(args) == 0
    path = out / "questions.jsonl"
    first, second = path.read_bytes().splitlines()
    path.write_bytes(first + b"\n" + second[:20] + b"\n" + second + b"\n")
    capsys.readouterr()
    assert main([*args, "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ragate: error: ") and "line 2: not a JSON record" in err and "Traceback" not in err


def test_a_dataset_line_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "questions.jsonl"
    path.write_bytes(
        b'{"question": "who?", "answers": ["a"]}\n{"question": "R\xc3ntgen?", "answers": ["b"]}\n'
    )
    with pytest.raises(DatasetFormatError, match=r"questions.jsonl:2: not valid UTF-8"):
        load_dataset(path)
    tsv = tmp_path / "qa.tsv"
    tsv.write_bytes(b"who?\t['a']\nR\xc3ntgen?\t['b']\n")
    from ragate.eval.datasets import _read_dpr_tsv

    with pytest.raises(DatasetFormatError, match=r"qa.tsv:2: not valid UTF-8"):
        _read_dpr_tsv(tsv, "qa", "span")
