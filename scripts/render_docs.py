"""Re-render, or check, every generated block of the README and docs from the command that prints it.

    .venv/bin/python scripts/render_docs.py            # run each block's command, write its output into the block
    .venv/bin/python scripts/render_docs.py --check    # exit 1, with a diff, where a block differs from its command
    .venv/bin/python scripts/render_docs.py --list     # the blocks and their commands, and every hand-typed table

A generated block is the text between

    <!-- begin generated: NAME (COMMAND) -->
    <!-- end generated: NAME -->

in README.md or a Markdown file under docs/. COMMAND runs from the repository root (no shell; a leading
``.venv/bin/python`` is this interpreter) and reads only committed records, so its output is the block. A command
that prints several blocks frames each with a line ``<!-- block: NAME -->``; each distinct command runs once.
Hand-written prose stays outside the markers; a number inside them that is edited by hand, or a record or default
that changed without a re-render, fails ``--check`` (tests/test_generated_docs.py runs it).

A figure is drawn by the command of the block that prints the data behind it: an argument ``{figure:PATH}`` is the
PNG's path under the root when rendering, and a scratch file when checking, so ``--check`` compares the figure by
its data (the block's text) and a render redraws it; a command prints nothing about where it drew.

One seed and resample count reach every block whose command draws bootstrap intervals: the results spec's
(docs/results/spec.toml, ``seed`` and ``samples``). An argument ``{spec}`` is the spec's path and ``{spec:KEY}`` its
value of KEY, so a command says ``--seed {spec:seed} --resamples {spec:samples}`` and an edited spec changes every
such block (``--spec FILE`` renders or checks against another spec; tests/test_generated_docs.py holds it).

A table typed by hand outside the blocks is either a reference table, marked by a line ``<!-- reference table:
WHY -->`` just before it (the papers' own numbers, defaults, options, file lists), or a measured table typed by
hand: ``--list`` names each, with its rows that hold a number, and tests/test_generated_docs.py counts those rows
(docs/results/archive.md, the dated record of superseded results, aside).
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN = re.compile(r"^<!-- begin generated: (?P<name>[\w.-]+) \((?P<command>[^\n]*)\) -->$", re.MULTILINE)
FRAME = re.compile(r"^<!-- block: (?P<name>[\w.-]+) -->$", re.MULTILINE)
FIGURE = re.compile(r"\{figure:(?P<path>[\w./-]+\.png)\}")
SPEC_ARG = re.compile(r"\{spec(?::(?P<key>\w+))?\}")
SPEC = Path("docs/results/spec.toml")


@dataclass(frozen=True)
class Block:
    path: Path
    name: str
    command: str
    start: int  # offset of the block's text (after the begin line)
    end: int  # offset of the end line
    text: str


ARCHIVE = Path("docs/results/archive.md")
RECORDS = Path("docs/results/runs")  # what ragate eval, sweep and report wrote: records, not typed
REFERENCE = re.compile(r"^<!-- reference table: .+ -->$")
NUMBER = re.compile(r"(?<![\w.])[-+−]?\d+(?:[.,]\d+)?")  # not bm25's, sha256's or Qwen2.5's digits


def doc_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


@dataclass(frozen=True)
class HandTable:
    """A Markdown table typed by hand (outside every generated block and code fence): where it starts (1-based),
    its rows that hold a number past their first cell, and why it is a reference table (None: a measured one)."""

    path: Path
    line: int
    numeric_rows: int
    reference: str | None


def hand_tables(path: Path) -> list[HandTable]:
    """The hand-typed tables of one file."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[HandTable] = []
    generated = fenced = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif BEGIN.match(line):
            generated = True
        elif line.startswith("<!-- end generated:"):
            generated = False
        if generated or fenced or not line.startswith("|"):
            i += 1
            continue
        start = i
        while i < len(lines) and lines[i].startswith("|"):
            i += 1
        rows = [r for r in lines[start + 2 : i] if any(NUMBER.search(c) for c in r.strip("|").split("|")[1:])]
        before = next((lines[j] for j in range(start - 1, max(-1, start - 4), -1) if lines[j].strip()), "")
        before = before.strip()
        why = REFERENCE.match(before)
        out.append(HandTable(path, start + 1, len(rows), before[len("<!-- reference table: ") : -4] if why else None))
    return out


def measured_by_hand(root: Path = ROOT) -> list[HandTable]:
    """Every hand-typed table with numbers that is not a reference table, outside the archive and the records."""
    typed = [p for p in doc_files(root) if p != root / ARCHIVE and not p.is_relative_to(root / RECORDS)]
    return [t for p in typed for t in hand_tables(p) if t.reference is None and t.numeric_rows]


def blocks(path: Path) -> Iterator[Block]:
    """The generated blocks of one file; a begin without its end (or a name used twice) is an error naming it."""
    doc = path.read_text(encoding="utf-8")
    seen = set()
    for m in BEGIN.finditer(doc):
        name = m["name"]
        end_line = f"<!-- end generated: {name} -->"
        start = m.end() + 1
        end = doc.find(end_line, start)
        if end < 0:
            raise SystemExit(f"{path}: the block {name!r} has no line {end_line!r}")
        if name in seen:
            raise SystemExit(f"{path}: two blocks are named {name!r}")
        seen.add(name)
        yield Block(path, name, m["command"], start, end, doc[start:end])


