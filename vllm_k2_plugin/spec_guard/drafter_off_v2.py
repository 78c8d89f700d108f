"""k = 0 from the guard under Model Runner V2: the step runs no drafter.

Model Runner V2 (``vllm/v1/worker/gpu/``) verifies as many drafts per request as the scheduler
scheduled, and with async scheduling the scheduler's placeholders follow the per-step k that the
guard writes into vLLM's per-batch-size lookup. But V2's ``sample_tokens`` runs the speculator's
``propose`` on every step, k = 0 included: the drafter's passes cost as much as at full k and
nothing they draft is verified. Here a decode step of one token per request scheduled at k = 0
hands ``sample_tokens`` a stand-in speculator that drafts nothing: each request's draft row keeps
what it held (the next step verifies none of it), and the drafter's KV cache misses that
stretch's tokens, as under the v1 runner's drafter_off (measured there: acceptance after such a
stretch within 3 % of a drafter that ran).

Measured on an H100 (vLLM 0.26, tiny pair under load, benchmarks/results/load_gpu/): with a
drafter whose drafts are never accepted, the guard served 1.00x / 1.20x / 0.94x the throughput of
no speculation at 1 / 4 / 16 requests in flight with this skip, 0.62x / 1.12x / 0.68x without it.
"""

from __future__ import annotations

from ..patching import REGISTRY, RUNNER_V2, PatchContext, scope
from .patch import drafter_skipped, switched_off

MODULE = "vllm.v1.worker.gpu.model_runner"
#: the releases whose Model Runner V2 the guard's runner half was written against (shared by its parts)
V2_GUARD_RANGE = ">=0.26,<0.27"
V2_GUARD_RANGE_ENDS = "written against vLLM 0.26's Model Runner V2 only (read in its sources)"
FLAG = "_k2_step_skips_drafter"


class _NoDrafts:
    """The speculator of one step that drafts nothing (every other attribute is the real one's)."""

    supports_mm_inputs = False  # no multimodal embeddings gathered for a drafter that does not run

    def __init__(self, real, draft_rows):
        self._real, self._draft_rows = real, draft_rows

    def __getattr__(self, name):
        return getattr(self._real, name)

    def propose(self, input_batch, *args, **kwargs):
        # what the rows already hold: written back unchanged, never verified
        return self._draft_rows[input_batch.idx_mapping]


def _wrap_execute_model(original):
    def execute_model(self, scheduler_output, *args, **kwargs):
        self.__dict__[FLAG] = bool(
            self.speculator is not None
            and not kwargs.get("dummy_run", False)
            and drafter_skipped(scheduler_output)
            and scope.acts("spec-guard-v2-drafter-off", getattr(self, "vllm_config", None))
        )
        return original(self, scheduler_output, *args, **kwargs)

    return execute_model


def _wrap_sample_tokens(original):
    def sample_tokens(self, *args, **kwargs):
        if not self.__dict__.pop(FLAG, False):
            return original(self, *args, **kwargs)
        real = self.speculator
        self.speculator = _NoDrafts(real, self.req_states.draft_tokens)
        try:
            return original(self, *args, **kwargs)
        finally:
            self.speculator = real

    return sample_tokens


def _upstream_skips_drafter() -> bool:
    """Does V2 itself skip the drafter on a k = 0 decode step? Read from its ``sample_tokens``:
    where it consults the step's per-step k before proposing, upstream has this."""
    import inspect

    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    source = inspect.getsource(GPUModelRunner.sample_tokens)
    return "num_spec_tokens_to_schedule" in source


@REGISTRY.patch(
    name="spec-guard-v2-drafter-off",
    feature="spec_guard",
    target=f"{MODULE}:GPUModelRunner.sample_tokens",
    applies_to=V2_GUARD_RANGE,
    needs_whole_feature=True,
    model_runner=RUNNER_V2,
    why_range_ends=V2_GUARD_RANGE_ENDS,
    only_if=switched_off,
    already_upstream=_upstream_skips_drafter,
    upstream="none yet (V2 runs the speculator on every step; vllm-project/vllm#54082 asks for K in {0, K})",
    why="Model Runner V2 runs every drafter pass also on a step scheduled at k = 0 (vLLM 0.26's sources)",
    remove_when="Model Runner V2 reads the step's k before proposing (the probe reads sample_tokens)",
)
def _apply(ctx: PatchContext) -> None:
    from vllm.v1.worker.gpu import model_runner

    ctx.target()
    runner = model_runner.GPUModelRunner
    ctx.wrap(runner, "execute_model", _wrap_execute_model)
    ctx.wrap(runner, "sample_tokens", _wrap_sample_tokens)
