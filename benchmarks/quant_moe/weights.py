"""Random but valid quantized expert weights, made on the device, and a realistic router.

GGUF blocks: random bytes, with every block's float16 super-block scale(s) overwritten by a
small finite value (random bytes there could be inf/NaN; every other byte of every type is a
valid quant, grid index, sign or sub-scale whatever its value). IQ1_M keeps its scale in the
top nibbles of its four scale words: those nibbles are written instead.
W4A16: random int4 codes (any bit pattern is a valid Marlin-packed int4) with bf16 group scales.
"""

from __future__ import annotations

import math

import torch

#: byte offsets of each block's float16 scale fields (ggml's block layouts, ggml-common.h)
F16_FIELDS = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
    "IQ2_XXS": (0,), "IQ2_XS": (0,), "IQ2_S": (0,), "IQ3_XXS": (0,), "IQ3_S": (0,),
    "IQ1_S": (0,), "IQ4_NL": (0,), "IQ4_XS": (0,),
    "IQ1_M": (),  # scale in the scale words' top nibbles: see gguf_blocks
}


def gguf_sizes(qtype: str) -> tuple[int, int]:
    """(weights per block, bytes per block) from gguf-py."""
    import gguf

    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]


def gguf_type_id(qtype: str) -> int:
    import gguf

    return int(gguf.GGMLQuantizationType[qtype])


def gguf_blocks(experts: int, rows: int, cols: int, qtype: str, device, gen: torch.Generator) -> torch.Tensor:
    """[experts, rows, bytes per row] uint8: `cols` weights per row in ggml `qtype` blocks."""
    block, size = gguf_sizes(qtype)
    if cols % block:
        raise ValueError(f"{qtype}: a row of {cols} weights is not a whole number of {block}-weight blocks")
    nb = cols // block
    raw = torch.randint(0, 256, (experts, rows, nb, size), dtype=torch.uint8, device=device, generator=gen)
    scales = torch.empty((experts, rows, nb), dtype=torch.float32, device=device).uniform_(1e-4, 3e-4, generator=gen)
    f16 = scales.to(torch.float16).view(torch.uint8).view(experts, rows, nb, 2)
    for off in F16_FIELDS[qtype]:
        raw[..., off : off + 2] = f16
    if qtype == "IQ1_M":  # block: qs[32] qh[16] scales[8]; d = top nibbles of the four uint16 scale words
        bits = f16.view(torch.int16).to(torch.int32) & 0xFFFF  # [..., 1]
        words = raw[..., 48:56].contiguous().view(torch.int16).to(torch.int32) & 0xFFFF  # [..., 4]
        for i in range(4):
            nib = (bits[..., 0] >> (4 * i)) & 0xF
            words[..., i] = (words[..., i] & 0x0FFF) | (nib << 12)
        raw[..., 48:56] = words.to(torch.int16).view(torch.uint8).view(experts, rows, nb, 8)
    return raw.view(experts, rows, nb * size)


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
