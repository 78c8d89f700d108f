"""Patch ``gguf-moe-grouped-small-batches``: GGUF-quantized routed experts at decode and verify
batch sizes read each touched expert once for all the tokens routed to it.

Why (benchmarks/results/quant_moe): up to 64 tokens vLLM's GGUF MoE gives every (token,
expert) pair its own pass over that expert's weights (``ggml_moe_a8_vec``), so its time
grows with the tokens even when they share experts; measured on an H100 at Kimi-K2.5's TP-8
expert shapes it runs at 5-24x its memory floor (Q4_K: 75 us for 1 token, 204 us for 4).

How: vLLM's ``fused_moe_gguf`` op is replaced by one that picks, per call, our Triton path
(``ops.fused_moe_gguf_grouped``) or vLLM's own function. Ours runs only for expert layouts whose
start-up check passed and only at token counts where it was measured faster (choice.py); the
check and the timings run once per layout, as vLLM finishes loading the first layer of it, on
that layer's own weights, and are logged.
"""

from __future__ import annotations

import importlib

from ..log import get_logger
from ..patching import REGISTRY, PatchContext, scope
from ..platform import no_cuda
from ..settings import gguf_moe_mode

MODULE = "vllm.model_executor.layers.quantization.gguf"
PATCH_NAME = "gguf-moe-grouped-small-batches"
OP_NAME = "k2_fused_moe_gguf"

logger = get_logger("gguf_moe")

#: (gate+up type, down type, experts, 2N, hidden) -> the start-up verdict for that layout
CHOICES: dict = {}  # values: choice.Choice (imported with torch, at load time)


def layout(w1, w2, type1: int, type2: int) -> tuple[int, int, int, int, int]:
    return int(type1), int(type2), int(w1.shape[0]), int(w1.shape[1]), int(w2.shape[1])


def _ours(x, w1, w2, topk_weights, topk_ids, type1, type2):
    from .ops import fused_moe_gguf_grouped

    return fused_moe_gguf_grouped(x, w1, w2, topk_weights, topk_ids, type1, type2)


def _vllm(x, w1, w2, topk_weights, topk_ids, type1, type2):
    return importlib.import_module(MODULE)._fused_moe_gguf(x, w1, w2, topk_weights, topk_ids, type1, type2, "silu")


def _dispatch(x, w1, w2, topk_weights, topk_ids, qweight_type: int, qweight_type2: int, activation: str):
    choice = CHOICES.get(layout(w1, w2, qweight_type, qweight_type2))
    if choice is not None and str(activation).lower().endswith("silu") and choice.use_ours(x.shape[0]):
        return _ours(x, w1, w2, topk_weights, topk_ids, qweight_type, qweight_type2)
    return importlib.import_module(MODULE)._fused_moe_gguf(
        x, w1, w2, topk_weights, topk_ids, qweight_type, qweight_type2, activation
    )


def _dispatch_fake(x, w1, w2, topk_weights, topk_ids, qweight_type: int, qweight_type2: int, activation: str):
    import torch

    return torch.empty_like(x)


def register_op():
    """Our dispatcher as a torch custom op beside vLLM's (torch.compile sees an opaque call, as
    with vLLM's own op), registered once per process with vLLM's helper."""
    import torch

    if not hasattr(torch.ops.vllm, OP_NAME):
        # the op schema is read from real annotations (this module's are strings)
        types = {
            "x": torch.Tensor,
            "w1": torch.Tensor,
            "w2": torch.Tensor,
            "topk_weights": torch.Tensor,
            "topk_ids": torch.Tensor,
            "qweight_type": int,
            "qweight_type2": int,
            "activation": str,
            "return": torch.Tensor,
        }
        _dispatch.__annotations__ = dict(types)
        _dispatch_fake.__annotations__ = dict(types)
        importlib.import_module(MODULE).direct_register_custom_op(
            op_name=OP_NAME, op_func=_dispatch, fake_impl=_dispatch_fake
        )
    return getattr(torch.ops.vllm, OP_NAME)


