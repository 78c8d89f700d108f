"""GGUF block geometry per type, and random-but-valid blocks for tests and benchmarks.

Random blocks: random bytes, with every block's float16 super-block scale(s) overwritten by a
small finite value (random bytes there could be inf/NaN; every other byte of every type is a
valid quant, grid index, sign or sub-scale whatever its value). IQ1_M keeps its scale in the
top nibbles of its four scale words: those nibbles are written instead.
"""

from __future__ import annotations

import torch

#: byte offsets of each block's float16 scale fields (ggml's block layouts, ggml-common.h)
F16_FIELDS = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ2_XXS": (0,),
    "IQ2_XS": (0,),
    "IQ2_S": (0,),
    "IQ3_XXS": (0,),
    "IQ3_S": (0,),
    "IQ1_S": (0,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
    "IQ1_M": (),  # scale in the scale words' top nibbles: see random_blocks
}


def type_name(qtype: int | str) -> str:
    """'Q4_K' for 12 or 'Q4_K'; ValueError naming the value for an unknown type."""
    import gguf

    try:
        if isinstance(qtype, str):
            return gguf.GGMLQuantizationType[qtype].name
        return gguf.GGMLQuantizationType(int(qtype)).name
    except (KeyError, ValueError):
        raise ValueError(f"{qtype!r} is not a ggml quantization type") from None


def type_id(qtype: int | str) -> int:
    import gguf

    return int(gguf.GGMLQuantizationType[type_name(qtype)])


def block_shape(qtype: int | str) -> tuple[int, int]:
    """(weights per block, bytes per block) from gguf-py."""
    import gguf

    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name(qtype)]]


def random_blocks(experts: int, rows: int, cols: int, qtype: str, device, gen: torch.Generator) -> torch.Tensor:
    """[experts, rows, bytes per row] uint8: `cols` weights per row in ggml `qtype` blocks."""
    qtype = type_name(qtype)
    if qtype not in F16_FIELDS:
        raise ValueError(f"no random-block recipe for {qtype}")
    block, size = block_shape(qtype)
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
