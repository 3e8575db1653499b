"""How many threads a local engine computes with, and why the default watches the CPUs.

llama.cpp splits every matrix product over its threads and waits for all of them at a barrier after each
operation (a few hundred barriers per token). In this build the barrier is OpenMP's (libgomp), whose waiting
threads spin before they sleep. When a thread is descheduled because another process runs on its core, every
barrier waits for the scheduler to bring it back: on a 2-core machine with two busy processes beside it, a SmolLM2
draft that takes 0.7 s idle took 35 s with two threads. One thread has no barrier to wait at, and two
threads on cores that nobody else wants are faster than one. So the default (``auto``) uses as many threads as
this process has CPUs that other processes leave free:

    threads = max(1, min(usable, floor(usable - others + 0.25)))

``usable`` is the number of CPUs in this process's affinity (``taskset`` narrows it) and ``others`` the cores'
worth of work other processes did on those CPUs since the last look: the busy time ``/proc/stat`` counts on them
minus this process's own CPU time, over the wall time between the two looks. The margin 0.25 keeps a thread off a
core a neighbour uses a quarter of the time. The engine looks at most every :data:`LOOK_EVERY` seconds, between
tokens, and changes its thread count (``llama_set_n_threads``) only when the answer changes; the first look is at
the engine's first computation, measured from when it started loading. A thread count does not change what the
engine computes: ggml splits work by rows, and the logits were bit for bit the same with 1, 2 and 3 threads
(prompt and decoding), so ``auto`` keeps every answer exact and reproducible.

A fixed number (``--threads N``, ``Pipeline(threads=N)``) turns the watching off. ``batch_threads`` (prompt
evaluation) defaults to the same. llama-cpp-python (0.3) exposes no threadpool or polling setting; OpenMP's own
(``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT``) are read once, when the library loads, and are left to the operator
(benchmarks/threads.py measured both ways). Where ``/proc/stat`` cannot be read (not Linux), ``auto`` uses every
usable CPU.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any

from ragate.errors import RagateError

LOOK_EVERY = 0.5  # seconds between two looks at /proc/stat
FIRST_LOOK_AFTER = 0.05  # the first look needs at least this much time since the engine started loading
MARGIN = 0.25  # a core a neighbour uses more than 1 - MARGIN of the time is not counted free
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user, nice, system, irq, softirq, steal (guest time is inside user)


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity: ``taskset -c 0`` gives [0])."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return list(range(os.cpu_count() or 1))


def check_threads(value: int | str | None, name: str = "threads") -> int | None:
    """A thread setting as the engines take it: a positive whole number, or None for ``auto`` (also "auto")."""
    if value is None or value == "auto":
        return None
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            raise ValueError(f"{name} must be a whole number >= 1 or 'auto', not {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1 or 'auto', not {value!r}")
    most = max_threads()
    if value > most:
        raise ValueError(
            f"{name} {value} is more than this machine can use: at most {most} (4 per CPU of its "
            f"{os.cpu_count() or 1}); 'auto' picks the CPUs other processes leave free"
        )
    return value


def max_threads() -> int:
    """The most threads an engine may be given: 4 per CPU (at least 8). More only spin: a llama.cpp thread per
    core is its best, and thousands of them stall the machine (and llama.cpp crashes past some count)."""
    return max(8, 4 * (os.cpu_count() or 1))


def busy_seconds(cpus: list[int], stat: str | None = None) -> float | None:
    """Busy seconds since boot summed over ``cpus``, from ``/proc/stat`` (or the text ``stat``); None where it
    cannot be read or lacks one of them."""
    if stat is None:
        try:
            with open("/proc/stat", encoding="ascii") as f:
                stat = f.read()
        except OSError:
            return None
    wanted = {f"cpu{c}" for c in cpus}
    ticks, seen = 0, 0
    for line in stat.splitlines():
        name, _, rest = line.partition(" ")
        if name in wanted:
            values = rest.split()
            ticks += sum(int(values[i]) for i in _BUSY_FIELDS if i < len(values))
            seen += 1
    if seen != len(wanted):
        return None
    return ticks / _clock_ticks()


def _clock_ticks() -> int:
    try:
        return int(os.sysconf("SC_CLK_TCK"))
    except (AttributeError, ValueError, OSError):
        return 100


def free_threads(usable: int, others: float) -> int:
    """Threads for ``usable`` CPUs when other processes use ``others`` cores' worth of them."""
    return max(1, min(usable, math.floor(usable - max(0.0, others) + MARGIN)))


