"""The ``ragate`` command: ``--help``, ``ask`` on the real default model, and its errors."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from ragate.cli.main import main


def test_help_lists_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "ask" in out and "models" in out


def test_ask_json_from_the_installed_command(smollm2_path: Path) -> None:
    """The real entry point, as a user runs it: one JSON object with the answer and per-token values."""
    ragate = Path(sys.executable).with_name("ragate")
    if not ragate.exists():
        pytest.skip("the ragate command is not installed in this environment (pip install -e .)")
    proc = subprocess.run(
        [str(ragate), "ask", "What is the capital of France?", "--json", "--max-tokens", "12"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["answer"]
    assert data["model"] == "smollm2-135m" and data["backend"] == "llama.cpp"
    assert data["entropy"] == "exact"
    assert len(data["tokens"]) == data["completion_tokens"] > 0
    for tok in data["tokens"]:
        assert tok["logprob"] <= 0 and tok["entropy"] >= 0 and tok["margin"] >= 0
        assert tok["top_logprobs"][0]["token_id"] == tok["token_id"]  # greedy
    u = data["uncertainty"]["normalised_nll"]
    assert u == pytest.approx(-sum(t["logprob"] for t in data["tokens"]) / len(data["tokens"]))
    assert 0 < data["uncertainty"]["mean_margin_uncertainty"] <= 1
    assert not math.isnan(data["uncertainty"]["mean_entropy"])


def test_ask_table(smollm2_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ask", "Who wrote Hamlet?", "--max-tokens", "6"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Q: Who wrote Hamlet?\nA: ")
    assert "DTR normalised NLL u" in out and "runner-up" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["ask", "   "], "question is empty"),
        (["ask", "x" * 5000], "at most 4000"),
        (["ask", "hi", "--max-tokens", "0"], "max_tokens must be >= 1"),
        (["ask", "hi", "--model", "smollm"], "Did you mean"),
        (["ask", "hi", "--model", "qwen2.5-coder-1.5b"], "ragate models install qwen2.5-coder-1.5b"),
        (["ask", "hi", "--model", "/no/such/model.gguf"], "/no/such/model.gguf"),
        (["ask", "hi", "--backend", "openai"], "--base-url"),
        (["ask", "hi", "--base-url", "http://127.0.0.1:9/v1"], "--base-url goes with --backend openai"),
        (["ask", "hi", "--method", "dtr", "--max-tokens", "0"], "max_tokens must be >= 1"),
        (["ask", "hi", "--calibration", "x.json"], "--calibration goes with --method"),
        (["ask", "hi", "--method", "dtrr"], "Did you mean 'dtr'"),
        (["ask", "hi", "--method", "dtr", "--gate", "targ-margn"], "Did you mean 'targ-margin'"),
        (["ask", "hi", "--method", "dtr", "--selector", "hide"], "Did you mean 'hyde'"),
        (["ask", "hi", "--index", "/tmp"], "--index goes with --method"),
    ],
)
def test_ask_errors_name_the_problem_and_the_fix(
    argv: list[str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("RAGATE_HOME", str(tmp_path))  # an empty home: the 1.5B model is not installed there
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("ragate: error: ") and message in err


def test_a_rerank_method_without_a_cross_encoder_is_refused_before_the_model_loads(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import ragate.backends

    def no_model(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was loaded before the command was checked")

    monkeypatch.setattr(ragate.backends, "load_backend", no_model)
    assert main(["ask", "Who wrote Hamlet?", "--method", "dpr-ais-rerank"]) == 2
    assert "--cross-encoder DIR" in capsys.readouterr().err
    assert main(["ask", "Who wrote Hamlet?", "--method", "standard-rag", "--cross-encoder", "x"]) == 2
    assert "goes with the selectors dpr-ais-rerank, rerank" in capsys.readouterr().err