def choose_for_layer(layer) -> None:
    """Check and time once per expert layout (on the first layer of that layout)."""
    import torch
    from vllm import _custom_ops as ops

    from .choice import choose

    w1, w2 = layer.w13_qweight, layer.w2_qweight
    t1, t2 = int(layer.w13_qweight_type.weight_type), int(layer.w2_qweight_type.weight_type)
    key = layout(w1, w2, t1, t2)
    if key in CHOICES:
        return
    top_k = int(getattr(layer, "top_k", 8))
    CHOICES[key] = choose(
        w1.data,
        w2.data,
        t1,
        t2,
        top_k,
        _vllm,
        _ours,
        lambda w, t, rows, cols: ops.ggml_dequantize(w, t, rows, cols, None),
        always=gguf_moe_mode() == "always",
    )
    torch.cuda.empty_cache()  # before vLLM measures memory for its KV cache
    logger.info(
        "grouped GGUF MoE, experts %s/%s %s: %s", _type_name(t1), _type_name(t2), key[2:], CHOICES[key].summary()
    )


def _type_name(t: int) -> str:
    import gguf

    return gguf.GGMLQuantizationType(t).name


def _wrap_after_loading(original):
    # vLLM's worker loads the model under its current config: the model gate can ask it here
    def process_weights_after_loading(self, layer):
        out = original(self, layer)
        if scope.acts(PATCH_NAME, None):
            choose_for_layer(layer)
        return out

    return process_weights_after_loading


def _upstream_groups_small_batches() -> bool:
    """Ask vLLM's GGUF MoE which kernel it calls for 4 tokens x top 2 of 8 Q4_K experts: its
    custom ops are stood in for by recorders during the call (nothing runs). Upstream groups
    small batches itself unless it calls the per-pair ``ggml_moe_a8_vec``."""
    import gguf
    import torch

    mod = importlib.import_module(MODULE)
    real = mod.ops

    class Called(Exception):
        pass

    class Recorder:
        def __getattr__(self, name):
            if name.startswith("ggml_"):

                def record(*args, **kwargs):
                    raise Called(name)

                return record
            return getattr(real, name)

    q4k = int(gguf.GGMLQuantizationType.Q4_K)
    x = torch.zeros((4, 256), dtype=torch.bfloat16)
    w1, w2 = torch.zeros((8, 64, 144), dtype=torch.uint8), torch.zeros((8, 256, 144), dtype=torch.uint8)
    ids = (torch.arange(8, dtype=torch.int32) % 8).view(4, 2)
    mod.ops = Recorder()
    try:
        mod._fused_moe_gguf(x, w1, w2, torch.full((4, 2), 0.5), ids, q4k, q4k, "silu")
    except Called as c:
        return c.args[0] != "ggml_moe_a8_vec"
    finally:
        mod.ops = real
    return True  # no per-pair kernel was called: upstream does something else


@REGISTRY.patch(
    name=PATCH_NAME,
    feature="gguf_moe",
    target=f"{MODULE}:fused_moe_gguf",
    applies_to=">=0.16,<0.24",
    why_range_ends="vllm.model_executor.layers.quantization.gguf left vLLM in 0.24 (vllm-project/vllm#39612)",
    already_upstream=_upstream_groups_small_batches,
    only_if=lambda: no_cuda("the GGUF MoE kernels are CUDA kernels"),
    upstream="none yet (vLLM's GGUF MoE runs one pass per (token, expert) pair up to 64 tokens)",
    why="a verify step's tokens that share GGUF experts each stream those experts' weights again",
    remove_when="vLLM's GGUF MoE reads each touched expert once for small batches (the probe sees no per-pair kernel)",
)
def _apply(ctx: PatchContext) -> None:
    ctx.target()
    gguf_moe_mode()  # a bad VLLM_K2_GGUF_MOE fails the patch here, not the model load
    mod = importlib.import_module(MODULE)
    ctx.replace(mod, "fused_moe_gguf", register_op())
    ctx.wrap(mod.GGUFMoEMethod, "process_weights_after_loading", _wrap_after_loading)
