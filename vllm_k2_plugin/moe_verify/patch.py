"""Patch ``moe-group-tokens-by-expert``: Triton ``fused_moe`` sorts a multi-token batch by
expert (``moe_align_block_size``) instead of giving each (token, expert) pair a block.

Why: below tokens x top-k x 4 <= experts (12 tokens for K2.5's 384 experts, top 8) vLLM
skips the sort, so a verify step of 4 tokens that route to the same 8 experts streams
those experts' weights 4 times (the issue's measurement: 1.8x one token's MoE time). With
the sort, tokens of one expert share a block and its weight tiles. One token keeps the
unsorted path: its experts are distinct anyway and the sort would only add a launch.
"""

from __future__ import annotations

from ..patching import REGISTRY, PatchContext, scope

MODULE = "vllm.model_executor.layers.fused_moe.fused_moe"
#: vLLM's model runners (v1; Model Runner V2, the only one in 0.34): each present one is wrapped.
RUNNERS = ("vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu.model_runner")
PATCH_NAME = "moe-group-tokens-by-expert"
#: The model gate's answer for the model this process's runner loaded. The expert assignment
#: runs in a forward, where vLLM holds no current config: the runner asks at load_model.
_LOADED = {"acts": None}


def _acts() -> bool:
    known = _LOADED["acts"]
    return scope.acts(PATCH_NAME, None) if known is None else known


def _wrap_load_model(original):
    def load_model(self, *args, **kwargs):
        _LOADED["acts"] = scope.acts(PATCH_NAME, self.vllm_config)
        return original(self, *args, **kwargs)

    return load_model


#: Experts and top-k of the probe: K2.5's routing.
_EXPERTS, _TOP_K = 384, 8


def _wrap_prepare(original):
    import importlib

    fused_moe = importlib.import_module(MODULE)

    def prepare_expert_assignment(topk_ids, config, num_tokens, top_k_num, global_num_experts, expert_map, **kw):
        if num_tokens > 1 and _acts():
            return fused_moe.moe_align_block_size(
                topk_ids,
                config["BLOCK_SIZE_M"],
                global_num_experts,
                expert_map,
                ignore_invalid_experts=kw.get("ignore_invalid_experts", False),
            )
        return original(topk_ids, config, num_tokens, top_k_num, global_num_experts, expert_map, **kw)

    return prepare_expert_assignment


def _upstream_sorts_small_batches() -> bool:
    """Ask stock vLLM for the expert assignment of 4 tokens x top 8 of 384 experts:
    upstream sorts small batches itself if it calls its sort (``moe_align_block_size``,
    a CUDA op, stood in for by a recorder during the call) or returns sorted ids."""
    import importlib

    import torch

    fused_moe = importlib.import_module(MODULE)
    sort, calls = fused_moe.moe_align_block_size, []
    fused_moe.moe_align_block_size = lambda *a, **kw: calls.append(a) or (torch.empty(0), torch.empty(0), None)
    try:
        topk_ids = torch.arange(4 * _TOP_K, dtype=torch.int32).view(4, _TOP_K) % _EXPERTS
        sorted_ids = fused_moe._prepare_expert_assignment(topk_ids, {"BLOCK_SIZE_M": 16}, 4, _TOP_K, _EXPERTS, None)[0]
    finally:
        fused_moe.moe_align_block_size = sort
    return bool(calls) or sorted_ids is not None


@REGISTRY.patch(
    name=PATCH_NAME,
    patch_file="0004-moe-group-tokens-by-expert.patch",  # patches/vllm-0.32.0/
    feature="moe_verify",
    target=f"{MODULE}:_prepare_expert_assignment",
    applies_to=">=0.20,<0.35",
    already_upstream=_upstream_sorts_small_batches,
    upstream="none yet (fused_moe's 'naive block assignment' for tokens x top-k x 4 <= experts)",
    why="a verify step's tokens that route to the same experts each stream those experts' weights",
    remove_when="fused_moe sorts multi-token batches by expert below its sparsity threshold (the probe sees a sort)",
)
def _apply(ctx: PatchContext) -> None:
    import importlib
    import importlib.util

    ctx.target()
    ctx.wrap(importlib.import_module(MODULE), "_prepare_expert_assignment", _wrap_prepare)
    for name in RUNNERS:
        if importlib.util.find_spec(name) is None:
            continue  # a runner this release does not have; without any, the gate asks vLLM's current config
        ctx.wrap(importlib.import_module(name).GPUModelRunner, "load_model", _wrap_load_model)
