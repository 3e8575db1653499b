"""A local engine's threads (issue 51, item 6): ``auto`` uses the CPUs of this process that other processes leave
free, a number fixes them, and no thread count changes what llama.cpp computes."""

from __future__ import annotations

from typing import Any

import pytest

from ragate.backends import threads as T
from ragate.backends.threads import ThreadPolicy, busy_seconds, check_threads, free_threads, thread_options
from ragate.errors import RagateError


def test_check_threads_takes_auto_or_a_positive_whole_number() -> None:
    assert check_threads(None) is None and check_threads("auto") is None
    assert check_threads("2") == 2 and check_threads(3) == 3
    for bad in (0, -1, "0", "two", 1.5, True):
        with pytest.raises(ValueError, match="whole number >= 1 or 'auto'"):
            check_threads(bad)  # type: ignore[arg-type]


def test_free_threads_keeps_a_thread_off_a_core_a_neighbour_uses() -> None:
    assert free_threads(2, 0.0) == 2 and free_threads(2, 0.2) == 2  # background noise: both cores
    assert free_threads(2, 0.5) == 1 and free_threads(2, 1.0) == 1 and free_threads(2, 2.0) == 1
    assert free_threads(1, 0.0) == 1 and free_threads(4, 1.0) == 3 and free_threads(4, -0.3) == 4


def test_busy_seconds_reads_the_cpus_of_this_process_from_proc_stat() -> None:
    stat = (
        "cpu  100 0 100 1000 0 0 0 0 0 0\n"
        "cpu0 10 1 20 500 7 3 4 5 0 0\n"  # busy: user, nice, system, irq, softirq, steal = 43 (iowait 7 not)
        "cpu1 90 0 80 500 0 0 0 0 0 0\n"
        "intr 1 2 3\n"
    )
    ticks = T._clock_ticks()
    assert busy_seconds([0], stat) == pytest.approx(43 / ticks)
    assert busy_seconds([0, 1], stat) == pytest.approx(213 / ticks)
    assert busy_seconds([2], stat) is None  # a CPU /proc/stat does not list


class _Clock:
    """A fake machine: wall time, other processes' busy seconds on our CPUs, and this process's CPU time."""

    def __init__(self) -> None:
        self.wall, self.others, self.own = 0.0, 0.0, 0.0

    def run(self, seconds: float, *, others: float, own: float) -> None:
        self.wall += seconds
        self.others += seconds * others
        self.own += seconds * own


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    clock = _Clock()
    monkeypatch.setattr(T, "usable_cpus", lambda: [0, 1])
    monkeypatch.setattr(T.time, "monotonic", lambda: clock.wall)
    monkeypatch.setattr(T.time, "process_time", lambda: clock.own)
    monkeypatch.setattr(T, "busy_seconds", lambda cpus: clock.others + clock.own)
    return clock


def test_auto_drops_to_the_cores_others_leave_free_and_comes_back(machine: _Clock) -> None:
    policy = ThreadPolicy()
    assert policy.current() == (2, 2) and policy.policy == "auto"
    machine.run(0.3, others=0.0, own=0.9)  # loading the model: our own work is not a neighbour's
    assert policy.look() is None and policy.current() == (2, 2)
    machine.run(0.2, others=2.0, own=0.0)
    assert policy.look() is None  # too soon to look again
    machine.run(0.4, others=2.0, own=0.3)  # two busy processes beside us
    assert policy.look() == (1, 1) and policy.describe()["others_load"] == pytest.approx(2.0)
    machine.run(1.0, others=0.05, own=1.0)  # they are gone
    assert policy.look() == (2, 2)


def test_fixed_counts_are_never_changed(machine: _Clock) -> None:
    policy = ThreadPolicy(2, 1)
    machine.run(5.0, others=2.0, own=0.0)
    assert policy.look() is None and policy.current() == (2, 1) and policy.policy == "fixed"
    batch_fixed = ThreadPolicy(None, 2)  # decoding threads auto, prompt threads fixed
    machine.run(5.0, others=2.0, own=0.0)
    assert batch_fixed.look() == (1, 2)


def test_thread_options_per_engine() -> None:
    assert thread_options("llama.cpp", "auto", None) == {}
    assert thread_options("llama.cpp", "2", "1") == {"n_threads": 2, "n_threads_batch": 1}
    assert thread_options("transformers", 2, None) == {"n_threads": 2}
    with pytest.raises(RagateError, match="batch_threads is llama.cpp's"):
        thread_options("transformers", 2, 2)
    with pytest.raises(RagateError, match="a model server sets its own"):
        thread_options("openai", 2, None)
    with pytest.raises(RagateError, match="threads must be a whole number"):
        thread_options("llama.cpp", "0", None)


def test_cli_and_service_refuse_a_bad_thread_count() -> None:
    from ragate.cli.main import main
    from ragate.service.settings import ServiceSettings

    assert main(["ask", "Who wrote Hamlet?", "--threads", "0"]) == 2  # before any model loads
    with pytest.raises(ValueError, match="--threads must be"):
        ServiceSettings(threads=0)
    with pytest.raises(ValueError, match="a model server sets its own"):
        ServiceSettings(engine="openai", openai_base_url="http://127.0.0.1:9/v1", threads=2)
    assert ServiceSettings(threads=2, batch_threads=1).backend_options["n_threads_batch"] == 1


def test_llama_cpp_computes_the_same_with_any_thread_count(llama_backend: Any) -> None:
    """ggml splits work by rows: the logits are bit for bit the same with 1 or 2 threads, so ``auto`` changing
    the count as the load changes keeps every answer exact."""
    from ragate.types import GenerationRequest, Message

    lm = llama_backend
    request = GenerationRequest((Message("user", "Who wrote the novel Pride and Prejudice?"),), max_tokens=12)
    counts = lm._threads.current()
    try:
        outs = []
        for n in (1, 2):
            lm._lib.llama_set_n_threads(lm._llm.ctx, n, n)
            lm.clear_cache()
            outs.append(lm.generate([request])[0])
    finally:
        lm._lib.llama_set_n_threads(lm._llm.ctx, *counts)
    assert outs[0].token_ids == outs[1].token_ids
    assert outs[0].logprobs == outs[1].logprobs and outs[0].entropies == outs[1].entropies
    assert lm.thread_counts["policy"] == "auto"


def test_thread_counts_past_what_the_machine_can_use_are_refused_before_anything_loads() -> None:
    """`ask --threads 100000` used to crash llama.cpp (a segfault), `--threads 4096` spun thousands of threads."""
    import os
    import subprocess
    import sys

    from ragate.backends.threads import max_threads

    most = max_threads()
    assert most == max(8, 4 * (os.cpu_count() or 1)) and check_threads(most) == most
    with pytest.raises(ValueError, match=rf"--threads 4096 is more than this machine can use: at most {most}"):
        check_threads(4096, "--threads")
    out = subprocess.run(
        [sys.executable, "-m", "ragate.cli.main", "ask", "--threads", "100000", "who wrote hamlet"],
        check=False, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2 and f"at most {most}" in out.stderr