@dataclass
class _Look:
    wall: float
    busy: float
    own: float


class ThreadPolicy:
    """The thread counts of one engine: fixed (``threads`` given) or ``auto`` (see the module docstring).

    :meth:`current` is what to compute with now; call :meth:`look` between computations (it is cheap: a clock read,
    and at most every :data:`LOOK_EVERY` seconds a read of ``/proc/stat``); it returns the new counts when they
    change, else None."""

    def __init__(self, threads: int | None = None, batch_threads: int | None = None) -> None:
        self.fixed = threads is not None
        self.cpus = usable_cpus()
        usable = len(self.cpus)
        self.threads = threads if threads is not None else usable
        self.batch_threads = batch_threads if batch_threads is not None else self.threads
        self._batch_fixed = batch_threads is not None
        self._last: _Look | None = None
        self._looked = False
        self.others: float | None = None  # the last measure of other processes' load on our CPUs, in cores
        if not self.fixed and usable > 1:
            self._last = self._measure()

    @property
    def policy(self) -> str:
        return "fixed" if self.fixed else "auto"

    def current(self) -> tuple[int, int]:
        return self.threads, self.batch_threads

    def describe(self) -> dict[str, object]:
        """The counts and how they are chosen, for logs and ``/healthz``."""
        out: dict[str, object] = {
            "threads": self.threads, "batch_threads": self.batch_threads, "policy": self.policy,
            "usable_cpus": len(self.cpus),
        }  # fmt: skip
        if self.others is not None:
            out["others_load"] = round(self.others, 2)
        return out

    def _measure(self) -> _Look | None:
        busy = busy_seconds(self.cpus)
        if busy is None:
            return None
        return _Look(time.monotonic(), busy, time.process_time())

    def look(self) -> tuple[int, int] | None:
        """New (threads, batch threads) when the load on this process's CPUs calls for other counts, else None."""
        if self._last is None:
            return None
        wait = LOOK_EVERY if self._looked else FIRST_LOOK_AFTER
        if time.monotonic() - self._last.wall < wait:
            return None
        now = self._measure()
        if now is None:
            self._last = None  # /proc/stat went away: keep the counts
            return None
        last, self._last, self._looked = self._last, now, True
        others = ((now.busy - last.busy) - (now.own - last.own)) / max(1e-9, now.wall - last.wall)
        self.others = max(0.0, others)
        threads = free_threads(len(self.cpus), self.others)
        batch = self.batch_threads if self._batch_fixed else threads
        if (threads, batch) == (self.threads, self.batch_threads):
            return None
        self.threads, self.batch_threads = threads, batch
        return threads, batch


def thread_options(engine: str, threads: int | str | None, batch_threads: int | str | None) -> dict[str, Any]:
    """The engine's keyword options for ``threads`` and ``batch_threads`` (checked; "auto" is None)."""
    try:
        n, n_batch = check_threads(threads, "threads"), check_threads(batch_threads, "batch_threads")
    except ValueError as err:
        raise RagateError(str(err)) from None
    if engine == "openai":
        if n is not None or n_batch is not None:
            raise RagateError("threads and batch_threads set a local engine's threads; a model server sets its own")
        return {}
    if engine == "transformers":
        if n_batch is not None:
            raise RagateError("batch_threads is llama.cpp's; transformers has one thread count (threads)")
        return {} if n is None else {"n_threads": n}
    return {k: v for k, v in (("n_threads", n), ("n_threads_batch", n_batch)) if v is not None}
