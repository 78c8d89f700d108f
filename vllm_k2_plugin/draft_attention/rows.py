"""Causal attention of ``q_len`` query tokens at the end of each sequence, rewritten as
``q_len`` one-token sequences over the same KV blocks: pseudo-sequence i of a request sees
``seq_len - (q_len - 1 - i)`` keys, which is exactly its causal window. Token order is
unchanged, so queries, outputs and slot mapping stay as they are.

Device ops only, no host sync: safe inside a CUDA graph capture.
"""

from __future__ import annotations

import torch


def as_decode_rows(
    seq_lens: torch.Tensor, block_table: torch.Tensor, q_len: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(query_start_loc, seq_lens, block_table) for ``len(seq_lens) * q_len`` one-token
    sequences; every request must carry exactly ``q_len`` query tokens."""
    reqs = seq_lens.shape[0]
    offsets = torch.arange(q_len, dtype=seq_lens.dtype, device=seq_lens.device) - (q_len - 1)
    row_lens = (seq_lens[:, None] + offsets[None, :]).reshape(reqs * q_len)
    row_table = block_table[:reqs, None, :].expand(reqs, q_len, block_table.shape[1]).reshape(reqs * q_len, -1)
    query_start_loc = torch.arange(reqs * q_len + 1, dtype=torch.int32, device=seq_lens.device)
    return query_start_loc, row_lens, row_table
