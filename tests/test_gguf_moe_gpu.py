"""On the GPU: our grouped GGUF MoE against vLLM's own GGUF MoE and a float reference of the
weights (vLLM's dequantization), every type the kernel takes, at several token counts, through
the start-up check the patch runs (gguf_moe/choice.py: ours may err at most twice vLLM's own error,
or 2 %). Run through the device tool (`pytest -m gpu`); skipped without CUDA."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.gpu]

TYPES = (
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q8_0",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
    "IQ4_NL",
    "IQ4_XS",
    "IQ2_XXS",
    "IQ2_XS",
    "IQ2_S",
    "IQ3_XXS",
    "IQ3_S",
    "IQ1_S",
    "IQ1_M",
)
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
