"""Patch ``draft-attention-segments``: TRITON_ATTN's split-KV (3D) decode grid sized to fill
the GPU at small batches.

Why: the 3D kernel runs (sequences x KV heads x 16 segments) programs. A K2.5 drafter at
its TP-8 share has one KV head, so a single-stream draft pass is 16 programs each walking a
sixteenth of the context: 0.49 ms of the drafter's 3 passes per step at 32k on the H200
(profiled, 24-layer slice), ~9 % of the step. Here ``build`` gives such batches more
segments, as many as fill the SMs once, twice for several rows (a power of two, at most MAX_SEGMENTS), laid out in
the builder's own scratch (no new allocation): stock sizes it for ``seq_threshold_3D`` rows
of 16 segments, and a small batch needs far fewer rows. The count depends only on the
batch's shape, so every CUDA graph captured for a shape replays the grid it was built with.
"""

from __future__ import annotations

import functools

from ..patching import REGISTRY, PatchContext, scope

MODULE = "vllm.v1.attention.backends.triton_attn"
PATCH_NAME = "draft-attention-segments"
#: vLLM's reduce kernel holds segments x head size fp32 per program: 128 x 128 is 128
#: registers a thread at its 4 warps.
MAX_SEGMENTS = 128


#: How many times a batch of several rows (the drafter's first pass: 1 + k rows of one request)
#: may fill the SMs: two waves. H200, 4 rows at 128k with 128-key tiles: 64 segments 65.7 µs
#: against 108.9 at 32 (one wave); 32k 23.3 vs 33.8 (benchmarks/results/draft_attention_tile_h200/).
MULTI_ROW_WAVES = 2


def wide_segments(rows: int, kv_heads: int, sm_count: int, stock: int, scratch_segment_rows: int) -> int:
    """Segments per row (query token) for a batch of ``rows`` one-token rows: the largest power
    of two whose grid (rows x KV heads x segments) fits the SMs once (MULTI_ROW_WAVES times for
    several rows) and whose partials fit the scratch; never fewer than stock's."""
    budget = sm_count * (MULTI_ROW_WAVES if rows > 1 else 1)
    best = stock
    s = stock * 2
    while s <= MAX_SEGMENTS and rows * kv_heads * s <= budget and rows * s <= scratch_segment_rows:
        if scratch_segment_rows % s == 0:
            best = s
        s *= 2
    return best


@functools.cache
def _sm_count(index: int) -> int:
    import torch

    return torch.cuda.get_device_properties(index).multi_processor_count


def widen(builder, meta, sm_count: int) -> None:
    """Give ``meta`` (a 3D-eligible decode batch) more segments if its grid under-fills ``sm_count`` SMs."""
    out = getattr(meta, "softmax_segm_output", None)
    if out is None or int(meta.max_query_len) != 1:
        return
    rows = max(int(meta.num_actual_tokens), int(meta.seq_lens.shape[0]))  # padded graph batches: every row
    if rows > int(meta.seq_threshold_3D):
        return  # the 2D kernel runs
    heads_q, stock, pad = out.shape[1], int(meta.num_par_softmax_segments), out.shape[-1]
    segment_rows = out.numel() // (heads_q * pad)  # rows x segments the scratch holds
    s = wide_segments(rows, int(builder.num_heads_kv), sm_count, stock, segment_rows)
    if s == stock:
        return
    meta.num_par_softmax_segments = s
    meta.softmax_segm_output = out.view(-1, heads_q, s, pad)
    meta.softmax_segm_max = meta.softmax_segm_max.view(-1, heads_q, s)
    meta.softmax_segm_expsum = meta.softmax_segm_expsum.view(-1, heads_q, s)


def _wrap_build(original):
    def build(self, *args, **kwargs):
        meta = original(self, *args, **kwargs)
        out = getattr(meta, "softmax_segm_output", None)
        if out is not None and out.device.type == "cuda" and scope.acts(PATCH_NAME, getattr(self, "vllm_config", None)):
            widen(self, meta, _sm_count(out.device.index or 0))
        return meta

    return build


def _upstream_fills_the_gpu() -> bool:
    """Whether stock ``build`` already gives one decode row of a one-KV-head builder more
    segments than its 16-segment default (vLLM 0.32 does so only in ``__init__`` for sm_120,
    which a bare builder does not run)."""
    import torch
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.attention.backends.triton_attn import NUM_PAR_SOFTMAX_SEGMENTS, TritonAttentionMetadataBuilder

    b = TritonAttentionMetadataBuilder.__new__(TritonAttentionMetadataBuilder)
    b.device, b.seq_threshold_3D, b.num_par_softmax_segments = torch.device("cpu"), 16, NUM_PAR_SOFTMAX_SEGMENTS
    b.num_heads_kv, b.num_heads_q, b.max_seqs_64_segments, b.rswa_window = 1, 8, 0, None
    b.softmax_segm_output = torch.empty(16, 8, NUM_PAR_SOFTMAX_SEGMENTS, 128)
    b.softmax_segm_max = b.softmax_segm_expsum = torch.empty(16, 8, NUM_PAR_SOFTMAX_SEGMENTS)
    i32 = dict(dtype=torch.int32)
    common = CommonAttentionMetadata(
        query_start_loc=torch.tensor([0, 1], **i32),
        query_start_loc_cpu=torch.tensor([0, 1], **i32),
        seq_lens=torch.tensor([32768], **i32),
        num_reqs=1,
        num_actual_tokens=1,
        max_query_len=1,
        max_seq_len=32768,
        block_table_tensor=torch.zeros(1, 2048, **i32),
        slot_mapping=torch.tensor([32767]),
    )
    try:
        meta = TritonAttentionMetadataBuilder.build(b, 0, common)
    except Exception:  # noqa: BLE001 - a builder that needs more state: not upstream
        return False
    return int(meta.num_par_softmax_segments) > NUM_PAR_SOFTMAX_SEGMENTS


@REGISTRY.patch(
    name=PATCH_NAME,
    feature="draft_attention",
    target=f"{MODULE}:TritonAttentionMetadataBuilder.build",
    applies_to=">=0.16,<0.35",
    already_upstream=_upstream_fills_the_gpu,
    upstream="none (vLLM 0.32 uses 64 segments on sm_120 only, chosen in the builder's __init__)",
    why="a single-stream draft pass with one KV head runs 16 programs over the whole context",
    remove_when="stock build gives a one-row, one-KV-head decode batch more than 16 segments (the probe sees it)",
)
def _apply(ctx: PatchContext) -> None:
    from vllm.v1.attention.backends import triton_attn

    ctx.target()
    ctx.wrap(triton_attn.TritonAttentionMetadataBuilder, "build", _wrap_build)
