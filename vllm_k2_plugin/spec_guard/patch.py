"""The speculation guard inside vLLM's scheduler: per batch size, the number of speculative
tokens k a step verifies (0 = none, and no drafter pass), from measured acceptance and step cost.

How the k reaches the engine depends on the release, the controller does not:
- vLLM with dynamic speculative decoding (a per-step ``num_spec_tokens_to_schedule`` taken from
  the scheduler's ``dynamic_sd_lookup[batch size]``, which the proposers honour, k = 0 included):
  the guard owns that lookup and writes the k it wants per batch size before each ``schedule()``
  (capped by the user's own schedule, if any).
- vLLM without it (0.16 ... 0.24: our users' 0.16): before each ``schedule()`` the guard trims
  every running request's drafts to k, so vLLM schedules a verify of 1 + k tokens per request as
  it does when a token budget cuts drafts short, and tells the runner the step's k
  (``num_spec_tokens_to_schedule`` on the scheduler output, the field later releases have) so
  that a k = 0 decode step skips the drafter (drafter_off). The drafter still drafts the
  configured k at 0 < k < full: the measured step cost at each k says whether that pays.
  A request whose last step skipped the drafter has no drafts: whatever the runner left in their
  place is dropped, so the next step verifies none and its drafter pass drafts again.

``make_spec_decoding_stats`` hands the guard vLLM's acceptance counts per request, and
``update_from_output`` the step's wall time (schedule to update: scheduling plus the model step),
kept only for pure decode steps whose k equals the previous step's (the verify width and the
draft passes both at that k). A change of k is logged.
"""

from __future__ import annotations

import time

from ..log import get_logger
from ..patching import REGISTRY, PatchContext, scope
from ..settings import ENV_SPEC_GUARD, spec_guard_enabled
from .controller import SpecGuard

MODULE = "vllm.v1.core.sched.scheduler"
ATTR = "_vllm_k2_spec_guard"
STEP_ATTR = "_vllm_k2_spec_guard_step"  # on a scheduler output: (scheduled at, batch, k, pure decode)
#: The scheduler half serves both model runners; the runner half differs: on the v1 runner k = 0
#: steps skip the drafter and the rejection sampler (drafter_off, zero_draft_sampling), under
#: Model Runner V2 the drafter (drafter_off_v2). Without its runner's half the scheduler half
#: alone would still run the drafter: the feature is all or none.
V1_RUNNER_GONE = "vLLM 0.34 removed its v1 model runner (vllm/v1/worker/gpu_model_runner.py)"


def switched_off() -> str | None:
    return None if spec_guard_enabled() else f"{ENV_SPEC_GUARD}=0"


def drafter_skipped(scheduler_output) -> bool:
    """Does this step skip the drafter (drafter_off)? A decode step of one token per request,
    no new request, scheduled at k = 0. The runner asks the same of the same output."""
    if getattr(scheduler_output, "num_spec_tokens_to_schedule", None) != 0 or scheduler_output.scheduled_new_reqs:
        return False
    return all(n == 1 for n in scheduler_output.num_scheduled_tokens.values())


def _upstream_adapts_k() -> bool:
    """Does vLLM adapt k from what it measures? Two ways to say yes:
    vLLM's own acceptance accounting, on a bare scheduler state with a k = 3 lookup, fed
    64 drafts of which nothing was accepted, moves the lookup; or the staged patch file's
    guard (patches/vllm-0.34.0/0007-spec-guard), where vLLM has it and its opt-in is set,
    driven as its Scheduler drives it, turns k down for steps whose drafts are never
    accepted and whose k = 3 steps take 1.6x a k = 0 step."""
    from vllm.v1.core.sched.scheduler import Scheduler

    probe = Scheduler.__new__(Scheduler)
    probe.log_stats, probe.num_spec_tokens = True, 3
    probe.dynamic_sd_lookup = [3] * 5
    stats = None
    for i in range(64):
        stats = Scheduler.make_spec_decoding_stats(probe, stats, 3, 0, None, f"probe-{i}")
    return probe.dynamic_sd_lookup != [3] * 5 or _file_guard_turns_k_down()


