"""Both cores: a run's questions sharded over N worker processes, each pinned to its own core with one thread.

Each worker appends its records to its own part file beside the run's JSONL (``questions.part0.jsonl``, ...), so a
worker killed mid-line can only cut the last line of its own part, which the reader drops. The parent folds the
parts into the run's file when the workers end, and again at the start of every run (a run killed before it
could fold). Folding writes the whole file atomically and then deletes the parts; a record already in the file
is not added twice, so a fold interrupted between the two steps doubles nothing when it is redone.
"""

from __future__ import annotations

import ctypes
import json
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ragate.errors import RagateError
from ragate.eval.records import read_records, write_records

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TOKENIZERS_PARALLELISM")
PR_SET_PDEATHSIG = 1


def part_path(path: Path, worker: int) -> Path:
    return path.with_name(f"{path.stem}.part{worker}{path.suffix}")


def part_paths(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f"{path.stem}.part*{path.suffix}"))


def unfolded(path: Path) -> int:
    """How many records sit in ``path``'s part files, not yet folded into it: a multi-worker run that is still
    running, or was killed (its next ``--resume`` folds them)."""
    return sum(len(read_records(part)) for part in part_paths(path))


def fold_parts(path: Path) -> int:
    """Move the records of ``path``'s part files into ``path`` (atomically; none doubled); returns how many."""
    parts = part_paths(path)
    if not parts:
        return 0
    records = read_records(path)
    seen = {json.dumps(r, ensure_ascii=False) for r in records}
    added = 0
    for part in parts:
        for record in read_records(part):
            line = json.dumps(record, ensure_ascii=False)
            if line not in seen:
                seen.add(line)
                records.append(record)
                added += 1
    write_records(path, records)
    for part in parts:
        part.unlink(missing_ok=True)
    return added


def worker_cores(workers: int) -> list[int]:
    """The core each worker is pinned to: this process's allowed cores, in turn."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = list(range(os.cpu_count() or 1))
    return [cores[w % len(cores)] for w in range(workers)]


def _pinned(core: int, target: Callable[..., None], args: tuple[Any, ...]) -> None:
    """A worker's entry: die with the parent, run on one core, then do the work."""
    try:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # no orphan keeps writing after the parent
    except (OSError, AttributeError):
        pass
    try:
        os.sched_setaffinity(0, {core})
    except (AttributeError, OSError):
        pass
    try:
        target(*args)
    except RagateError as err:  # named, not a traceback; the parent names the worker and the fix
        print(f"ragate: error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)


def run_workers(
    target: Callable[..., None],
    payloads: Sequence[tuple[Any, ...]],
    parts: Sequence[Path],
    *,
    total: int,
    desc: str,
    progress: bool = True,
) -> None:
    """Run ``target(*payload)`` in one spawned process per payload, worker w pinned to its core with one thread;
    a bar counts the lines of ``parts``. Raises :class:`RagateError` naming every worker that failed."""
    ctx = multiprocessing.get_context("spawn")
    cores = worker_cores(len(payloads))
    if len(set(cores)) < len(cores):
        print(
            f"ragate: {len(payloads)} workers share {len(set(cores))} cores: each is slower than alone",
            file=sys.stderr,
        )
    saved = {k: os.environ.get(k) for k in THREAD_VARS}
    os.environ.update({k: ("false" if k == "TOKENIZERS_PARALLELISM" else "1") for k in THREAD_VARS})
    procs = []
    try:
        for w, (payload, core) in enumerate(zip(payloads, cores, strict=True)):
            proc = ctx.Process(target=_pinned, args=(core, target, payload), name=f"ragate-worker-{w}")
            proc.start()
            procs.append(proc)
            print(f"worker {w + 1}/{len(payloads)}: pid {proc.pid}, core {core}", file=sys.stderr, flush=True)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        with tqdm(total=total, desc=desc, unit="answer", disable=not progress) as bar:
            while any(p.is_alive() for p in procs):
                bar.update(min(total, _lines(parts)) - bar.n)
                time.sleep(1.0)
            bar.update(min(total, _lines(parts)) - bar.n)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join()
    failed = [(w, p) for w, p in enumerate(procs) if p.exitcode]
    if failed:
        said = ", ".join(
            f"worker {w + 1} (pid {p.pid}) "
            + (f"killed by signal {-(p.exitcode or 0)}" if (p.exitcode or 0) < 0 else f"exited {p.exitcode}")
            for w, p in failed
        )
        raise RagateError(
            f"{said}; the answers written so far are kept: rerun the same command with --resume to finish"
        )


def _lines(paths: Sequence[Path]) -> int:
    n = 0
    for path in paths:
        try:
            n += path.read_bytes().count(b"\n")
        except OSError:
            pass
    return n
