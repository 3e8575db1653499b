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

RECORD = {
    "id": "q1", "method": "no-retrieval", "prediction": "Wilhelm Röntgen",
    "scores": {"em": 1.0, "f1": 1.0, "acc": 1.0}, "retrieved": False, "retrievals": 0, "prompt_tokens": 30,
    "completion_tokens": 4, "overhead_tokens": 0, "seconds": 0.5,
}  # fmt: skip


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
    for bad in (b'{"id": "q2", "meth', b'{"id": "q2", "method": "dtr", "prediction": "R\xc3"}'):
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

    def served(seconds: float) -> None:
        work = slots.take()
        assert work is not None
        slots.begin(work)
        now[0] += seconds
        slots.give(work, seconds)

    served(40.0)  # one answer took 40 s: the first of its kind is the mean
    served(10.0)
    mean = 0.8 * 40.0 + 0.2 * 10.0  # 34
    work = slots.take()
    assert work is not None
    assert slots.retry_after() == math.ceil(mean)  # it waits for the model: the whole mean is left
    slots.begin(work)
    now[0] += 2.0
    assert slots.take() is None and slots.retry_after() == math.ceil(mean - 2.0) == 32
    now[0] += 60.0  # overdue: it may end any moment
    assert slots.retry_after() == 1
    slots.give(work, 62.0)
    assert slots.take() is not None and slots.used == 1


def test_retry_after_is_per_kind_of_request() -> None:
    """Before (issue N): one mean over every endpoint; fast searches pulled it to ~1 s while answers held the
    slots for ~42 s. Now each request at work is expected to last as long as its own kind does."""
    from ragate.service.admission import Slots

    now = [0.0]
    slots = Slots(2, lambda used: None, clock=lambda: now[0])

    def take(kind: str) -> Any:
        work = slots.take(kind)
        assert work is not None
        slots.begin(work)
        return work

    for _ in range(20):  # many fast searches
        search = take("search")
        now[0] += 0.01
        slots.give(search, 0.01)
    answer = take("answer")
    now[0] += 42.0
    slots.give(answer, 42.0)
    answers = [take("answer"), take("answer")]  # two answers hold both slots
    now[0] += 2.0
    assert slots.take("search") is None
    assert slots.retry_after() == 40  # not 1
    slots.give(answers[0], None)  # one never ran: a slot is free again
    assert slots.retry_after() == 1 and slots.take("search") is not None


# -- issue N: state files a server keeps are checked at start -------------------------------------------------


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("scores", [float("nan"), 1.0], "'scores' must be a list of finite numbers"),
        ("scores", "123", "'scores' must be a list of finite numbers"),
        ("scores", [10**400], "'scores' must be a list of finite numbers"),
        ("scores", [True], "'scores' must be a list of finite numbers"),
        ("decisions", "abc", "'decisions' must be a list of true/false"),
        ("decisions", [1, 0], "'decisions' must be a list of true/false"),
        ("tau", float("nan"), "'tau' must be a finite number"),
        ("tau", float("inf"), "'tau' must be a finite number"),
        ("tau", "0.7", "'tau' must be a finite number"),
        ("tau", True, "'tau' must be a finite number"),
    ],
)
def test_a_budget_state_with_bad_values_is_refused_at_start(
    tmp_path: Path, field: str, value: object, words: str
) -> None:
    """Before: NaN scores were loaded, every answer was computed and then lost to a 500 (`dev scores contain NaN`)
    for a whole window; "123" was read as the scores [1, 2, 3] and "abc" as three retrievals."""
    from ragate.errors import RagateError
    from ragate.methods import get_method
    from ragate.service.budget import BudgetController

    state = tmp_path / "budget.json"
    good = {"method": "targ-margin", "model": "m", "tau": 0.5, "scores": [0.1, 0.2], "decisions": [True, False]}
    state.write_text(json.dumps({**good, field: value}))
    with pytest.raises(RagateError, match=words) as caught:
        BudgetController(0.3, 10, get_method("targ-margin"), state, model="m")
    assert "budget.json" in str(caught.value) and "delete it" in str(caught.value)
    state.write_text(json.dumps(good))  # the same file with good values loads
    assert BudgetController(0.3, 10, get_method("targ-margin"), state, model="m").tau == 0.5


def test_a_budget_state_path_that_cannot_be_written_is_refused_before_the_model_loads(tmp_path: Path) -> None:
    """Before: `--budget-state afile/budget.json` (afile a file) started; every answer was computed (110 s) and
    then answered 500 (FileExistsError). Now the Pipeline refuses it before loading a model."""
    import ragate
    from ragate.errors import RagateError

    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    with pytest.raises(RagateError, match="cannot create its folder") as caught:
        ragate.Pipeline("targ-margin", model="no-such-model", budget=0.3, budget_state=afile / "budget.json")
    assert "--budget-state" in str(caught.value)
    with pytest.raises(RagateError, match="is a directory"):
        ragate.Pipeline("targ-margin", model="no-such-model", budget=0.3, budget_state=tmp_path)


