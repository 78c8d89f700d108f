"""llama.cpp's MLA tensor layout and its exact inverse.

llama.cpp's ``convert_hf_to_gguf.py`` (DeepseekV2Model.modify_tensors; the same for
Kimi-K2, which converts as ``deepseek2``) splits HF ``kv_b_proj.weight``
``[H * (nope + v), kv_lora]`` per head into

* ``attn_k_b``: ``k_b.transpose(1, 2)`` -> ``[H, kv_lora, nope]``
* ``attn_v_b``: ``v_b``                 -> ``[H, v, kv_lora]``

where ``kv_b.view(H, nope + v, kv_lora)`` is split along dim 1 into k_b (first
``nope`` rows of each head) and v_b. Older conversions (and ik_llama.cpp) keep
``attn_kv_b`` instead; both load.
"""

from __future__ import annotations

import torch


def split_kv_b(kv_b: torch.Tensor, heads: int, nope: int, v: int) -> tuple[torch.Tensor, torch.Tensor]:
    kv_lora = kv_b.shape[-1]
    per_head = kv_b.view(heads, nope + v, kv_lora)
    k_b, v_b = per_head.split([nope, v], dim=1)
    return k_b.transpose(1, 2).contiguous(), v_b.contiguous()


def merge_kv_b(k_b: torch.Tensor, v_b: torch.Tensor) -> torch.Tensor:
    """Inverse of split_kv_b: [H, kv_lora, nope] + [H, v, kv_lora] -> [H*(nope+v), kv_lora]."""
    heads, kv_lora, nope = k_b.shape
    if v_b.shape[0] != heads or v_b.shape[2] != kv_lora:
        raise ValueError(f"attn_k_b {list(k_b.shape)} and attn_v_b {list(v_b.shape)} do not pair up")
    merged = torch.cat([k_b.transpose(1, 2), v_b], dim=1)  # [H, nope + v, kv_lora]
    return merged.reshape(heads * (nope + v_b.shape[1]), kv_lora).contiguous()
