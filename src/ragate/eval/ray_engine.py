"""Ray as the engine of a run (``ragate eval|sweep|tune|calibrate|gate learn --engine ray [--ray-address ADDR]
[--ray-workers N]``).

The driver (the process that runs ``ragate eval``) keeps the run directory exactly as a local run does: it opens,
checks and resumes it, then sends the questions still to answer as batches of ``batch`` jobs to N Ray actors.
Each actor opens its own model (the run's local model file, or the user's fleet of servers with ``--base-url``)
and index once, through the same ``Answering`` as a local run (:mod:`ragate.eval.run`), and returns the batch's
records; only the driver writes them, in the order batches finish, fsync'ed as they arrive. So:

- the records of a Ray run are a local run's (the same seed per question, ``seed + its index``), timings aside;
- a worker that dies mid-batch is restarted by Ray and its batch run again (``max_restarts`` /
  ``max_task_retries``); since only returned batches are written, no record is written twice, and a killed
  driver resumes with ``--resume`` like any run;
- progress shows the answers and, per worker, how many it returned.

``ragate calibrate`` (the gate's scores of dev or your own questions) and ``ragate gate learn --sweep`` (the hidden
states of a sweep's questions) write no run directory: :func:`map_ray` returns their results in the questions'
order, the same values a local run computes.

Without ``--ray-address`` it starts a local cluster with the CPUs this process may use (one actor per CPU by
default); ``--ray-address auto`` or ``ray://HOST:10001`` joins an existing one. A cluster must answer within
``--ray-start-timeout`` seconds (default 30): an address where nothing answers is a ragate error naming it before
any run directory is written, and a local start that Ray gives up on (its own 30-second limit, on a busy machine)
is tried again until that many seconds have passed. On a cluster of several machines
the run's model, index and dataset paths must exist on every worker node (or give ``--base-url`` servers); the call
cache is a SQLite file, so give ``--no-call-cache`` unless its path is on storage every node shares.
Ray stays optional: ``pip install 'ragate[ray]'``.
"""

from __future__ import annotations

import copy
import math
import os
import re
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from itertools import accumulate
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ragate.errors import RagateError
from ragate.eval.config import EvalConfig
from ragate.eval.records import RecordWriter

Job = tuple[Any, ...]  # (question index, example, method or family, ...): what ``make``'s record takes
RETRIES = 3  # restarts of a dead worker, and runs of a batch it was answering
RAY_START_TIMEOUT = 30.0  # seconds a cluster has to answer (Ray's own limit for a local start is 30 s)


class _Worker:
    """A Ray actor: what ``make(*args)`` opens (a model and index, once, when it starts) answers batches of jobs
    with its ``record``."""

    def __init__(self, make: Callable[..., Any], *args: Any) -> None:
        self.answering = make(*args)

    def close(self) -> None:
        self.answering.close()

    def pid(self) -> int:
        return os.getpid()

    def answer(self, worker: int, batch: Sequence[Job]) -> tuple[int, list[Any]]:
        return worker, [self.answering.record(job) for job in batch]


def worker_threads(threads: int | str | None, engine: str) -> int | str | None:
    """A Ray worker's engine threads: one unless the run says otherwise, so N workers on a node use N cores, not N x
    its cores (threads change no computation, :mod:`ragate.backends.threads`); a server (openai) sets its own."""
    return 1 if engine != "openai" and threads in (None, "auto") else threads


def one_thread(config: EvalConfig) -> EvalConfig:
    """``config`` with a Ray worker's threads (:func:`worker_threads`)."""
    threads = worker_threads(config.extra.get("threads"), config.engine)
    return replace(config, extra={**config.extra, "threads": threads})


def check_engine(
    engine: str, *, ray_address: str | None, ray_workers: int | None, workers: int, handed_in: bool, concurrency: int,
    ray_start_timeout: float = RAY_START_TIMEOUT,
) -> None:  # fmt: skip
    """Refuse settings a run's engine cannot honour (``run_eval`` and ``sweep_pass``), naming the fix."""
    if engine not in ("local", "ray"):
        raise RagateError(f"--engine is local or ray, not {engine!r}")
    if (ray_address is not None or ray_workers is not None) and engine != "ray":
        raise RagateError("--ray-address and --ray-workers go with --engine ray")
    check_start_timeout(ray_start_timeout)
    if engine != "ray":
        return
    if handed_in or concurrency > 1:
        raise RagateError("--engine ray opens a model per Ray worker: not with a backend handed in or --concurrency")
    if workers > 1:
        raise RagateError("--workers shards over this machine's processes; with --engine ray give --ray-workers")
    if ray_workers is not None and ray_workers < 1:
        raise RagateError(f"--ray-workers must be >= 1, not {ray_workers}")
    check_address(ray_address)