def test_a_budget_state_that_cannot_be_written_later_keeps_the_answers(tmp_path: Path) -> None:
    """A state folder that disappears after start (a full disk, an operator's rm): the answer is kept, tau lives
    in memory, and the error is shown until a write succeeds."""
    from ragate.methods import get_method
    from ragate.service.budget import BudgetController

    folder = tmp_path / "state"
    controller = BudgetController(0.3, 10, get_method("targ-margin"), folder / "budget.json", model="m")
    folder.rmdir()
    folder.write_text("now a file")  # the state's folder is gone: every write fails
    tau = controller.observe(1.0, retrieved=True)
    assert tau == 1.0 and controller.write_error is not None
    folder.unlink()
    folder.mkdir()
    controller.observe(2.0, retrieved=False)
    assert controller.write_error is None and json.loads((folder / "budget.json").read_text())["scores"] == [1, 2]


# -- issue N: text no tokenizer can encode is named, wherever it comes from --------------------------------------


def test_a_lone_surrogate_reaching_a_tokenizer_is_named_not_a_traceback(llama_backend: Any) -> None:
    """Before: a dataset question "q1\\ud800" reached llama.cpp's tokenize and raised UnicodeEncodeError. The
    readers now refuse such text; the backend is the last line for any reader that misses one."""
    from ragate.errors import RagateError
    from ragate.types import GenerationRequest, Message

    request = GenerationRequest((Message("user", "who wrote \ud800 hamlet"),), max_tokens=4)
    with pytest.raises(RagateError, match="lone surrogate .* after 'who wrote '"):
        llama_backend.tokenize(request.prompt)
    with pytest.raises(RagateError, match="lone surrogate"):
        llama_backend.generate([request])
    assert llama_backend.tokenize("who wrote hamlet")  # valid text is unchanged


def test_ask_with_bytes_that_are_not_utf8_is_an_error_exit_2() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ragate.cli.main", "ask", b"who wrote \xff hamlet", "--quiet"],
        check=False, capture_output=True, timeout=300,
    )  # fmt: skip
    err = done.stderr.decode("utf-8", "replace")
    assert done.returncode == 2 and "ragate: error:" in err and "not UTF-8" in err and "Traceback" not in err


# -- issue N: an index manifest is checked before it is trusted ---------------------------------------------------


def _small_bm25(path: Path, words: str) -> Path:
    from ragate.retrieval.index import build_index
    from ragate.retrieval.types import Passage

    passages = [Passage(f"p{i}", f"title {i}", f"{words} number {i} {words.split()[i % 3]}") for i in range(6)]
    return build_index(passages, path, "bm25", progress=False)


def test_a_manifest_entry_without_a_size_is_named(tmp_path: Path) -> None:
    """Before: KeyError: 'size' (a traceback from retrieval/store.py verify_files)."""
    from ragate.errors import IndexFormatError
    from ragate.retrieval.index import open_index

    index = _small_bm25(tmp_path / "ix", "alpha beta gamma delta")
    manifest = json.loads((index / "manifest.json").read_text())
    del manifest["files"]["passages.jsonl"]["size"]
    (index / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexFormatError, match=r"manifest.json is damaged: the entry of 'passages.jsonl' has no"):
        open_index(index)


