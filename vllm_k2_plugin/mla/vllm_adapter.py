"""Where the vLLM pieces the backend builds on live, per vLLM version.

Kept apart so that the backend itself has no version branches. vLLM 0.16 is the only
version wired today; issue #11 adds the 0.20 locations here (TritonMLA* moved and the
builder API changed there), not in backend.py.
"""

from __future__ import annotations

from types import SimpleNamespace

BACKEND_REGISTRY = "vllm.v1.attention.backends.registry"
TRITON_MLA_MODULE = "vllm.v1.attention.backends.mla.triton_mla"


def vllm016() -> SimpleNamespace:
    from vllm.model_executor.layers.attention.mla_attention import (
        MLACommonDecodeMetadata,
        MLACommonImpl,
        MLACommonMetadata,
        MLACommonMetadataBuilder,
        QueryLenSupport,
    )
    from vllm.v1.attention.backend import AttentionCGSupport, AttentionType
    from vllm.v1.attention.backends.mla.triton_mla import TritonMLABackend, TritonMLAImpl

    return SimpleNamespace(
        MLACommonDecodeMetadata=MLACommonDecodeMetadata,
        MLACommonImpl=MLACommonImpl,
        MLACommonMetadata=MLACommonMetadata,
        MLACommonMetadataBuilder=MLACommonMetadataBuilder,
        QueryLenSupport=QueryLenSupport,
        AttentionCGSupport=AttentionCGSupport,
        AttentionType=AttentionType,
        TritonMLABackend=TritonMLABackend,
        TritonMLAImpl=TritonMLAImpl,
    )


def max_graph_tokens(vllm_config) -> int:
    """Largest batch (in tokens) vLLM may replay as a CUDA graph; 0 when eager."""
    cc = vllm_config.compilation_config
    if getattr(vllm_config.model_config, "enforce_eager", False):
        return 0
    return int(getattr(cc, "max_cudagraph_capture_size", None) or max(cc.cudagraph_capture_sizes or [0]))
