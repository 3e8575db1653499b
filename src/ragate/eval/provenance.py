"""What a result came from: package versions, the model file, the index, the code's git commit."""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from ragate.models import model_identity

PACKAGES = (
    "ragate", "numpy", "llama_cpp_python", "transformers", "torch", "sentence-transformers", "bm25s",
    "faiss-cpu", "httpx",
)  # fmt: skip


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_commit(where: Path | None = None) -> dict[str, Any]:
    """The commit of the checkout ragate runs from, and whether its package code (the files under ``where``,
    default this package's directory) had uncommitted changes; None outside git. Run files and docs being
    written beside it do not count as changes."""
    cwd = where or Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", "."],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": head, "dirty": bool(dirty)}


def index_identity(index: str | None) -> dict[str, Any]:
    """The index manifest's description (kind, size, encoder, corpus) and a digest of its file checksums."""
    from ragate.models import ragate_home
    from ragate.retrieval.index import index_info

    demo = ragate_home() / "indexes" / "demo"
    where = index or (demo if (demo / "manifest.json").exists() else None)
    if where is None:
        return {"index": None}
    manifest = index_info(where, verify=False)
    files = json.dumps(manifest.get("files", {}), sort_keys=True).encode()
    keep = ("kind", "passages", "encoder", "params", "corpus", "ragate_version", "created_at")
    texts = (manifest.get("files") or {}).get("passages.jsonl") or {}
    return (
        {"path": str(Path(where).resolve())}
        | {k: manifest.get(k) for k in keep}
        | {"files_sha256": hashlib.sha256(files).hexdigest(), "passages_sha256": texts.get("sha256")}
    )


def engine_build(engine: str) -> dict[str, Any]:
    """The CPU and, for llama.cpp, the features its library was compiled with (the binding's version is in
    :func:`package_versions`).

    Two machines with different llama.cpp builds answer a few prompts differently (docs/evaluation.md measures it),
    so a run records which build produced its answers."""
    info: dict[str, Any] = {"cpu": _cpu_model()}
    if engine == "llama.cpp":
        try:
            import llama_cpp
        except ImportError:
            return info
        system = llama_cpp.llama_print_system_info()
        text = system.decode(errors="replace") if isinstance(system, bytes) else str(system)
        info["system_info"] = text.strip()
    return info


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None  # not Linux: "processor" beside it has what the platform says


def provenance(config: Any) -> dict[str, Any]:
    return {
        "packages": package_versions(),
        "git": git_commit(),
        "model": model_identity(config.model, config.engine, getattr(config, "base_url", None)),
        "index": index_identity(config.index),
        "machine": {"platform": platform.platform(), "processor": platform.processor() or None}
        | engine_build(config.engine),
    }
