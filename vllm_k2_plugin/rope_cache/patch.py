"""Patch ``rope-float32-cache``: vLLM's rotary embedding hands its CUDA op a float32 copy of
its bf16/fp16 cos/sin cache, made once at construction.

Why: vLLM 0.20's ``_C::rotary_embedding`` converts a half-precision cache to float32 inside
the op on every call: for a drafter with K2.5's 262,144 positions x 128 that is one 97 µs
cast kernel per draft pass on an H200, for a rotation that takes 1.6 µs
(benchmarks/results/rope_cache_h200.md). The copy is ``cache.float()``, the values the op
would compute with anyway, so outputs are bit-identical; every new module checks that
once against the op on its own device and keeps stock behaviour if not. Costs twice the
cache's memory (134 MB for K2.5's drafter). Modules whose class replaces ``forward_cuda``
(DeepSeek's scaling rope runs the native path) and flashinfer's path are left alone.
"""

from __future__ import annotations

from ..log import get_logger
from ..patching import REGISTRY, PatchContext, scope
from ..platform import no_cuda

MODULE = "vllm.model_executor.layers.rotary_embedding.base"
PATCH_NAME = "rope-float32-cache"
ATTR = "_vllm_k2_cos_sin_f32"
SOURCE = "_vllm_k2_cos_sin_source"  # the cache the copy was made from: a replaced cache means stock again
_HALF = ("torch.bfloat16", "torch.float16")


def _ops():
    from vllm import _custom_ops

    return _custom_ops


def _float_copy_if_identical(module):
    """cache.float() if the CUDA op gives bit-identical q/k with it, else None."""
    import torch

    cache = module.cos_sin_cache
    f32 = cache.float()
    pos = torch.tensor([0, cache.shape[0] - 1], device=cache.device)
    gen = torch.Generator(device=cache.device).manual_seed(0)
    q = torch.randn(2, module.head_size, generator=gen, device=cache.device).to(cache.dtype)
    k = torch.randn(2, module.head_size, generator=gen, device=cache.device).to(cache.dtype)
    out = []
    for c in (cache, f32):
        qq, kk = q.clone(), k.clone()
        _ops().rotary_embedding(pos, qq, kk, module.head_size, c, module.is_neox_style)
        out.append((qq, kk))
    (qa, ka), (qb, kb) = out
    return f32 if torch.equal(qa, qb) and torch.equal(ka, kb) else None


def _attach(module, base) -> None:
    cache = getattr(module, "cos_sin_cache", None)
    if (
        cache is None
        or str(cache.dtype) not in _HALF
        or cache.device.type != "cuda"
        or getattr(module, "use_flashinfer", False)
        or type(module).forward_cuda is not base.forward_cuda
        or not scope.acts(PATCH_NAME, None)  # built under the engine's current config
    ):
        return
    try:
        f32 = _float_copy_if_identical(module)
    except Exception as e:  # noqa: BLE001 - an op that refuses a float32 cache: stock path, said once
        f32, why = None, f"{type(e).__name__}: {e}"
    else:
        why = "different q/k"
    if f32 is None:
        logger().warning(
            "vllm-k2: rope-float32-cache: the CUDA rotary op with a float32 copy of %s's cache on %s: %s; "
            "this module keeps vLLM's path",
            type(module).__name__,
            cache.device,
            why,
        )
        return
    module.register_buffer(ATTR, f32, persistent=False)
    object.__setattr__(module, SOURCE, cache)  # a plain reference, not a second buffer


def _wrap_init(original, base):
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        _attach(self, base)

    return __init__


def _wrap_forward_cuda(original):
    def forward_cuda(self, positions, query, key=None):
        f32 = getattr(self, ATTR, None)
        if (
            f32 is None
            or getattr(self, SOURCE, None) is not self.cos_sin_cache
            or query.dtype != self.cos_sin_cache.dtype
            or f32.device != query.device
        ):
            return original(self, positions, query, key)
        # in place on query and key, as stock; the op computes with float32 values anyway
        _ops().rotary_embedding(positions, query, key, self.head_size, f32, self.is_neox_style)
        return query, key

    return forward_cuda


def _no_cuda() -> str | None:
    return no_cuda("the CUDA rotary op is not used")


def _upstream_hands_float_cache() -> bool:
    """A bare stock module with a bf16 cache, the CUDA op stood in for by a recorder:
    upstream has this if forward_cuda hands the op a float32 cache."""
    import importlib

    import torch

    base = importlib.import_module(MODULE).RotaryEmbedding
    ops, seen = _ops(), []
    probe = base.__new__(base)
    torch.nn.Module.__init__(probe)
    probe.head_size, probe.rotary_dim, probe.is_neox_style, probe.use_flashinfer = 8, 8, True, False
    probe.register_buffer("cos_sin_cache", torch.zeros(4, 8, dtype=torch.bfloat16), persistent=False)
    stock = ops.rotary_embedding
    ops.rotary_embedding = lambda positions, q, k, head, cache, neox, *a: seen.append(cache.dtype)
    try:
        q = torch.zeros(1, 8, dtype=torch.bfloat16)
        base.forward_cuda(probe, torch.zeros(1, dtype=torch.long), q, q.clone())
    finally:
        ops.rotary_embedding = stock
    return seen == [torch.float32]


def logger():
    return get_logger("rope_cache")


@REGISTRY.patch(
    name=PATCH_NAME,
    patch_file="0003-rope-float32-cache.patch",  # patches/vllm-0.32.0/
    feature="rope_cache",
    target=f"{MODULE}:RotaryEmbedding.forward_cuda",
    applies_to=">=0.20,<0.35",
    only_if=_no_cuda,
    already_upstream=_upstream_hands_float_cache,
    upstream="none yet (vLLM's rotary op converts a bf16/fp16 cos/sin cache to float32 per call)",
    why="the EAGLE-3 drafter's rope re-converts its whole cache every draft pass (97 µs on an H200, K2.5 positions)",
    remove_when=(
        "forward_cuda hands the op a float32 cache (the probe sees it), or the op stops converting a half cache "
        "(benchmarks/rope_cache_probe.py shows no cast kernel)"
    ),
)
def _apply(ctx: PatchContext) -> None:
    import importlib

    ctx.target()
    base = importlib.import_module(MODULE).RotaryEmbedding
    ctx.wrap(base, "forward_cuda", _wrap_forward_cuda)
    ctx.wrap(base, "__init__", lambda original: _wrap_init(original, base))
