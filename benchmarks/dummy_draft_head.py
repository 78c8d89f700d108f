"""Bench-only patch: a dummy-loaded EAGLE-3 drafter keeps its own lm_head.

vLLM gives an EAGLE-3 drafter the target's lm_head when its checkpoint has none, and a
dummy load (``load_format="dummy"``) reads no checkpoint: the slice's drafter then ran the
target's full-vocabulary head (20,480 rows at TP 8) in each of its k passes, where a
trained K2.5 drafter has its own head over its draft vocabulary (32,000 / 8 = 4,000 rows).
Loaded into the engine's processes by ``gpu_engine_e2e.py`` (VLLM_K2_EXTRA_PATCH_MODULES)
for dummy EAGLE-3 cases only.
"""

from vllm_k2_plugin.patching import REGISTRY

EAGLE3 = "vllm.model_executor.models.llama_eagle3:Eagle3LlamaForCausalLM"


def _own_head(ctx):
    ctx.replace(ctx.target(), "has_own_lm_head", True)


REGISTRY.patch(
    name="bench-dummy-drafter-own-lm-head",
    feature="benchmarks",
    target=EAGLE3,
    applies_to=">=0.16",
    upstream="n/a (benchmark fixture)",
    why="a dummy-loaded drafter must run its own draft-vocabulary head, as a trained one does",
    remove_when="never (benchmark only)",
)(_own_head)
