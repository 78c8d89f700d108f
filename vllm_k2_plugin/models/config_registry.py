"""Let vLLM read `model_type: kimi_k2` configs without remote code.

Kimi-K2 checkpoints (and EAGLE-3 drafts trained for them) declare
``model_type: "kimi_k2"``; the class behind it is transformers' DeepseekV3Config.
vLLM 0.16 does not know the name, so such a config only loads through
``trust_remote_code`` + ``auto_map``, which drafts often lack.
"""

from __future__ import annotations

from ..patching import REGISTRY, PatchContext

TARGET = "vllm.transformers_utils.config:_CONFIG_REGISTRY"


def _upstream_has_it() -> bool:
    from vllm.transformers_utils.config import _CONFIG_REGISTRY

    return "kimi_k2" in _CONFIG_REGISTRY


@REGISTRY.patch(
    name="kimi-k2-config-registry",
    feature="models",
    target=TARGET,
    applies_to=">=0.16,<0.35",
    already_upstream=_upstream_has_it,
    upstream="vllm-project/vllm: kimi_k2 in _CONFIG_REGISTRY (present by 0.32)",
    why="configs with model_type kimi_k2 (K2 targets, K2/K2.5 drafts) fail to load without remote code",
    remove_when="the minimum supported vLLM registers kimi_k2 itself",
    patch_file="0001-kimi-k2-config-registry.patch",
)
def _apply(ctx: PatchContext) -> None:
    from transformers import DeepseekV3Config

    registry = ctx.target()
    ctx.replace_item(registry, "kimi_k2", DeepseekV3Config)