def _file_guard_turns_k_down() -> bool:
    import logging
    import time
    from types import SimpleNamespace

    import vllm.envs as envs

    try:
        from vllm.v1.core.sched import spec_guard as vllm_guard
    except ImportError:
        return False
    if not getattr(envs, "VLLM_SPEC_DECODE_GUARD", False):
        return False
    guard = vllm_guard.SchedulerSpecGuard(3, [3] * 5)
    log = logging.getLogger(vllm_guard.__name__)
    level = log.level
    log.setLevel(logging.WARNING)  # the probe's own switches are not the engine's news
    ks = []
    try:
        for _ in range(200):
            guard.fill()
            k = guard.lookup[1]
            ks.append(k)
            step = SimpleNamespace(
                num_scheduled_tokens={"probe": 1 + k},
                num_spec_tokens_to_schedule=k,
                scheduled_new_reqs=[],
                scheduled_spec_decode_tokens={"probe": [0] * k},
            )
            guard.scheduled(step, time.perf_counter() - 1e-3 * (10 + 2 * k))  # the step's cost, as if it ran
            guard.observe_request(k, 0)
            guard.step_done(step)
    finally:
        log.setLevel(level)
    return ks[-100:].count(0) > 50


class _State:
    """Per-scheduler bookkeeping around the controller."""

    def __init__(self, guard: SpecGuard, caps: list[int], lookup: bool):
        self.guard, self.caps = guard, caps
        #: True: vLLM's dynamic_sd_lookup carries k; False: the guard trims drafts (no lookup here)
        self.lookup = lookup
        #: requests whose last step skipped the drafter: their drafts are placeholders
        self.no_drafts: set[str] = set()
        self.prev_k: int | None = None
        #: (time, k, pure) of the last step whose output was read: the step period's start
        self.last_done: tuple[float, int, bool] | None = None
        self.last_step: tuple[int, list[str]] | None = None  # (k, request ids) of the step just updated
        self.reset_counts()

    def reset_counts(self) -> None:
        self.drafted = [0] * self.guard.max_k
        self.accepted = [0] * self.guard.max_k

    def k_for(self, batch: int) -> int:
        return min(self.caps[min(batch, len(self.caps) - 1)], self.guard.k_for(batch))

    def fill(self, lookup: list[int]) -> None:
        for batch in range(1, len(lookup)):
            lookup[batch] = self.k_for(batch)

    def trim_drafts(self, running, k: int) -> None:
        for request in running:
            drafts = request.spec_token_ids
            if not drafts:
                continue
            if request.request_id in self.no_drafts:
                request.spec_token_ids = []
            elif len(drafts) > k:
                request.spec_token_ids = drafts[:k]


def _pure_decode(out) -> bool:
    if out.scheduled_new_reqs:
        return False
    spec = out.scheduled_spec_decode_tokens
    return all(n == 1 + len(spec.get(req, ())) for req, n in out.num_scheduled_tokens.items())


def _wrap_init(original):
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        k = int(getattr(self, "num_spec_tokens", 0) or 0)
        if k <= 0 or not scope.acts("spec-guard", self.vllm_config):
            return
        if getattr(self, "use_v2_model_runner", False) and not self.scheduler_config.async_scheduling:
            # V2 then hands back k placeholder drafts per request whatever the step's k: no k of ours holds
            logger().info("vllm-k2: speculation guard off: Model Runner V2 without async scheduling")
            return
        size = int(self.scheduler_config.max_num_seqs) + 1
        lookup = hasattr(self, "dynamic_sd_lookup")  # this vLLM schedules a per-step k of its own
        user = self.dynamic_sd_lookup if lookup else None
        caps = list(user) if user is not None else [k] * size
        if lookup:
            self.dynamic_sd_lookup = list(caps)
        setattr(self, ATTR, _State(SpecGuard(max_k=k), caps, lookup))
        logger().info("vllm-k2: speculation guard on (k <= %d per step; %s=0 turns it off)", k, ENV_SPEC_GUARD)

    return __init__


