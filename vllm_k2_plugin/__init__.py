"""vllm-k2-plugin: serve Kimi-K2.5 with EAGLE-3 speculative decoding on vLLM 0.16+.

vLLM calls :func:`register` (entry point group ``vllm.general_plugins``) in every
process it starts: the API server / ``LLM`` process, the engine core, each worker
and the model-inspection subprocess. Nothing else happens at import time.
"""

from __future__ import annotations

__version__ = "0.1.0"

_LOADS = 0  # how many times register() ran in this process (idempotency is tested)


def register() -> None:
    """Entry point: apply every patch that fits the installed vLLM.

    Never breaks vLLM start-up because of the plugin itself; only
    ``VLLM_K2_STRICT=1`` turns a failed patch into a start-up failure.
    """
    global _LOADS
    from .settings import Settings

    settings = Settings.from_env()
    if settings.disabled:
        return
    _LOADS += 1
    from .patching import REGISTRY, StrictModeAbort
    from .patching.registry import logger

    try:
        from .features import load_feature_patches
        from .threads import caller_thread_only

        # the probes' torch ops run in vLLM's API-server process too, which forks the engine core
        with caller_thread_only():
            load_feature_patches(settings.extra_patch_modules)
            REGISTRY.apply_all(disabled=settings.disabled_patches, strict=settings.strict)
    except StrictModeAbort:
        raise
    except Exception as e:  # noqa: BLE001 - the plugin must not take vLLM down
        if settings.strict:
            raise StrictModeAbort(f"vllm-k2 (VLLM_K2_STRICT=1): {type(e).__name__}: {e}") from e
        logger().exception("vllm-k2: plugin failed to load; vLLM runs unpatched")
    finally:
        if settings.trace_dir:
            from .trace import write_trace

            write_trace(settings.trace_dir, _LOADS)
