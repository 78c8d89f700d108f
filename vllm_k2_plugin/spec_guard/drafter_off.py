"""k = 0 from the guard means speculation off, drafter included.

At a per-step k of 0 stock vLLM still runs the EAGLE drafter's first pass over every
request's new token, so that the drafter's KV cache stays complete for later steps. On the
CPU engine that pass is most of what a k = 0 step costs over no speculation. While the
guard holds k at 0 the plugin skips it on decode steps of one token per request (prefill,
resumed requests and the step that verifies the last drafts still run it, so every prompt
is in the drafter's cache); the decode tokens of a k = 0
stretch are then missing from the drafter's cache, as they are in stock vLLM for inputs
too long for the drafter. Drafts stay verified, so outputs do not change.
"""

from __future__ import annotations

from ..patching import REGISTRY, RUNNER_V1, PatchContext, scope
from .patch import V1_RUNNER_GONE, _no_dynamic_sd

MODULE = "vllm.v1.worker.gpu_model_runner"


def _skips_drafter(runner, scheduler_output, sampled_token_ids) -> bool:
    import torch

    if getattr(scheduler_output, "num_spec_tokens_to_schedule", None) != 0:
        return False
    if not scope.acts("spec-guard-drafter-off", getattr(runner, "vllm_config", None)):
        return False
    spec = runner.speculative_config
    if not spec.use_eagle() or spec.disable_padded_drafter_batch:
        return False
    if scheduler_output.scheduled_new_reqs or not isinstance(sampled_token_ids, torch.Tensor):
        return False
    return all(n == 1 for n in scheduler_output.num_scheduled_tokens.values())


def _wrap_propose(original):
    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, *args, **kwargs):
        if not _skips_drafter(self, scheduler_output, sampled_token_ids):
            return original(self, scheduler_output, sampled_token_ids, *args, **kwargs)
        import torch

        # What stock does around a drafter that does not run (inputs too long for it):
        # the next tokens and valid counts the scheduler and async outputs read.
        self._draft_probs = self._draft_prob_req_ids = None
        if self.valid_sampled_token_count_event is not None:
            next_token_ids, valid_count = self.drafter.prepare_next_token_ids_padded(
                sampled_token_ids, self.requests, self.input_batch, self.discard_request_mask.gpu
            )
            self._copy_valid_sampled_token_count(next_token_ids, valid_count)
        return torch.empty(sampled_token_ids.shape[0], 0, dtype=torch.int64, device=sampled_token_ids.device)

    return propose_draft_token_ids


class _Recorder:
    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *a, **kw: self.calls.append(name)


def _upstream_skips_drafter() -> bool:
    """Hand a bare stock runner an EAGLE decode step at k = 0 with a drafter that records
    its calls: upstream skips the drafter if its ``propose`` is not reached."""
    from types import SimpleNamespace

    import torch
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    drafter = _Recorder()
    probe = GPUModelRunner.__new__(GPUModelRunner)
    probe.speculative_config = SimpleNamespace(
        method="eagle3", use_eagle=lambda: True, disable_padded_drafter_batch=False,
        use_ngram_gpu=lambda: False, uses_extract_hidden_states=lambda: False,
        use_dflash=lambda: False, uses_draft_model=lambda: False,
    )  # fmt: skip
    probe.drafter, probe.valid_sampled_token_count_event = drafter, None  # None: no async copy (as on CPU)
    out = SimpleNamespace(num_spec_tokens_to_schedule=0, total_num_scheduled_tokens=1,
                          num_scheduled_tokens={"probe": 1}, scheduled_new_reqs=[])  # fmt: skip
    try:
        GPUModelRunner.propose_draft_token_ids(probe, out, torch.zeros(1, 1, dtype=torch.int32),
                                               *([None] * 7))  # fmt: skip
    except Exception:  # noqa: BLE001 - stock reaches for the runner's state on the way to the drafter
        return False
    return "propose" not in drafter.calls


@REGISTRY.patch(
    name="spec-guard-drafter-off",
    feature="spec_guard",
    target=f"{MODULE}:GPUModelRunner.propose_draft_token_ids",
    applies_to=">=0.17,<0.34",
    needs_whole_feature=True,
    model_runner=RUNNER_V1,
    why_range_ends=V1_RUNNER_GONE,
    only_if=_no_dynamic_sd,
    already_upstream=_upstream_skips_drafter,
    upstream="none yet (vLLM runs the EAGLE drafter's first pass at k = 0 to keep its KV cache complete)",
    why="at k = 0 the drafter's pass cost 12.6-13.7 % of a no-speculation step on the CPU engine (two profiles)",
    remove_when="vLLM skips the drafter on k = 0 decode steps (the probe sees no drafter call)",
)
def _apply(ctx: PatchContext) -> None:
    from vllm.v1.worker import gpu_model_runner

    ctx.target()
    ctx.wrap(gpu_model_runner.GPUModelRunner, "propose_draft_token_ids", _wrap_propose)
