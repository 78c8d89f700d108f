"""Patch declaration: TRITON_MLA resolves to our backend (vllm_k2_plugin.mla.backend).

Overrides the existing ``AttentionBackendEnum.TRITON_MLA`` entry (research §1.3), not
CUSTOM: sm_120 then auto-selects it with no flag, and a Llama-style EAGLE-3 drafter
keeps its own (non-MLA) backend. The retire probe imports the stock TritonMLA classes
(at apply time, never at import); our backend class is imported by vLLM when selected.
"""

from __future__ import annotations

from ..patching import REGISTRY, PatchContext
from .vllm_adapter import BACKEND_REGISTRY

CLASS_PATH = "vllm_k2_plugin.mla.backend.K2TritonMLABackend"


def _upstream_has_it() -> bool:
    """vLLM's own TritonMLA takes uniform multi-token decode with full CUDA graphs and an
    fp8 KV cache (asked of its classes; 0.32 does)."""
    from .vllm_adapter import stock_has_spec_decode_graphs_and_fp8

    return stock_has_spec_decode_graphs_and_fp8()


@REGISTRY.patch(
    name="triton-mla-k2-decode",
    feature="mla",
    target=f"{BACKEND_REGISTRY}:_ATTN_OVERRIDES",
    applies_to=">=0.16,<0.35",
    upstream="vLLM #40608 (issue), #40750 (closed), #53748/#54013 (fp8 smem); 0.32's TritonMLA has UNIFORM",
    why=(
        "TRITON_MLA (the MLA backend sm_120 gets) before 0.32 runs EAGLE-3 verify as prefill and has no full "
        "CUDA graphs (0.16 also: 4 KV splits, no fp8 KV); ours: own Triton kernel, graph-safe adaptive splits, "
        "fp8 within 101,376 B; a start-up self-check falls back to stock on failure"
    ),
    remove_when="minimum supported vLLM's TRITON_MLA has uniform decode, UNIFORM_BATCH graphs and fp8 KV",
    already_upstream=_upstream_has_it,
)
def _apply(ctx: PatchContext) -> None:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    ctx.replace_item(ctx.target(), AttentionBackendEnum.TRITON_MLA, CLASS_PATH)
