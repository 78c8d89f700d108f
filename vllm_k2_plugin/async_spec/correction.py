"""The arithmetic of the correction, apart from vLLM's runner (testable on any device).

A request that carried d drafts into the previous step is prepared as if all d were accepted;
the previous step's count c (accepted + 1, on the GPU) says r = d - (c - 1) were not. Its
tokens' positions and its sequence length are r too high, and so are its KV slots, which are
looked up again in the block table at the corrected positions (vLLM 0.16's formula without
context parallelism: block_table[row, pos // block_size] * block_size + pos % block_size).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Optimistic:
    """Requests prepared this step as if every draft of the previous step had been accepted."""

    req_ids: tuple[str, ...]
    prev_rows: tuple[int, ...]  # the request's row in the previous step's batch (the count's index)
    drafts: tuple[int, ...]  # drafts it carried into the previous step

    def __len__(self) -> int:
        return len(self.req_ids)

    def counts_all_accepted(self, prev_batch_size: int) -> list[int]:
        """What 0.16's runner reads as the previous step's counts: d + 1 for these, 1 elsewhere."""
        out = [1] * prev_batch_size
        for row, d in zip(self.prev_rows, self.drafts, strict=True):
            out[row] = d + 1
        return out

    def rejected(self, counts_cpu) -> list[int]:
        """Drafts not accepted, per request, from the count once it is on the host."""
        out = []
        for req_id, row, d in zip(self.req_ids, self.prev_rows, self.drafts, strict=True):
            r = d - (int(counts_cpu[row]) - 1)
            if not 0 <= r <= d:
                raise ValueError(f"request {req_id!r}: count {int(counts_cpu[row])} for {d} drafts")
            out.append(r)
        return out


def correct_on_device(
    *,
    rows: list[int],
    starts: list[int],
    ends: list[int],
    prev_rows: list[int],
    drafts: list[int],
    count,
    positions,
    seq_lens,
    tables: list[tuple[object, object, int]],
) -> None:
    """Queue the correction on ``count``'s device (no host wait): for request i at batch row
    rows[i] with tokens [starts[i], ends[i]), positions, seq_lens[rows[i]] and each KV-cache
    group's slots ``(block_table, slot_mapping, block_size)`` drop by its rejected drafts."""
    import numpy as np  # here, not at the top: `vllm-k2 doctor` imports every patch without numpy
    import torch

    lengths = np.asarray(ends, dtype=np.int64) - np.asarray(starts, dtype=np.int64)
    tokens = np.concatenate([np.arange(s, e, dtype=np.int64) for s, e in zip(starts, ends, strict=True)])
    owner = np.repeat(np.arange(len(rows), dtype=np.int64), lengths)
    host = torch.from_numpy(
        np.concatenate(
            [np.asarray(prev_rows, np.int64), np.asarray(drafts, np.int64), np.asarray(rows, np.int64), tokens, owner]
        )
    )
    device = count.device
    if device.type == "cuda":
        host = host.pin_memory().to(device, non_blocking=True)  # one copy, no host wait
    n, t = len(rows), len(tokens)
    prev, d, row, tok, own = host.split([n, n, n, t, t])
    rejected = d - (count.index_select(0, prev).to(torch.int64) - 1)
    seq_lens.index_add_(0, row, (-rejected).to(seq_lens.dtype))
    pos = positions.index_select(0, tok) - rejected.index_select(0, own).to(positions.dtype)
    positions.index_copy_(0, tok, pos)
    tok_rows = row.index_select(0, own)
    for table, slots, block_size in tables:
        blocks = table[tok_rows, pos // block_size].to(slots.dtype)
        slots.index_copy_(0, tok, blocks * block_size + (pos % block_size).to(slots.dtype))


def self_check(device) -> str | None:
    """Run the correction on ``device`` against the same inputs prepared exactly; None if equal,
    else what differs (the patch then keeps vLLM's wait)."""
    import numpy as np  # here, not at the top: `vllm-k2 doctor` imports every patch without numpy
    import torch

    gen = np.random.default_rng(0)
    block_size, n_reqs, width = 16, 5, 8
    table = gen.permutation(n_reqs * width).reshape(n_reqs, width).astype(np.int32) + 1
    computed = np.array([37, 5, 60, 18, 90], np.int64)  # exact, before this step
    scheduled = np.array([4, 1, 3, 4, 2], np.int64)
    drafts = np.array([3, 0, 2, 3, 1], np.int64)  # carried into the previous step
    accepted_plus_one = np.array([2, 1, 3, 4, 1], np.int64)  # by this step's row
    rows = [0, 2, 3, 4]  # requests with drafts (row 1 had none)
    prev_rows = [2, 4, 0, 1]  # their rows in the previous step's batch (reordered since)
    counts = np.ones(n_reqs, np.int32)
    counts[prev_rows] = accepted_plus_one[rows]
    rejected = drafts - (accepted_plus_one - 1)
    ends = np.cumsum(scheduled)
    starts = ends - scheduled

    def prepared(num_computed):
        pos = np.concatenate([np.arange(c, c + s) for c, s in zip(num_computed, scheduled, strict=True)])
        req = np.repeat(np.arange(n_reqs), scheduled)
        slots = table[req, pos // block_size].astype(np.int64) * block_size + pos % block_size
        return pos, (num_computed + scheduled).astype(np.int32), slots

    want = prepared(computed)
    got = [torch.from_numpy(a.copy()).to(device) for a in prepared(computed + rejected)]
    correct_on_device(
        rows=rows,
        starts=[int(starts[i]) for i in rows],
        ends=[int(ends[i]) for i in rows],
        prev_rows=prev_rows,
        drafts=[int(drafts[i]) for i in rows],
        count=torch.from_numpy(counts).to(device),
        positions=got[0],
        seq_lens=got[1],
        tables=[(torch.from_numpy(table).to(device), got[2], block_size)],
    )
    for name, w, g in zip(("positions", "seq_lens", "slot_mapping"), want, got, strict=True):
        if not np.array_equal(w, g.cpu().numpy()):
            return f"{name}: {g.cpu().numpy().tolist()} != {w.tolist()}"
    return None