def figure_args(argv: list[str], root: Path, figures: Path | None, spec: Path | None = None) -> list[str]:
    """``{figure:PATH}`` arguments made paths: ``root / PATH`` when rendering, a file under ``figures`` when checking
    (so that a check writes nothing into the tree); ``{spec}`` the results spec's path (``spec``, default the
    repository's) and ``{spec:KEY}`` its value of KEY."""
    spec = root / SPEC if spec is None else spec.resolve()
    out = []
    for arg in argv:
        if m := FIGURE.fullmatch(arg):
            out.append(str(root / m["path"] if figures is None else figures / Path(m["path"]).name))
        elif m := SPEC_ARG.fullmatch(arg):
            out.append(str(spec) if m["key"] is None else _spec_value(spec, m["key"]))
        else:
            out.append(arg)
    return out


def _spec_value(spec: Path, key: str) -> str:
    import tomllib

    with spec.open("rb") as f:
        values = tomllib.load(f)
    if key not in values or isinstance(values[key], dict | list):
        raise SystemExit(f"{spec} has no value {key!r} for a block's command")
    return str(values[key])


def run(command: str, root: Path = ROOT, figures: Path | None = None, spec: Path | None = None) -> dict[str, str] | str:
    """The command's output: one text, or the named blocks it frames (its figures drawn and the spec's values put
    in, see :func:`figure_args`)."""
    argv = figure_args(shlex.split(command), root, figures, spec)
    if argv and argv[0] in (".venv/bin/python", "python", "python3"):
        argv[0] = sys.executable
    # one thread of numeric libraries each: two commands at a time, each with a BLAS thread per core, oversubscribe
    # a small machine many times over (the learned-gate tables took 9 minutes that way, 80 s so)
    env = {**os.environ, **{k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}}
    done = subprocess.run(argv, cwd=root, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise SystemExit(f"`{command}` failed ({done.returncode}):\n{done.stderr[-3000:]}")
    out = done.stdout
    frames = list(FRAME.finditer(out))
    if not frames:
        return _normal(out)
    return {
        m["name"]: _normal(out[m.end() + 1 : frames[i + 1].start() if i + 1 < len(frames) else len(out)])
        for i, m in enumerate(frames)
    }


def _normal(text: str) -> str:
    return text.strip("\n") + "\n"


def expected(
    found: list[Block], root: Path = ROOT, workers: int = 2, figures: Path | None = None, spec: Path | None = None
) -> dict[tuple[Path, str], str]:
    """Each block's text as its command prints it (each distinct command run once, ``workers`` at a time)."""
    commands = sorted({b.command for b in found})
    with ThreadPoolExecutor(max_workers=workers) as pool:
        outputs = dict(zip(commands, pool.map(lambda c: run(c, root, figures, spec), commands), strict=True))
    want = {}
    for b in found:
        out = outputs[b.command]
        if isinstance(out, dict):
            if b.name not in out:
                raise SystemExit(f"{b.path}: `{b.command}` prints no block {b.name!r} (it prints {', '.join(out)})")
            out = out[b.name]
        want[b.path, b.name] = out
    return want


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 where a block is stale")
    ap.add_argument("--list", action="store_true", help="list the blocks and their commands")
    ap.add_argument("--only", action="append", default=[], help="only the block NAME (repeatable)")
    ap.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    ap.add_argument("--spec", type=Path, default=None, help="another results spec for {spec} arguments (with --check)")
    args = ap.parse_args(argv)
    found = [b for p in doc_files(args.root) for b in blocks(p) if not args.only or b.name in args.only]
    if args.list:
        for b in found:
            print(f"{b.path.relative_to(args.root)}: {b.name}: {b.command}")
        if not args.only:
            by_hand = measured_by_hand(args.root)
            for t in by_hand:
                print(f"{t.path.relative_to(args.root)}:{t.line}: typed by hand, {t.numeric_rows} rows with numbers")
            rows = sum(t.numeric_rows for t in by_hand)
            print(f"{len(found)} generated blocks; {len(by_hand)} measured tables typed by hand ({rows} rows)")
        return 0
    with tempfile.TemporaryDirectory(prefix="render-docs-figures-") as scratch:
        if args.spec is not None and not args.check:
            raise SystemExit("--spec renders against another spec: give --check too (the pages keep the repository's)")
        want = expected(found, args.root, figures=Path(scratch) if args.check else None, spec=args.spec)
    stale = [b for b in found if b.text != want[b.path, b.name]]
    if args.check:
        for b in stale:
            where = f"{b.path.relative_to(args.root)} ({b.name})"
            diff = difflib.unified_diff(
                b.text.splitlines(), want[b.path, b.name].splitlines(), f"{where} as written",
                f"{where} as `{b.command}` prints it", lineterm="", n=1,
            )  # fmt: skip
            print("\n".join(diff))
        print(f"{len(found) - len(stale)} of {len(found)} generated blocks match their commands", file=sys.stderr)
        return 1 if stale else 0
    from ragate.fileio import atomic_writer

    for path in {b.path for b in stale}:
        doc = path.read_text(encoding="utf-8")
        for b in sorted((b for b in stale if b.path == path), key=lambda b: -b.start):  # from the end: offsets hold
            doc = doc[: b.start] + want[b.path, b.name] + doc[b.end :]
        with atomic_writer(path) as f:
            f.write(doc.encode("utf-8"))
    print(f"re-rendered {len(stale)} of {len(found)} generated blocks", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
