"""On the GPU: our grouped GGUF MoE against vLLM's own GGUF MoE and a float reference of the
weights (vLLM's dequantization), every type the kernel takes, at several token counts, through
the start-up check the patch runs (gguf_moe/choice.py: ours may err at most twice vLLM's own error,
or 2 %). Run through the device tool (`pytest -m gpu`); skipped without CUDA."""

from __future__ import annotations

import pytest

from vllm_k2_plugin.gguf_moe.ops import SUPPORTED

pytestmark = [pytest.mark.gpu]

#: every type the kernel takes (tests/test_gguf_moe_kernel.py pins that list by name)
TYPES = SUPPORTED
#: experts, hidden, per-expert intermediate, top-k: small, but rows of whole 256-weight blocks
E_, H, N, TOP_K = 32, 512, 256, 8


@pytest.fixture(scope="module")
def cuda():
    from vllm_k2_plugin.platform import on_cuda

    if not on_cuda():
        pytest.skip("no CUDA device")
    import torch

    return torch.device("cuda")


@pytest.mark.parametrize("qtype", TYPES)
def test_ours_matches_vllm_and_the_reference(cuda, qtype):
    import torch
    from vllm import _custom_ops as ops

    from vllm_k2_plugin.gguf_moe import blocks
    from vllm_k2_plugin.gguf_moe.choice import CHECK_TOKENS, check
    from vllm_k2_plugin.gguf_moe.patch import _ours, _vllm

    gen = torch.Generator(device=cuda).manual_seed(7)
    w1 = blocks.random_blocks(E_, 2 * N, H, qtype, cuda, gen)
    w2 = blocks.random_blocks(E_, H, N, qtype, cuda, gen)
    t = blocks.type_id(qtype)
    errors = check(w1, w2, t, t, TOP_K, _vllm, _ours, lambda w, ty, r, c: ops.ggml_dequantize(w, ty, r, c, None))
    assert sorted(errors) == sorted(CHECK_TOKENS)
    for tokens, (ev, eo) in errors.items():
        assert eo <= max(2 * ev, 0.02), (qtype, tokens, ev, eo)
