"""Split-KV MLA decode in Triton: the 576-wide latent (512 nope + 64 rope), paged.

Stage 1 (``mla_decode_split``): one program per (row block, KV split, request). A
row is one (query token, head) pair of a request: the Q tokens of a uniform
spec-verify step and all heads share one KV stream, so each latent tile is loaded
once for all of them (Q = 4 costs little more than Q = 1). The 512 nope columns of a
tile are both K (scores) and V (output): one load, no second pass. Causality inside
a verify step: token t of a request with seq_len S sees positions < S - (Q - 1 - t).

D_SPLIT: the scores as four 128-column dots (plus the rope one) instead of one chain of MMAs
over 576 columns: independent accumulations a warp can interleave, the same bytes loaded.

Addressing: page ids from the block table become int64 before they are multiplied by
the real page stride (cross-layer KV views have a page stride != PAGE * 576, and
page * stride overflows int32 for large caches).

fp8-e4m3 KV: the tile is loaded as fp8 (half the bytes), widened to the query dtype
for the dot, and the scalar scale is applied to the scores and once to the output
(read from a device pointer, so CUDA graphs see scale updates).

Each split writes its normalised partial output (fp32) and its natural-log LSE
(fp32); an empty split writes zeros and -inf, so every workspace element is written.
With one split the program writes the final output and LSE directly (DIRECT).

Stage 2 (``mla_decode_reduce``): one program per (row, 512-column block) merges the
splits by their LSEs, a chunk of splits at a time (any split count, bounded registers).
Splits whose LSE is -inf are masked out of the loads.
"""

from __future__ import annotations

import triton
import triton.language as tl

D_NOPE = tl.constexpr(512)
D_ROPE = tl.constexpr(64)
D_CHUNK = tl.constexpr(128)  # D_NOPE / 4 (D_SPLIT)
LN2 = tl.constexpr(0.6931471805599453)
LOG2E = 1.4426950408889634
#: finite "minus infinity" for the running max: exp2(-inf - M) is 0 and exp2(M - M)
#: is 1, so rows that see no key in a tile never produce inf - inf = NaN.
NEG_BIG = tl.constexpr(-1.0e30)


