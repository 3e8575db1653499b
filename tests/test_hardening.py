"""Issue K: what a careless user or a damaged file must get is a `ragate: error:` naming the problem and the fix
(exit 2), never a traceback; a kill that cuts a line anywhere, even inside a multi-byte character, loses only that
line. Each test here failed on main before the fix (see the issue's closing note)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

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


def _hold_lock(path: Path) -> subprocess.Popen[str]:
    """Another process holding ``path``'s lock (as a running `ragate eval` does) until it is killed."""
    code = (
        "import sys, time\nfrom ragate.fileio import exclusive_lock\n"
        f"with exclusive_lock({str(path)!r}, 'x'):\n    print('held', flush=True)\n    time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def test_a_second_writer_of_a_run_directory_is_refused_with_the_holders_pid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ragate.eval.run import LOCK_FILE

    out = tmp_path / "run"
    holder = _hold_lock(out / LOCK_FILE)
    try:
        for command in ("eval", "sweep"):
            args = [command, "--dataset", "demo", "--methods", "dtr", "--limit", "1", "--out", str(out)]
            assert main([*args, "--resume"]) == 2
            err = capsys.readouterr().err
            assert f"run directory {out} is in use by another ragate process (pid {holder.pid})" in err
    finally:
        holder.kill()
        holder.wait()
    assert not list(out.glob("*.jsonl"))  # the refused runs wrote nothing


def test_one_index_build_per_out_and_a_killed_builds_staging_is_cleaned(tmp_path: Path) -> None:
    from ragate.errors import RagateError
    from ragate.retrieval.index import build_index
    from ragate.retrieval.types import Passage

    passages = [Passage(f"p{i}", f"title {i}", f"text number {i} about things") for i in range(5)]
    out = tmp_path / "ix"
    dead = tmp_path / ".ix.tmp-0badc0de"  # what `kill -9` during a build leaves behind
    dead.mkdir()
    (dead / "passages.jsonl").write_text("{}\n")
    holder = _hold_lock(tmp_path / ".ix.lock")
    try:
        with pytest.raises(RagateError, match=rf"index directory {out} .*in use .*pid {holder.pid}"):
            build_index(passages, out, "bm25", progress=False)
    finally:
        holder.kill()
        holder.wait()
    assert dead.exists()  # a live build's staging is never touched
    build_index(passages, out, "bm25", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ix"]


def _rewrite(index: Path, name: str, data: bytes) -> None:
    """Replace one index file and record its new size and sha256, as a careless rebuild of the manifest would."""
    import hashlib

    (index / name).write_bytes(data)
    manifest = json.loads((index / "manifest.json").read_text())
    manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (index / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    ("name", "damage"),
    [
        ("bm25/vocab.index.json", lambda b: b[: len(b) // 2]),  # truncated JSON
        ("bm25/vocab.index.json", lambda b: b"[1, 2, 3]"),  # JSON, but not the vocabulary object
        ("bm25/params.index.json", lambda b: b"{not json"),
        ("bm25/data.csc.index.npy", lambda b: b[: len(b) - 9]),  # truncated array
        ("bm25/data.csc.index.npy", None),  # an object-dtype (pickled) array
    ],
)
@pytest.mark.parametrize("verify", [True, False])
def test_damaged_bm25_files_are_an_index_error_not_a_traceback(
    tmp_path: Path, name: str, damage: Any, verify: bool
) -> None:
    import io

    import numpy as np

    from ragate.errors import IndexFormatError
    from ragate.retrieval.index import build_index, open_index
    from ragate.retrieval.types import Passage

    passages = [Passage(f"p{i}", f"title {i}", f"text number {i} about things") for i in range(5)]
    index = build_index(passages, tmp_path / "ix", "bm25", progress=False)
    if damage is None:
        buf = io.BytesIO()
        np.save(buf, np.array([{"x": 1}, None], dtype=object), allow_pickle=True)
        data = buf.getvalue()
    else:
        data = damage((index / name).read_bytes())
    _rewrite(index, name, data)
    with pytest.raises(
        IndexFormatError, match=r"bm25.* cannot be read .*rebuild the index with `ragate index"
    ):
        open_index(index, verify=verify).close()


def test_resume_knows_the_index_by_its_resolved_path_and_notices_a_rebuild(tmp_path: Path) -> None:
    from ragate.backends.scripted import ScriptedBackend, make_generation
    from ragate.errors import RagateError
    from ragate.eval.run import EvalConfig, run_eval
    from ragate.models import ragate_home
    from ragate.retrieval.index import build_index
    from ragate.retrieval.types import Passage

    def lm() -> ScriptedBackend:
        return ScriptedBackend([make_generation(["x"], [-0.1])] * 4)

    def run(index: str | None, out: Path, *, resume: bool, limit: int, accept: bool = False) -> None:
        config = EvalConfig("demo", ("no-retrieval",), index=index, limit=limit)
        run_eval(
            config, out, lm=lm(), progress=False, resume=resume, cache=False, accept_rebuilt_index=accept
        )

    # the default index, then the same index spelled out: one index, so the run resumes
    run(None, tmp_path / "a", resume=False, limit=1)
    saved = json.loads((tmp_path / "a" / "config.json").read_text())
    assert saved["index"] is None and saved["index_identity"]["path"] == str(
        ragate_home() / "indexes" / "demo"
    )
    run(str(ragate_home() / "indexes" / ".." / "indexes" / "demo"), tmp_path / "a", resume=True, limit=1)

    passages = [Passage(f"p{i}", f"title {i}", f"text number {i} about things") for i in range(5)]
    index = build_index(passages, tmp_path / "ix", "bm25", progress=False)
    run(str(index), tmp_path / "b", resume=False, limit=1)
    run(str(index), tmp_path / "b", resume=True, limit=1)  # unchanged: fine
    # the same passages and settings, other bits (as a rebuild on another CPU leaves dense vectors): refused,
    # with the way out named; accepted on request and recorded
    config_path = tmp_path / "b" / "config.json"
    saved = json.loads(config_path.read_text())
    saved["index_identity"]["files_sha256"] = "0" * 64
    config_path.write_text(json.dumps(saved))
    with pytest.raises(
        RagateError, match=r"rebuilt since.*only the vectors' bits differ.*--accept-rebuilt-index"
    ):
        run(str(index), tmp_path / "b", resume=True, limit=1)
    run(str(index), tmp_path / "b", resume=True, limit=1, accept=True)
    after = json.loads(config_path.read_text())
    (rebuild,) = after["index_rebuilds"]
    assert (
        rebuild["was"] == "0" * 64 and rebuild["now"] == after["index_identity"]["files_sha256"] != "0" * 64
    )
    assert rebuild["passages_verified"] is True
    # a run saved before the passages' digest was recorded: compared by count, encoder and settings, said so
    after["index_identity"] |= {"files_sha256": "1" * 64, "passages_sha256": None}
    config_path.write_text(json.dumps(after))
    with pytest.raises(RagateError, match=r"did not record its passages' sha256.*texts are unverified"):
        run(str(index), tmp_path / "b", resume=True, limit=1)
    run(str(index), tmp_path / "b", resume=True, limit=1, accept=True)
    assert json.loads(config_path.read_text())["index_rebuilds"][-1]["passages_verified"] is False
    build_index(passages[:3], index, "bm25", progress=False, overwrite=True)
    for accept in (False, True):  # other passages: another index, whatever is accepted
        with pytest.raises(RagateError, match=r"the index at .*ix was rebuilt since") as err:
            run(str(index), tmp_path / "b", resume=True, limit=1, accept=accept)
        assert "--accept-rebuilt-index" not in str(err.value)


def test_retry_after_is_the_expected_wait_for_the_oldest_request_not_the_mean() -> None:
    from ragate.service.admission import Slots

    now = [0.0]
    slots = Slots(1, lambda used: None, clock=lambda: now[0])
    assert slots.take()
    now[0] = 40.0
    slots.give(40.0)  # one request took 40 s: the mean moves from 1 toward 40
    mean = 0.8 * 1.0 + 0.2 * 40.0  # 8.8
    assert slots.take()
    assert slots.retry_after() == math.ceil(mean)  # it just started: the whole mean is left
    now[0] += 2.0
    assert not slots.take() and slots.retry_after() == math.ceil(mean - 2.0) == 7  # the mean alone said 9
    now[0] += 60.0  # overdue: it may end any moment
    assert slots.retry_after() == 1
    slots.give(62.0)
    assert slots.take() and slots.used == 1
