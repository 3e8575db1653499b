"""One computation per distinct LM call (issue G): the call cache charges what the original call cost and changes
no prediction; worker processes shard a run and survive a kill of one of them. Real SmolLM2 on llama.cpp."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ragate.backends.prompt_states import PREFIX_ALIGN, KeptPrompt, PromptStates, reusable
from ragate.backends.scripted import ScriptedBackend, make_generation
from ragate.errors import CallCacheError
from ragate.eval.calls import CallCache, CallStore, generation_from_json, generation_to_json, request_key
from ragate.eval.datasets import dataset_files, load_dataset
from ragate.eval.records import read_records
from ragate.eval.run import EvalConfig, run_eval
from ragate.eval.workers import fold_parts, part_path
from ragate.retrieval.corpus import demo_dir
from ragate.types import GenerationRequest, Message

DEMO_QUESTIONS = demo_dir() / "questions.jsonl"


def _request(question: str, **kw: Any) -> GenerationRequest:
    return GenerationRequest((Message("user", question),), max_tokens=12, **kw)


def test_a_cached_call_returns_the_same_generation_and_charges_its_original_cost(
    llama_backend: Any, tmp_path: Path
) -> None:
    store = CallStore(tmp_path / "calls.sqlite")
    calls = CallCache(llama_backend, store, "smollm2-test")
    with calls.tally() as first:
        [a] = calls.generate([_request("Who wrote Hamlet?")])
    with calls.tally() as second:
        [b] = calls.generate([_request("Who wrote Hamlet?")])
    assert a == b and a.entropies == b.entropies  # bit for bit, every per-token value
    assert (first.hits, second.hits) == (0, 1)
    assert first.paid.calls == 1 and second.paid.calls == 0 and second.paid.seconds == 0
    assert second.charged == first.charged  # wall, CPU, tokens: what the original call cost
    assert first.charged.prompt_tokens > 0 and first.charged.cpu_seconds > 0
    with calls.tally() as third:  # another decoding parameter is another call
        calls.generate([_request("Who wrote Hamlet?", top_logprobs=2)])
    assert third.hits == 0 and len(store) == 2


def test_a_damaged_or_foreign_entry_is_recomputed_and_overwritten(tmp_path: Path) -> None:
    lm = ScriptedBackend(lambda _: make_generation(["Shakespeare"], [-0.1], prompt_tokens=7))
    store = CallStore(tmp_path / "calls.sqlite")
    calls = CallCache(lm, store, "scripted-test")
    key = request_key(lm, "scripted-test", [_request("Who wrote Hamlet?")])
    assert key is not None
    damaged = [
        {"generations": [{"text": "half"}], "seconds": 1.0, "cpu_seconds": 1.0},  # a generation lacks keys
        {"generations": [], "seconds": 1.0, "cpu_seconds": 1.0},  # not one generation per request
        {"seconds": "fast"},  # not the shape CallCache writes
    ]
    for n, value in enumerate(damaged, 1):
        store.put(key, value)
        with calls.tally() as t:
            [g] = calls.generate([_request("Who wrote Hamlet?")])
        assert g.text == "Shakespeare" and t.hits == 0 and t.paid.calls == 1 and len(lm.calls) == n
        assert store.get(key) is not None and store.get(key)["generations"][0]["text"] == "Shakespeare"
    store._db.execute("UPDATE calls SET value = ? WHERE key = ?", (b"not zlib", key))
    with calls.tally() as t:
        calls.generate([_request("Who wrote Hamlet?")])
    assert t.hits == 0 and len(lm.calls) == 4
    with calls.tally() as t:  # and the recomputed entry is served from then on
        calls.generate([_request("Who wrote Hamlet?")])
    assert t.hits == 1 and len(lm.calls) == 4


def _damaged_store(path: Path) -> Path:
    """A call store of 200 entries whose table pages, past the header, are overwritten."""
    store = CallStore(path)
    for i in range(200):
        store.put(f"k{i}", {"value": "x" * 500})
    store.close()
    db = sqlite3.connect(path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # every entry into the main file
    db.close()
    data = bytearray(path.read_bytes())
    data[8192:16384] = b"\xab" * 8192
    path.write_bytes(bytes(data))
    return path


def test_a_call_store_with_damaged_pages_is_a_named_error(tmp_path: Path) -> None:
    path = _damaged_store(tmp_path / "calls.sqlite")
    # before issue N the damage was met at the first read, and every question of a run recorded it as its error
    with pytest.raises(CallCacheError, match=r"calls.sqlite is damaged.*; delete it \(it only saves time\)"):
        CallStore(path)


@pytest.mark.parametrize(
    "extra",
    [[], ["--workers", "2"], ["sweep"]],
    ids=["eval", "eval-workers", "sweep"],
)
def test_a_damaged_call_cache_stops_eval_before_the_model_loads(tmp_path: Path, extra: list[str]) -> None:
    """Before: `ragate eval` over a cache with overwritten pages exited 0 with n = 0, every record holding the
    error. Now it is `ragate: error:` and exit 2, before the model is looked for (this model does not exist), with
    worker processes and in a sweep too (the review found both printing a worker's traceback)."""
    path = _damaged_store(tmp_path / "calls.sqlite")
    out = tmp_path / "run"
    cmd = [*_eval_cmd(out, path), "--model", "no-such-model"]
    if extra == ["sweep"]:
        cmd[cmd.index("eval")] = "sweep"
        cmd[cmd.index("no-retrieval,random")] = "dtr"
    else:
        cmd += extra
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "ragate: error:" in done.stderr and "calls.sqlite is damaged" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("kind", ["file-as-folder", "directory", "other-table", "not-sqlite"])
def test_a_call_cache_that_is_not_one_is_named(tmp_path: Path, kind: str) -> None:
    """Before: `--call-cache a_file/x.sqlite` gave a traceback (FileExistsError) and a table of another shape was
    reported as "another process may be holding it"."""
    path = tmp_path / "x.sqlite"
    if kind == "file-as-folder":
        (tmp_path / "a_file").write_text("a file")
        path, words = tmp_path / "a_file" / "x.sqlite", "cannot be created"
    elif kind == "directory":
        path.mkdir()
        words = "is a directory"
    elif kind == "other-table":
        db = sqlite3.connect(path)
        db.execute("CREATE TABLE calls (id INTEGER, answer TEXT)")
        db.close()
        words = "not ragate's call cache"
    else:
        path.write_bytes(b"not a database at all, just text" * 100)
        words = "is damaged or not a call cache"
    with pytest.raises(CallCacheError, match=words) as caught:
        CallStore(path)
    assert str(path) in str(caught.value)


def test_a_call_cache_failing_mid_run_stops_the_run_and_keeps_its_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that fails after it opened (its disk went away) ends the run with the error; answers written
    before it stay for --resume, and no question is recorded with the store's error as its own."""
    examples = load_dataset(DEMO_QUESTIONS, limit=3)
    lm = ScriptedBackend(lambda _: make_generation(["Jane", " Austen"], [-0.1, -0.2]))
    seen = []

    def failing_get(self: CallStore, key: str) -> None:
        seen.append(key)
        if len(seen) > 1:
            raise CallCacheError(f"could not use the call cache {self.path} (disk I/O error)")

    monkeypatch.setattr(CallStore, "get", failing_get)
    config = EvalConfig("demo", ("no-retrieval",), limit=3)
    with pytest.raises(CallCacheError, match="disk I/O error"):
        run_eval(
            config, tmp_path / "run", lm=lm, examples=examples, progress=False, call_cache=tmp_path / "c.sqlite"
        )
    records = read_records(tmp_path / "run" / "questions.jsonl")
    assert [r["prediction"] for r in records] == ["Jane Austen"] and "error" not in records[0]


def test_sampling_is_reused_only_with_the_same_seed(llama_backend: Any) -> None:
    q = "Name a colour."
    greedy = [request_key(llama_backend, "m", [_request(q, seed=s)]) for s in (1, 2)]
    assert greedy[0] == greedy[1]  # a greedy answer does not depend on the seed
    sampled = [request_key(llama_backend, "m", [_request(q, temperature=0.7, seed=s)]) for s in (1, 1, 2)]
    assert sampled[0] == sampled[1] != sampled[2]
    assert request_key(llama_backend, "m", [_request(q, temperature=0.7)]) is None  # unseeded: never stored
    assert request_key(llama_backend, "other-model", [_request(q)]) != greedy[0]


def test_the_key_is_the_exact_prompt_tokens_not_the_text(llama_backend: Any) -> None:
    # same text through another template path gives other tokens: another key
    chat = request_key(llama_backend, "m", [_request("Who wrote Hamlet?")])
    raw = request_key(llama_backend, "m", [GenerationRequest("Who wrote Hamlet?", max_tokens=12)])
    assert chat != raw


def test_a_generation_survives_its_json_form(llama_backend: Any) -> None:
    [gen] = llama_backend.generate([_request("Who wrote Hamlet?")])
    assert generation_from_json(generation_to_json(gen)) == gen


def test_turning_the_cache_off_changes_no_prediction(llama_backend: Any, tmp_path: Path) -> None:
    from ragate.retrieval.demo import demo_index
    from ragate.retrieval.index import open_index

    methods = ("no-retrieval", "dtr", "targ-margin", "targ-variance", "llm-judge", "standard-rag")
    examples = load_dataset(DEMO_QUESTIONS, limit=1)  # one question (the suite's time); methods share its calls
    config = EvalConfig("demo", methods, limit=1)
    runs = {}
    with open_index(demo_index()) as index:
        for name, cache in (("on", True), ("off", False)):
            runs[name] = run_eval(
                config, tmp_path / name, lm=llama_backend, retriever=index, examples=examples, progress=False,
                call_cache=tmp_path / "calls.sqlite", cache=cache,
            )  # fmt: skip
    on = {(r["id"], r["method"]): r for r in read_records(tmp_path / "on" / "questions.jsonl")}
    off = {(r["id"], r["method"]): r for r in read_records(tmp_path / "off" / "questions.jsonl")}
    assert on.keys() == off.keys() and len(on) == 6
    for key, r in on.items():
        twin = off[key]
        assert (r["prediction"], r["gate_score"], r["retrieved"], r["doc_ids"]) == (
            twin["prediction"],
            twin["gate_score"],
            twin["retrieved"],
            twin["doc_ids"],
        ), key
        # charged tokens are the method's own, whether its calls were computed or reused
        assert (r["prompt_tokens"], r["completion_tokens"]) == (
            twin["prompt_tokens"],
            twin["completion_tokens"],
        )
        assert r["charged"]["prompt_tokens"] == r["prompt_tokens"]
        assert (
            twin["paid"] | {"cached_calls": 0} == twin["paid"]
            and twin["paid"]["calls"] == twin["charged"]["calls"]
        )
    paid, charged = runs["on"]["calls"]["paid"], runs["on"]["calls"]["charged"]
    # no-retrieval's answer is DTR's draft, the TARG drafts are one call
    assert paid["calls"] < charged["calls"]
    # prompts that share passages started from an earlier prompt's state, and still predicted the same
    # (an aligned prefix, or a whole prompt seen before: TARG-variance's samples after its greedy draft)
    assert paid["reused_prompt_tokens"] > 0
    off = runs["off"]["calls"]
    assert off["paid"]["reused_prompt_tokens"] == 0
    assert {k: v for k, v in off["paid"].items() if k != "reused_prompt_tokens"} == off["charged"]
    assert runs["on"]["dataset_files"][0]["sha256"] == dataset_files("demo")[0]["sha256"]


def test_a_dynamic_method_in_eval_starts_from_kept_states_and_answers_the_same(
    llama_backend: Any, tmp_path: Path
) -> None:
    """The dynamic loop calls the engine itself; in ``ragate eval`` (call store on) its first prompt starts from the
    kept state of the instruction and exemplars an earlier answer evaluated, as through a Pipeline: the same records
    as computing every prompt whole (``cache=False``), fewer tokens evaluated, and each record charged what its
    reused tokens took when first evaluated."""
    from ragate.retrieval.demo import demo_index
    from ragate.retrieval.index import open_index

    examples = load_dataset(DEMO_QUESTIONS, limit=2)
    config = EvalConfig("demo", ("wo-rag",), limit=2)  # the two questions' prompts share the exemplars
    llama_backend.drop_prompt_states()  # the session's backend: earlier tests' prompts are not this test's
    records, evaluated = {}, {}
    with open_index(demo_index()) as index:
        for name, cache in (("off", False), ("on", True)):
            before = llama_backend.evaluated_tokens
            run_eval(
                config, tmp_path / name, lm=llama_backend, retriever=index, examples=examples, progress=False,
                call_cache=tmp_path / "calls.sqlite", cache=cache,
            )  # fmt: skip
            evaluated[name] = llama_backend.evaluated_tokens - before
            records[name] = {r["id"]: r for r in read_records(tmp_path / name / "questions.jsonl")}

    def seen(r: dict[str, Any]) -> tuple[Any, ...]:
        stages = [(s["name"], s["prompt_tokens"], s["completion_tokens"], s.get("logprob"))
                  for s in r["trace"]["stages"]]  # fmt: skip
        return r["prediction"], r["doc_ids"], r["prompt_tokens"], r["completion_tokens"], stages

    assert {m: seen(r) for m, r in records["on"].items()} == {m: seen(r) for m, r in records["off"].items()}
    assert evaluated["on"] < evaluated["off"]
    assert all(r["paid"]["reused_prompt_tokens"] == 0 for r in records["off"].values())
    reused = [r for r in records["on"].values() if r["paid"]["reused_prompt_tokens"] > 0]
    assert reused  # the second question started from the first one's instruction and exemplars
    for r in reused:  # charged what the reused tokens took when first evaluated, in the record's seconds too
        assert r["charged"]["seconds"] > r["paid"]["seconds"] and r["charged"]["cpu_seconds"] > r["paid"]["cpu_seconds"]
        assert r["seconds"] >= r["charged"]["seconds"]  # wo-rag retrieves nothing: its wall is its LM calls'
    for r in records["off"].values():
        assert r["charged"] == {k: v for k, v in r["paid"].items() if k in r["charged"]}


def _passages_request(question: str, n: int) -> GenerationRequest:
    texts = [json.loads(line)["text"] for line in (demo_dir() / "passages.jsonl").open()][:n]
    body = "Passages:\n" + "\n".join(texts) + f"\nQuestion: {question}"
    return GenerationRequest((Message("user", body),), max_tokens=8, top_logprobs=3)


def _same(a: Any, b: Any) -> bool:
    """The same generation bit for bit (all but the wall time it took)."""
    fields = ("token_ids", "logprobs", "entropies", "top_logprobs", "text", "finish_reason", "prompt_tokens")
    return all(getattr(a, f) == getattr(b, f) for f in fields)


def test_a_prompt_started_from_an_earlier_prompts_state_gives_the_same_generation(llama_backend: Any) -> None:
    requests = [
        _passages_request("Who is Sara Gilbert?", 2),
        _passages_request("What is the optic nerve?", 2),  # shares the passages, not the question
        _passages_request("Who presented the show?", 3),  # shares two of its passages
    ]
    llama_backend.drop_prompt_states()  # the session's backend: earlier tests' prompts are not this test's
    fresh = []
    for r in requests:
        llama_backend.clear_cache()
        fresh.append(llama_backend.generate([r])[0])
    reused = []
    for r in requests:
        llama_backend.clear_cache()
        with llama_backend.exact_prefix_reuse() as reuse:
            [gen] = llama_backend.generate([r])
        reused.append(reuse)
        assert _same(gen, fresh[len(reused) - 1])
    assert reused[0].tokens == 0  # the first of its kind has nothing to start from
    for u, gen in zip(reused[1:], fresh[1:], strict=True):
        assert 0 < u.tokens < gen.prompt_tokens and u.tokens % PREFIX_ALIGN == 0
        assert u.cpu_seconds > 0 and u.seconds > 0  # what the reused tokens took when they were evaluated


def test_a_computed_call_that_reused_a_prefix_is_charged_what_it_costs_alone(llama_backend: Any) -> None:
    calls = CallCache(llama_backend, None, "smollm2-test", exact_prefixes=True)
    calls.generate([_passages_request("Who is Sara Gilbert?", 3)])
    with calls.tally() as second:
        calls.generate([_passages_request("What is the optic nerve?", 3)])
    assert second.reused_tokens > 0 and second.hits == 0
    assert second.charged.prompt_tokens == second.paid.prompt_tokens  # the call's own tokens either way
    assert second.charged.cpu_seconds > second.paid.cpu_seconds  # plus the reused share, as first measured
    assert second.charged.calls == second.paid.calls == 1
    plain = CallCache(llama_backend, None, "smollm2-test")  # exact_prefixes off: nothing reused
    with plain.tally() as third:
        plain.generate([_passages_request("What is the optic nerve?", 3)])
    assert third.reused_tokens == 0 and third.charged == third.paid


def test_reuse_stops_at_an_aligned_length_that_leaves_a_full_batch_to_evaluate() -> None:
    kept = tuple(range(200))
    assert (
        reusable(kept, [*range(40), 999, *range(60)], align=16, min_suffix=32) == 32
    )  # 40 shared, cut to 32
    assert (
        reusable(kept, list(range(80)), align=16, min_suffix=32) == 48
    )  # the same prompt: 32 evaluated again
    assert reusable(kept, list(range(81)), align=16, min_suffix=32) == 48
    assert reusable(kept, list(range(96)), align=16, min_suffix=32) == 64
    assert reusable(kept, list(range(40)), align=16, min_suffix=32) == 0  # too short to leave 32
    assert reusable(kept, [5, 6, 7], align=16, min_suffix=32) == 0


def test_prompt_states_keep_the_newest_within_their_byte_budget() -> None:
    def kept(first: int, nbytes: int) -> KeptPrompt:
        return KeptPrompt(tuple(range(first, first + 40)), None, nbytes, 1.0, 1.0)

    states = PromptStates(max_bytes=250, align=16)
    for first in (0, 1000, 2000):
        states.add(kept(first, 100))
    assert len(states) == 2 and states.nbytes == 200  # the oldest dropped
    assert states.best([*range(30), *range(500, 540)])[1] is None
    keep, found = states.best([*range(1000, 1030), *range(7, 47)])  # 30 shared: 16 reused
    assert keep == 16 and found is not None and found.token_ids[0] == 1000
    states.add(kept(3000, 100))  # 1000 was used last, so 2000 goes
    assert states.best([*range(2000, 2040), *range(600, 640)])[1] is None and len(states) == 2
    states.add(kept(4000, 300))  # larger than the whole budget: not kept
    states.add(KeptPrompt((1, 2, 3), None, 1, 1.0, 1.0))  # shorter than one aligned block: not kept
    assert len(states) == 2
    assert kept(0, 1).share(10) == (0.25, 0.25)


def test_a_resume_on_another_file_of_the_same_name_is_refused(tmp_path: Path) -> None:
    from ragate.errors import RagateError

    data = tmp_path / "questions.jsonl"
    data.write_text(DEMO_QUESTIONS.read_text().split("\n", 1)[0] + "\n")
    config = EvalConfig(str(data), ("no-retrieval",))
    lm = ScriptedBackend([make_generation(["x"], [-0.1])] * 2)
    run_eval(config, tmp_path / "run", lm=lm, progress=False, cache=False)
    saved = (tmp_path / "run" / "config.json").read_text()
    assert str(data.resolve()) in saved
    data.write_text(data.read_text().replace('"question": "', '"question": "edited '))
    with pytest.raises(RagateError, match="another file under the same name"):
        run_eval(config, tmp_path / "run", lm=lm, progress=False, resume=True, cache=False)


def test_folding_parts_twice_doubles_nothing(tmp_path: Path) -> None:
    path = tmp_path / "questions.jsonl"
    path.write_text('{"id": "a", "method": "m"}\n')
    part_path(path, 0).write_text('{"id": "b", "method": "m"}\n{"id": "c", "me')  # a worker killed mid-line
    part_path(path, 1).write_text('{"id": "d", "method": "m"}\n')
    saved = {p: p.read_text() for p in (part_path(path, 0), part_path(path, 1))}
    assert fold_parts(path) == 2
    for p, text in saved.items():  # as if the fold was cut after the file was replaced, before the parts went
        p.write_text(text)
    assert fold_parts(path) == 0
    assert [r["id"] for r in read_records(path)] == ["a", "b", "d"]
    assert not list(tmp_path.glob("*.part*"))


def _eval_cmd(out: Path, calls: Path, index: Path | None = None) -> list[str]:
    """``ragate eval`` of two methods over 10 demo questions (over ``index``: the demo index when None)."""
    return [
        sys.executable, "-m", "ragate.cli.main", "eval", "--dataset", str(DEMO_QUESTIONS), "--methods",
        "no-retrieval,random", "--limit", "10", "--out", str(out), "--quiet", "--call-cache", str(calls),
        *(["--index", str(index)] if index is not None else []),
    ]  # fmt: skip


def test_killing_one_of_two_workers_then_resuming_loses_and_doubles_nothing(
    smollm2_path: Path, demo_bm25: Path, tmp_path: Path
) -> None:
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    whole = tmp_path / "whole"
    subprocess.run(
        [*_eval_cmd(whole, tmp_path / "c1.sqlite", demo_bm25), "--no-call-cache"],
        check=True, env=env, capture_output=True, timeout=600,
    )  # fmt: skip
    for attempt in range(3):  # a worker answered from calls its sibling stored can finish between two polls
        run, store = tmp_path / f"sharded{attempt}", tmp_path / f"c2-{attempt}.sqlite"
        proc = subprocess.Popen(
            [*_eval_cmd(run, store, demo_bm25), "--workers", "2"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert proc.stderr is not None
        pids = {}
        while len(pids) < 2:
            line = proc.stderr.readline()
            assert line, "the run ended before naming its workers"
            if m := re.match(r"worker (\d)/2: pid (\d+), core (\d+)", line):
                pids[int(m[1])] = int(m[2])
        part = part_path(run / "questions.jsonl", 1)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not (part.exists() and part.read_text().count("\n") >= 2):
            time.sleep(0.02)
        try:
            os.kill(pids[2], signal.SIGKILL)
            break
        except ProcessLookupError:  # worker 2 had already finished its shard: nothing was killed, try again
            proc.communicate(timeout=600)
    else:
        pytest.fail("worker 2 finished its shard before it could be killed, three times")
    rest = proc.stderr.read()
    assert proc.wait(timeout=600) != 0
    assert "worker 2" in rest and "killed by signal 9" in rest and "--resume" in rest
    assert not (run / "results.json").exists()
    partial = read_records(run / "questions.jsonl")
    assert 2 <= len(partial) < 20 and not list(run.glob("*.part*"))
    resumed = subprocess.run(
        [*_eval_cmd(run, store, demo_bm25), "--workers", "2", "--resume"],
        check=False, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    again = read_records(run / "questions.jsonl")
    keys = [(r["id"], r["method"]) for r in again]
    assert len(keys) == len(set(keys)) == 20
    reference = {(r["id"], r["method"]): r for r in read_records(whole / "questions.jsonl")}
    assert set(keys) == set(reference)
    for r in again:  # one-thread pinned workers and the cache give the one-process answers
        assert (r["prediction"], r["retrieved"]) == (reference[r["id"], r["method"]]["prediction"],
                                                     reference[r["id"], r["method"]]["retrieved"])  # fmt: skip
