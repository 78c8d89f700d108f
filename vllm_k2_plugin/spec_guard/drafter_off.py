"""k = 0 from the guard means speculation off, drafter included.

At a per-step k of 0 stock vLLM still runs the EAGLE drafter's first pass over every
request's new token, so that the drafter's KV cache stays complete for later steps. On the
CPU engine that pass is most of what a k = 0 step costs over no speculation. While the
guard holds k at 0 the plugin skips it on decode steps of one token per request (prefill,
resumed requests and the step that verifies the last drafts still run it, so every prompt
is in the drafter's cache); the decode tokens of a k = 0
stretch are then missing from the drafter's cache, as they are in stock vLLM for inputs
too long for the drafter. Drafts stay verified, so outputs do not change.

On releases whose scheduler output has no per-step k (0.16 ... 0.24) the guard's scheduler half
sets it, and the runner keeps a fixed-width draft buffer: the skipped pass leaves zeros there,
as stock does when the drafter cannot run, and the scheduler drops them (spec_guard/patch.py).
Around the skipped pass the runner's own drafter work goes too: the zeros are written on the
CPU instead of copied from the GPU, and the step builds no attention metadata for the drafter's
layers. The worker marks such a step before the runner prepares it.
"""

from __future__ import annotations

import functools
import inspect

from ..patching import REGISTRY, RUNNER_V1, PatchContext, scope
from .patch import V1_RUNNER_GONE, drafter_skipped, switched_off

MODULE = "vllm.v1.worker.gpu_model_runner"


def _step_skips_drafter(runner, scheduler_output) -> bool:
    if not drafter_skipped(scheduler_output):
        return False
    if not scope.acts("spec-guard-drafter-off", getattr(runner, "vllm_config", None)):
        return False
    spec = runner.speculative_config
    return spec is not None and spec.use_eagle() and not spec.disable_padded_drafter_batch


def _skips_drafter(runner, scheduler_output, sampled_token_ids) -> bool:
    import torch

    return isinstance(sampled_token_ids, torch.Tensor) and _step_skips_drafter(runner, scheduler_output)


@functools.cache
def _per_step_k_in_vllm() -> bool:
    """Does vLLM's scheduler output carry a per-step k (dynamic speculative decoding)?"""
    import dataclasses

    from vllm.v1.core.sched.output import SchedulerOutput

    return "num_spec_tokens_to_schedule" in {f.name for f in dataclasses.fields(SchedulerOutput)}


@functools.cache
def _takes_attn_metadata_first(drafter_type: type) -> bool:
    """Which of the two signatures of the drafter's ``prepare_next_token_ids_padded`` this vLLM
    has (read from the method itself: the change did not come with the per-step k). Cached:
    reading a signature costs about 0.1 ms, on every step the guard saves."""
    params = list(inspect.signature(drafter_type.prepare_next_token_ids_padded).parameters)[1:]  # after self
    return bool(params) and params[0] == "common_attn_metadata"


@functools.cache
def _metadata_position(original) -> int:
    """Where the runner's ``propose_draft_token_ids`` takes ``common_attn_metadata`` (self first)."""
    return list(inspect.signature(original).parameters).index("common_attn_metadata")


def _wrap_propose(original):
    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, *args, **kwargs):
        self._k2_drafts_are_zeros = False
        if not _skips_drafter(self, scheduler_output, sampled_token_ids):
            return original(self, scheduler_output, sampled_token_ids, *args, **kwargs)
        import torch

        self._k2_drafts_are_zeros = True  # read by the drafts' copy to the CPU, next in the runner

        # What stock does around a drafter that does not run (inputs too long for it):
        # the next tokens and valid counts the scheduler and async outputs read.
        self._draft_probs = self._draft_prob_req_ids = None
        per_step_k = _per_step_k_in_vllm()
        if self.valid_sampled_token_count_event is not None:
            state = (sampled_token_ids, self.requests, self.input_batch, self.discard_request_mask.gpu)
            if _takes_attn_metadata_first(type(self.drafter)):  # 0.16: the step's attention metadata first
                at = _metadata_position(original) - 3  # after self, scheduler_output, sampled_token_ids
                metadata = args[at] if 0 <= at < len(args) else kwargs["common_attn_metadata"]
                state = (metadata, *state)
            next_token_ids, valid_count = self.drafter.prepare_next_token_ids_padded(*state)
            self._copy_valid_sampled_token_count(next_token_ids, valid_count)
        rows = sampled_token_ids.shape[0]
        if per_step_k:
            return torch.empty(rows, 0, dtype=torch.int64, device=sampled_token_ids.device)
        # the runner's draft buffers are num_spec_tokens wide: zeros, which the guard drops
        return torch.zeros(1, dtype=torch.int32, device=sampled_token_ids.device).expand(rows, self.num_spec_tokens)

    return propose_draft_token_ids