def test_a_manifest_entry_outside_the_index_is_never_read(tmp_path: Path) -> None:
    """Before: an entry `../../../../etc/passwd` made verification stat and hash a file outside the index and
    print its size. Now the manifest is refused before any listed file is touched."""
    from ragate.cli.main import main as cli
    from ragate.errors import IndexFormatError
    from ragate.retrieval.index import open_index

    secret = tmp_path / "secret.txt"
    secret.write_text("not the index's")
    index = _small_bm25(tmp_path / "a" / "b" / "ix", "alpha beta gamma delta")
    for rel in ("../../../secret.txt", str(secret), "bm25/../../../../secret.txt"):
        manifest = json.loads((index / "manifest.json").read_text())
        manifest["files"][rel] = {"size": 15, "sha256": "0" * 64}
        (index / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(IndexFormatError, match="which is not a path inside the index"):
            open_index(index)
        assert cli(["index", "info", str(index)]) == 2
        del manifest["files"][rel]
        (index / "manifest.json").write_text(json.dumps(manifest))
    (index / "link.txt").symlink_to(secret)  # a link inside the index that leads out of it
    _rewrite(index, "link.txt", secret.read_bytes())
    with pytest.raises(IndexFormatError, match="leads outside the index"):
        open_index(index)


def test_bm25_arrays_of_another_index_with_matching_checksums_are_refused_at_open(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: an array swapped in from another index, its checksum recorded, opened fine and `ragate search`
    died in bm25s (ValueError traceback; the service called it a client error)."""
    from ragate.cli.main import main as cli
    from ragate.errors import IndexFormatError
    from ragate.retrieval.index import open_index

    index = _small_bm25(tmp_path / "ix", "alpha beta gamma delta")
    other = _small_bm25(tmp_path / "other", "one two three four five six seven eight nine ten eleven twelve")
    _rewrite(index, "bm25/indptr.csc.index.npy", (other / "bm25/indptr.csc.index.npy").read_bytes())
    with pytest.raises(IndexFormatError, match=r"bm25: the BM25 files cannot be read .*indptr"):
        open_index(index)
    for verify in ([], ["--no-verify"]):
        assert cli(["search", str(index), "alpha number", *verify]) == 2
        err = capsys.readouterr().err
        assert "ragate: error:" in err and "rebuild the index" in err and "Traceback" not in err


@pytest.mark.parametrize("key", [" secret", "secret ", "sec ret", "ключ", "tab\tkey"])
def test_an_api_key_no_client_could_send_is_refused_at_start(
    key: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before (issue N): a key with spaces at either end or non-ASCII characters was accepted at start and then
    matched no request (the server strips the header; headers are ASCII): every request got 401."""
    monkeypatch.delenv("RAGATE_API_KEY", raising=False)
    assert main(["serve", "--api-key", key]) == 2  # before any model loads
    err = capsys.readouterr().err
    assert "ragate: error:" in err and "printable ASCII without spaces" in err
    monkeypatch.setenv("RAGATE_API_KEY", key)
    assert main(["serve"]) == 2
    assert "printable ASCII without spaces" in capsys.readouterr().err


def test_a_damaged_results_json_is_named_by_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Left by the fuzz suite's first round: `ragate report` read results.json (and, comparing runs, config.json)
    with a bare json.loads: a traceback on a cut file."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "questions.jsonl").write_text(json.dumps(RECORD | {"dataset": "demo"}) + "\n")
    for damaged in ('{"summary": {"no-retr', '{"provenance": {}, "summary": 3}'):
        (run / "results.json").write_text(damaged)
        assert main(["report", str(run)]) == 2
        err = capsys.readouterr().err
        assert "ragate: error:" in err and "results.json" in err and "Traceback" not in err


@pytest.mark.parametrize("flag", ["--threshold", "--at"])
@pytest.mark.parametrize("value", ["nan", "inf", "abc"])
def test_a_threshold_that_is_not_a_finite_number_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    command = "eval" if flag == "--threshold" else "sweep"
    args = [command, "--dataset", "demo", "--methods", "dtr", "--limit", "1", "--out", str(tmp_path / "r")]
    assert main([*args, flag, f"dtr={value}", "--model", "no-such-model"]) == 2
    assert "must be a finite number" in capsys.readouterr().err


def test_a_manifest_with_a_huge_number_or_deep_nesting_or_an_unlisted_file_is_named(tmp_path: Path) -> None:
    """Found by the review: json.loads raises ValueError past 4,300 digits and RecursionError on deep nesting,
    which read_manifest did not catch; a manifest that omits a file opening reads by name left that file
    unchecked (a link out of the index would be read)."""
    from ragate.errors import IndexFormatError
    from ragate.retrieval.index import open_index

    index = _small_bm25(tmp_path / "ix", "alpha beta gamma delta")
    text = (index / "manifest.json").read_text()
    for damaged, words in (
        (text.replace('"passages": 6', '"passages": ' + "1" * 5000), "not valid JSON"),
        ("[" * 100_000, "nested too deeply"),
    ):
        (index / "manifest.json").write_text(damaged)
        with pytest.raises(IndexFormatError, match=words):
            open_index(index)
    manifest = json.loads(text)
    del manifest["files"]["passages.jsonl"]
    (index / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexFormatError, match="does not list passages.jsonl, which a bm25 index reads"):
        open_index(index)


def test_a_deeply_nested_budget_state_is_named(tmp_path: Path) -> None:
    from ragate.errors import RagateError
    from ragate.methods import get_method
    from ragate.service.budget import BudgetController

    state = tmp_path / "budget.json"
    state.write_text("[" * 100_000)
    with pytest.raises(RagateError, match="budget.json is not a readable budget state"):
        BudgetController(0.3, 10, get_method("targ-margin"), state, model="m")
