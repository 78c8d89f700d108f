"""Patch ``draft-prefill-as-decode``: TRITON_ATTN's metadata for the drafter's first pass
(every request carries the same 1 + k verified tokens) describes one-token sequences, so
vLLM's split-KV decode kernel runs it.

Why: with any query longer than one token, vLLM's unified attention takes its 2D kernel,
one program per (query block, KV head), each walking the whole context; at batch 1 that is
8 programs for a K2.5 drafter with 8 KV heads on one GPU (1 per GPU at TP 8) over up to
128k tokens. Its 3D kernel splits the context into segments, but only for one-token
queries. Rewritten only where the rows fit the 3D kernel (rows <= the builder's
``seq_threshold_3D``); larger batches keep the 2D kernel, which has programs enough.
"""

from __future__ import annotations

import dataclasses

from ..log import get_logger
from ..patching import REGISTRY, RUNNER_V1, PatchContext, scope

MODULE = "vllm.v1.attention.backends.triton_attn"
PATCH_NAME = "draft-prefill-as-decode"


#: CommonAttentionMetadata fields laid out per request that the rewrite does not expand:
#: a call that sets any of them runs stock.
_PER_REQUEST_EXTRAS = (
    "encoder_seq_lens",
    "dcp_local_seq_lens",
    "mm_req_doc_ranges",
    "rswa_prefix_lens",
    "logits_indices_padded",
    "req_idx",
)


def rows_for(builder, common, draft_index: int) -> int | None:
    """Query length per request when this drafting metadata should be rewritten, else None."""
    q_len, reqs = int(common.max_query_len), int(common.num_reqs)
    if draft_index != 0 or q_len <= 1 or not getattr(common, "causal", True):
        return None
    if int(common.num_actual_tokens) != reqs * q_len:  # not uniform (sum of lengths == reqs * max)
        return None
    if reqs * q_len > int(getattr(builder, "seq_threshold_3D", 0) or 0):
        return None
    if any(getattr(common, name, None) is not None for name in _PER_REQUEST_EXTRAS):
        return None
    return q_len


def as_decode_metadata(common, q_len: int):
    """``common`` with each request's ``q_len`` query tokens as one-token sequences."""
    import torch

    from .rows import as_decode_rows

    reqs = int(common.num_reqs)
    query_start_loc, seq_lens, block_table = as_decode_rows(common.seq_lens[:reqs], common.block_table_tensor, q_len)
    # host copies and caches laid out per request: dropped, the builder recomputes what it reads
    host = (
        "_seq_lens_cpu",
        "_num_computed_tokens_cpu",
        "seq_lens_cpu_upper_bound",
        "is_prefilling",
        "_num_computed_tokens_cache",
        "_token_to_req_indices_cache",
    )
    return dataclasses.replace(
        common,
        query_start_loc=query_start_loc,
        query_start_loc_cpu=torch.arange(reqs * q_len + 1, dtype=torch.int32),
        seq_lens=seq_lens,
        block_table_tensor=block_table,
        num_reqs=reqs * q_len,
        max_query_len=1,
        **{k: None for k in host if hasattr(common, k)},
    )


def _wrap_build_for_drafting(original):
    def build_for_drafting(self, common_attn_metadata, draft_index):
        q_len = None if self.__dict__.get(_FAILED) else rows_for(self, common_attn_metadata, draft_index)
        if q_len is not None and not scope.acts(PATCH_NAME, getattr(self, "vllm_config", None)):
            q_len = None
        if q_len is not None:
            try:
                rows = as_decode_metadata(common_attn_metadata, q_len)
                return original(self, common_attn_metadata=rows, draft_index=draft_index)
            except Exception as e:  # noqa: BLE001 - an optimisation must not stop serving: stock from now on
                self.__dict__[_FAILED] = True
                _logger().warning("vllm-k2: draft-prefill-as-decode failed (%r); this drafter runs stock", e)
        return original(self, common_attn_metadata=common_attn_metadata, draft_index=draft_index)

    return build_for_drafting


_FAILED = "_vllm_k2_prefill_as_decode_failed"


def _logger():
    return get_logger("draft_attention")


def _upstream_runs_drafts_as_decode() -> bool:
    """Ask a bare stock builder for drafting metadata of one request with 4 verified tokens:
    upstream does this itself if the result's query length is 1."""
    import torch
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.attention.backends.triton_attn import TritonAttentionMetadataBuilder

    probe = TritonAttentionMetadataBuilder.__new__(TritonAttentionMetadataBuilder)
    probe.device, probe.seq_threshold_3D, probe.num_par_softmax_segments = torch.device("cpu"), 16, 16
    probe.max_seqs_64_segments, probe.rswa_window = 0, None  # newer builders' state
    probe.softmax_segm_output = probe.softmax_segm_max = probe.softmax_segm_expsum = torch.empty(0)
    i32 = dict(dtype=torch.int32)
    common = CommonAttentionMetadata(
        query_start_loc=torch.tensor([0, 4], **i32),
        query_start_loc_cpu=torch.tensor([0, 4], **i32),
        seq_lens=torch.tensor([20], **i32),
        num_reqs=1,
        num_actual_tokens=4,
        max_query_len=4,
        max_seq_len=20,
        block_table_tensor=torch.zeros(1, 2, **i32),
        slot_mapping=torch.arange(16, 20),
    )
    try:
        meta = TritonAttentionMetadataBuilder.build_for_drafting(probe, common_attn_metadata=common, draft_index=0)
    except Exception:  # noqa: BLE001 - a builder that needs more state: not upstream; the wrapper's own checks run
        return False
    return int(meta.max_query_len) == 1


@REGISTRY.patch(
    name=PATCH_NAME,
    feature="draft_attention",
    target=f"{MODULE}:TritonAttentionMetadataBuilder.build_for_drafting",
    applies_to=">=0.16,<0.34",
    model_runner=RUNNER_V1,
    why_range_ends="vLLM 0.34's TRITON_ATTN builder has no build_for_drafting (its caller, the v1 proposer, is gone)",
    already_upstream=_upstream_runs_drafts_as_decode,
    upstream="none yet (vLLM's unified attention splits the context only for one-token queries)",
    why="the drafter's first pass (1 + k tokens per request) walks the whole context in one program per KV head",
    remove_when="vLLM's drafting metadata or its 3D kernel covers multi-token queries (the probe sees query length 1)",
)
def _apply(ctx: PatchContext) -> None:
    from vllm.v1.attention.backends import triton_attn

    ctx.target()
    ctx.wrap(triton_attn.TritonAttentionMetadataBuilder, "build_for_drafting", _wrap_build_for_drafting)
