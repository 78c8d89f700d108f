"""The vllm-0.32.0 series (CPU fixes that still apply on the latest engine): applies
to the installed package, reverts byte-identically, and equals its runtime twins."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_k2_plugin.patching import files

from .conftest import REPO, engine_env

pytestmark = pytest.mark.vllm_latest
TWINS = "cpu-rope-3d-query,cpu-kernel-rebind-scan"
PROBE = r"""
import json
from vllm.plugins import load_general_plugins
load_general_plugins()
import vllm
from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding
from vllm.triton_utils import dispatcher
from vllm_k2_plugin.cpu.kernel_rebind import _scan_survives_opaque_dict
from vllm_k2_plugin.cpu.rope_inplace import _rotates_like_reference
print(json.dumps({
    "vllm_from": vllm.__file__,
    "cpu_rope": _rotates_like_reference(RotaryEmbedding.forward_cpu),
    "kernel_scan": _scan_survives_opaque_dict(dispatcher._rebind_kernels),
}))
"""


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "vllm_k2_plugin.cli", "patches", *args],
        env=engine_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _probe(env):
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def patched_site(tmp_path_factory):
    import vllm

    site = tmp_path_factory.mktemp("site32")
    shutil.copytree(Path(vllm.__file__).parent, site / "vllm", ignore=shutil.ignore_patterns("__pycache__"))
    return site


def test_apply_check_revert_on_installed_copy(patched_site, tmp_path):
    tree = tmp_path / "vllm"
    touched = files._all_files(files.load_series("0.32.0"))
    for rel in touched + ["_version.py"]:
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(patched_site / "vllm" / rel, tree / rel)
    before = {rel: (tree / rel).read_bytes() for rel in touched}
    assert "not applied" in _cli("check", "--vllm-root", str(tree)).stdout
    assert _cli("apply", "--vllm-root", str(tree)).returncode == 0
    assert _cli("apply", "--vllm-root", str(tree)).stdout.strip() == "already applied (no change)"
    assert _cli("revert", "--vllm-root", str(tree)).returncode == 0
    assert {rel: (tree / rel).read_bytes() for rel in touched} == before


def test_patch_files_equal_their_runtime_twins(patched_site):
    assert _cli("apply", "--vllm-root", str(patched_site / "vllm")).returncode == 0
    runtime = _probe(engine_env())
    files_only = _probe(
        engine_env(PYTHONPATH=os.pathsep.join([str(patched_site), str(REPO)]), VLLM_K2_DISABLE_PATCHES=TWINS)
    )
    stock = _probe(engine_env(VLLM_K2_DISABLE="1"))
    assert files_only.pop("vllm_from").startswith(str(patched_site))
    runtime.pop("vllm_from"), stock.pop("vllm_from")
    assert runtime == files_only == {"cpu_rope": True, "kernel_scan": True}
    assert stock == {"cpu_rope": False, "kernel_scan": False}
