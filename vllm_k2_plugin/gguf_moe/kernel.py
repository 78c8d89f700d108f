"""Triton kernels for GGUF-quantized routed experts, one program per (expert, tile of output rows).

The step's (token, slot) pairs come sorted by expert; program t of the grid takes the t-th
distinct expert (programs past the number of distinct experts do nothing), so every touched
expert's rows are streamed once for all the tokens routed to it.

Weights are never dequantized to full values: each ggml block splits into groups of S weights
whose values are `a * v + b` with per-row scalars a, b and small exact values v (integers, grid
values, +-1/8 deltas: all exact in bf16). The kernel dots v with the tokens' activations (fp32
accumulate) and applies a, b to the [rows, tokens] partial, so the bf16 dot loses nothing on the
weight side; b needs the group's activation sum. One `_<type>` function per ggml type returns
(v, a, b) for group g of a block; `_expert_dot` is the GEMM skeleton every type shares.
"""

from __future__ import annotations

import triton
import triton.language as tl

# ggml type ids (gguf.GGMLQuantizationType); constexpr so the kernels can branch on them
Q4_0 = tl.constexpr(2)
Q4_1 = tl.constexpr(3)
Q5_0 = tl.constexpr(6)
Q5_1 = tl.constexpr(7)
Q8_0 = tl.constexpr(8)
Q2_K = tl.constexpr(10)
Q3_K = tl.constexpr(11)
Q4_K = tl.constexpr(12)
Q5_K = tl.constexpr(13)
Q6_K = tl.constexpr(14)
IQ2_XXS = tl.constexpr(16)
IQ2_XS = tl.constexpr(17)
IQ3_XXS = tl.constexpr(18)
IQ1_S = tl.constexpr(19)
IQ4_NL = tl.constexpr(20)
IQ3_S = tl.constexpr(21)
IQ2_S = tl.constexpr(22)
IQ4_XS = tl.constexpr(23)
IQ1_M = tl.constexpr(29)

#: per ggml type id: (groups per block, weights per group, has an additive min term b)
GROUPS = {
    2: (1, 32, False),
    3: (1, 32, True),
    6: (1, 32, False),
    7: (1, 32, True),
    8: (1, 32, False),
    20: (1, 32, False),
    10: (16, 16, True),
    11: (16, 16, False),
    12: (8, 32, True),
    13: (8, 32, True),
    14: (16, 16, False),
    16: (8, 32, False),
    17: (16, 16, False),
    22: (16, 16, False),
    18: (8, 32, False),
    21: (8, 32, False),
    19: (8, 32, False),
    29: (16, 16, False),
    23: (8, 32, False),
}


# --- byte helpers: blocks are byte arrays with no alignment promise beyond 2 bytes ---------------


@triton.jit
def _u8(p):
    return tl.load(p).to(tl.int32)


@triton.jit
def _u16(p):
    return _u8(p) | (_u8(p + 1) << 8)


@triton.jit
def _u32(p):  # unsigned, so >> 28 does not drag the sign in
    return _u16(p).to(tl.uint32) | (_u16(p + 2).to(tl.uint32) << 16)


@triton.jit
def _f16_bits(bits):
    return bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _f16(p):
    return _f16_bits(_u16(p))


@triton.jit
def _i8(q):  # a byte read as int8
    return q - ((q >> 7) << 8)


@triton.jit
def _sign(signs, idx, bit):  # +1 / -1 from bit `bit` of byte ksigns[idx]
    return 1.0 - 2.0 * ((_u8(signs + idx) >> bit) & 1).to(tl.float32)


# --- one function per type: group g of the block at `blk` ([BN, 1] byte pointers) -> (v, a, b) ---
# i: a group's weight positions [1, S]; w: their positions in the block.


