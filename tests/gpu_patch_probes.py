"""What the GPU patches' files change, asked of whichever vLLM is on the path (stock, with
the runtime twins, or a patched copy): imported by the patch-file tests' subprocess probes
(tests/test_patch_files_latest.py, tests/test_patch_files_034.py). CUDA ops are recorders."""

import torch
from vllm import _custom_ops as ops
from vllm.model_executor.layers.fused_moe import fused_moe
from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding


def moe_assignment():
    # per batch size (top 8 of 384 experts): the naive path, or the sort (a recorder here)
    sort, out = fused_moe.moe_align_block_size, []
    fused_moe.moe_align_block_size = lambda *a, **kw: ("sorted", None, None)
    try:
        for n in (1, 2, 4, 12, 13):
            ids = torch.arange(n * 8, dtype=torch.int32).view(n, 8) % 384
            first = fused_moe._prepare_expert_assignment(
                ids, {"BLOCK_SIZE_M": 16}, n, 8, 384, None, ignore_invalid_experts=True
            )[0]
            out.append("naive" if first is None else first)
    finally:
        fused_moe.moe_align_block_size = sort
    return out


def rope_cache_handed():
    # two forward_cuda calls on a bf16 cache, the op a recorder: the cache it gets
    m = RotaryEmbedding.__new__(RotaryEmbedding)
    torch.nn.Module.__init__(m)
    m.head_size, m.rotary_dim, m.is_neox_style, m.use_flashinfer = 8, 8, True, False
    cache = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    m.register_buffer("cos_sin_cache", cache, persistent=False)
    stock, seen = ops.rotary_embedding, []
    ops.rotary_embedding = lambda positions, q, k, head, c, neox, *a: seen.append(c)
    try:
        for _ in range(2):
            q = torch.zeros(2, 8, dtype=torch.bfloat16)
            RotaryEmbedding.forward_cuda(m, torch.tensor([0, 3]), q, q.clone())
    finally:
        ops.rotary_embedding = stock
    return {
        "dtype": str(seen[0].dtype),
        "made_once": seen[0] is seen[1],
        "same_values": torch.equal(seen[0].float(), cache.float()),
    }
