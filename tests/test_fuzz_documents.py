"""Fuzz: folders of documents as a user's file system holds them (``ragate index build --docs`` and ``ragate index
add``). Each example is a generated tree under ``d/``: files with odd names (spaces, a newline, a leading dash,
glob characters, non-UTF-8 bytes, hidden), subfolders, FIFOs, and links of every kind (to a file or a folder
inside ``d``, to a file or a folder outside it, to an ancestor, dangling, to themselves, to /dev/zero). ragate
builds an index of it (the folder, ``d/**`` or ``d/**/*.txt``), then the tree changes (files deleted, renamed,
replaced by a FIFO, added) and ``index add`` updates the index.

The property, for both commands: the command ends within a time limit in a child process with capped memory; it
either succeeds or refuses with a one-line ``ragate: error:`` (never a traceback); no text from outside ``d`` is
indexed; every regular file ``d`` holds under a UTF-8 name is indexed (the policy leaves out links, not files);
and after the add no passage is left of a file that is gone.

Each example runs in its own child process (about a second): the example budget is a quarter of the fuzz
suite's (``RAGATE_FUZZ_EXAMPLES``, default 40: 10 examples, about 15 s).
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

from fuzzing import FUZZ_EXAMPLES, fuzz_settings
from hypothesis import given, settings
from hypothesis import strategies as st

from ragate.retrieval.files import SUFFIXES

TIME_LIMIT = 60  # seconds for one example's build and add together; both take about a second
OUTSIDE = "OUTSIDEMARK"  # in every file outside d: never in a passage
NAMES = [
    "a",
    "b",
    "notes",
    "Ünïcode",
    "with space",
    "new\nline",
    "-dash",
    "[x]",
    "st*r",
    ".hidden",
    "caf\udce9",
]
SUFFIX_CHOICES = [".txt", ".md", ".jsonl", ".html", ".png", ""]
KINDS = [
    "file", "file", "file", "dir", "dir", "fifo", "link-file-in", "link-file-out", "link-dir-in", "link-dir-out",
    "link-up", "link-dangling", "link-self", "link-dev",
]  # fmt: skip
ARGS = ["d", "./d/", "d/**", "d/**/*.txt", "ABS"]
_examples = itertools.count()

CHILD = r"""
import json, os, shutil, sys
from ragate.cli.main import main

plan = json.loads(sys.argv[1])
rcs = {"build": main(plan["build"])}
if rcs["build"] == 0:
    shutil.copy("ix/passages.jsonl", "built.jsonl")
    for op, path, *rest in plan["mutate"]:
        if op == "delete":
            os.unlink(path)
        elif op == "rename":
            os.rename(path, rest[0])
        elif op == "fifo":
            os.unlink(path)
            os.mkfifo(path)
        else:
            with open(path, "w", encoding="utf-8") as f:
                f.write(rest[0])
    rcs["add"] = main(plan["add"])
with open("rcs.json", "w") as f:
    json.dump(rcs, f)
