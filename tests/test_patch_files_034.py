"""The vllm-0.34.0 series (GPU runtime patches staged for upstream, ported to PyPI's newest
vLLM): applies to a copy of the installed 0.34 package, reverts byte-identically, and each
file flips its runtime twin's own upstream probe (stock 0.34: False). No GPU and no engine:
the probes stand in for the CUDA ops (recorders) and, for the Triton attention builder,
for a CUDA platform with an H200's SM count."""

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

pytestmark = pytest.mark.vllm034
VERSION = "0.34.0"
TWINS = ("rope-float32-cache", "moe-group-tokens-by-expert", "draft-attention-segments")
#: Rows of a one-KV-head decode batch (8 query heads, scratch of 16 rows x 16 segments).
ROWS = (1, 2, 4, 8, 9, 16, 17)
H200_SMS = 132
PROBE = r"""
import json
import sys
from vllm.plugins import load_general_plugins
load_general_plugins()
import torch
import vllm
from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding
from vllm.platforms import current_platform
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.attention.backends.triton_attn import TritonAttentionMetadataBuilder as Builder
from vllm_k2_plugin.draft_attention.segments import _upstream_fills_the_gpu, widen
from vllm_k2_plugin.moe_verify.patch import _upstream_sorts_small_batches
from vllm_k2_plugin.patching import REGISTRY
from vllm_k2_plugin.rope_cache.patch import _upstream_hands_float_cache

from tests.gpu_patch_probes import moe_assignment, rope_cache_handed

ROWS, SMS = json.loads(sys.argv[1])


def segments(twin):
    # one-KV-head decode batches of ROWS rows at 32k: build's segment count, or (twin)
    # the runtime twin's rule applied to build's metadata for SMS SMs
    out = []
    for rows in ROWS:
        b = Builder.__new__(Builder)
        b.device, b.seq_threshold_3D, b.num_par_softmax_segments = torch.device("cpu"), 16, 16
        b.num_heads_kv, b.num_heads_q, b.max_seqs_64_segments, b.rswa_window = 1, 8, 0, None
        b.softmax_segm_output = torch.empty(16, 8, 16, 128)
        b.softmax_segm_max = torch.empty(16, 8, 16)
        b.softmax_segm_expsum = torch.empty(16, 8, 16)
        i32 = dict(dtype=torch.int32)
        common = CommonAttentionMetadata(
            query_start_loc=torch.arange(rows + 1, **i32),
            query_start_loc_cpu=torch.arange(rows + 1, **i32),
            seq_lens=torch.full((rows,), 32768, **i32),
            num_reqs=rows,
            num_actual_tokens=rows,
            max_query_len=1,
            max_seq_len=32768,
            block_table_tensor=torch.zeros(rows, 2048, **i32),
            slot_mapping=torch.arange(rows),
        )
        meta = Builder.build(b, 0, common)
        if twin:
            widen(b, meta, SMS)
        s = int(meta.num_par_softmax_segments)
        assert meta.softmax_segm_output.shape[2] == meta.softmax_segm_max.shape[2] == s
        out.append(s)
    return out


result = {
    "vllm_from": vllm.__file__,
    "rope_float32_cache": _upstream_hands_float_cache(),
    "moe_sorts_batches": _upstream_sorts_small_batches(),
    "moe_assignment": moe_assignment(),
    "rope_cache_handed": rope_cache_handed(),
    "segments_no_gpu": _upstream_fills_the_gpu(),
    "states": {p.name: p.state.value for p in REGISTRY},
}
# The segments probe builds on the CPU; what a CUDA platform with SMS SMs would answer:
current_platform.is_cuda_alike = lambda: True
current_platform.num_compute_units = lambda device_id=0: SMS
result["fills_the_gpu"] = _upstream_fills_the_gpu()
result["segments_build"] = segments(twin=False)
result["segments_twin"] = segments(twin=True)
print(json.dumps(result))
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
    out = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps([ROWS, H200_SMS])],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def patched_site(tmp_path_factory):
    import vllm

    site = tmp_path_factory.mktemp("site34")
    shutil.copytree(Path(vllm.__file__).parent, site / "vllm", ignore=shutil.ignore_patterns("__pycache__"))
    return site


def test_series_covers_the_gpu_patches():
    series = files.load_series(VERSION)
    assert [p.name for p in series] == [f"{i:04d}-{twin}.patch" for i, twin in enumerate(TWINS, 1)]
    for p, twin in zip(series, TWINS, strict=True):
        assert p.header["Runtime twin"].startswith(twin + " ")
        assert {"Title", "Why", "Changes", "Upstream", "Remove when"} <= set(p.header)


def test_apply_check_revert_on_installed_copy(patched_site, tmp_path):
    tree = tmp_path / "vllm"
    touched = files._all_files(files.load_series(VERSION))
    for rel in touched + ["_version.py"]:
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(patched_site / "vllm" / rel, tree / rel)
    before = {rel: (tree / rel).read_bytes() for rel in touched}
    check = _cli("check", "--vllm-root", str(tree)).stdout
    assert "not applied" in check and "conflicting" not in check, check
    applied = _cli("apply", "--vllm-root", str(tree))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert _cli("apply", "--vllm-root", str(tree)).stdout.strip() == "already applied (no change)"
    assert {rel: (tree / rel).read_bytes() for rel in touched} != before
    assert _cli("revert", "--vllm-root", str(tree)).returncode == 0
    assert {rel: (tree / rel).read_bytes() for rel in touched} == before


def test_patch_files_flip_their_twins_probes(patched_site):
    applied = _cli("apply", "--vllm-root", str(patched_site / "vllm"))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    patched_path = os.pathsep.join([str(patched_site), str(REPO)])
    runtime = _probe(engine_env())
    files_only = _probe(engine_env(PYTHONPATH=patched_path, VLLM_K2_DISABLE_PATCHES=",".join(TWINS)))
    stock = _probe(engine_env(VLLM_K2_DISABLE="1"))
    assert files_only.pop("vllm_from").startswith(str(patched_site))
    assert not runtime.pop("vllm_from").startswith(str(patched_site))
    stock.pop("vllm_from")

    # Each twin's own upstream probe: False on stock 0.34, True with the files (twins off).
    probes = ("rope_float32_cache", "moe_sorts_batches", "fills_the_gpu")
    assert {k: stock[k] for k in probes} == dict.fromkeys(probes, False)
    assert {k: files_only[k] for k in probes} == dict.fromkeys(probes, True)
    # without a CUDA-alike platform the file's build keeps stock's 16 segments
    assert stock["segments_no_gpu"] is files_only["segments_no_gpu"] is False

    # moe: the file assigns like the runtime twin (stock: unsorted up to 12 tokens x top 8 of 384).
    assert runtime["states"]["moe-group-tokens-by-expert"] == "applied"
    assert runtime["moe_assignment"] == files_only["moe_assignment"] == ["naive"] + ["sorted"] * 4
    assert stock["moe_assignment"] == ["naive"] * 4 + ["sorted"]
    # rope: the op gets one float32 copy of the bf16 cache, the same values (the twin's cache.float()).
    assert files_only["rope_cache_handed"] == {"dtype": "torch.float32", "made_once": True, "same_values": True}
    assert stock["rope_cache_handed"]["dtype"] == "torch.bfloat16"
    # segments: build gives the counts the twin's rule gives stock's metadata, on an H200's SMs.
    assert stock["segments_build"] == [16] * len(ROWS)
    # rows 1, 2, 4, 8 widen (several rows: two waves of the 132 SMs), 9+ stay stock
    assert files_only["segments_build"] == stock["segments_twin"] == [128, 128, 64, 32, 16, 16, 16]
    assert files_only["segments_twin"] == files_only["segments_build"]  # the twin adds nothing on top