def _wrap_schedule(original):
    def schedule(self, *args, **kwargs):
        state = getattr(self, ATTR, None)
        if state is None:
            return original(self, *args, **kwargs)
        t0 = time.perf_counter()
        if state.lookup:
            state.fill(self.dynamic_sd_lookup)
        else:
            k = state.k_for(max(1, len(self.running)))
            state.trim_drafts(self.running, k)
        out = original(self, *args, **kwargs)
        if not state.lookup:
            out.num_spec_tokens_to_schedule = k  # what later releases' scheduler output carries
            state.no_drafts = set(out.num_scheduled_tokens) if drafter_skipped(out) else set()
        batch = len(out.num_scheduled_tokens)
        if batch:
            # on the output itself: an id()-keyed table kept entries of outputs never updated, and
            # a later output reusing such an id would have read their start time
            setattr(out, STEP_ATTR, (t0, batch, int(out.num_spec_tokens_to_schedule), _pure_decode(out)))
        return out

    return schedule


def _wrap_stats(original):
    def make_spec_decoding_stats(self, spec_decoding_stats, num_draft_tokens, num_accepted_tokens, *args, **kwargs):
        state = getattr(self, ATTR, None)
        if state is not None and num_draft_tokens:
            for i in range(min(num_draft_tokens, len(state.drafted))):
                state.drafted[i] += 1
            for i in range(min(num_accepted_tokens, len(state.accepted))):
                state.accepted[i] += 1
        return original(self, spec_decoding_stats, num_draft_tokens, num_accepted_tokens, *args, **kwargs)

    return make_spec_decoding_stats


def _wrap_update(original):
    def update_from_output(self, scheduler_output, model_runner_output):
        result = original(self, scheduler_output, model_runner_output)
        state = getattr(self, ATTR, None)
        started = scheduler_output.__dict__.pop(STEP_ATTR, None) if state is not None else None
        if started is None:
            if state is not None:
                state.last_step = state.last_done = None
            return result
        now = time.perf_counter()
        t0, batch, k, pure = started
        last, state.last_done = state.last_done, (now, k, pure)
        state.last_step = (k, list(scheduler_output.num_scheduled_tokens))
        state.guard.observe_drafts(state.drafted, state.accepted)
        state.reset_counts()
        steady = pure and state.prev_k == k
        state.prev_k = k
        if steady:
            # the step's cost: from its scheduling to its output, or, where the engine overlaps
            # steps (async scheduling), the time since the previous such step's output if shorter
            cost = now - t0
            if last is not None and last[1] == k and last[2]:
                cost = min(cost, now - last[0])
            decision = state.guard.observe_step(batch, k, 1e3 * cost)
            if decision is not None:
                logger().info(
                    "vllm-k2: speculation guard: batch bucket %d (%d+ requests): k %d -> %d "
                    "(tokens/ms by k: %s; acceptance by position: %s)",
                    decision.bucket,
                    1 << decision.bucket,
                    decision.old_k,
                    decision.new_k,
                    {j: round(v, 4) for j, v in sorted(decision.tokens_per_ms.items())},
                    [round(a, 3) for a in state.guard.acceptance()],
                )
        return result

    return update_from_output


def logger():
    return get_logger("spec_guard")


@REGISTRY.patch(
    name="spec-guard",
    feature="spec_guard",
    target=f"{MODULE}:Scheduler.schedule",
    applies_to=">=0.16,<0.35",
    needs_whole_feature=True,
    only_if=switched_off,
    already_upstream=_upstream_adapts_k,
    upstream="none yet (vLLM's dynamic speculative decoding takes a fixed batch-size schedule)",
    why="speculation that loses (low acceptance, MoE verify cost) must turn itself down per batch size",
    remove_when="vLLM adapts its per-step k from its own acceptance counts (the probe feeds it unaccepted drafts)",
)
def _apply(ctx: PatchContext) -> None:
    from vllm.v1.core.sched import scheduler

    ctx.target()
    cls = scheduler.Scheduler
    ctx.wrap(cls, "__init__", _wrap_init)
    ctx.wrap(cls, "schedule", _wrap_schedule)
    ctx.wrap(cls, "make_spec_decoding_stats", _wrap_stats)
    ctx.wrap(cls, "update_from_output", _wrap_update)
