"""Random but valid quantized expert weights, made on the device, and a realistic router.

GGUF blocks come from vllm_k2_plugin.gguf_moe.blocks (one helper, shared with the kernel's tests).
W4A16: random int4 codes (any bit pattern is a valid Marlin-packed int4) with bf16 group scales.
"""

from __future__ import annotations

import math

import torch


def w4a16_marlin(experts: int, k: int, n: int, group: int, device, gen: torch.Generator):
    """Marlin MoE operands of one weight: packed int4 [E, k/16, n*2] int32 and scales [E, k/group, n] bf16."""
    q = torch.randint(-(2**31), 2**31 - 1, (experts, k // 16, n * 2), dtype=torch.int32, device=device, generator=gen)
    s = torch.empty((experts, k // group, n), dtype=torch.float32, device=device).uniform_(0.004, 0.008, generator=gen)
    return q, s.to(torch.bfloat16)


def bf16_experts(experts: int, rows: int, cols: int, device, gen: torch.Generator) -> torch.Tensor:
    w = torch.empty((experts, rows, cols), dtype=torch.bfloat16, device=device)
    return w.normal_(0.0, 0.02, generator=gen)


class Router:
    """Kimi-K2.5's routing (sigmoid scores, correction bias for selection, top-k, normalised
    weights times the routed scaling) over random gate weights: each token's hidden state is
    drawn afresh, so tokens choose experts nearly uniformly, as a trained load-balanced router
    does on average. `expected_distinct(t)` is what a uniform router touches."""

    def __init__(self, experts: int, top_k: int, hidden: int, scaling: float, device, gen: torch.Generator):
        self.experts, self.top_k, self.scaling = experts, top_k, scaling
        self.weight = torch.randn((experts, hidden), device=device, generator=gen) / math.sqrt(hidden)
        self.bias = 0.01 * torch.randn((experts,), device=device, generator=gen)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = torch.sigmoid(x.float() @ self.weight.t())
        ids = torch.topk(scores + self.bias, self.top_k, dim=-1).indices
        w = scores.gather(1, ids)
        w = w / w.sum(-1, keepdim=True) * self.scaling
        return w.float(), ids.to(torch.int32)

    def expected_distinct(self, tokens: int) -> float:
        return self.experts * (1.0 - (1.0 - self.top_k / self.experts) ** tokens)
