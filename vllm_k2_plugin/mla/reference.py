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
    out = torch.zeros(tokens, heads, 512, dtype=torch.float64, device="cpu")
    lse = torch.full((tokens, heads), float("-inf"), dtype=torch.float64, device="cpu")
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


def random_case(heads, seqs, page, q_len, fp8, device="cpu", seed=0, pad_pages=2, page_stride_extra=0):
    """A random paged decode case: (q, kv_cache, block_table, seq_lens, k_scale).

    Pages are shuffled in the block table; ``page_stride_extra`` > 0 gives a page stride
    larger than PAGE * 576 (vLLM's cross-layer KV views). Drawn on the CPU (explicitly: vLLM's
    workers set a CUDA default device), then moved to ``device``."""
    cpu = torch.device("cpu")
    g = torch.Generator(cpu).manual_seed(seed)
    batch = len(seqs)
    max_pages = max(-(-s // page) for s in seqs) + pad_pages
    n_pages = batch * max_pages + 3
    base = torch.randn(n_pages, page * 576 + page_stride_extra, generator=g, device=cpu)
    k_scale = None
    if fp8:
        store = base.mul(3.0).to(torch.float8_e4m3fn).to(device)
        k_scale = torch.tensor([0.37], dtype=torch.float32, device=cpu).to(device)
    else:
        store = base.to(torch.bfloat16).to(device)
    kv = torch.as_strided(store, (n_pages, page, 576), (store.stride(0), 576, 1))
    block_table = torch.randperm(n_pages, generator=g, device=cpu)[: batch * max_pages].view(batch, max_pages)
    block_table = block_table.to(torch.int32)
    seq_lens = torch.tensor(seqs, dtype=torch.int32, device=cpu)
    q = torch.randn(batch * q_len, heads, 576, generator=g, device=cpu).to(torch.bfloat16)
    return q.to(device), kv, block_table.to(device), seq_lens.to(device), k_scale


def mismatch(out, lse, ref_out, ref_lse, tol=1e-2, lse_tol=1e-3) -> str | None:
    """Why (out, lse) is not the float64 reference, or None when it is: relative error of
    the output, NaN (unwritten) elements, LSE error, rows that see no key (out 0, lse -inf)."""
    o, l64 = out.detach().double().cpu(), lse.detach().double().cpu()
    if torch.isnan(o).any() or torch.isnan(l64).any():
        return "unwritten (NaN) output or LSE elements"
    err = float((o - ref_out).norm() / ref_out.norm().clamp_min(1e-30))
    if not err < tol:
        return f"relative error {err:.3e} >= {tol}"
    finite = torch.isfinite(ref_lse)
    if not torch.equal(torch.isfinite(l64), finite):
        return "rows with no visible key must have lse -inf"
    if finite.any():
        lse_err = float((l64[finite] - ref_lse[finite]).abs().max())
        if not lse_err < lse_tol:
            return f"LSE error {lse_err:.3e} >= {lse_tol}"
    if not (o[~finite] == 0).all():
        return "rows with no visible key must be 0"
    return None
