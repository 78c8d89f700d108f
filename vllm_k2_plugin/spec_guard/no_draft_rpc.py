"""After a step the guard scheduled at k = 0, the engine core does not ask the worker for drafts.

Without async scheduling (vLLM's CPU platform turns it off; ``--no-async-scheduling``) the
engine core asks the worker for the step's drafts after every step of a speculative engine:
one RPC round trip to the worker process per step. A step scheduled with k = 0 has none
(the proposers draft ``num_spec_tokens_to_schedule`` tokens), and the worker answers with
an empty list per request, which the scheduler stores. The plugin stores the same empty
lists for the step's requests without the round trip (the CPU engine served: the round trip
0.47 ms of a 9.8 ms k = 0 step; benchmarks/served_step_timers.py).
"""

from __future__ import annotations

from ..patching import REGISTRY, RUNNER_V1, PatchContext, scope
from .drafter_off import _Recorder
from .patch import ATTR, switched_off

MODULE = "vllm.v1.engine.core"


def _drafts_of_k0_step(core) -> list[str] | None:
    """The request ids of the step just updated if it was scheduled at k = 0 by the guard
    on a proposer that honours the per-step k, else None (ask the worker as stock does)."""
    state = getattr(core.scheduler, ATTR, None)
    last = state.last_step if state is not None else None
    if last is None or last[0] != 0 or not scope.acts("spec-guard-no-draft-rpc", getattr(core, "vllm_config", None)):
        return None
    if getattr(core, "batch_queue", None) is not None or core.async_scheduling:
        return None
    spec = core.vllm_config.speculative_config
    if spec is None or not (spec.use_eagle() or spec.method == "ngram"):
        return None
    return last[1]


def _wrap_post_step(original):
    def post_step(self, model_executed: bool) -> None:
        asks = getattr(self, "check_for_draft_tokens", None)
        if asks is None:  # vLLM 0.16's name for it
            asks = self.use_spec_decode and not self.async_scheduling
        req_ids = _drafts_of_k0_step(self) if model_executed and asks else None
        if req_ids is None:
            return original(self, model_executed)
        from vllm.v1.outputs import DraftTokenIds

        self.scheduler.update_draft_token_ids(DraftTokenIds(req_ids, [[] for _ in req_ids]))

    return post_step


def _upstream_skips_rpc() -> bool:
    """A bare stock engine core, synchronous, its executor a recorder, told that a step of
    one request scheduled at k = 0 just ran: upstream has this if it does not ask for drafts.
    The scheduler stand-in records that step both as the guard does and as the staged patch
    file (patches/vllm-0.34.0/0005-...) does, ``draftless_req_ids``; stock reads neither."""
    from types import SimpleNamespace

    from vllm.v1.engine.core import EngineCore

    executor = _Recorder()
    probe = EngineCore.__new__(EngineCore)
    probe.model_executor, probe.check_for_draft_tokens, probe.async_scheduling = executor, True, False
    probe.use_spec_decode = True  # vLLM 0.16 asks this instead
    probe.batch_queue = None
    probe.vllm_config = SimpleNamespace(speculative_config=SimpleNamespace(method="eagle3", use_eagle=lambda: True))
    probe.scheduler = SimpleNamespace(update_draft_token_ids=lambda drafts: None, draftless_req_ids=["probe"])
    setattr(probe.scheduler, ATTR, SimpleNamespace(last_step=(0, ["probe"])))  # what the guard records
    try:
        EngineCore.post_step(probe, model_executed=True)
    except Exception:  # noqa: BLE001 - stock reaches for more engine state: not upstream
        return False
    return "take_draft_token_ids" not in executor.calls


@REGISTRY.patch(
    name="spec-guard-no-draft-rpc",
    feature="spec_guard",
    target=f"{MODULE}:EngineCore.post_step",
    applies_to=">=0.16,<0.35",
    needs_whole_feature=True,
    model_runner=RUNNER_V1,
    only_if=switched_off,
    already_upstream=_upstream_skips_rpc,
    upstream="none yet (vLLM's synchronous engine core asks the worker for drafts after every step)",
    why="the guard's k = 0 steps paid a worker round trip for no drafts (CPU engine served: ~5 % of a step)",
    remove_when="vLLM skips the draft RPC after steps scheduled with k = 0 (the probe sees no executor call)",
)
def _apply(ctx: PatchContext) -> None:
    from vllm.v1.engine import core

    ctx.target()
    ctx.wrap(core.EngineCore, "post_step", _wrap_post_step)