@triton.jit
def _q4_0(blk, i):  # d, qs[16]: weight i < 16 low nibble of qs[i], else high nibble of qs[i-16]
    q = (_u8(blk + 2 + i % 16) >> (4 * (i // 16))) & 15
    return (q - 8).to(tl.float32), _f16(blk), 0.0


@triton.jit
def _q4_1(blk, i):  # d, m, qs[16]
    q = (_u8(blk + 4 + i % 16) >> (4 * (i // 16))) & 15
    return q.to(tl.float32), _f16(blk), _f16(blk + 2)


@triton.jit
def _q5_0(blk, i):  # d, qh (32 fifth bits), qs[16]
    q = ((_u8(blk + 6 + i % 16) >> (4 * (i // 16))) & 15) | (((_u8(blk + 2 + i // 8) >> (i % 8)) & 1) << 4)
    return (q - 16).to(tl.float32), _f16(blk), 0.0


@triton.jit
def _q5_1(blk, i):  # d, m, qh, qs[16]
    q = ((_u8(blk + 8 + i % 16) >> (4 * (i // 16))) & 15) | (((_u8(blk + 4 + i // 8) >> (i % 8)) & 1) << 4)
    return q.to(tl.float32), _f16(blk), _f16(blk + 2)


@triton.jit
def _q8_0(blk, i):  # d, qs[32] int8
    return _i8(_u8(blk + 2 + i)).to(tl.float32), _f16(blk), 0.0


@triton.jit
def _iq4_nl(blk, i, kvalues):  # d, qs[16] as Q4_0, nibble -> non-linear kvalues
    q = (_u8(blk + 2 + i % 16) >> (4 * (i // 16))) & 15
    return tl.load(kvalues + q), _f16(blk), 0.0


@triton.jit
def _q2_k(blk, g: tl.constexpr, w):  # scales[16] (lo: scale, hi: min), qs[64] 2-bit, d, dmin; 16-weight groups
    q = (_u8(blk + 16 + 32 * (w // 128) + w % 32) >> (2 * ((w % 128) // 32))) & 3
    sc = _u8(blk + g)
    return q.to(tl.float32), _f16(blk + 80) * (sc & 15).to(tl.float32), -_f16(blk + 82) * (sc >> 4).to(tl.float32)


@triton.jit
def _q3_k(blk, g: tl.constexpr, w):  # hmask[32], qs[64] 2-bit, scales[12] 6-bit, d; 16-weight groups
    low = (_u8(blk + 32 + 32 * (w // 128) + w % 32) >> (2 * ((w % 128) // 32))) & 3
    high = (_u8(blk + w % 32) >> (w // 32)) & 1  # a clear hmask bit means -4
    sc = ((_u8(blk + 96 + g % 8) >> (4 * (g // 8))) & 15) | (((_u8(blk + 104 + g % 4) >> (2 * (g // 4))) & 3) << 4)
    return (low - 4 + 4 * high).to(tl.float32), _f16(blk + 108) * (sc - 32).to(tl.float32), 0.0


@triton.jit
def _k_scale_min(blk, j: tl.constexpr):  # Q4_K/Q5_K: 6-bit scale and min of 32-weight group j (12 bytes at 4)
    if j < 4:
        sc = _u8(blk + 4 + j) & 63
        m = _u8(blk + 8 + j) & 63
    else:
        sc = (_u8(blk + 8 + j) & 15) | ((_u8(blk + j) >> 6) << 4)
        m = (_u8(blk + 8 + j) >> 4) | ((_u8(blk + 4 + j) >> 6) << 4)
    return _f16(blk) * sc.to(tl.float32), -_f16(blk + 2) * m.to(tl.float32)


@triton.jit
def _q4_k(blk, g: tl.constexpr, i):  # d, dmin, scales[12], qs[128]; group g: nibble g%2 of bytes 32*(g//2)..
    q = (_u8(blk + 16 + 32 * (g // 2) + i) >> (4 * (g % 2))) & 15
    a, b = _k_scale_min(blk, g)
    return q.to(tl.float32), a, b


@triton.jit
def _q5_k(blk, g: tl.constexpr, i):  # d, dmin, scales[12], qh[32] (bit g), qs[128]
    q = ((_u8(blk + 48 + 32 * (g // 2) + i) >> (4 * (g % 2))) & 15) | (((_u8(blk + 16 + i) >> g) & 1) << 4)
    a, b = _k_scale_min(blk, g)
    return q.to(tl.float32), a, b


@triton.jit
def _q6_k(blk, g: tl.constexpr, w):  # ql[128], qh[64], scales[16] int8, d; 16-weight groups
    r = w % 128
    low = (_u8(blk + 64 * (w // 128) + r % 64) >> (4 * (r // 64))) & 15
    high = (_u8(blk + 128 + 32 * (w // 128) + r % 32) >> (2 * (r // 32))) & 3
    return ((low | (high << 4)) - 32).to(tl.float32), _f16(blk + 208) * _i8(_u8(blk + 192 + g)).to(tl.float32), 0.0


@triton.jit
def _iq2_xxs(blk, g: tl.constexpr, i, grid, signs):
    # d; per 32 weights 8 bytes: 4 grid indices (8 weights each), then a word: 4 x 7-bit sign
    # indices and a 4-bit scale on top
    base = blk + 2 + 8 * g
    aux = _u32(base + 4)
    db = _f16(blk) * (0.5 + (aux >> 28).to(tl.float32)) * 0.25
    e = i // 8
    s = _sign(signs, ((aux >> (7 * e)) & 127).to(tl.int32), i % 8)
    return tl.load(grid + _u8(base + e) * 8 + i % 8) * s, db, 0.0


@triton.jit
def _iq2_xs(blk, g: tl.constexpr, i, grid, signs):
    # d; qs: 32 words (9-bit grid index, 7-bit sign index per 8 weights); scales[8] 4-bit per 16 weights
    q = _u16(blk + 2 + 2 * (2 * g + i // 8))
    sc = (_u8(blk + 66 + g // 2) >> (4 * (g % 2))) & 15
    db = _f16(blk) * (0.5 + sc.to(tl.float32)) * 0.25
    return tl.load(grid + (q & 511) * 8 + i % 8) * _sign(signs, q >> 9, i % 8), db, 0.0


@triton.jit
def _iq2_s(blk, g: tl.constexpr, i, grid):
    # d, qs[32] grid index low bytes, signs[32] (a bit per weight), qh[8] 2 high index bits, scales[8]
    e = 2 * g + i // 8
    idx = _u8(blk + 2 + e) | (((_u8(blk + 66 + e // 4) >> (2 * (e % 4))) & 3) << 8)
    s = 1.0 - 2.0 * ((_u8(blk + 34 + e) >> (i % 8)) & 1).to(tl.float32)
    sc = (_u8(blk + 74 + g // 2) >> (4 * (g % 2))) & 15
    db = _f16(blk) * (0.5 + sc.to(tl.float32)) * 0.25
    return tl.load(grid + idx * 8 + i % 8) * s, db, 0.0


@triton.jit
def _iq3_xxs(blk, g: tl.constexpr, w, i, grid, signs):
    # d, qs[64] grid indices (4 weights each), then per 32 weights a word: 4 x 7-bit sign indices, 4-bit scale
    aux = _u32(blk + 66 + 4 * g)
    db = _f16(blk) * (0.5 + (aux >> 28).to(tl.float32)) * 0.5
    s = _sign(signs, ((aux >> (7 * (i // 8))) & 127).to(tl.int32), i % 8)
    return tl.load(grid + _u8(blk + 2 + w // 4) * 4 + w % 4) * s, db, 0.0


@triton.jit
def _iq3_s(blk, g: tl.constexpr, w, grid):
    # d, qs[64] grid index low bytes (4 weights each), qh[8] ninth bits, signs[32], scales[4] 4-bit
    q = w // 4
    idx = _u8(blk + 2 + q) | (((_u8(blk + 66 + q // 8) >> (q % 8)) & 1) << 8)
    s = 1.0 - 2.0 * ((_u8(blk + 74 + w // 8) >> (w % 8)) & 1).to(tl.float32)
    sc = (_u8(blk + 106 + g // 2) >> (4 * (g % 2))) & 15
    return tl.load(grid + idx * 4 + w % 4) * s, _f16(blk) * (1.0 + 2.0 * sc.to(tl.float32)), 0.0


@triton.jit
def _iq1_s(blk, g: tl.constexpr, i, grid):
    # d, qs[32] grid index low bytes (8 weights each), qh[8] words: 4 x 3 high index bits,
    # 3-bit scale, delta sign on top
    qh = _u16(blk + 34 + 2 * g)
    e = i // 8
    idx = _u8(blk + 2 + 4 * g + e) | (((qh >> (3 * e)) & 7) << 8)
    delta = tl.where((qh & 0x8000) != 0, -0.125, 0.125)
    dl = _f16(blk) * (2 * ((qh >> 12) & 7) + 1).to(tl.float32)
    return tl.load(grid + idx * 8 + i % 8) + delta, dl, 0.0


@triton.jit
def _iq1_m(blk, g: tl.constexpr, w, grid):
    # qs[32] grid index low bytes, qh[16] nibbles (3 high index bits, delta sign), scales: 4 words of
    # 4 x 3-bit scales (per 16 weights) with the float16 d in their top nibbles
    e = w // 8
    nib = (_u8(blk + 32 + e // 2) >> (4 * (e % 2))) & 15
    idx = _u8(blk + e) | ((nib & 7) << 8)
    delta = tl.where((nib & 8) != 0, -0.125, 0.125)
    d_bits = (
        (_u16(blk + 48) >> 12)
        | ((_u16(blk + 50) >> 8) & 0xF0)
        | ((_u16(blk + 52) >> 4) & 0xF00)
        | (_u16(blk + 54) & 0xF000)
    )
    sc = (_u16(blk + 48 + 2 * (g // 4)) >> (3 * (g % 4))) & 7
    return tl.load(grid + idx * 8 + w % 8) + delta, _f16_bits(d_bits) * (2 * sc + 1).to(tl.float32), 0.0


@triton.jit
def _iq4_xs(blk, g: tl.constexpr, i, kvalues):
    # d, scales_h word (2 high bits per 32 weights), scales_l[4] (4 low bits), qs[128] (16 bytes per 32 weights)
    sc = ((_u8(blk + 4 + g // 2) >> (4 * (g % 2))) & 15) | (((_u16(blk + 2) >> (2 * g)) & 3) << 4)
    q = (_u8(blk + 8 + 16 * g + i % 16) >> (4 * (i // 16))) & 15
    return tl.load(kvalues + q), _f16(blk) * (sc - 32).to(tl.float32), 0.0


@triton.jit
def _group(TYPE: tl.constexpr, blk, g: tl.constexpr, S: tl.constexpr, grid, signs, kvalues):
    """(v [BN, S], a [BN, 1], b [BN, 1] or 0.0) of weights g*S .. g*S+S-1 of the block at `blk`."""
    i = tl.arange(0, S)[None, :]
    w = g * S + i
    if TYPE == Q4_0:
        v, a, b = _q4_0(blk, i)
    elif TYPE == Q4_1:
        v, a, b = _q4_1(blk, i)
    elif TYPE == Q5_0:
        v, a, b = _q5_0(blk, i)
    elif TYPE == Q5_1:
        v, a, b = _q5_1(blk, i)
    elif TYPE == Q8_0:
        v, a, b = _q8_0(blk, i)
    elif TYPE == IQ4_NL:
        v, a, b = _iq4_nl(blk, i, kvalues)
    elif TYPE == Q2_K:
        v, a, b = _q2_k(blk, g, w)
    elif TYPE == Q3_K:
        v, a, b = _q3_k(blk, g, w)
    elif TYPE == Q4_K:
        v, a, b = _q4_k(blk, g, i)
    elif TYPE == Q5_K:
        v, a, b = _q5_k(blk, g, i)
    elif TYPE == Q6_K:
        v, a, b = _q6_k(blk, g, w)
    elif TYPE == IQ2_XXS:
        v, a, b = _iq2_xxs(blk, g, i, grid, signs)
    elif TYPE == IQ2_XS:
        v, a, b = _iq2_xs(blk, g, i, grid, signs)
    elif TYPE == IQ2_S:
        v, a, b = _iq2_s(blk, g, i, grid)
    elif TYPE == IQ3_XXS:
        v, a, b = _iq3_xxs(blk, g, w, i, grid, signs)
    elif TYPE == IQ3_S:
        v, a, b = _iq3_s(blk, g, w, grid)
    elif TYPE == IQ1_S:
        v, a, b = _iq1_s(blk, g, i, grid)
    elif TYPE == IQ1_M:
        v, a, b = _iq1_m(blk, g, w, grid)
    else:
        tl.static_assert(TYPE == IQ4_XS, "ggml type without a kernel")
        v, a, b = _iq4_xs(blk, g, i, kvalues)
    return v, a, b


# --- the shared skeleton ---------------------------------------------------------------------------


@triton.jit
def _group_dot(
    acc,
    TYPE: tl.constexpr,
    blk,
    g: tl.constexpr,
    S: tl.constexpr,
    HAS_MIN: tl.constexpr,
    xg,
    xsum,
    dot_ty: tl.constexpr,
    grid,
    signs,
    kvalues,
):
    v, a, b = _group(TYPE, blk, g, S, grid, signs, kvalues)
    acc += a * tl.dot(v.to(dot_ty), xg)
    if HAS_MIN:
        acc += b * xsum
    return acc


@triton.jit
def _expert_dot(
    rows_a,
    rows_b,
    x_rows,
    m_ok,
    kb_start,
    kb_end,
    TYPE: tl.constexpr,
    QK: tl.constexpr,
    BYTES: tl.constexpr,
    GROUPS: tl.constexpr,
    S: tl.constexpr,
    HAS_MIN: tl.constexpr,
    STEP: tl.constexpr,
    DUAL: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    DOT_F32: tl.constexpr,
    grid,
    signs,
    kvalues,
):
    """[BLOCK_N, BLOCK_M] fp32 products of the weight rows at `rows_a` (and `rows_b` when DUAL:
    gate and up share each activation load) with the activation rows at `x_rows` ([1, BLOCK_M]),
    over the row's block steps [kb_start, kb_end) (a step = STEP ggml blocks)."""
    dot_ty: tl.constexpr = tl.float32 if DOT_F32 else x_rows.dtype.element_ty
    acc_a = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    acc_b = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    k_in = tl.arange(0, S)[:, None]
    for kb in range(kb_start, kb_end):
        for s in tl.static_range(STEP):
            nb = kb * STEP + s
            for g in tl.static_range(GROUPS):
                xg = tl.load(x_rows + (nb * QK + g * S) + k_in, mask=m_ok, other=0.0)
                xsum = 0.0
                if HAS_MIN:
                    xsum = tl.sum(xg.to(tl.float32), axis=0)[None, :]
                xg = xg.to(dot_ty)
                acc_a = _group_dot(
                    acc_a, TYPE, rows_a + nb * BYTES, g, S, HAS_MIN, xg, xsum, dot_ty, grid, signs, kvalues
                )
                if DUAL:
                    acc_b = _group_dot(
                        acc_b, TYPE, rows_b + nb * BYTES, g, S, HAS_MIN, xg, xsum, dot_ty, grid, signs, kvalues
                    )
    return acc_a, acc_b


@triton.jit
def _expert_tile(sorted_ids, t, P, P_PAD: tl.constexpr):
    """(first sorted position, pair count) of the t-th distinct expert; count 0 past the last."""
    offs = tl.arange(0, P_PAD)
    live = offs < P
    ids = tl.load(sorted_ids + offs, mask=live, other=-1)
    prev = tl.load(sorted_ids + offs - 1, mask=live & (offs > 0), other=-1)
    seg = tl.cumsum((live & (ids != prev)).to(tl.int32), axis=0) - 1
    mine = live & (seg == t)
    return tl.min(tl.where(mine, offs, P_PAD), axis=0), tl.sum(mine.to(tl.int32), axis=0)


@triton.jit
def gate_up_kernel(
    x,
    w,
    sorted_ids,
    order,
    act,
    grid_table,
    signs,
    kvalues,
    P,
    N,
    K,
    stride_x,
    stride_we,
    stride_wn,
    TOP_K: tl.constexpr,
    P_PAD: tl.constexpr,
    TYPE: tl.constexpr,
    QK: tl.constexpr,
    BYTES: tl.constexpr,
    GROUPS: tl.constexpr,
    S: tl.constexpr,
    HAS_MIN: tl.constexpr,
    STEP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    DOT_F32: tl.constexpr,
    KSPLIT: tl.constexpr,
):
    """KSPLIT == 1: act[pair, n] = SiLU(gate) * up for rows n of this program's tile, every pair of
    its expert. KSPLIT > 1: program_id(2) takes its share of the row's blocks and writes fp32 partial
    gate and up rows to act[split, pair, 0:2N] (summed and activated afterwards): a few experts x
    long rows would otherwise leave most of the GPU idle at one token.
    w: [E, 2N, bytes] with the gate rows first (vLLM's fused w13)."""
    start, count = _expert_tile(sorted_ids, tl.program_id(0), P, P_PAD)
    if count > 0:
        expert = tl.load(sorted_ids + start).to(tl.int64)
        rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        rows_in = tl.minimum(rows, N - 1).to(tl.int64)[:, None]  # clamped: loads need no mask
        base = w + expert * stride_we
        steps = K // QK // STEP
        per_split = tl.cdiv(steps, KSPLIT)
        kb_start = tl.program_id(2) * per_split
        kb_end = tl.minimum(kb_start + per_split, steps)
        for m0 in range(0, count, BLOCK_M):  # more than BLOCK_M tokens on one expert: another pass
            m = m0 + tl.arange(0, BLOCK_M)
            m_ok = m < count
            pair = tl.load(order + start + m, mask=m_ok, other=0).to(tl.int64)
            x_rows = x + (pair // TOP_K)[None, :] * stride_x
            gate, up = _expert_dot(
                base + rows_in * stride_wn,
                base + (rows_in + N) * stride_wn,
                x_rows,
                m_ok[None, :],
                kb_start,
                kb_end,
                TYPE,
                QK,
                BYTES,
                GROUPS,
                S,
                HAS_MIN,
                STEP,
                True,
                BLOCK_N,
                BLOCK_M,
                DOT_F32,
                grid_table,
                signs,
                kvalues,
            )
            mask = (rows < N)[:, None] & m_ok[None, :]
            if KSPLIT == 1:
                h = gate * tl.sigmoid(gate) * up
                tl.store(act + pair[None, :] * N + rows[:, None], h.to(act.dtype.element_ty), mask=mask)
            else:
                part = act + (tl.program_id(2) * P + pair[None, :]) * (2 * N) + rows[:, None]
                tl.store(part, gate, mask=mask)
                tl.store(part + N, up, mask=mask)


@triton.jit
def down_kernel(
    act,
    w,
    sorted_ids,
    order,
    topk_weights,
    y,
    grid_table,
    signs,
    kvalues,
    P,
    H,
    N,
    stride_we,
    stride_wn,
    P_PAD: tl.constexpr,
    TYPE: tl.constexpr,
    QK: tl.constexpr,
    BYTES: tl.constexpr,
    GROUPS: tl.constexpr,
    S: tl.constexpr,
    HAS_MIN: tl.constexpr,
    STEP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    """y[pair, h] = topk_weight[pair] * (w2[expert] @ act[pair])[h] (fp32) for this tile's rows h."""
    start, count = _expert_tile(sorted_ids, tl.program_id(0), P, P_PAD)
    if count > 0:
        expert = tl.load(sorted_ids + start).to(tl.int64)
        rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        rows_in = tl.minimum(rows, H - 1).to(tl.int64)[:, None]
        base = w + expert * stride_we
        for m0 in range(0, count, BLOCK_M):
            m = m0 + tl.arange(0, BLOCK_M)
            m_ok = m < count
            pair = tl.load(order + start + m, mask=m_ok, other=0).to(tl.int64)
            out, _ = _expert_dot(
                base + rows_in * stride_wn,
                base,
                act + pair[None, :] * N,
                m_ok[None, :],
                0,
                N // QK // STEP,
                TYPE,
                QK,
                BYTES,
                GROUPS,
                S,
                HAS_MIN,
                STEP,
                False,
                BLOCK_N,
                BLOCK_M,
                DOT_F32,
                grid_table,
                signs,
                kvalues,
            )
            scale = tl.load(topk_weights + pair, mask=m_ok, other=0.0).to(tl.float32)
            tl.store(
                y + pair[None, :] * H + rows[:, None], out * scale[None, :], mask=(rows < H)[:, None] & m_ok[None, :]
            )
