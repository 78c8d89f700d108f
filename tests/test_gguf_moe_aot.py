"""AOT compile (no GPU) of the grouped GGUF MoE kernels for sm_120, every ggml type, as the op
launches them at Kimi-K2.5's per-GPU shapes: the claim that they build for the users' RTX PRO
6000 (sm_120) rests on this. Runs where Triton 3.6 is installed (the vLLM 0.16 venv: the H200's
Triton, on which the kernels were timed)."""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed in this venv", allow_module_level=True)

from vllm_k2_plugin.gguf_moe import aot  # noqa: E402
from vllm_k2_plugin.gguf_moe.ops import SUPPORTED  # noqa: E402

pytestmark = pytest.mark.vllm016


@pytest.mark.parametrize("type_name", SUPPORTED)
def test_both_kernels_build_for_sm120_within_its_shared_memory(type_name):
    shared = aot.compile_type(type_name, 120)
    assert set(shared) == {"gate_up", "down"}
    assert max(shared.values()) <= aot.SMEM_LIMITS[120], shared


def test_a_verify_of_several_tokens_builds_too():
    # 4 tokens x top 8 = 32 pairs: the pair scan is twice as wide as at one token
    shared = aot.compile_type("Q4_K", 120, tokens=4)
    assert max(shared.values()) <= aot.SMEM_LIMITS[120], shared
