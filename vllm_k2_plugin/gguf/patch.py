"""Register the DeepSeek/Kimi GGUF loader with vLLM's in-tree GGUF support."""

from __future__ import annotations

import importlib.util

from vllm_k2_plugin.patching import REGISTRY, PatchContext

LOADERS = "vllm.model_executor.model_loader"
#: Where both GGUF patches end: what they change left vLLM with its in-tree GGUF.
GGUF_LEFT = "GGUF left vLLM's tree in 0.24 (vllm-project/vllm#39612; vllm-gguf-plugin serves it from then)"


def _no_in_tree_gguf() -> bool:
    # vLLM >= 0.24 moved GGUF out of tree (vllm-project/vllm#39612, vllm-gguf-plugin)
    return importlib.util.find_spec(f"{LOADERS}.gguf_loader") is None


def _unquantized_moe_when_skipped(original):
    def get_quant_method(self, layer, prefix):
        from vllm.model_executor.layers.fused_moe import FusedMoE
        from vllm.model_executor.layers.quantization.gguf import is_layer_skipped_gguf

        if isinstance(layer, FusedMoE) and is_layer_skipped_gguf(
            prefix, self.unquantized_modules, self.packed_modules_mapping
        ):
            from vllm.model_executor.layers.fused_moe.layer import UnquantizedFusedMoEMethod

            return UnquantizedFusedMoEMethod(layer.moe_config)
        return original(self, layer, prefix)

    return get_quant_method


@REGISTRY.patch(
    name="gguf-deepseek-force-dequant",
    feature="gguf",
    target=f"{LOADERS}:_LOAD_FORMAT_TO_MODEL_LOADER",
    applies_to=">=0.16,<0.24",
    why_range_ends=GGUF_LEFT,
    already_upstream=_no_in_tree_gguf,
    upstream="vllm-project/vllm#39583 (GGUF+MLA garbled); GGUF left vLLM in #39612 (>= 0.24)",
    why="Kimi/DeepSeek MLA GGUFs (kimi_k2 types, split attn_k_b/attn_v_b, shards) do not load on 0.16",
    remove_when="minimum supported vLLM >= 0.24 (then vllm-gguf-plugin owns GGUF)",
)
def _apply(ctx: PatchContext) -> None:
    from vllm.model_executor.layers.quantization.gguf import GGUFConfig

    from .k2p_gguf_loader import K2GGUFModelLoader

    ctx.replace_item(ctx.target(), "gguf", K2GGUFModelLoader)
    ctx.wrap(GGUFConfig, "get_quant_method", _unquantized_moe_when_skipped)


def _gguf_skips_speculators_probe(original):
    def maybe_override_with_speculators(
        model, tokenizer, trust_remote_code, revision=None, vllm_speculative_config=None, **kwargs
    ):
        from vllm.transformers_utils.gguf_utils import check_gguf_file

        if check_gguf_file(model):  # a GGUF is never a speculators checkpoint
            return model, tokenizer, vllm_speculative_config
        return original(model, tokenizer, trust_remote_code, revision, vllm_speculative_config, **kwargs)

    return maybe_override_with_speculators


@REGISTRY.patch(
    name="gguf-skip-speculators-probe",
    feature="gguf",
    target="vllm.engine.arg_utils:maybe_override_with_speculators",
    applies_to=">=0.16,<0.24",
    why_range_ends=GGUF_LEFT,
    already_upstream=_no_in_tree_gguf,
    upstream="none found: vLLM 0.16 parses the GGUF with transformers to look for speculators_config",
    why="transformers cannot parse deepseek2 GGUFs, so `vllm serve x.gguf --hf-config-path ...` crashes at config time",
    remove_when="minimum supported vLLM >= 0.24 (GGUF out of tree)",
)
def _apply_probe(ctx: PatchContext) -> None:
    from vllm.engine import arg_utils

    ctx.target()  # names this patch if the function moved
    ctx.wrap(arg_utils, "maybe_override_with_speculators", _gguf_skips_speculators_probe)
