"""A clone with no ../shared/data beside it (a user's machine): the tests that read the QA data folder skip, with a
reason naming it, instead of failing. They run in a subprocess with $RAGATE_DATA_DIR pointed at a folder that does
not exist, which :func:`ragate.eval.datasets.data_dir` (and every command it runs) then refuses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the tests that read the QA data folder through ragate.eval.datasets.data_dir (the generated docs do not:
# tests/test_generated_docs.py checks them with the folder out of reach)
READ_QA_DATA = (
    "tests/test_tune.py::test_reproduce_takes_a_tune_file_for_a_dataset_it_runs",
    "tests/test_reproduce.py::test_reproduce_runs_a_method_at_its_tuned_value",
    "tests/test_dynamic.py::test_the_committed_samples_are_the_real_first_questions",
)


def test_the_tests_that_read_the_qa_data_skip_without_it(tmp_path: Path) -> None:
    env = {**os.environ, "RAGATE_DATA_DIR": str(tmp_path / "absent"), "PYTHONDONTWRITEBYTECODE": "1"}
    argv = [sys.executable, "-m", "pytest", "-q", "-x", "-rs", "-p", "no:cacheprovider", "--basetemp"]
    done = subprocess.run(
        [*argv, str(tmp_path / "pytest"), *READ_QA_DATA], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    printed = done.stdout + done.stderr
    assert done.returncode == 0, printed[-4000:]
    assert f"{len(READ_QA_DATA)} skipped" in printed.splitlines()[-1], printed[-4000:]
    reasons = [line for line in printed.splitlines() if line.startswith("SKIPPED")]
    # each names the data folder (or the default model, where that is not installed either)
    assert all("../shared/data" in r or "not installed" in r for r in reasons), "\n".join(reasons)