def check_address(address: str | None) -> None:
    """Refuse a ``--ray-address`` that cannot name a cluster, before anything starts."""
    if address is None or address == "auto" or address.startswith("local"):
        return
    if not (address.startswith("ray://") or ":" in address) or any(c.isspace() for c in address):
        raise RagateError(
            f"--ray-address {address!r} is not a Ray cluster address: give auto, HOST:6379 (a head node's GCS) or "
            "ray://HOST:10001 (Ray Client), or leave it out for a local cluster"
        )


def check_start_timeout(seconds: float) -> None:
    """Refuse a ``--ray-start-timeout`` that is not a positive number of seconds."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 < seconds < math.inf:
        raise RagateError(f"--ray-start-timeout is a positive number of seconds, not {seconds!r}")


def reach_cluster(address: str | None, timeout: float = RAY_START_TIMEOUT) -> None:
    """Wait up to ``timeout`` seconds for something to answer at ``address`` (HOST:PORT, a head node's GCS, or
    ray://HOST:PORT, Ray Client), and refuse it naming the address and the timeout where nothing does, before Ray
    tries (it retries an address that does not answer for minutes, printing its own warnings). A local cluster
    (None, local) and ``auto`` (found by Ray) are not probed."""
    check_address(address)
    check_start_timeout(timeout)
    if address is None or address in ("auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        where = (host.strip("[]") or "127.0.0.1", int(port))
    except ValueError:
        raise RagateError(f"--ray-address {address!r}: the port {port!r} is not a number") from None
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            socket.create_connection(where, timeout=max(0.05, min(left, 2.0))).close()
            return
        except OSError as err:
            why = err.strerror or type(err).__name__
        if left <= 0.25:
            break
        time.sleep(min(0.25, left))
    raise RagateError(
        f"--ray-address {address}: no Ray cluster answered there within {timeout:g} s (--ray-start-timeout; the "
        f"last try: {why}): start one there (`ray start --head` on that machine), check the host and port "
        "(HOST:6379 for a head node, ray://HOST:10001 for Ray Client), or give it longer"
    )


def run_ray(
    config: EvalConfig,
    jobs: Sequence[Job],
    path: Path,
    store: Path | None,
    make: Callable[..., Any],
    *,
    address: str | None = None,
    workers: int | None = None,
    batch: int = 4,
    progress: bool = True,
    desc: str = "eval",
    start_timeout: float = RAY_START_TIMEOUT,
) -> None:
    """Answer ``jobs`` on Ray actors and append their records to ``path`` as batches return. ``make(config,
    store)`` opens what a worker answers with (:class:`ragate.eval.run.Answering`), once per worker."""
    with RecordWriter(path) as writer:

        def write(_: int, records: list[Any]) -> None:
            for record in records:
                writer.append(record)

        on_ray(
            jobs, make, (one_thread(config), store), write, address=address,
            workers=workers, batch=batch, progress=progress, desc=f"{desc} {config.dataset}",
            start_timeout=start_timeout,
        )  # fmt: skip


def map_ray(
    jobs: Sequence[Job],
    make: Callable[..., Any],
    args: tuple[Any, ...],
    *,
    address: str | None = None,
    workers: int | None = None,
    batch: int = 4,
    progress: bool = True,
    desc: str = "score",
    start_timeout: float = RAY_START_TIMEOUT,
) -> list[Any]:
    """``make(*args).record(job)`` of every job, computed on Ray actors (each opens ``make(*args)`` once), in the
    jobs' order: the scores ``ragate calibrate`` and the hidden states ``ragate gate learn`` read."""
    found: list[Any] = [None] * len(jobs)

    def keep(start: int, results: list[Any]) -> None:
        # arrays come back as read-only views of Ray's object store, which ends with the cluster: own them
        found[start : start + len(results)] = copy.deepcopy(results)

    on_ray(
        jobs, make, args, keep, address=address, workers=workers, batch=batch, progress=progress, desc=desc,
        lost="nothing was saved: run it again", start_timeout=start_timeout,
    )  # fmt: skip
    return found


def on_ray(
    jobs: Sequence[Job],
    make: Callable[..., Any],
    args: tuple[Any, ...],
    sink: Callable[[int, list[Any]], None],
    *,
    address: str | None = None,
    workers: int | None = None,
    batch: int = 4,
    progress: bool = True,
    desc: str = "eval",
    lost: str = "the answers so far are kept: rerun with --resume",
    start_timeout: float = RAY_START_TIMEOUT,
) -> None:
    """Send ``jobs`` in batches of ``batch`` to N Ray actors (one per CPU of the cluster by default) and hand each
    batch's results to ``sink(position of its first job, results)`` as it returns, in this process; a lost worker
    is restarted and its batch sent again (``RETRIES``). Joins the cluster at ``address``, or starts a local one
    with this process's CPUs and stops it at the end. ``lost``: what a failure tells of the results so far."""
    if batch < 1:
        raise RagateError(f"a Ray batch holds at least 1 job, not {batch}")
    pool: list[Any] = []
    with cluster(address, start_timeout) as ray:
        try:
            cpus = max(1.0, float(ray.cluster_resources().get("CPU", 1)))
            n = min(workers or int(cpus), max(1, -(-len(jobs) // batch)))  # no more workers than batches
            # more workers than the cluster's CPUs share them (each asks for a share) rather than wait for ever
            actor = ray.remote(num_cpus=min(1.0, cpus / n), max_restarts=RETRIES, max_task_retries=RETRIES)(_Worker)
            env = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
            for _ in range(n):
                pool.append(actor.options(runtime_env={"env_vars": env}).remote(make, *args))  # type: ignore[attr-defined]
            with tqdm(total=len(jobs), desc=f"{desc} (ray, {n} workers)", unit="job", disable=not progress) as bar:
                _dispatch(ray, pool, [list(jobs[i : i + batch]) for i in range(0, len(jobs), batch)], sink, bar, lost)
        finally:
            for worker in pool:  # on a cluster that outlives the run, no worker keeps computing
                ray.kill(worker)


def _dispatch(
    ray: Any, pool: list[Any], batches: list[list[Job]], sink: Callable[[int, list[Any]], None], bar: Any, lost: str
) -> None:
    """Each free worker takes the next batch; each batch's results go to ``sink`` as it returns."""
    starts = [0, *accumulate(len(b) for b in batches)]  # each batch's first job
    returned = [0] * len(pool)
    waiting = list(range(len(batches)))
    running: dict[Any, tuple[int, int]] = {}
    free = list(range(len(pool)))
    while waiting or running:
        while waiting and free:
            w, b = free.pop(0), waiting.pop(0)
            running[pool[w].answer.remote(w, batches[b])] = (w, b)
        done, _ = ray.wait(list(running), num_returns=1)
        for ref in done:
            w, b = running.pop(ref)
            free.append(w)
            try:
                _, results = ray.get(ref)
            except ray.exceptions.RayTaskError as err:  # ragate's own error in the worker: no retry
                cause = err.cause if isinstance(err.cause, BaseException) else err
                raise RagateError(f"a Ray worker stopped: {type(cause).__name__}: {_plain(cause)}; {lost}") from None
            except ray.exceptions.RayError as err:  # the worker or its node died more often than retried
                raise RagateError(
                    f"a Ray worker failed beyond its {RETRIES} retries ({type(err).__name__}: {_plain(err)}); {lost}"
                ) from None
            sink(starts[b], results)
            returned[w] += len(results)
            bar.update(len(results))
            bar.set_postfix_str(" ".join(f"w{i}:{c}" for i, c in enumerate(returned)))


@contextmanager
def cluster(address: str | None, start_timeout: float = RAY_START_TIMEOUT) -> Iterator[Any]:
    """The ``ray`` module, joined to the cluster at ``address`` (auto, HOST:PORT, ray://HOST:10001) or to a local
    one started with this process's CPUs and stopped at the end; a cluster already joined is used as it is. An
    address must answer within ``start_timeout`` seconds (:func:`reach_cluster`); a local start Ray gives up on is
    tried again while they last; either failure is a ragate error naming the address and the timeout."""
    try:
        import ray
    except ImportError:
        raise RagateError("--engine ray needs Ray: pip install 'ragate[ray]' (or pip install ray)") from None
    started_here = not ray.is_initialized()
    if started_here:
        _start(ray, address, start_timeout)
    try:
        yield ray
    finally:
        if started_here:
            ray.shutdown()


def _start(ray: Any, address: str | None, timeout: float) -> None:
    """``ray.init`` joining ``address`` (after :func:`reach_cluster`) or starting a local cluster, again while
    ``timeout`` seconds last where Ray gave up; a failure is a ragate error (Ray's traceback is no help)."""
    import logging

    deadline = time.monotonic() + timeout
    reach_cluster(address, timeout)
    mine = len(os.sched_getaffinity(0)) if address is None else None  # a local cluster: this process's CPUs
    where = f"--ray-address {address}" if address is not None else "a local Ray cluster"
    while True:
        try:
            ray.init(
                address=address, num_cpus=mine, include_dashboard=False, log_to_driver=False,
                logging_level=logging.ERROR,
            )  # fmt: skip
            return
        except Exception as err:  # noqa: BLE001 (Ray raises bare Exceptions: "timed out during startup")
            ray.shutdown()  # what a failed start left running
            if address is None and time.monotonic() < deadline and "timed out" in str(err):
                continue  # a busy machine: Ray's own start limit is 30 s, the user's may be longer
            said = _plain(err) or type(err).__name__
    raise RagateError(
        f"{where}: Ray could not start within {timeout:g} s (--ray-start-timeout): {said}; "
        + ("check that a cluster runs there" if address is not None else "give it longer on a busy machine, or "
           "start one by hand (`ray start --head`) and pass --ray-address auto")
    )  # fmt: skip


def _plain(err: BaseException) -> str:
    """An error's last line without the terminal colours Ray adds."""
    said = re.sub(r"\x1b\[[0-9;]*m", "", str(err)).strip().splitlines()
    return said[-1] if said else ""
