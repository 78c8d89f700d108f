"""`vllm-k2 --help` and `vllm-k2 doctor` in a Python with neither torch nor vLLM (only the
declared dependency `packaging`): doctor must diagnose exactly that situation."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import packaging

REPO = Path(__file__).resolve().parent.parent


def test_help_and_doctor_without_torch_or_vllm(tmp_path):
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    deps = tmp_path / "deps"
    shutil.copytree(Path(packaging.__file__).parent, deps / "packaging")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": f"{REPO}{os.pathsep}{deps}", "HOME": str(tmp_path)}
    py = str(venv / "bin" / "python")
    probe = subprocess.run(
        [py, "-c", "import importlib.util as u; print(u.find_spec('torch'), u.find_spec('vllm'))"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert probe.stdout.strip() == "None None", probe.stdout + probe.stderr
    help_ = subprocess.run(
        [py, "-m", "vllm_k2_plugin.cli", "--help"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert help_.returncode == 0 and "doctor" in help_.stdout, help_.stderr[-2000:]
    doctor = subprocess.run(
        [py, "-m", "vllm_k2_plugin.cli", "doctor"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert doctor.returncode == 0, doctor.stderr[-2000:]
    missing = [ln for ln in doctor.stdout.splitlines() if ln.strip().startswith("MISSING")]
    assert missing and "vllm" in missing[0] and "torch" in missing[0], doctor.stdout
    assert "triton-mla-k2-decode" in doctor.stdout and "vLLM is not installed" in doctor.stdout
