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
#: vLLM's own MLA drafter class (0.18+): without ``has_own_lm_head`` its proposer takes it for an
#: MTP model and shares the target's head (the plugin's MLA class on 0.16 inherits EAGLE3's)
EAGLE3_MLA = "vllm.model_executor.models.deepseek_eagle3:Eagle3DeepseekV2ForCausalLM"


def _own_head(ctx):
    ctx.replace(ctx.target(), "has_own_lm_head", True)


for name, target, since, drafter in (
    ("bench-dummy-drafter-own-lm-head", EAGLE3, ">=0.16", "drafter"),
    ("bench-dummy-mla-drafter-own-lm-head", EAGLE3_MLA, ">=0.18", "MLA drafter"),
):
    REGISTRY.patch(
        name=name,
        feature="benchmarks",
        target=target,
        applies_to=since,
        upstream="n/a (benchmark fixture)",
        why=f"a dummy-loaded {drafter} must run its own draft-vocabulary head, as a trained one does",
        remove_when="never (benchmark only)",
    )(_own_head)
