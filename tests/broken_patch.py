"""A deliberately broken patch (its target exists, its change fails in every vLLM), loaded into
real engines through VLLM_K2_EXTRA_PATCH_MODULES to prove failure handling. (A target that a
release lacks is not-applicable, not failed: that is the registry's own test.)"""

from vllm_k2_plugin.patching import REGISTRY


def _apply(ctx):
    ctx.target()
    raise ctx.fail("the change no longer fits this vLLM (test fixture)")


REGISTRY.patch(
    name="test-broken-target",
    feature="tests",
    target="vllm.config.speculative:SpeculativeConfig",
    applies_to=">=0.1,<1",
    why_range_ends="test fixture",
    upstream="n/a (test fixture)",
    why="proves a patch whose change fails is reported by name and vLLM serves without it",
    remove_when="never (test only)",
)(_apply)
