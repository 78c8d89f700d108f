"""A deliberately broken patch (its target does not exist in any vLLM), loaded into
real engines through VLLM_K2_EXTRA_PATCH_MODULES to prove failure handling."""

from vllm_k2_plugin.patching import REGISTRY

REGISTRY.patch(
    name="test-broken-target",
    feature="tests",
    target="vllm.config.speculative:SpeculativeConfig.no_such_attribute_k2",
    applies_to=">=0.1",
    upstream="n/a (test fixture)",
    why="proves a patch whose target moved fails by name",
    remove_when="never (test only)",
)(lambda ctx: ctx.target())