@triton.jit
def mla_decode_split(
    Q,  # [tokens, heads, 576], last dim contiguous
    KV,  # [pages, PAGE, 576], last dim contiguous, any page / token stride
    BLOCK_TABLE,  # [requests, max_pages] int32
    SEQ_LENS,  # [requests] int32: tokens in the cache incl. this step's Q tokens
    K_SCALE,  # [1] fp32 (read only when IS_FP8)
    OUT,  # [tokens, heads, 512] (DIRECT)
    LSE,  # [tokens, heads] fp32 (DIRECT)
    WS_OUT,  # [tokens * heads * splits, 512] fp32 (not DIRECT)
    WS_LSE,  # [tokens * heads * splits] fp32 (not DIRECT)
    qk_scale_log2,  # softmax scale * log2(e)
    stride_q_tok,
    stride_q_head,
    stride_kv_page,
    stride_kv_tok,
    stride_bt,
    stride_o_tok,
    stride_o_head,
    num_heads,
    q_len,
    num_splits,
    PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_FP8: tl.constexpr,
    DIRECT: tl.constexpr,
    D_SPLIT: tl.constexpr = False,  # 512 columns as four 128-wide dots (shorter dependent MMA chains)
    DOT_F32: tl.constexpr = False,  # TRITON_INTERPRET only: its bf16 dot is wrong (3.6, 3.9)
):
    pid_m = tl.program_id(0)  # fastest: row blocks of one split run side by side (L2 reuse)
    pid_s = tl.program_id(1)
    req = tl.program_id(2)

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < q_len * num_heads
    tok = rows // num_heads
    head = rows % num_heads

    seq = tl.load(SEQ_LENS + req)
    row_seq = seq - (q_len - 1 - tok)  # causal limit of each row's query token
    split_len = tl.cdiv(tl.cdiv(seq, num_splits), BLOCK_N) * BLOCK_N
    start = pid_s * split_len
    end = tl.minimum(start + split_len, seq)

    offs_d = tl.arange(0, D_NOPE)
    offs_r = tl.arange(0, D_ROPE)
    q_tok = req.to(tl.int64) * q_len + tok  # global token index of each row
    q_ptr = Q + q_tok[:, None] * stride_q_tok + head[:, None] * stride_q_head
    # e4m3 -> fp16 is one native conversion (sm_89+); e4m3 -> bf16 is not. The dots of
    # the fp8 path therefore run in fp16 (q of an MLA decode is far below 65504).
    # (Each form's statement order is the measured one: moving the rope load first cost the
    # one-dot fp8 kernel 4-10 % on the H200.)
    dot_ty: tl.constexpr = tl.float32 if DOT_F32 else (tl.float16 if IS_FP8 else Q.dtype.element_ty)
    if D_SPLIT:
        q_rope = tl.load(q_ptr + D_NOPE + offs_r[None, :], mask=row_ok[:, None], other=0.0).to(dot_ty)
        offs_c = tl.arange(0, D_CHUNK)
        q0 = tl.load(q_ptr + offs_c[None, :], mask=row_ok[:, None], other=0.0).to(dot_ty)
        q1 = tl.load(q_ptr + D_CHUNK + offs_c[None, :], mask=row_ok[:, None], other=0.0).to(dot_ty)
        q2 = tl.load(q_ptr + 2 * D_CHUNK + offs_c[None, :], mask=row_ok[:, None], other=0.0).to(dot_ty)
        q3 = tl.load(q_ptr + 3 * D_CHUNK + offs_c[None, :], mask=row_ok[:, None], other=0.0).to(dot_ty)
    else:
        q_nope = tl.load(q_ptr + offs_d[None, :], mask=row_ok[:, None], other=0.0)
        q_rope = tl.load(q_ptr + D_NOPE + offs_r[None, :], mask=row_ok[:, None], other=0.0)
        q_nope = q_nope.to(dot_ty)
        q_rope = q_rope.to(dot_ty)

    if IS_FP8:
        k_scale = tl.load(K_SCALE)
        score_scale = qk_scale_log2 * k_scale
    else:
        score_scale = qk_scale_log2

    m_i = tl.full([BLOCK_M], NEG_BIG, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    if D_SPLIT:
        acc0 = tl.zeros([BLOCK_M, D_CHUNK], dtype=tl.float32)
        acc1 = tl.zeros([BLOCK_M, D_CHUNK], dtype=tl.float32)
        acc2 = tl.zeros([BLOCK_M, D_CHUNK], dtype=tl.float32)
        acc3 = tl.zeros([BLOCK_M, D_CHUNK], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, D_NOPE], dtype=tl.float32)

    bt_row = BLOCK_TABLE + req.to(tl.int64) * stride_bt
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < end
        page = tl.load(bt_row + offs_n // PAGE, mask=n_ok, other=0).to(tl.int64)
        kv_off = page * stride_kv_page + (offs_n % PAGE).to(tl.int64) * stride_kv_tok
        kv_ptr = KV + kv_off[:, None]
        if D_SPLIT:
            k_rope = tl.load(kv_ptr + D_NOPE + offs_r[None, :], mask=n_ok[:, None], other=0.0).to(dot_ty)
            k0 = tl.load(kv_ptr + offs_c[None, :], mask=n_ok[:, None], other=0.0).to(dot_ty)
            k1 = tl.load(kv_ptr + D_CHUNK + offs_c[None, :], mask=n_ok[:, None], other=0.0).to(dot_ty)
            k2 = tl.load(kv_ptr + 2 * D_CHUNK + offs_c[None, :], mask=n_ok[:, None], other=0.0).to(dot_ty)
            k3 = tl.load(kv_ptr + 3 * D_CHUNK + offs_c[None, :], mask=n_ok[:, None], other=0.0).to(dot_ty)
            # five independent accumulations instead of one chain over 576 columns
            s = (tl.dot(q0, tl.trans(k0)) + tl.dot(q1, tl.trans(k1))) + (
                tl.dot(q2, tl.trans(k2)) + tl.dot(q3, tl.trans(k3))
            )
            s += tl.dot(q_rope, tl.trans(k_rope))
        else:
            k_nope = tl.load(kv_ptr + offs_d[None, :], mask=n_ok[:, None], other=0.0)
            k_rope = tl.load(kv_ptr + D_NOPE + offs_r[None, :], mask=n_ok[:, None], other=0.0)
            k_nope = k_nope.to(dot_ty)
            k_rope = k_rope.to(dot_ty)
            s = tl.dot(q_nope, tl.trans(k_nope))
            s = tl.dot(q_rope, tl.trans(k_rope), s)
        s = s * score_scale
        visible = (offs_n[None, :] < row_seq[:, None]) & n_ok[None, :]
        s = tl.where(visible, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if D_SPLIT:  # V = the same tile
            p = p.to(dot_ty)
            acc0 = acc0 * alpha[:, None] + tl.dot(p, k0)
            acc1 = acc1 * alpha[:, None] + tl.dot(p, k1)
            acc2 = acc2 * alpha[:, None] + tl.dot(p, k2)
            acc3 = acc3 * alpha[:, None] + tl.dot(p, k3)
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(dot_ty), k_nope)
        m_i = m_new

    has = l_i > 0.0
    inv_l = tl.where(has, 1.0 / tl.where(has, l_i, 1.0), 0.0)
    if IS_FP8:
        inv_l = inv_l * k_scale
    if not D_SPLIT:
        out = acc * inv_l[:, None]
    lse = tl.where(has, (m_i + tl.log2(tl.where(has, l_i, 1.0))) * LN2, float("-inf"))

    if DIRECT:
        o_ptr = OUT + q_tok[:, None] * stride_o_tok + head[:, None] * stride_o_head
        o_ty = OUT.dtype.element_ty
        if not D_SPLIT:
            tl.store(o_ptr + offs_d[None, :], out.to(o_ty), mask=row_ok[:, None])
        tl.store(LSE + q_tok * num_heads + head, lse, mask=row_ok)
    else:
        ws = (q_tok * num_heads + head) * num_splits + pid_s
        o_ptr = WS_OUT + ws[:, None] * D_NOPE
        o_ty = WS_OUT.dtype.element_ty
        if not D_SPLIT:
            tl.store(o_ptr + offs_d[None, :], out, mask=row_ok[:, None])
        tl.store(WS_LSE + ws, lse, mask=row_ok)
    if D_SPLIT:
        tl.store(o_ptr + offs_c[None, :], (acc0 * inv_l[:, None]).to(o_ty), mask=row_ok[:, None])
        tl.store(o_ptr + D_CHUNK + offs_c[None, :], (acc1 * inv_l[:, None]).to(o_ty), mask=row_ok[:, None])
        tl.store(o_ptr + 2 * D_CHUNK + offs_c[None, :], (acc2 * inv_l[:, None]).to(o_ty), mask=row_ok[:, None])
        tl.store(o_ptr + 3 * D_CHUNK + offs_c[None, :], (acc3 * inv_l[:, None]).to(o_ty), mask=row_ok[:, None])


@triton.jit
def mla_decode_reduce(
    WS_OUT,  # [rows * splits, 512] fp32
    WS_LSE,  # [rows * splits] fp32
    OUT,  # [tokens, heads, 512]
    LSE,  # [tokens, heads] fp32
    stride_o_tok,
    stride_o_head,
    num_heads,
    num_splits,
    SPLITS_P2: tl.constexpr,  # splits loaded at once (a power of two); more are looped over
    BLOCK_DV: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # = token * heads + head
    pid_d = tl.program_id(1)
    offs_d = pid_d * BLOCK_DV + tl.arange(0, BLOCK_DV)
    base = row * num_splits

    lse_max = float("-inf")
    for s0 in range(0, num_splits, SPLITS_P2):
        offs_s = s0 + tl.arange(0, SPLITS_P2)
        lse_s = tl.load(WS_LSE + base + offs_s, mask=offs_s < num_splits, other=float("-inf"))
        lse_max = tl.maximum(lse_max, tl.max(lse_s, 0))
    any_key = lse_max > float("-inf")
    safe_max = tl.where(any_key, lse_max, 0.0)

    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    w_sum = 0.0
    for s0 in range(0, num_splits, SPLITS_P2):
        offs_s = s0 + tl.arange(0, SPLITS_P2)
        lse_s = tl.load(WS_LSE + base + offs_s, mask=offs_s < num_splits, other=float("-inf"))
        w = tl.exp(lse_s - safe_max)  # 0 for empty splits
        live = (offs_s < num_splits) & (lse_s > float("-inf"))
        part = tl.load(WS_OUT + (base + offs_s)[:, None] * D_NOPE + offs_d[None, :], mask=live[:, None], other=0.0)
        acc += tl.sum(part * w[:, None], 0)
        w_sum += tl.sum(w, 0)
    inv = tl.where(any_key, 1.0 / tl.where(any_key, w_sum, 1.0), 0.0)
    out = acc * inv

    tok = row // num_heads
    head = row % num_heads
    tl.store(OUT + tok * stride_o_tok + head * stride_o_head + offs_d, out.to(OUT.dtype.element_ty))
    if pid_d == 0:
        tl.store(LSE + row, tl.where(any_key, safe_max + tl.log(w_sum), float("-inf")))
