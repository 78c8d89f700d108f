"""The test suite's own guard rails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_a_typoed_marker_fails_collection(tmp_path):
    (tmp_path / "test_typo.py").write_text("import pytest\n\n\n@pytest.mark.vllm16\ndef test_x():\n    pass\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(REPO / "pytest.ini"),
            "--rootdir",
            str(tmp_path),
            "-p",
            "no:cacheprovider",
            str(tmp_path / "test_typo.py"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "'vllm16' not found in `markers`" in proc.stdout + proc.stderr


def test_vllm_independent_with_a_version_marker_fails_collection(tmp_path):
    """Such a test would be skipped on every engine (conftest's collection hook)."""
    (tmp_path / "test_both.py").write_text(
        "import pytest\n\n\n@pytest.mark.vllm_independent\n@pytest.mark.vllm016\ndef test_x():\n    pass\n"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(REPO / "pytest.ini"),
            "--rootdir",
            str(tmp_path),
            "-p",
            "tests.conftest",
            "-p",
            "no:cacheprovider",
            str(tmp_path / "test_both.py"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode != 0
    assert "test_both.py::test_x: vllm_independent with a vLLM-version marker would never run" in (
        proc.stdout + proc.stderr
    )
