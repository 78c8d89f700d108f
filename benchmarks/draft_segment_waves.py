"""Bench-only patch module: the drafter's multi-row decode batches (its first pass) fill the SMs
once instead of the default twice (patch draft-attention-segments' MULTI_ROW_WAVES = 1), to
measure the two side by side. Loaded by ``gpu_engine_e2e.py`` for cases with
``"segment_waves": 1`` (VLLM_K2_EXTRA_PATCH_MODULES). (Call 2026-12-04-call5 ran the opposite
module, ``bench-draft-segments-two-waves``, when one wave was the default.)"""

from vllm_k2_plugin.patching import REGISTRY


def _one_wave(ctx):
    from vllm_k2_plugin.draft_attention import segments

    ctx.target()
    ctx.replace(segments, "MULTI_ROW_WAVES", 1)


REGISTRY.patch(
    name="bench-draft-segments-one-wave",
    feature="benchmarks",
    target="vllm.v1.attention.backends.triton_attn:TritonAttentionMetadataBuilder",
    applies_to=">=0.16",
    upstream="n/a (benchmark)",
    why="measure the first pass's grid in one wave of the SMs against two",
    remove_when="never (benchmark only)",
)(_one_wave)
