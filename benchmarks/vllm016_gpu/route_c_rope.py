"""Route C only: give vLLM 0.16's rotary embedding the cost of 0.16's own CUDA op.

On route C (0.16's Python on 0.20's kernels) 0.16's ``forward_cuda`` hands its bf16 cos/sin
cache to 0.20's ``rotary_embedding``, which converts a half-precision cache to float32 on every
call (one cast kernel per call; for the slice's drafter 6 per EAGLE-3 step, 0.30 ms on the
H200, benchmarks/results/vllm016_h200/). 0.16's own op reads the cache as the query's dtype and
has no such cast, so this is route C's cost, not 0.16's. Here, for every engine of a route-C
call that asks for it (stock and ours alike), the module holds a float32 copy made once and hands
that to the op: the cast kernel disappears, as with 0.16's op. The arithmetic stays 0.20's
(float32 rotation; 0.16's op rotates in the query's dtype). The copy and the per-module bit
check are those of the product's ``rope-float32-cache`` (vLLM >= 0.20), reused as they are.
Loaded by ``gpu_engine_e2e.py`` through VLLM_K2_EXTRA_PATCH_MODULES (case key ``route_c_rope``).
"""

from vllm_k2_plugin.patching import REGISTRY
from vllm_k2_plugin.rope_cache import patch as rope


def _float_cache(ctx) -> None:
    import importlib

    ctx.target()
    base = importlib.import_module(rope.MODULE).RotaryEmbedding
    ctx.wrap(base, "forward_cuda", rope._wrap_forward_cuda)
    ctx.wrap(base, "__init__", lambda original: rope._wrap_init(original, base))


REGISTRY.patch(
    name="bench-route-c-rope-as-016",
    feature="benchmarks",
    target=f"{rope.MODULE}:RotaryEmbedding.forward_cuda",
    applies_to=">=0.16,<0.17",
    only_if=rope._no_cuda,
    upstream="n/a (benchmark: route C's kernels are 0.20's)",
    why="route C's rotary op (0.20's) casts 0.16's bf16 cache per call; 0.16's own op does not",
    remove_when="never (route C only)",
)(_float_cache)
