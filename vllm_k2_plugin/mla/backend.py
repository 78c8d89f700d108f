"""TRITON_MLA with our decode kernel, registered over the stock entry (vLLM 0.16 - 0.31;
``vllm_adapter`` says what differs per version).

What changes against the stock TritonMLABackend of those versions:
* the builder declares ``QueryLenSupport.UNIFORM``: an EAGLE-3 verify step (1 + k
  tokens per request, all equal) is a decode, sent to our kernel with causal offsets,
  instead of prefill (which re-reads and up-projects the whole context each step);
* ``AttentionCGSupport.UNIFORM_BATCH``: full CUDA graphs for uniform decode batches.
  The split count is a function of (batch, heads, q_len, context bound) only, and the
  bound is max_model_len for every batch small enough to be a captured graph, so a
  replay launches exactly what was captured; the split workspace is shared and
  reserved before capture for the worst batch;
* fp8-e4m3 KV cache (``--kv-cache-dtype fp8``): the kernel dequantises with the
  layer's k_scale; the query stays bf16 (no query quantisation);
* the split count adapts to batch x heads x context and the SM count; the LSE is fp32.
Prefill (and mixed batches' prefill part) stay on vLLM's path, unchanged.

Safe by default: ``get_impl_cls``/``get_builder_cls`` hand out our classes only when the
process's start-up self-check (``selfcheck``) passed; otherwise vLLM's stock ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..patching import scope
from . import launcher, selfcheck
from .vllm_adapter import max_graph_tokens, pieces

_V = pieces()
PATCH_NAME = "triton-mla-k2-decode"


@dataclass
class K2TritonMLADecodeMetadata(_V.MLACommonDecodeMetadata):
    q_len: int = 1  # uniform query tokens per decode request (1 + speculative tokens)
    context_bound: int = 0  # context the split count is chosen for (not device data)


class K2TritonMLAMetadataBuilder(_V.MLACommonMetadataBuilder):
    query_len_support: ClassVar = _V.QueryLenSupport.UNIFORM
    _cudagraph_support: ClassVar = _V.AttentionCGSupport.UNIFORM_BATCH

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device, *args, **kwargs):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device, *args, **kwargs)
        self._max_model_len = int(vllm_config.model_config.max_model_len)
        self._max_graph_tokens = max_graph_tokens(vllm_config)

    def _build_decode(
        self,
        block_table_tensor,
        seq_lens_device,
        max_seq_len,
        query_start_loc_cpu,
        query_start_loc_device,
        num_decode_tokens,
        dcp_tot_seq_lens_device,
        **version_specific,  # 0.32: max_query_len (vLLM calls with keywords)
    ):
        num_decodes = max(1, query_start_loc_cpu.numel() - 1)
        q_len = max(1, num_decode_tokens // num_decodes)  # uniform: vLLM split the batch so
        graphable = num_decode_tokens <= self._max_graph_tokens
        return K2TritonMLADecodeMetadata(
            block_table=block_table_tensor,
            seq_lens=seq_lens_device,
            dcp_tot_seq_lens=dcp_tot_seq_lens_device,
            q_len=q_len,
            context_bound=self._max_model_len if graphable else int(max_seq_len),
        )


_WORKSPACES: dict[torch.device, launcher.Workspace] = {}
_RESERVED: set[tuple] = set()
MAX_Q_LEN = 16  # 1 + speculative tokens the workspace is reserved for up front


def shared_workspace(device: torch.device, heads: int, q_len: int) -> launcher.Workspace:
    """One split workspace per device for all layers, reserved on first use for the worst
    batch of every q_len up to MAX_Q_LEN, so it never grows (and never moves under a
    captured CUDA graph) afterwards; a larger q_len grows it once, before its capture."""
    ws = _WORKSPACES.get(device)
    if ws is None:
        ws = _WORKSPACES[device] = launcher.Workspace(device)
    key = (device, heads, max(q_len, MAX_Q_LEN))
    if key not in _RESERVED:
        limits = launcher.device_limits(device.index or 0)
        ws.reserve(max(launcher.Workspace.bound(heads, ql, limits, max_batch=1 << 16) for ql in range(1, key[2] + 1)))
        _RESERVED.add(key)
    return ws


class K2TritonMLAImpl(_V.TritonMLAImpl):
    def __init__(
        self,
        num_heads,
        head_size,
        scale,
        num_kv_heads,
        alibi_slopes,
        sliding_window,
        kv_cache_dtype,
        logits_soft_cap,
        attn_type,
        kv_sharing_target_layer_name,
        **mla_args,
    ) -> None:
        # TritonMLAImpl.__init__ refuses fp8 KV; run the common init and its other checks.
        _V.MLACommonImpl.__init__(
            self,
            num_heads,
            head_size,
            scale,
            num_kv_heads,
            alibi_slopes,
            sliding_window,
            kv_cache_dtype,
            logits_soft_cap,
            attn_type,
            kv_sharing_target_layer_name,
            **mla_args,
        )
        if any([alibi_slopes, sliding_window, logits_soft_cap]):
            raise NotImplementedError("K2 TritonMLA does not support alibi_slopes, sliding_window, logits_soft_cap")
        if attn_type != _V.AttentionType.DECODER:
            raise NotImplementedError("K2 TritonMLA implements decoder self-attention only")
        if kv_cache_dtype.startswith("fp8") and kv_cache_dtype not in ("fp8", "fp8_e4m3"):
            raise NotImplementedError(f"K2 TritonMLA supports fp8-e4m3 KV only, not {kv_cache_dtype}")
        # The kernel dequantises the KV itself; keep the query in the model dtype.
        self.supports_quant_query_input = False

    def forward_mqa(self, q, kv_c_and_k_pe_cache, attn_metadata, layer):
        assert kv_c_and_k_pe_cache.numel() > 0
        decode = attn_metadata.decode
        assert decode is not None
        if type(q) is tuple:
            q = torch.cat(q, dim=-1)
        q_len = getattr(decode, "q_len", 1)
        fp8 = self.kv_cache_dtype.startswith("fp8")
        if fp8 and kv_c_and_k_pe_cache.dtype != torch.float8_e4m3fn:
            kv_c_and_k_pe_cache = kv_c_and_k_pe_cache.view(torch.float8_e4m3fn)
        out, lse = launcher.mla_decode(
            q,
            kv_c_and_k_pe_cache,
            decode.block_table,
            decode.seq_lens,
            self.scale,
            q_len=q_len,
            k_scale=layer._k_scale if fp8 else None,
            context=getattr(decode, "context_bound", 0) or None,
            workspace=shared_workspace(q.device, q.shape[1], q_len),
        )
        return out, lse


class K2TritonMLABackend(_V.TritonMLABackend):
    supported_kv_cache_dtypes: ClassVar[list] = ["auto", "bfloat16", "fp8", "fp8_e4m3"]

    @staticmethod
    def get_name() -> str:
        return "TRITON_MLA"  # same name: selection, logs and configs keep working

    @staticmethod
    def get_impl_cls():
        return K2TritonMLAImpl if _ours() else _V.TritonMLAImpl

    @staticmethod
    def get_builder_cls():
        return K2TritonMLAMetadataBuilder if _ours() else _V.TritonMLABackend.get_builder_cls()


def _ours() -> bool:
    """Our impl and builder, or vLLM's: for a model of the family whose self-check passed.
    vLLM asks for both under the engine's current config (model build, KV-cache set-up)."""
    return scope.acts(PATCH_NAME, None) and not selfcheck.failure()