def _wrap_copy_drafts(original):
    """The zeros of a skipped drafter need no copy from the GPU: stock's own path for a drafter
    that did not run (``zeros_only``) zeroes the CPU buffer instead (0.19 ms of host time per
    k = 0 step measured on the H200)."""

    def _copy_draft_token_ids_to_cpu(self, scheduler_output, zeros_only=False):
        if getattr(self, "_k2_drafts_are_zeros", False):
            zeros_only = True
        return original(self, scheduler_output, zeros_only)

    return _copy_draft_token_ids_to_cpu


def _wrap_worker_execute_model(original):
    """Tells the worker's runner, before its step, whether the step skips the drafter (the
    runner's own ``execute_model`` is another patch's on the CPU engine)."""

    def execute_model(self, scheduler_output, *args, **kwargs):
        runner = self.model_runner
        runner._k2_drafts_are_zeros = False
        runner._k2_step_skips_drafter = scheduler_output is not None and _step_skips_drafter(runner, scheduler_output)
        try:
            return original(self, scheduler_output, *args, **kwargs)
        finally:
            runner._k2_step_skips_drafter = False

    return execute_model


def drafter_layer_names(drafter) -> set[str]:
    """The drafter's attention layers: ``attn_layer_names`` (0.16 ...) or
    ``_draft_attn_layer_names`` (0.20 ...)."""
    names = getattr(drafter, "attn_layer_names", None) or getattr(drafter, "_draft_attn_layer_names", None)
    return set(names or ())


def _wrap_build_attention_metadata(original):
    """A step that skips the drafter needs no attention metadata for the drafter's layers (the
    drafter builds its own when it runs): its groups are left out of that step's build. Only
    without cascade attention, whose prefix lengths are indexed by group."""

    def _build_attention_metadata(self, *args, **kwargs):
        if (
            not getattr(self, "_k2_step_skips_drafter", False)
            or kwargs.get("cascade_attn_prefix_lens")
            or kwargs.get("for_cudagraph_capture")
        ):
            return original(self, *args, **kwargs)
        groups = self.attn_groups
        cached = getattr(self, "_k2_groups_without_drafter", None)
        if cached is None or cached[0] is not groups:
            drafter_layers = drafter_layer_names(self.drafter)
            cached = (groups, [[g for g in gs if not set(g.layer_names) <= drafter_layers] for gs in groups])
            self._k2_groups_without_drafter = cached
        self.attn_groups = cached[1]
        try:
            return original(self, *args, **kwargs)
        finally:
            self.attn_groups = groups

    return _build_attention_metadata


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
        method="eagle3",
        use_eagle=lambda: True,
        disable_padded_drafter_batch=False,
        use_ngram_gpu=lambda: False,
        uses_extract_hidden_states=lambda: False,
        use_dflash=lambda: False,
        uses_draft_model=lambda: False,
    )
    probe.drafter, probe.valid_sampled_token_count_event = drafter, None  # None: no async copy (as on CPU)
    probe.num_spec_tokens = 1
    out = SimpleNamespace(
        num_spec_tokens_to_schedule=0,
        total_num_scheduled_tokens=1,
        num_scheduled_tokens={"probe": 1},
        scheduled_new_reqs=[],
    )
    try:
        GPUModelRunner.propose_draft_token_ids(probe, out, torch.zeros(1, 1, dtype=torch.int32), *([None] * 7))
    except Exception:  # noqa: BLE001 - stock reaches for the runner's state on the way to the drafter
        return False
    return "propose" not in drafter.calls


@REGISTRY.patch(
    name="spec-guard-drafter-off",
    feature="spec_guard",
    target=f"{MODULE}:GPUModelRunner.propose_draft_token_ids",
    applies_to=">=0.16,<0.34",
    needs_whole_feature=True,
    model_runner=RUNNER_V1,
    why_range_ends=V1_RUNNER_GONE,
    only_if=switched_off,
    already_upstream=_upstream_skips_drafter,
    upstream="none yet (vLLM runs the EAGLE drafter's first pass at k = 0 to keep its KV cache complete)",
    why="at k = 0 the drafter's pass cost 12.6-13.7 % of a no-speculation step on the CPU engine (two profiles); "
    "around it, on the H200 (vLLM 0.16), the drafts' copy from the GPU took 0.19 ms of host time per step and "
    "the attention metadata builds (the drafter's group among them) another 0.19 ms",
    remove_when="vLLM skips the drafter on k = 0 decode steps (the probe sees no drafter call)",
)
def _apply(ctx: PatchContext) -> None:
    from vllm.v1.worker import gpu_model_runner, gpu_worker

    ctx.target()
    runner = gpu_model_runner.GPUModelRunner
    ctx.wrap(runner, "propose_draft_token_ids", _wrap_propose)
    ctx.wrap(runner, "_copy_draft_token_ids_to_cpu", _wrap_copy_drafts)
    ctx.wrap(runner, "_build_attention_metadata", _wrap_build_attention_metadata)
    ctx.wrap(gpu_worker.Worker, "execute_model", _wrap_worker_execute_model)
