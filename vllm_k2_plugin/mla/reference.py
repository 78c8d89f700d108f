"""Float64 PyTorch reference for the MLA decode kernel (tests and the benchmark)."""

from __future__ import annotations

import torch


def mla_decode_reference(q, kv_cache, block_table, seq_lens, sm_scale, q_len=1, k_scale=None):
    """Same contract as launcher.mla_decode; returns (out [T, H, 512], lse [T, H]) in float64.

    Token t of a request with cache length S sees positions < S - (q_len - 1 - t);
    a row that sees nothing gets out 0 and lse -inf.
    """
    tokens, heads, _ = q.shape
    page = kv_cache.shape[1]
    scale = float(k_scale.reshape(-1)[0]) if k_scale is not None else 1.0
    out = torch.zeros(tokens, heads, 512, dtype=torch.float64)
    lse = torch.full((tokens, heads), float("-inf"), dtype=torch.float64)
    q64 = q.detach().cpu().to(torch.float64)
    for b in range(block_table.shape[0]):
        seq = int(seq_lens[b])
        n_pages = -(-seq // page)
        pages = block_table[b, :n_pages].long().cpu()
        kv = kv_cache.detach().cpu()[pages].to(torch.float64).reshape(-1, 576)[:seq] * scale
        for t in range(q_len):
            visible = seq - (q_len - 1 - t)
            if visible <= 0:
                continue
            row = b * q_len + t
            s = q64[row] @ kv[:visible].T * sm_scale  # [heads, visible]
            lse[row] = torch.logsumexp(s, dim=-1)
            out[row] = torch.softmax(s, dim=-1) @ kv[:visible, :512]
    return out, lse
