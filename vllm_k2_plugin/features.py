"""Which modules declare patches. Importing one registers its patches; it must not
import vLLM at import time (only its apply() functions may)."""

from __future__ import annotations

import importlib

#: Every feature's patch declarations, in application order.
FEATURE_PATCH_MODULES = (
    "vllm_k2_plugin.models.config_registry",
    "vllm_k2_plugin.cpu.rope_inplace",
    "vllm_k2_plugin.cpu.kernel_rebind",
    "vllm_k2_plugin.cpu.seeded_sampling",
    "vllm_k2_plugin.cpu.rejection_expand",
    "vllm_k2_plugin.models.eagle3_target",
    "vllm_k2_plugin.models.eagle3_allowlist",
    "vllm_k2_plugin.models.eagle3_preflight",
    "vllm_k2_plugin.models.eagle3_draft_registry",
    "vllm_k2_plugin.gguf.patch",
    "vllm_k2_plugin.speculators_compat.patch",
    "vllm_k2_plugin.mla.patch",
    "vllm_k2_plugin.spec_guard.patch",
    "vllm_k2_plugin.spec_guard.drafter_off",
    "vllm_k2_plugin.spec_guard.drafter_off_v2",
    "vllm_k2_plugin.spec_guard.decode_graphs_v2",
    "vllm_k2_plugin.spec_guard.zero_draft_sampling",
    "vllm_k2_plugin.spec_guard.no_draft_rpc",
    "vllm_k2_plugin.spec_guard.decode_graphs",
    "vllm_k2_plugin.async_spec.patch",
    "vllm_k2_plugin.draft_graph.patch",
    "vllm_k2_plugin.draft_graph.drafter_backend",
    "vllm_k2_plugin.draft_attention.patch",
    "vllm_k2_plugin.draft_attention.segments",
    "vllm_k2_plugin.draft_attention.tile",
    "vllm_k2_plugin.moe_verify.patch",
    "vllm_k2_plugin.gguf_moe.patch",
    "vllm_k2_plugin.rope_cache.patch",
    "vllm_k2_plugin.comm.patch",
)


#: Features whose patches change what the GPU runs or how fast: they act only for the models they
#: were measured on (patching/scope.py), every patched code path asks ``scope.acts``.
MODEL_SCOPED_FEATURES = (
    "spec_guard",
    "mla",
    "draft_graph",
    "draft_attention",
    "moe_verify",
    "gguf_moe",
    "rope_cache",
    "async_spec",
    "comm",
)


def load_feature_patches(extra: tuple[str, ...] = ()) -> None:
    for name in FEATURE_PATCH_MODULES + tuple(extra):
        importlib.import_module(name)