"""


def _content(name: str, token: str) -> str:
    text = f"{token} words about gardens, tides and lighthouses."
    if name.endswith(".jsonl"):
        return json.dumps({"text": text}) + "\n"
    if name.endswith(".html"):
        return f"<html><body><p>{text}</p></body></html>"
    return text


def _make_tree(root: Path, ops: list[tuple[str, int, str, str, int]]) -> list[Path]:
    """``root/d`` built from ``ops`` (kind, parent, name, suffix, target), and ``root/o`` outside it; the regular
    files made in ``d``."""
    outside = root / "o"
    (outside / "sub").mkdir(parents=True)
    (outside / "secret.txt").write_text(f"{OUTSIDE} the launch code", encoding="utf-8")
    (outside / "sub" / "deep.md").write_text(f"# {OUTSIDE}\nfrom a folder outside", encoding="utf-8")
    d = root / "d"
    d.mkdir()
    dirs, files = [d], []
    for n, (kind, parent, name, suffix, target) in enumerate(ops):
        path = dirs[parent % len(dirs)] / (name + suffix)
        if os.path.lexists(path):
            continue
        if kind == "file":
            path.write_text(_content(path.name, f"inside{n}"), encoding="utf-8")
            files.append(path)
        elif kind == "dir":
            path.mkdir()
            dirs.append(path)
        elif kind == "fifo":
            os.mkfifo(path)
        else:
            path.symlink_to(_link_target(kind, path, dirs, files, outside, target))
    return files


def _link_target(
    kind: str, path: Path, dirs: list[Path], files: list[Path], outside: Path, target: int
) -> str:
    if kind == "link-file-in" and files:
        return os.path.relpath(files[target % len(files)], path.parent)
    if kind == "link-file-out":
        return (
            str(outside / "secret.txt")
            if target % 2
            else os.path.relpath(outside / "secret.txt", path.parent)
        )
    if kind == "link-dir-in":
        return os.path.relpath(dirs[target % len(dirs)], path.parent)
    if kind == "link-dir-out":
        return os.path.relpath(outside / "sub" if target % 2 else outside, path.parent)
    if kind == "link-up":
        return ".."
    if kind == "link-self":
        return path.name
    if kind == "link-dev":
        return "/dev/zero"
    return "nowhere.txt"


def _expected(root: Path, arg: str) -> set[str]:
    """The sources of the regular files under ``d`` that a build of ``arg`` must index: reached without a link,
    no hidden part, a UTF-8 name, a supported suffix (``.txt`` for the glob that names it)."""
    out = set()
    for dirpath, dirnames, filenames in os.walk(root / "d"):
        dirnames[:] = [n for n in dirnames if not n.startswith(".") and _utf8(n)]
        for name in filenames:
            path = Path(dirpath) / name
            wanted = path.suffix == ".txt" if arg.endswith("*.txt") else path.suffix.lower() in SUFFIXES
            if (
                wanted
                and not name.startswith(".")
                and _utf8(name)
                and not path.is_symlink()
                and path.is_file()
            ):
                rel = path.relative_to(root).as_posix()
                out.add(str(root / rel) if arg == "ABS" else rel)
    return out


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _run(root: Path, plan: dict[str, Any]) -> tuple[dict[str, int], str]:
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    try:
        result = subprocess.run(  # noqa: PLW1510 (the exit status is checked below, with the output)
            [sys.executable, "-c", CHILD, json.dumps(plan)],
            cwd=root,
            capture_output=True,
            text=True,
            errors="backslashreplace",
            timeout=TIME_LIMIT,
            preexec_fn=cap,
        )
    except subprocess.TimeoutExpired:
        raise AssertionError(f"build and add still running after {TIME_LIMIT} s: {plan}") from None
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((root / "rcs.json").read_text()), result.stderr


def _passages(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _check_index(passages: list[dict[str, Any]], expected: set[str]) -> None:
    assert not [p for p in passages if OUTSIDE in p["text"]], "text from outside d was indexed"
    sources = {p["source"] for p in passages}
    assert expected <= sources, f"regular files not indexed: {expected - sources}"


ops = st.lists(
    st.tuples(
        st.sampled_from(KINDS),
        st.integers(0, 20),
        st.sampled_from(NAMES),
        st.sampled_from(SUFFIX_CHOICES),
        st.integers(0, 20),
    ),
    min_size=1,
    max_size=14,
)


@settings(fuzz_settings, max_examples=max(4, FUZZ_EXAMPLES // 4))
@given(ops=ops, arg=st.sampled_from(ARGS), skip_bad=st.booleans(), data=st.data())
def test_fuzz_document_folders(
    tmp_path: Path, ops: list[tuple[str, int, str, str, int]], arg: str, skip_bad: bool, data: st.DataObject
) -> None:
    root = tmp_path / f"ex{next(_examples)}"
    root.mkdir()
    files = _make_tree(root, ops)
    docs = str(root / "d") if arg == "ABS" else arg
    mutate: list[list[str]] = []
    for path in files:
        change = data.draw(st.sampled_from(["keep", "keep", "delete", "rename", "fifo", "edit"]))
        rel = str(path.relative_to(root))
        if change == "rename":
            mutate.append(["rename", rel, rel + "-renamed.txt"])
        elif change == "edit":
            mutate.append(["write", rel, _content(path.name, "edited")])
        elif change != "keep":
            mutate.append([change, rel])
    mutate.append(["write", "d/added.txt", _content("added.txt", "added")])
    flags = ["--quiet", *(["--skip-bad"] if skip_bad else [])]
    plan = {
        "build": ["index", "build", "--docs", docs, "--kind", "bm25", "--out", "ix", *flags],
        "mutate": mutate,
        "add": ["index", "add", "ix", "--docs", docs, *flags],
    }
    expected = _expected(root, arg)
    rcs, stderr = _run(root, plan)
    if rcs["build"] != 0:  # refused: d holds no file with text, or a link gives a file another type's suffix
        damaged = not skip_bad and "--skip-bad" in stderr  # (a.jsonl -> a.txt is not JSON lines)
        assert "ragate: error:" in stderr and (not expected or damaged), stderr[-3000:]
        return
    _check_index(_passages(root / "built.jsonl"), expected)
    assert rcs["add"] == 0, stderr[-3000:]  # d/added.txt is always there to add
    passages = _passages(root / "ix" / "passages.jsonl")
    added = str(root / "d/added.txt") if arg == "ABS" else "d/added.txt"
    _check_index(passages, _expected(root, arg) | {added})
    for source in {p["source"] for p in passages}:  # nothing is left of a file that is gone
        assert os.path.isfile(root / source), f"passages of {source!r}, which is gone, are still served"
