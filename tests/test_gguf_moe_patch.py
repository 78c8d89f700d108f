"""Patch gguf-moe-grouped-small-batches on the CPU engine: its upstream probe against vLLM's
real GGUF MoE function, the per-token-count choice, the setting. (The kernel's outputs:
tests/test_gguf_moe_kernel.py; in a GPU engine: benchmarks/gpu_engine_e2e.py's gguf suite.)"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.vllm016]


def test_probe_sees_vllms_per_pair_kernel():
    """vLLM 0.16 runs 4 tokens through ggml_moe_a8_vec: one pass per (token, expert) pair."""
    from vllm_k2_plugin.gguf_moe.patch import _upstream_groups_small_batches

    assert _upstream_groups_small_batches() is False


def test_probe_retires_the_patch_where_vllm_groups(monkeypatch):
    """A vLLM whose GGUF MoE groups small batches by expert (its grouped kernel, as above 64
    tokens) makes the probe answer yes; vLLM's real module is restored afterwards."""
    import vllm.model_executor.layers.quantization.gguf as g

    from vllm_k2_plugin.gguf_moe.patch import _upstream_groups_small_batches

    def grouped(x, w1, w2, topk_weights, topk_ids, t1, t2, activation):
        block = g.ops.ggml_moe_get_block_size(t1)
        return g.ops.ggml_moe_a8(x, w1, None, None, None, t1, w1.shape[1], topk_ids.shape[1], block)

    real_ops = g.ops
    monkeypatch.setattr(g, "_fused_moe_gguf", grouped)
    assert _upstream_groups_small_batches() is True
    assert g.ops is real_ops


def test_not_applied_without_cuda():
    from vllm_k2_plugin.features import load_feature_patches
    from vllm_k2_plugin.patching import REGISTRY

    load_feature_patches()
    patch = REGISTRY["gguf-moe-grouped-small-batches"]
    assert patch.only_if() == "no CUDA device (the GGUF MoE kernels are CUDA kernels)"


def test_choice_answers_each_token_count_from_the_next_timed_one():
    from vllm_k2_plugin.gguf_moe.choice import TIMED_TOKENS, Choice

    ours = [t <= 8 or t == 32 for t in TIMED_TOKENS]
    c = Choice(ours=ours)
    assert [c.use_ours(t) for t in (1, 7, 8, 9, 12, 13, 24, 25, 32, 33, 64, 65)] == [
        True,
        True,
        True,
        False,
        False,
        False,
        False,
        True,
        True,
        False,
        False,
        False,
    ]
    assert not Choice(why="self-check failed").use_ours(1)


def test_setting_names_a_bad_value(monkeypatch):
    from vllm_k2_plugin.settings import SettingError, gguf_moe_mode

    monkeypatch.setenv("VLLM_K2_GGUF_MOE", "fast")
    with pytest.raises(SettingError, match="VLLM_K2_GGUF_MOE='fast'"):
        gguf_moe_mode()
    monkeypatch.setenv("VLLM_K2_GGUF_MOE", " Always ")
    assert gguf_moe_mode() == "always"
    monkeypatch.delenv("VLLM_K2_GGUF_MOE")
    assert gguf_moe_mode() == "auto"


def test_dispatcher_registers_as_a_torch_op_that_runs_vllms_function(monkeypatch):
    """The op vLLM's GGUF MoE method will call: registered with vLLM's helper (its schema from
    the dispatcher's signature) and, with no start-up choice made, running vLLM's own function."""
    import torch
    import vllm.model_executor.layers.quantization.gguf as g

    from vllm_k2_plugin.gguf_moe import patch

    calls = []
    monkeypatch.setattr(g, "_fused_moe_gguf", lambda *a: calls.append(a[5:]) or a[0] * 2)
    op = patch.register_op()
    assert op is torch.ops.vllm.k2_fused_moe_gguf
    x = torch.ones((2, 4), dtype=torch.bfloat16)
    w = torch.zeros((3, 4, 1), dtype=torch.uint8)
    out = op(x, w, w, torch.ones((2, 2)), torch.zeros((2, 2), dtype=torch.int32), 12, 8, "silu")
    assert calls == [(12, 8, "silu")] and torch.equal(out, x * 2)
