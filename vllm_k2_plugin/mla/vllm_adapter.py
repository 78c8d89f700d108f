"""Where the vLLM pieces the backend builds on live, per vLLM version.

Kept apart so that the backend itself has no version branches. What differs between
the versions we run on (read from their sources; each row is exercised by a test):

=========  =====================================================================
0.16       TritonMLA: SINGLE_ONLY queries, no builder of its own (cudagraph NEVER),
           fp8 KV refused in TritonMLAImpl.__init__, 4 fixed KV splits.
0.20       same builder story; fp8 KV accepted; splits from max_seq_len (device
           data at run time, so no graph-safe split count). Proven on the H200.
0.32       TritonMLAMetadataBuilder with UNIFORM queries and UNIFORM_BATCH graphs
           (our patch retires there); ``_build_decode`` gains ``max_query_len``.
=========  =====================================================================

The import locations are the same in all three; ``_build_decode`` is called with
keywords everywhere, so our builder takes the version-specific ones as ``**kwargs``.
"""

from __future__ import annotations

from types import SimpleNamespace

BACKEND_REGISTRY = "vllm.v1.attention.backends.registry"
TRITON_MLA_MODULE = "vllm.v1.attention.backends.mla.triton_mla"
TESTED_RELEASES = ("0.16", "0.20", "0.32")


def pieces() -> SimpleNamespace:
    """The vLLM classes our backend subclasses or returns, for the installed vLLM."""
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


def stock_triton_mla():
    """vLLM's own TRITON_MLA backend class (the enum's value, never an override)."""
    import importlib

    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    module, _, name = AttentionBackendEnum.TRITON_MLA.value.rpartition(".")
    return getattr(importlib.import_module(module), name)


def stock_has_spec_decode_graphs_and_fp8() -> bool:
    """Behaviour of the stock backend: uniform multi-token (spec-verify) decode, full CUDA
    graphs for uniform batches and an fp8 KV cache, as its classes declare them."""
    v = pieces()
    stock = stock_triton_mla()
    builder = stock.get_builder_cls()
    graphs = builder.get_cudagraph_support(None, None)
    return (
        builder.query_len_support != v.QueryLenSupport.SINGLE_ONLY
        and graphs in (v.AttentionCGSupport.UNIFORM_BATCH, v.AttentionCGSupport.ALWAYS)
        and "fp8" in stock.supported_kv_cache_dtypes
    )


def current_engine_config():
    """The VllmConfig vLLM is building a model under, or None outside of that."""
    from vllm.config import get_current_vllm_config_or_none

    return get_current_vllm_config_or_none()


def max_graph_tokens(vllm_config) -> int:
    """Largest batch (in tokens) vLLM may replay as a CUDA graph; 0 when eager."""
    cc = vllm_config.compilation_config
    if getattr(vllm_config.model_config, "enforce_eager", False):
        return 0
    return int(getattr(cc, "max_cudagraph_capture_size", None) or max(cc.cudagraph_capture_sizes or [0]))
