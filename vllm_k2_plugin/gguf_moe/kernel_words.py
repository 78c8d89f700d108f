"""Triton kernels for the 256-weight K-quants (Q2_K ... Q6_K) at decode / verify batches.

Same contract and grid as ``kernel.py`` (one program per distinct expert x row tile x K split,
each touched expert's rows streamed once for all its tokens), built for few tokens per expert:

* weights are read as 32-bit words (16-bit where the block size is not a multiple of 4: Q3_K,
  Q6_K) and unpacked with shifts into a [rows, 256] tile in the block's own weight order (the
  axes of each tile are chosen so that row-major order is weight order): no byte loads, and no
  permutation of the activations;
* the dot runs on the CUDA cores in fp32 (broadcast multiply, sum over K): with one or two tokens
  per expert a tensor-core tile would be mostly padding and costs a shared-memory round trip per
  group (the tensor-core kernel's PTX has 192 byte loads and 68 barriers per step of its Q4_K
  gate/up loop; that these cost most is a hypothesis: the H100 timed this kernel 1.2-1.9x faster,
  nothing profiled where).

Values are exact (small integers times fp16 scales, in fp32); the only rounding besides fp32
accumulation is the SiLU-and-mul output stored in the activation dtype, as vLLM's kernel does.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .kernel import Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, _expert_tile, _f16_bits

#: ggml type ids these kernels decode (all 256-weight super-blocks)
TYPE_IDS = (10, 11, 12, 13, 14)


@triton.jit
def _i(n: tl.constexpr, axis: tl.constexpr, rank: tl.constexpr):
    """arange(n) along `axis` of a rank-`rank` tensor (other axes 1)."""
    r = tl.arange(0, n)
    if rank == 5:
        if axis == 1:
            r = r[None, :, None, None, None]
        elif axis == 2:
            r = r[None, None, :, None, None]
        elif axis == 3:
            r = r[None, None, None, :, None]
        else:
            r = r[None, None, None, None, :]
    else:
        if axis == 1:
            r = r[None, :, None, None, None, None]
        elif axis == 2:
            r = r[None, None, :, None, None, None]
        elif axis == 3:
            r = r[None, None, None, :, None, None]
        elif axis == 4:
            r = r[None, None, None, None, :, None]
        else:
            r = r[None, None, None, None, None, :]
    return r


@triton.jit
def _u16w(p):  # 16-bit word, unsigned, as int32
    return tl.load(p).to(tl.int32) & 0xFFFF


@triton.jit
def _k_scales(b8, o):
    """Q4_K / Q5_K: the 8 (6-bit scale, 6-bit min) pairs from the 12 bytes at byte 4: [BN, 8] each."""
    j = tl.arange(0, 8)[None, :]
    sb = b8 + o + 4
    lo = j < 4
    a = tl.load(sb + tl.where(lo, j, j + 4)).to(tl.int32)
    c = tl.load(sb + tl.where(lo, j + 4, j - 4)).to(tl.int32)
    d = tl.load(sb + j).to(tl.int32)
    sc = tl.where(lo, a & 63, (a & 15) | ((c >> 6) << 4))
    mn = tl.where(lo, c & 63, (a >> 4) | ((d >> 6) << 4))
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def _block(TYPE: tl.constexpr, b8, b16, b32, off, BN: tl.constexpr):
    """[BN, 256] fp32 weights of the block starting `off` bytes into each row ([BN] int64)."""
    o = off[:, None]
    if TYPE == Q4_K:  # d, dmin | scales[12] | qs[128]: weight 64c + 32h + 4jj + b = nibble h of byte b of word 4+8c+jj
        hdr = tl.load(b32 + o // 4)
        sc, mn = _k_scales(b8, o)
        a = tl.reshape(_f16_bits(hdr & 0xFFFF) * sc, (BN, 4, 2, 1, 1))
        m = tl.reshape(_f16_bits((hdr >> 16) & 0xFFFF) * mn, (BN, 4, 2, 1, 1))
        o5 = tl.reshape(o, (BN, 1, 1, 1, 1))
        words = tl.load(b32 + o5 // 4 + 4 + 8 * _i(4, 1, 5) + _i(8, 3, 5))
        q = (words >> (8 * _i(4, 4, 5) + 4 * _i(2, 2, 5))) & 15
        w = tl.reshape(a * q.to(tl.float32) - m, (BN, 256))
    elif TYPE == Q5_K:  # d, dmin | scales[12] | qh[32] (bit g of byte i) | qs[128] as Q4_K
        hdr = tl.load(b32 + o // 4)
        sc, mn = _k_scales(b8, o)
        a = tl.reshape(_f16_bits(hdr & 0xFFFF) * sc, (BN, 4, 2, 1, 1))
        m = tl.reshape(_f16_bits((hdr >> 16) & 0xFFFF) * mn, (BN, 4, 2, 1, 1))
        o5 = tl.reshape(o, (BN, 1, 1, 1, 1))
        c, h, jj, bb = _i(4, 1, 5), _i(2, 2, 5), _i(8, 3, 5), _i(4, 4, 5)
        low = (tl.load(b32 + o5 // 4 + 12 + 8 * c + jj) >> (8 * bb + 4 * h)) & 15
        high = (tl.load(b32 + o5 // 4 + 4 + jj) >> (8 * bb + 2 * c + h)) & 1
        w = tl.reshape(a * (low | (high << 4)).to(tl.float32) - m, (BN, 256))
    elif TYPE == Q2_K:  # scales[16] | qs[64] | d, dmin: weight 128 half + 32 j + 16 tq + 4 tr + b
        hdr = tl.load(b32 + o // 4 + 20)
        sc = tl.load(b8 + o + tl.arange(0, 16)[None, :]).to(tl.int32)
        a = tl.reshape(_f16_bits(hdr & 0xFFFF) * (sc & 15).to(tl.float32), (BN, 2, 4, 2, 1, 1))
        m = tl.reshape(_f16_bits((hdr >> 16) & 0xFFFF) * (sc >> 4).to(tl.float32), (BN, 2, 4, 2, 1, 1))
        o6 = tl.reshape(o, (BN, 1, 1, 1, 1, 1))
        words = tl.load(b32 + o6 // 4 + 4 + 8 * _i(2, 1, 6) + 4 * _i(2, 3, 6) + _i(4, 4, 6))
        q = (words >> (8 * _i(4, 5, 6) + 2 * _i(4, 2, 6))) & 3
        w = tl.reshape(a * q.to(tl.float32) - m, (BN, 256))
    elif TYPE == Q3_K:  # hmask[32] | qs[64] | scales[12] | d (110 B: 16-bit words)
        # weight 128 half + 32 j + 16 tq + 2 tr + b
        d = _f16_bits(_u16w(b16 + o // 2 + 54))
        g = tl.arange(0, 16)[None, :]
        sc = ((tl.load(b8 + o + 96 + g % 8).to(tl.int32) >> (4 * (g // 8))) & 15) | (
            ((tl.load(b8 + o + 104 + g % 4).to(tl.int32) >> (2 * (g // 4))) & 3) << 4
        )
        a = tl.reshape(d * (sc - 32).to(tl.float32), (BN, 2, 4, 2, 1, 1))
        o6 = tl.reshape(o, (BN, 1, 1, 1, 1, 1)) // 2
        half, j, tq, tr, bb = _i(2, 1, 6), _i(4, 2, 6), _i(2, 3, 6), _i(8, 4, 6), _i(2, 5, 6)
        low = (_u16w(b16 + o6 + 16 + 16 * half + 8 * tq + tr) >> (8 * bb + 2 * j)) & 3
        high = (_u16w(b16 + o6 + 8 * tq + tr) >> (8 * bb + 4 * half + j)) & 1
        w = tl.reshape(a * (low - 4 + 4 * high).to(tl.float32), (BN, 256))
    else:
        tl.static_assert(TYPE == Q6_K, "ggml type without a word kernel")
        # ql[128] | qh[64] | scales[16] int8 | d (210 B: 16-bit words); weight 128 half + 32 j + 16 tq + 2 tr + b
        d = _f16_bits(_u16w(b16 + o // 2 + 104))
        s = tl.load(b8 + o + 192 + tl.arange(0, 16)[None, :]).to(tl.int32)
        a = tl.reshape(d * (s - ((s >> 7) << 8)).to(tl.float32), (BN, 2, 4, 2, 1, 1))
        o6 = tl.reshape(o, (BN, 1, 1, 1, 1, 1)) // 2
        half, j, tq, tr, bb = _i(2, 1, 6), _i(4, 2, 6), _i(2, 3, 6), _i(8, 4, 6), _i(2, 5, 6)
        low = (_u16w(b16 + o6 + 32 * half + 16 * (j % 2) + 8 * tq + tr) >> (8 * bb + 4 * (j // 2))) & 15
        high = (_u16w(b16 + o6 + 64 + 16 * half + 8 * tq + tr) >> (8 * bb + 2 * j)) & 3
        w = tl.reshape(a * ((low | (high << 4)) - 32).to(tl.float32), (BN, 256))
    return w


@triton.jit
def _rows_dot(acc, w, xv):
    """acc [BN, BM] += w [BN, 256] @ xv [256, BM], fp32 on the CUDA cores."""
    return acc + tl.sum(w[:, :, None] * xv[None, :, :], axis=1)


@triton.jit
def gate_up_words_kernel(
    x,
    b8,
    b16,
    b32,
    sorted_ids,
    order,
    act,
    P,
    N,
    K,
    stride_x,
    stride_we,
    stride_wn,
    TOP_K: tl.constexpr,
    P_PAD: tl.constexpr,
    TYPE: tl.constexpr,
    BYTES: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    KSPLIT: tl.constexpr,
):
    """As kernel.gate_up_kernel (KSPLIT > 1: fp32 partial gate and up rows per split);
    strides in bytes; b8 / b16 / b32 the same weights as bytes / 16-bit / 32-bit words."""
    start, count = _expert_tile(sorted_ids, tl.program_id(0), P, P_PAD)
    if count > 0:
        expert = tl.load(sorted_ids + start).to(tl.int64)
        rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        gate = expert * stride_we + tl.minimum(rows, N - 1).to(tl.int64) * stride_wn  # clamped: no load masks
        up = gate + N * stride_wn
        blocks = K // 256
        per_split = tl.cdiv(blocks, KSPLIT)
        kb_start = tl.program_id(2) * per_split
        kb_end = tl.minimum(kb_start + per_split, blocks)
        k = tl.arange(0, 256)[:, None]
        for m0 in range(0, count, BLOCK_M):  # more than BLOCK_M tokens on one expert: another pass
            m = m0 + tl.arange(0, BLOCK_M)
            m_ok = m < count
            pair = tl.load(order + start + m, mask=m_ok, other=0).to(tl.int64)
            x_rows = x + (pair // TOP_K)[None, :] * stride_x
            acc_g = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            acc_u = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            for kb in range(kb_start, kb_end):
                xv = tl.load(x_rows + kb * 256 + k, mask=m_ok[None, :], other=0.0).to(tl.float32)
                acc_g = _rows_dot(acc_g, _block(TYPE, b8, b16, b32, gate + kb * BYTES, BLOCK_N), xv)
                acc_u = _rows_dot(acc_u, _block(TYPE, b8, b16, b32, up + kb * BYTES, BLOCK_N), xv)
            mask = (rows < N)[:, None] & m_ok[None, :]
            if KSPLIT == 1:
                h = acc_g * tl.sigmoid(acc_g) * acc_u
                tl.store(act + pair[None, :] * N + rows[:, None], h.to(act.dtype.element_ty), mask=mask)
            else:
                part = act + (tl.program_id(2) * P + pair[None, :]) * (2 * N) + rows[:, None]
                tl.store(part, acc_g, mask=mask)
                tl.store(part + N, acc_u, mask=mask)


@triton.jit
def down_words_kernel(
    act,
    b8,
    b16,
    b32,
    sorted_ids,
    order,
    topk_weights,
    y,
    P,
    H,
    N,
    stride_we,
    stride_wn,
    P_PAD: tl.constexpr,
    TYPE: tl.constexpr,
    BYTES: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """As kernel.down_kernel; strides in bytes."""
    start, count = _expert_tile(sorted_ids, tl.program_id(0), P, P_PAD)
    if count > 0:
        expert = tl.load(sorted_ids + start).to(tl.int64)
        rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        base = expert * stride_we + tl.minimum(rows, H - 1).to(tl.int64) * stride_wn
        k = tl.arange(0, 256)[:, None]
        for m0 in range(0, count, BLOCK_M):
            m = m0 + tl.arange(0, BLOCK_M)
            m_ok = m < count
            pair = tl.load(order + start + m, mask=m_ok, other=0).to(tl.int64)
            a_rows = act + pair[None, :] * N
            out = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            for kb in range(0, N // 256):
                xv = tl.load(a_rows + kb * 256 + k, mask=m_ok[None, :], other=0.0).to(tl.float32)
                out = _rows_dot(out, _block(TYPE, b8, b16, b32, base + kb * BYTES, BLOCK_N), xv)
            scale = tl.load(topk_weights + pair, mask=m_ok, other=0.0).to(tl.float32)
            tl.store(
                y + pair[None, :] * H + rows[:, None], out * scale[None, :], mask=(rows < H)[:, None] & m_ok[None, :]
            )


def word_views(w):
    """(bytes, 16-bit words, 32-bit words) views of one [E, rows, bytes] uint8 tensor; the 32-bit
    view is the 16-bit one where rows are not a multiple of 4 bytes (Q3_K / Q6_K never read it)."""
    import torch

    flat = w.view(-1)
    w16 = flat.view(torch.int16)
    w32 = flat.view(torch.int32) if flat.numel() % 4 == 0 and w.storage_offset() % 4 == 0 else w16
    return flat, w16, w32
