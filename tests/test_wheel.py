"""The built wheel, installed (not editable), has every feature the CLI reads at run time:
patch files, the planner's calibration, the trained tiny target. Run from outside the
repository with only the wheel's copy of the package importable."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from vllm_k2_plugin import __version__
from vllm_k2_plugin.fixtures import build_draft

from .conftest import engine_env

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel_site(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(REPO)], check=True,
                   capture_output=True, timeout=300)  # fmt: skip
    wheel = next(out.glob("vllm_k2_plugin-*.whl"))
    site = out / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True, capture_output=True,
                   timeout=300)  # fmt: skip
    return wheel, site


def _cli(site, tmp_path, *args):
    env = engine_env()
    env["PYTHONPATH"] = str(site)  # the wheel's copy only: no checkout on the path
    return subprocess.run([sys.executable, "-m", "vllm_k2_plugin.cli", *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)  # fmt: skip


def test_wheel_carries_package_data_and_one_version(wheel_site):
    wheel, _ = wheel_site
    names = set(zipfile.ZipFile(wheel).namelist())
    for series in (REPO / "patches").glob("vllm-*/series"):
        for line in series.read_text().split():
            assert f"vllm_k2_plugin/patch_files/{series.parent.name}/{line}" in names
    assert "vllm_k2_plugin/train/calibration/train_step_h200.json" in names
    assert "vllm_k2_plugin/fixtures/data/tiny-trained/model-00001-of-00002.safetensors" in names
    assert wheel.name.startswith(f"vllm_k2_plugin-{__version__}-")


def test_installed_wheel_runs_the_cli(wheel_site, tmp_path, k25_model, fixture_root):
    _, site = wheel_site
    probe = "import vllm_k2_plugin; print(vllm_k2_plugin.__file__)"
    where = subprocess.run([sys.executable, "-c", probe], env={**engine_env(), "PYTHONPATH": str(site)}, cwd=tmp_path,
                           capture_output=True, text=True)  # fmt: skip
    assert where.stdout.strip().startswith(str(site)), where.stdout + where.stderr
    doctor = _cli(site, tmp_path, "doctor")
    assert doctor.returncode == 0 and "triton-mla-k2-decode" in doctor.stdout, doctor.stdout + doctor.stderr[-2000:]
    check = _cli(site, tmp_path, "patches", "check")
    assert "cpu-rope-3d-query" in check.stdout, check.stdout + check.stderr[-2000:]
    plan = _cli(site, tmp_path, "train", "plan")
    assert plan.returncode == 0 and "Hero-run plan" in plan.stdout, plan.stdout + plan.stderr[-2000:]
    draft = build_draft("legacy", str(fixture_root / "wheel-draft"), k25_model)
    eagle = _cli(site, tmp_path, "eagle3", "check", "--target", k25_model, "--draft", draft)
    assert eagle.returncode == 0, eagle.stdout + eagle.stderr[-2000:]
