"""The built wheels, installed (not editable), have every feature the CLI reads at run time:
the runtime wheel its patch files, the tools wheel the planner's calibration and the trained
tiny target. Run from outside the repository with only the wheels' copies importable: doctor,
patches check, train plan, an EAGLE-3 check (the drafter, then vLLM's engine config for the
pair) and a GGUF check (where gguf-py is installed: the vLLM 0.16 engine)."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from vllm_k2_plugin import __version__
from vllm_k2_tools.fixtures import build_draft

from .conftest import IS_016, engine_env

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel_site(tmp_path_factory):
    """The runtime's sdist, then its wheel built from the sdist (so the sdist is complete too),
    and the tools' wheel (built from the checkout: its package lives beside tools/, so it has no
    sdist of its own), both installed (not editable) into a folder of their own."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(out), "sdist", "-d", str(out)],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=300,
    )
    sdist = next(out.glob("vllm_k2_plugin-*.tar.gz"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(sdist)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    wheel = next(out.glob("vllm_k2_plugin-*.whl"))
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(REPO / "tools")],
        check=True,
        capture_output=True,
        timeout=300,
    )
    tools = next(out.glob("vllm_k2_plugin_tools-*.whl"))
    site = out / "site"
    subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(site), str(wheel), str(tools)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return wheel, tools, site


def _cli(site, tmp_path, *args):
    env = engine_env()
    env["PYTHONPATH"] = str(site)  # the wheel's copy only: no checkout on the path
    return subprocess.run(
        [sys.executable, "-m", "vllm_k2_plugin.cli", *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_wheels_carry_package_data_and_one_version(wheel_site):
    wheel, tools, _ = wheel_site
    names = set(zipfile.ZipFile(wheel).namelist())
    for series in (REPO / "patches").glob("vllm-*/series"):
        for line in series.read_text().split():
            assert f"vllm_k2_plugin/patch_files/{series.parent.name}/{line}" in names
    assert not [n for n in names if n.startswith("vllm_k2_tools/") or n.endswith(".safetensors")]
    tool_names = set(zipfile.ZipFile(tools).namelist())
    assert "vllm_k2_tools/train/calibration/train_step_h200.json" in tool_names
    assert "vllm_k2_tools/fixtures/data/tiny-trained/model-00001-of-00002.safetensors" in tool_names
    assert not [n for n in tool_names if n.startswith("vllm_k2_plugin/")]
    assert wheel.name.startswith(f"vllm_k2_plugin-{__version__}-")
    assert tools.name.startswith(f"vllm_k2_plugin_tools-{__version__}-")


#: every module the CLI runs below, and the package data it reads
PROBE = """
import vllm_k2_plugin, vllm_k2_plugin.cli, vllm_k2_plugin.doctor, vllm_k2_plugin.patching.files as pf
import vllm_k2_plugin.models.eagle3_checks as ec, vllm_k2_plugin.models.eagle3_engine_check as ee
import vllm_k2_plugin.gguf.check as gc, vllm_k2_plugin.gguf.loader as gl
from vllm_k2_tools.train import plan
for m in (vllm_k2_plugin, vllm_k2_plugin.cli, vllm_k2_plugin.doctor, pf, ec, ee, gc, gl, plan):
    print(m.__file__)
print(plan.DEFAULT_CALIBRATION)
print(pf.PATCHES_ROOT)
"""


def test_installed_wheel_runs_the_cli(wheel_site, tmp_path, k25_model, fixture_root):
    _, _, site = wheel_site
    where = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={**engine_env(), "PYTHONPATH": str(site)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    paths = [line for line in where.stdout.splitlines() if line]
    assert len(paths) == 11 and all(p.startswith(str(site)) for p in paths), where.stdout + where.stderr[-2000:]
    doctor = _cli(site, tmp_path, "doctor")
    assert doctor.returncode == 0 and "triton-mla-k2-decode" in doctor.stdout, doctor.stdout + doctor.stderr[-2000:]
    check = _cli(site, tmp_path, "patches", "check")
    assert "cpu-rope-3d-query" in check.stdout, check.stdout + check.stderr[-2000:]
    plan = _cli(site, tmp_path, "train", "plan")
    assert plan.returncode == 0 and "Hero-run plan" in plan.stdout, plan.stdout + plan.stderr[-2000:]
    draft = build_draft("legacy", str(fixture_root / "wheel-draft"), k25_model)
    eagle = _cli(
        site,
        tmp_path,
        "eagle3",
        "check",
        "--target",
        k25_model,
        "--draft",
        draft,
        "--engine-config",
        "--dtype",
        "float32",
        "--max-model-len",
        "512",
    )
    assert eagle.returncode == 0, eagle.stdout + eagle.stderr[-2000:]
    engine = json.loads(eagle.stdout)["engine_config"]  # vLLM built the EAGLE-3 config, our class serves it
    assert engine["method"] == "eagle3" and engine["aux_layer_ids"] == [2, 4, 8]
    ours = "vllm_k2_plugin.models.k2p_eagle3_draft.Eagle3KimiK25ForCausalLM"  # 0.16; later: upstream's class
    assert engine["draft_class"] == (
        ours if IS_016 else "vllm.model_executor.models.llama_eagle3.Eagle3LlamaForCausalLM"
    )


def test_installed_wheel_checks_a_gguf(wheel_site, tmp_path, text_model):
    """A GGUF written by the test-only llama.cpp-style writer (no plugin code), checked by
    the wheel's `vllm-k2 gguf check`."""
    pytest.importorskip("gguf")  # gguf-py ships with vLLM <= 0.23 (the 0.16 engine)
    from .gguf_llamacpp_writer import convert

    _, _, site = wheel_site
    path = convert(text_model, str(tmp_path / "llamacpp.gguf"))
    r = _cli(site, tmp_path, "gguf", "check", path, "--hf-config-path", text_model, "--json")
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    summary = json.loads(r.stdout)
    assert summary["mla_layout"] == "attn_k_b + attn_v_b" and summary["layers"] == 8, summary
    assert summary["tensors"] == 142 and summary["types"] == {"F32": 142}
