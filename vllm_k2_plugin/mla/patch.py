"""Patch declaration: TRITON_MLA resolves to our backend (vllm_k2_plugin.mla.backend).

Overrides the existing ``AttentionBackendEnum.TRITON_MLA`` entry (research §1.3), not
CUSTOM: sm_120 then auto-selects it with no flag, and a Llama-style EAGLE-3 drafter
keeps its own (non-MLA) backend. Nothing is imported from vLLM at registration beyond
the backend registry; the backend class is imported by vLLM when it is selected.
"""

from __future__ import annotations

import importlib.util

from ..patching import REGISTRY, PatchContext
from .vllm_adapter import BACKEND_REGISTRY, TRITON_MLA_MODULE

CLASS_PATH = "vllm_k2_plugin.mla.backend.K2TritonMLABackend"


def _upstream_has_it() -> bool:
    """vLLM's own TritonMLA already takes uniform multi-token decode, full CUDA graphs
    for uniform batches and fp8 KV (source probe: no import of the backend)."""
    spec = importlib.util.find_spec(TRITON_MLA_MODULE)
    if spec is None or not spec.origin:
        return False
    with open(spec.origin) as f:
        src = f.read()
    return (
        all(token in src for token in ("QueryLenSupport.UNIFORM", "AttentionCGSupport.UNIFORM_BATCH", '"fp8"'))
        and "not yet supported" not in src
    )


@REGISTRY.patch(
    name="triton-mla-k2-decode",
    feature="mla",
    target=f"{BACKEND_REGISTRY}:_ATTN_OVERRIDES",
    applies_to=">=0.16,<0.17",
    upstream="vLLM #40608 (issue), #40750 (closed), #53748/#54013 (fp8 smem); 0.32's TritonMLA has UNIFORM",
    why=(
        "0.16 TRITON_MLA (the only MLA backend on sm_120) runs EAGLE-3 verify as prefill, 4 KV splits, "
        "no full CUDA graphs, no fp8 KV; ours: own Triton kernel, adaptive splits, fp8 within 101,376 B"
    ),
    remove_when="minimum supported vLLM's TRITON_MLA has uniform decode, UNIFORM_BATCH graphs and fp8 KV "
    "that fit sm_120 shared memory (issue #11 ports it to 0.20)",
    already_upstream=_upstream_has_it,
)
def _apply(ctx: PatchContext) -> None:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    ctx.replace_item(ctx.target(), AttentionBackendEnum.TRITON_MLA, CLASS_PATH)
