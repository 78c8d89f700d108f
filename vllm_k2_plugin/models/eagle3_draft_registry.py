"""Register the Kimi-K2.5 EAGLE-3 speculator class with vLLM's ModelRegistry.

``Eagle3KimiK25ForCausalLM`` is the architecture name our exports carry. On vLLM
0.16 and 0.20 it is our class (k2p_eagle3_draft); where upstream's Llama EAGLE-3 class
already does what ours adds (0.32: target hidden size from text_config, nested aux
ids, AutoWeightsLoader), the name points at upstream's class. The stock
names ``LlamaForCausalLMEagle3`` / ``Eagle3LlamaForCausalLM`` (legacy and
speculators checkpoints) are routed to our class on 0.16 too: it is a strict
superset of the stock class, so other Llama EAGLE-3 drafters load as before.
"""

from __future__ import annotations

from vllm_k2_plugin.patching import REGISTRY, PatchContext

ARCH = "Eagle3KimiK25ForCausalLM"
OURS = "vllm_k2_plugin.models.k2p_eagle3_draft:Eagle3KimiK25ForCausalLM"
UPSTREAM = "vllm.model_executor.models.llama_eagle3:Eagle3LlamaForCausalLM"
STOCK_NAMES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")


def _upstream_class_is_enough() -> bool:
    import inspect

    from vllm.model_executor.models import llama_eagle3

    return "get_total_num_hidden_layers" in inspect.getsource(llama_eagle3)


@REGISTRY.patch(
    name="kimi-k25-eagle3-draft-class",
    feature="eagle3",
    target="vllm.model_executor.models.registry:ModelRegistry",
    applies_to=">=0.16,<0.35",
    upstream="none: names our drafter class; upstream's Llama EAGLE-3 class covers it in 0.32 (not 0.20)",
    why="0.16's Llama EAGLE-3 class ignores the target's text_config hidden size and loads bad d2t silently",
    remove_when="the minimum supported vLLM is one whose class is enough (0.32 is; keep the alias for exports)",
)
def _apply(ctx: PatchContext) -> None:
    registry = ctx.target()
    if _upstream_class_is_enough():
        entries = {ARCH: UPSTREAM}
    else:
        entries = {ARCH: OURS, **{name: OURS for name in STOCK_NAMES}}
    for name, cls_path in entries.items():
        ctx.replace_item(registry.models, name, _lazy(cls_path))


def _lazy(cls_path: str):
    from vllm.model_executor.models.registry import _LazyRegisteredModel

    module, cls = cls_path.split(":")
    return _LazyRegisteredModel(module_name=module, class_name=cls)


MLA_ARCHS = ("Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM")
MLA_OURS = "vllm_k2_plugin.models.k2p_eagle3_mla_draft:Eagle3KimiK25MLAForCausalLM"


def _upstream_builds_mla_drafters() -> bool:
    from vllm.model_executor.models.registry import ModelRegistry

    return all(
        name in ModelRegistry.get_supported_archs() and ModelRegistry.models[name].module_name.startswith("vllm.")
        for name in MLA_ARCHS
    )


@REGISTRY.patch(
    name="kimi-eagle3-mla-draft-class",
    feature="eagle3",
    target="vllm.model_executor.models.registry:ModelRegistry",
    applies_to=">=0.16,<0.18",
    why_range_ends="vLLM 0.18 ships its own class for these drafters (vLLM PR #36361)",
    already_upstream=_upstream_builds_mla_drafters,
    upstream="vllm-project/vllm#36361 (K2.5 MLA-based EAGLE-3, vLLM 0.18)",
    why="vLLM 0.16 has no class for EAGLE-3 drafters with MLA attention (lightseekorg's Kimi MLA drafters)",
    remove_when="the minimum supported vLLM is 0.18",
)
def _apply_mla(ctx: PatchContext) -> None:
    registry = ctx.target()
    for name in MLA_ARCHS:
        ctx.replace_item(registry.models, name, _lazy(MLA_OURS))
