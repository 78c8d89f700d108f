"""The vllm-0.32.0 series (CPU fixes, and the GPU runtime patches staged for upstream,
that still apply on the latest engine): applies to the installed package, reverts
byte-identically, and equals its runtime twins; the GPU files flip their twins' probes."""

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
CPU_TWINS = ("cpu-rope-3d-query", "cpu-kernel-rebind-scan")
#: GPU runtime patches staged as 0003/0004: their files must make the twins' own
#: upstream probes answer True (the twins then retire).
GPU_TWINS = ("rope-float32-cache", "moe-group-tokens-by-expert")
TWINS = ",".join(CPU_TWINS + GPU_TWINS)
PROBE = r"""
import json
from vllm.plugins import load_general_plugins
load_general_plugins()
import torch
import vllm
from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding
from vllm.triton_utils import dispatcher
from vllm_k2_plugin.cpu.kernel_rebind import _scan_survives_opaque_dict
from vllm_k2_plugin.cpu.rope_inplace import _rotates_like_reference
from vllm_k2_plugin.moe_verify.patch import _upstream_sorts_small_batches
from vllm_k2_plugin.patching import REGISTRY
from vllm_k2_plugin.rope_cache.patch import _upstream_hands_float_cache

from tests.gpu_patch_probes import moe_assignment, rope_cache_handed


print(json.dumps({
    "vllm_from": vllm.__file__,
    "cuda": torch.cuda.is_available(),
    "cpu_rope": _rotates_like_reference(RotaryEmbedding.forward_cpu),
    "kernel_scan": _scan_survives_opaque_dict(dispatcher._rebind_kernels),
    "rope_float32_cache": _upstream_hands_float_cache(),
    "moe_sorts_batches": _upstream_sorts_small_batches(),
    "moe_assignment": moe_assignment(),
    "rope_cache_handed": rope_cache_handed(),
    "states": {p.name: p.state.value for p in REGISTRY},
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


def test_series_covers_the_gpu_patches():
    series = {p.name: p for p in files.load_series("0.32.0")}
    assert list(series)[2:] == ["0003-rope-float32-cache.patch", "0004-moe-group-tokens-by-expert.patch"]
    for name, twin in zip(list(series)[2:], GPU_TWINS, strict=True):
        assert series[name].header["Runtime twin"].startswith(twin + " ")
        assert {"Title", "Why", "Changes", "Upstream", "Remove when"} <= set(series[name].header)


def test_patch_files_equal_their_runtime_twins(patched_site):
    assert _cli("apply", "--vllm-root", str(patched_site / "vllm")).returncode == 0
    patched_path = os.pathsep.join([str(patched_site), str(REPO)])
    # The probe builds no model, so the runtime twin's model gate has no config to ask: opt in.
    runtime = _probe(engine_env(VLLM_K2_ANY_MODEL="1"))
    files_only = _probe(engine_env(PYTHONPATH=patched_path, VLLM_K2_DISABLE_PATCHES=TWINS))
    files_and_twins = _probe(engine_env(PYTHONPATH=patched_path))
    stock = _probe(engine_env(VLLM_K2_DISABLE="1"))
    assert files_only.pop("vllm_from").startswith(str(patched_site))
    assert files_and_twins.pop("vllm_from").startswith(str(patched_site))
    runtime.pop("vllm_from"), stock.pop("vllm_from")
    cpu = ("cpu_rope", "kernel_scan")
    assert {k: runtime[k] for k in cpu} == {k: files_only[k] for k in cpu} == {"cpu_rope": True, "kernel_scan": True}
    assert {k: stock[k] for k in cpu} == {"cpu_rope": False, "kernel_scan": False}

    # The GPU twins' own upstream probes: False on stock 0.32, True with the files (twins off).
    gpu = ("rope_float32_cache", "moe_sorts_batches")
    assert {k: stock[k] for k in gpu} == {"rope_float32_cache": False, "moe_sorts_batches": False}
    assert {k: files_only[k] for k in gpu} == {"rope_float32_cache": True, "moe_sorts_batches": True}
    # ... so with the files applied the twins retire (rope-float32-cache only runs with CUDA).
    assert files_and_twins["states"]["moe-group-tokens-by-expert"] == "retired-upstream"
    rope_state = files_and_twins["states"]["rope-float32-cache"]
    assert rope_state == ("retired-upstream" if files_and_twins["cuda"] else "not-applicable")
    assert runtime["states"]["moe-group-tokens-by-expert"] == "applied"

    # moe: the file assigns like the runtime twin (stock: unsorted up to 12 tokens x top 8 of 384).
    assert runtime["moe_assignment"] == files_only["moe_assignment"] == ["naive"] + ["sorted"] * 4
    assert stock["moe_assignment"] == ["naive"] * 4 + ["sorted"]
    # rope: the op gets one float32 copy of the bf16 cache, the same values (the twin's cache.float()).
    assert files_only["rope_cache_handed"] == {"dtype": "torch.float32", "made_once": True, "same_values": True}
    assert stock["rope_cache_handed"]["dtype"] == "torch.bfloat16"
