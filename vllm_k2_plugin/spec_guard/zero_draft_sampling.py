"""A step that verifies no drafts samples like a step without speculation.

With speculation configured, vLLM's runner sends every step through its rejection sampler,
also a step with no drafts at all (every k = 0 step of the guard, prefill steps): that
samples the one "bonus" token per request with extra bookkeeping around the same sampler
call (the CPU engine's k = 0 profile: 0.15 ms per step in the rejection sampler, against
0.11 ms for all of sampling without speculation). The plugin hands such a step to the
plain sampler, as vLLM does without speculation: the logits are the same rows (one per
request) and with no drafts nothing is verified. Steps that request logprobs keep vLLM's
path (their tensors are laid out by the rejection sampler).
"""

from __future__ import annotations

from ..patching import REGISTRY, RUNNER_V1, PatchContext, scope
from .patch import V1_RUNNER_GONE, switched_off

MODULE = "vllm.v1.worker.gpu_model_runner"


def _no_drafts(runner, spec_decode_metadata) -> bool:
    return (
        spec_decode_metadata is not None
        and spec_decode_metadata.max_spec_len == 0
        and runner.input_batch.sampling_metadata.max_num_logprobs is None
        and scope.acts("spec-guard-zero-draft-sampling", getattr(runner, "vllm_config", None))
    )


def _wrap_sample(original):
    def _sample(self, logits, spec_decode_metadata):
        if _no_drafts(self, spec_decode_metadata):
            return original(self, logits, None)
        return original(self, logits, spec_decode_metadata)

    return _sample


def _upstream_samples_plainly() -> bool:
    """A bare stock runner, its samplers stood in for by recorders, asked to sample a step
    with zero drafts: upstream has this if the plain sampler runs, not the rejection sampler."""
    from types import SimpleNamespace

    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    calls = []
    probe = GPUModelRunner.__new__(GPUModelRunner)
    probe.input_batch = SimpleNamespace(
        sampling_metadata=SimpleNamespace(max_num_logprobs=None), update_async_output_token_ids=lambda: None
    )
    probe.sampler = lambda **kw: calls.append("sampler")
    probe.rejection_sampler = lambda *a, **kw: calls.append("rejection")
    probe.use_async_scheduling, probe._draft_token_req_ids = False, None
    probe._get_spec_decode_draft_probs = lambda metadata: None
    metadata = SimpleNamespace(max_spec_len=0)
    try:
        GPUModelRunner._sample(probe, None, metadata)
    except Exception:  # noqa: BLE001 - stock reaches for more runner state on its way: not upstream
        return False
    return calls == ["sampler"]


@REGISTRY.patch(
    name="spec-guard-zero-draft-sampling",
    feature="spec_guard",
    target=f"{MODULE}:GPUModelRunner._sample",
    applies_to=">=0.16,<0.34",
    needs_whole_feature=True,
    model_runner=RUNNER_V1,
    why_range_ends=V1_RUNNER_GONE,
    only_if=switched_off,
    already_upstream=_upstream_samples_plainly,
    upstream="none yet (vLLM sends every step of a speculative engine through its rejection sampler)",
    why="the guard's k = 0 steps paid the rejection sampler's bookkeeping for no drafts (CPU profile: 0.15 ms)",
    remove_when="vLLM samples steps without drafts with its plain sampler (the probe sees the sampler called)",
)
def _apply(ctx: PatchContext) -> None:
    from vllm.v1.worker import gpu_model_runner

    ctx.target()
    ctx.wrap(gpu_model_runner.GPUModelRunner, "_sample", _wrap_sample)
