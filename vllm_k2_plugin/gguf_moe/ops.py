"""fused_moe_gguf_grouped: vLLM's `_fused_moe_gguf` (SiLU) for small batches, each touched
expert's weights read once for all the tokens routed to it.

Semantics: out[t] = sum over slots j of topk_weights[t, j] * w2[e] @ (SiLU(gate) * up), with
gate, up = halves of w1[e] @ x[t], e = topk_ids[t, j]. The SiLU-and-mul output is rounded to the
activation dtype between the projections as vLLM's is; everything else accumulates in fp32.
"""

from __future__ import annotations

import functools
import os

import torch
import triton

from . import blocks

#: the ggml types vLLM's GGUF MoE accepts that this kernel runs. Q8_1 is not one of them: it is
#: ggml's activation format (no weight file stores it), gguf-py has no dequantizer for it and its
#: GGML_QUANT_SIZES entry (40 bytes) is not ggml's 36-byte block.
SUPPORTED = (
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
#: (T * top_k) pairs one call may route: each program scans the sorted pair list in registers
MAX_PAIRS = 4096
#: types whose values come from a lookup table (gguf-py's grids, IQ4's non-linear values)
TABLE_TYPES = ("IQ4_NL", "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M")


def default_stages(name: str) -> int:
    """Software-pipeline stages of both kernels. Pipelining a table type's gathers takes ~64 KB of
    shared memory per stage (Triton's sm_120 compile: 132-147 KB at 3 stages, over sm_120's
    101,376 B; 66-82 KB at 2), so those run 2 stages; the rest keep Triton's default 3."""
    return 2 if name in TABLE_TYPES else 3


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _check_type(qtype, arg: str) -> tuple[int, str]:
    try:
        name = blocks.type_name(qtype)
    except ValueError as e:
        raise ValueError(f"{arg}: {e}") from None
    if name not in SUPPORTED:
        raise ValueError(
            f"{arg}: ggml type {name} ({qtype}) has no grouped GGUF MoE kernel; supported: {', '.join(SUPPORTED)}"
        )
    return blocks.type_id(name), name


@functools.cache
def type_tables(name: str, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grid fp32, sign bytes uint8, non-linear values fp32) of an i-quant, from gguf-py's own
    tables; a 1-element placeholder where the type has none."""
    from gguf import quants

    none = torch.zeros(1, dtype=torch.float32, device=device)
    cls = getattr(quants, name)
    grid = none
    if getattr(cls, "grid_hex", None) is not None:
        cls.init_grid()
        grid = torch.from_numpy(cls.grid.reshape(-1).copy()).to(device=device, dtype=torch.float32)
    signs = torch.zeros(1, dtype=torch.uint8, device=device)
    if name in ("IQ2_XXS", "IQ2_XS", "IQ3_XXS"):
        signs = torch.frombuffer(bytearray(quants.IQ2_XXS.ksigns), dtype=torch.uint8).to(device)
    kvalues = none
    if name in ("IQ4_NL", "IQ4_XS"):
        kvalues = torch.tensor(quants.IQ4_NL.kvalues, dtype=torch.float32, device=device)
    return grid, signs, kvalues


def _geometry(type_id: int, name: str, cols: int, arg: str, what: str) -> dict:
    from .kernel import GROUPS

    qk, nbytes = blocks.block_shape(name)
    if cols % qk:
        raise ValueError(f"{arg}: {what} of {cols} weights is not a whole number of {name}'s {qk}-weight blocks")
    groups, size, has_min = GROUPS[type_id]
    per_256 = 256 // qk  # 32-weight types take 8 blocks a step where the row allows it
    return {
        "TYPE": type_id,
        "QK": qk,
        "BYTES": nbytes,
        "GROUPS": groups,
        "S": size,
        "HAS_MIN": has_min,
        "STEP": per_256 if (cols // qk) % per_256 == 0 else 1,
    }


def fused_moe_gguf_grouped(
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    qtype1: int | str,
    qtype2: int | str,
    *,
    block_n1: int = 32,
    ksplit1: int = 8,
    block_n2: int = 64,
    block_m: int = 16,
    num_warps1: int = 4,
    num_warps2: int = 4,
    num_stages: int | None = None,
    words: bool = True,
    word_block_m: int = 1,
) -> torch.Tensor:
    """[T, H] in x's dtype. x [T, H] bf16/fp16; w1 [E, 2N, bytes] uint8 (gate rows then up rows);
    w2 [E, H, bytes] uint8; topk_weights / topk_ids [T, top_k]; qtype1 / qtype2 the ggml types of
    w1 / w2 (ids or names). block_n*: output rows per program of each projection; ksplit1: programs
    sharing one gate/up row's blocks (at most; fp32 partials summed after: at one token 8 experts x
    16 row tiles alone leave most of a GPU idle); block_m: tokens per expert a program takes at
    once (more make another pass over the expert); num_stages: software-pipeline stages (default:
    ``default_stages``). words: a 256-weight K-quant projection (Q2_K ... Q6_K) runs the
    word-load kernels of ``kernel_words`` (fp32 dot on the CUDA cores, ``word_block_m`` tokens
    per pass: 1 measured fastest at 1-16 tokens on an H100, 2 up to 7x slower at 32-row tiles)
    instead of the tensor-core ones (measured 1.2-1.9x slower than the word kernels there; Q4_K
    and Q2_K/Q3_K experts, benchmarks/results/quant_moe/h100_vllm020_ours_v3_words.json)."""
    if x.dim() != 2 or x.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"x: want [tokens, hidden] bf16 or fp16, got {tuple(x.shape)} {x.dtype}")
    if x.stride(1) != 1:
        raise ValueError("x: the hidden dimension must be contiguous")
    t, hidden = x.shape
    for arg, w in (("w1", w1), ("w2", w2)):
        if w.dim() != 3 or w.dtype != torch.uint8:
            raise ValueError(f"{arg}: want [experts, rows, bytes] uint8 ggml blocks, got {tuple(w.shape)} {w.dtype}")
        if w.stride(2) != 1:
            raise ValueError(f"{arg}: each row's bytes must be contiguous")
        if w.device != x.device:
            raise ValueError(f"{arg}: on {w.device}, x on {x.device}")
    id1, name1 = _check_type(qtype1, "qtype1")
    id2, name2 = _check_type(qtype2, "qtype2")
    experts, two_n, _ = w1.shape
    if two_n % 2:
        raise ValueError(f"w1: {two_n} rows is not gate + up of equal size")
    n = two_n // 2
    g1 = _geometry(id1, name1, hidden, "w1", "a row (x's hidden size)")
    g2 = _geometry(id2, name2, n, "w2", "a row (w1's intermediate size)")
    if w1.shape[2] != hidden // g1["QK"] * g1["BYTES"]:
        raise ValueError(
            f"w1: {w1.shape[2]} bytes per row, {name1} rows of {hidden} weights take {hidden // g1['QK'] * g1['BYTES']}"
        )
    if w2.shape[0] != experts or w2.shape[1] != hidden:
        raise ValueError(f"w2: want [{experts}, {hidden}, bytes], got {tuple(w2.shape)}")
    if w2.shape[2] != n // g2["QK"] * g2["BYTES"]:
        raise ValueError(
            f"w2: {w2.shape[2]} bytes per row, {name2} rows of {n} weights take {n // g2['QK'] * g2['BYTES']}"
        )
    if topk_ids.dim() != 2 or topk_ids.shape[0] != t or topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"topk_ids: want [{t}, top_k] int32/int64, got {tuple(topk_ids.shape)} {topk_ids.dtype}")
    if topk_weights.shape != topk_ids.shape or not topk_weights.is_floating_point():
        raise ValueError(
            f"topk_weights: want float {tuple(topk_ids.shape)}, got {tuple(topk_weights.shape)} {topk_weights.dtype}"
        )
    top_k = topk_ids.shape[1]
    pairs = t * top_k
    if pairs > MAX_PAIRS:
        raise ValueError(
            f"topk_ids: {t} tokens x top {top_k} = {pairs} pairs, this kernel takes at most "
            f"{MAX_PAIRS} (it is for decode / verify batches)"
        )
    if pairs == 0:
        return torch.zeros_like(x)
    from .kernel import down_kernel, gate_up_kernel
    from .kernel_words import TYPE_IDS, down_words_kernel, gate_up_words_kernel, word_views

    # pairs sorted by expert (stable: a token's pairs keep their order); no host sync, so a CUDA
    # graph can hold the call
    sorted_ids, order = torch.sort(topk_ids.reshape(-1), stable=True)
    weights = topk_weights.reshape(-1).contiguous()
    words1 = words and id1 in TYPE_IDS and _word_aligned(w1, g1["BYTES"])
    words2 = words and id2 in TYPE_IDS and _word_aligned(w2, g2["BYTES"])
    steps = hidden // g1["QK"] // (1 if words1 else g1["STEP"])
    ksplit = max(1, min(ksplit1, steps))
    ksplit = triton.cdiv(steps, triton.cdiv(steps, ksplit))  # no split left without blocks
    if ksplit > 1:  # fp32 partial gate/up rows per split, summed below (deterministic: no atomics)
        act = torch.empty((ksplit, pairs, two_n), dtype=torch.float32, device=x.device)
    else:
        act = torch.empty((pairs, n), dtype=x.dtype, device=x.device)
    y = torch.empty((pairs, hidden), dtype=torch.float32, device=x.device)
    p_pad = max(16, triton.next_power_of_2(pairs))
    dot_f32 = interpreting()  # the interpreter's bf16 dot is wrong (Triton 3.6): widen there only
    dev = str(x.device)
    # arguments both kernel families of a projection take, by name
    route = {"sorted_ids": sorted_ids, "order": order, "P": pairs, "P_PAD": p_pad}
    up1 = {
        **route,
        "x": x,
        "act": act,
        "N": n,
        "K": hidden,
        "stride_x": x.stride(0),
        "stride_we": w1.stride(0),
        "stride_wn": w1.stride(1),
        "TOP_K": top_k,
        "BLOCK_N": block_n1,
        "KSPLIT": ksplit,
        "num_warps": num_warps1,
    }
    grid1 = (pairs, triton.cdiv(n, block_n1), ksplit)
    if words1:
        b8, b16, b32 = word_views(w1)
        gate_up_words_kernel[grid1](
            **up1,
            b8=b8,
            b16=b16,
            b32=b32,
            TYPE=id1,
            BYTES=g1["BYTES"],
            BLOCK_M=word_block_m,
            num_stages=num_stages or 3,
        )
    else:
        grid_table, signs, kvalues = type_tables(name1, dev)
        gate_up_kernel[grid1](
            **up1,
            w=w1,
            grid_table=grid_table,
            signs=signs,
            kvalues=kvalues,
            **g1,
            BLOCK_M=block_m,
            DOT_F32=dot_f32,
            num_stages=num_stages or default_stages(name1),
        )
    if ksplit > 1:
        gate_up = act.sum(dim=0)
        act = (torch.nn.functional.silu(gate_up[:, :n]) * gate_up[:, n:]).to(x.dtype)
    down = {
        **route,
        "act": act,
        "topk_weights": weights,
        "y": y,
        "H": hidden,
        "N": n,
        "stride_we": w2.stride(0),
        "stride_wn": w2.stride(1),
        "BLOCK_N": block_n2,
        "num_warps": num_warps2,
    }
    grid2 = (pairs, triton.cdiv(hidden, block_n2))
    if words2:
        b8, b16, b32 = word_views(w2)
        down_words_kernel[grid2](
            **down,
            b8=b8,
            b16=b16,
            b32=b32,
            TYPE=id2,
            BYTES=g2["BYTES"],
            BLOCK_M=word_block_m,
            num_stages=num_stages or 3,
        )
    else:
        grid_table, signs, kvalues = type_tables(name2, dev)
        down_kernel[grid2](
            **down,
            w=w2,
            grid_table=grid_table,
            signs=signs,
            kvalues=kvalues,
            **g2,
            BLOCK_M=block_m,
            DOT_F32=dot_f32,
            num_stages=num_stages or default_stages(name2),
        )
    return y.view(t, top_k, hidden).sum(dim=1).to(x.dtype)


def _word_aligned(w: torch.Tensor, block_bytes: int) -> bool:
    """The word kernels read a block's 16/32-bit words in place: the tensor must be contiguous
    and every block start a multiple of the word size (4 bytes, or 2 where the block size is)."""
    unit = 4 if block_bytes % 4 == 0 else 2
    return (
        w.is_contiguous()
        and w.storage_offset() % unit == 0
        and w.stride(0) % unit == 0
        and w.stride(1) % unit == 0
        and w.data_ptr() % unit == 0
    )
