"""The practical memory roofline for an MLA decode: a plain streaming read of the same
paged latent bytes the attention kernel reads (same block table, same pages), with no
math but a running sum so the loads cannot be dropped. Benchmark only."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def paged_stream_read(
    KV,  # [pages, PAGE, 576]
    BLOCK_TABLE,  # [requests, max_pages] int32
    SINK,  # [requests * programs] fp32: one sum per program
    stride_kv_page,
    stride_kv_tok,
    stride_bt,
    context,
    tokens_per_program,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    req = tl.program_id(1)
    start = pid * tokens_per_program
    end = tl.minimum(start + tokens_per_program, context)
    offs_d = tl.arange(0, 512)
    offs_r = tl.arange(0, 64)
    bt_row = BLOCK_TABLE + req.to(tl.int64) * stride_bt
    acc = tl.zeros([BLOCK_N, 512], dtype=tl.float32)
    acc_r = tl.zeros([BLOCK_N, 64], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        ok = offs_n < end
        page = tl.load(bt_row + offs_n // PAGE, mask=ok, other=0).to(tl.int64)
        ptr = KV + (page * stride_kv_page + (offs_n % PAGE).to(tl.int64) * stride_kv_tok)[:, None]
        acc += tl.load(ptr + offs_d[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
        acc_r += tl.load(ptr + 512 + offs_r[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    tl.store(SINK + req * tl.num_programs(0) + pid, tl.sum(tl.sum(acc, 1), 0) + tl.sum(tl.sum(acc_r, 1), 0))


def stream_read(kv, block_table, context: int, programs_per_request: int, block_n: int = 16, num_warps: int = 4):
    """Launch the read with ``programs_per_request`` programs per request; returns the sink."""
    import torch

    batch = block_table.shape[0]
    sink = torch.empty(batch * programs_per_request, dtype=torch.float32, device=kv.device)
    per = -(-context // programs_per_request)
    paged_stream_read[(programs_per_request, batch)](
        kv,
        block_table,
        sink,
        kv.stride(0),
        kv.stride(1),
        block_table.stride(0),
        context,
        per,
        PAGE=kv.shape[1],
        BLOCK_N=block_n,
        num_warps=num_warps,
    )
    return sink
