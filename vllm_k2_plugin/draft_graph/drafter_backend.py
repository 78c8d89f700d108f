"""Patch ``draft-attention-triton``: an EAGLE drafter of an MLA target gets TRITON_ATTN for
its attention layers where no backend was chosen.

Why: the draft step replays as one graph only when the drafter's attention metadata is
replay-safe (TRITON_ATTN, graphs.py). vLLM's priority list gives a Llama-style drafter
FLASH_ATTN first on sm_90 and sm_120 (FLASHINFER first on sm_100), so on our users' GPUs
the draft step would stay on piecewise graphs. ``--attention-backend`` cannot pick it: it
is global and the target's MLA layers need an MLA backend. Only non-MLA decoder layers of
an engine whose target is MLA and whose speculation is EAGLE are touched (that is the
drafter), and only where the draft step can be captured (CUDA graphs on); a backend the
user chose (``selected_backend``) is always kept, and where TRITON_ATTN does not fit the
layer, vLLM's own pick stays (logged).
"""

from __future__ import annotations

from typing import Any

from ..log import get_logger
from ..patching import REGISTRY, RUNNER_V1, PatchContext, scope
from .patch import _not_wanted, _upstream_graphs_drafts, uses_graphs

TARGET = "vllm.platforms.cuda:CudaPlatformBase.get_attn_backend_cls"


def _logger():
    return get_logger("draft_graph")


def drafter_of_mla_target(engine_config: Any, selector_config: Any) -> bool:
    """True for the attention layers of an EAGLE drafter whose target uses MLA."""
    if engine_config is None or selector_config.use_mla:
        return False
    if getattr(selector_config, "attn_type", "decoder") != "decoder":
        return False
    spec = engine_config.speculative_config
    if spec is None or not spec.use_eagle():
        return False
    target = spec.target_model_config or engine_config.model_config
    return bool(getattr(target, "use_mla", False))


def _wrap_get_attn_backend_cls(pick):
    """``pick``: the classmethod's function, called with the platform class vLLM uses."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from ..mla.vllm_adapter import current_engine_config

    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, *args, **kwargs):
        engine = current_engine_config()
        if (
            selected_backend is not None
            or not drafter_of_mla_target(engine, attn_selector_config)
            or not uses_graphs(engine, engine.speculative_config)  # eager: no draft graph to gain
            or not scope.acts("draft-attention-triton", engine)
        ):
            return pick(cls, selected_backend, attn_selector_config, *args, **kwargs)
        default = pick(cls, None, attn_selector_config, *args, **kwargs)
        try:
            triton = pick(cls, AttentionBackendEnum.TRITON_ATTN, attn_selector_config, *args, **kwargs)
        except ValueError as e:
            _logger().warning(
                "vllm-k2: EAGLE drafter attention keeps %s (TRITON_ATTN does not fit it: %s); "
                "the draft step stays on piecewise graphs",
                default,
                e,
            )
            return default
        if triton != default:
            _logger().info(
                "vllm-k2: EAGLE drafter attention: TRITON_ATTN instead of vLLM's pick %s "
                "(the draft step replays as one CUDA graph only with TRITON_ATTN)",
                default,
            )
        return triton

    return get_attn_backend_cls


def _no_cuda_or_not_wanted() -> str | None:
    from ..platform import no_cuda

    return no_cuda("a CUDA platform's backend choice") or _not_wanted()


@REGISTRY.patch(
    name="draft-attention-triton",
    feature="draft_graph",
    target=TARGET,
    applies_to=">=0.16,<0.35",
    model_runner=RUNNER_V1,
    only_if=_no_cuda_or_not_wanted,
    already_upstream=_upstream_graphs_drafts,
    upstream="none yet (companion of draft-step-graph: vLLM graphs the drafter's passes piecewise only)",
    why="vLLM gives a Llama-style drafter FLASH_ATTN on sm_90/sm_120, whose draft step draft-step-graph cannot replay",
    remove_when="draft-step-graph retires (vLLM captures the draft passes in full graphs itself)",
)
def _apply(ctx: PatchContext) -> None:
    import importlib

    ctx.target()
    owner = importlib.import_module(TARGET.partition(":")[0]).CudaPlatformBase
    ctx.wrap(owner, "get_attn_backend_cls", _wrap_get_attn_backend_cls)
