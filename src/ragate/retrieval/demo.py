"""The demo index: a hybrid index over the small real Wikipedia sample that ships in the package, built on first
use under ``<ragate home>/indexes/demo`` (about half a minute on 2 cores, then reused)."""

from __future__ import annotations

from pathlib import Path

from ragate.fileio import exclusive_lock
from ragate.models import ragate_home
from ragate.retrieval.corpus import demo_dir, read_passages
from ragate.retrieval.index import IndexKind, build_index

DEMO_KIND: IndexKind = "hybrid"


def demo_index(home: Path | str | None = None, *, progress: bool = True) -> Path:
    """The demo index directory, built from ``ragate/data/demo/passages.jsonl`` if it is not there yet."""
    target = ragate_home(home) / "indexes" / "demo"
    if (target / "manifest.json").exists():
        return target
    # two processes started together on a fresh machine (`make demo` twice): the second waits for the first's
    # build and uses it, instead of failing on the build's own lock
    with exclusive_lock(target.parent / ".demo.first-use.lock", "building the demo index", wait=True):
        if (target / "manifest.json").exists():
            return target
        passages = demo_dir() / "passages.jsonl"
        return build_index(
            read_passages(passages), target, DEMO_KIND, progress=progress, overwrite=True, corpus=str(passages)
        )
