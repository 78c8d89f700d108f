"""Patch ``async-spec-zero-bubble`` (vLLM 0.16): a speculative step's inputs are prepared
without waiting for the previous step's accepted count.

0.16's ``_update_states`` reads that count (``_get_valid_sampled_token_count``: an event wait)
before it can set each request's computed tokens, so the host prepares the step only once the
previous verify has finished, and the GPU idles while it does (24-layer slice, H200, route C:
~1 ms of a 6.3 ms EAGLE-3 step; benchmarks/results/vllm016_h200/). Here, per runner:

1. ``_update_states`` is handed "every draft accepted" for the requests that carried drafts
   (the ``Optimistic`` record says which), so nothing waits;
2. after ``_prepare_inputs`` has queued its copies, ``correct_on_device`` lowers those
   requests' positions, sequence lengths and KV slots on the GPU by the drafts the count (kept
   on the GPU from the previous step's ``_copy_valid_sampled_token_count``) says were rejected;
3. at ``sample_tokens`` (the forward queued) the host's books follow: computed tokens and the
   output placeholders of the rejected drafts; what the scheduler sees is unchanged.

Host-side upper bounds stay optimistic within a step (``max_seq_len``, ``seq_lens_cpu``): they
size work only (our MLA decode, TRITON_ATTN). Steps that need exact host-side token lists
(structured output, penalties), and runners outside what this was written for (no async
scheduling, non-EAGLE or unpadded drafting, M-RoPE, context or pipeline parallelism), keep
vLLM's wait. The correction checks itself on the runner's device before the first step uses it,
and each runner measures its first speculative steps both ways (choice.py): where the host,
not the GPU, bounds a step (a tiny model), the wait costs less than the correction and stays.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

from ..log import get_logger
from ..patching import REGISTRY, RUNNER_V1, PatchContext, scope
from ..platform import no_cuda
from .choice import WaitOrCorrect
from .correction import Optimistic, correct_on_device, self_check

RUNNER = "vllm.v1.worker.gpu_model_runner"
STATE = "_vllm_k2_async_spec"
PATCH_NAME = "async-spec-zero-bubble"


class RunnerState:
    """One model runner's: the count kept on the GPU, this step's optimistic requests, counters."""

    def __init__(self) -> None:
        self.off: str | None = None  # why this runner keeps vLLM's wait (None: not decided yet)
        self.choice = WaitOrCorrect()
        self.scheduler_output = None
        self.count = None  # the last step's accepted+1 per batch row, on the GPU
        self.optimistic: Optimistic | None = None
        self.correction_s = 0.0  # host time of this step's correction (the choice's trial)
        self.stats = {
            "steps_without_wait": 0,
            "steps_waited": 0,
            "requests_corrected": 0,
            "drafts_rejected": 0,
            "choice": "",
        }


def state(runner) -> RunnerState:
    st = runner.__dict__.get(STATE)
    if st is None:
        st = runner.__dict__[STATE] = RunnerState()
    return st


def _runner_off_reason(runner) -> str | None:
    """Why this runner is outside what the patch was written for, or None."""
    from vllm.distributed.parallel_state import get_pp_group

    spec = runner.speculative_config
    if not scope.acts(PATCH_NAME, getattr(runner, "vllm_config", None)):
        return "a model outside the DeepSeek-V3 / Kimi-K2.x family"
    if not runner.use_async_scheduling:
        return "no async scheduling"
    if spec is None or not spec.use_eagle() or spec.disable_padded_drafter_batch:
        return "not EAGLE with a padded drafter batch"
    if runner.valid_sampled_token_count_event is None:
        return "no accepted-count event"
    if runner.uses_mrope or getattr(runner, "uses_xdrope_dim", 0) > 0:
        return "M-RoPE / XD-RoPE positions"
    if get_pp_group().world_size > 1:
        return "pipeline parallel"
    for table in runner.input_batch.block_table.block_tables:
        if table.pcp_world_size * table.dcp_world_size > 1:
            return "context parallel KV"
    return None


def _decide(runner, st: RunnerState) -> bool:
    """True where this runner skips the wait (checked once per runner, said once)."""
    if st.off is None:
        try:
            st.off = _runner_off_reason(runner) or ""
            problem = None if st.off else self_check(runner.device)
        except Exception as e:  # noqa: BLE001 - a runner or device this was not written for: vLLM's wait
            problem = f"{type(e).__name__}: {e}"
        if problem is not None:
            st.off = f"the correction's check on {runner.device} failed ({problem})"
            logger().warning(
                "vllm-k2: async-spec-zero-bubble: %s (vLLM %s); this runner keeps vLLM's wait", st.off, _version()
            )
        elif not st.off:
            logger().info("vllm-k2: async-spec-zero-bubble: speculative steps prepared without waiting")
    return not st.off


def _step_needs_exact_tokens(runner, scheduler_output) -> bool:
    needs_ids = runner.input_batch.sampling_metadata.output_token_ids  # penalties, bad words
    return bool(scheduler_output.has_structured_output_requests or needs_ids)


def optimistic_requests(runner, scheduler_output) -> Optimistic:
    """The requests 0.16's ``_update_states`` will advance by the previous step's count: cached,
    scheduled, in the persistent batch, with drafts in the previous step."""
    batch = runner.input_batch
    ids, rows, drafts = [], [], []
    for req_id in scheduler_output.scheduled_cached_reqs.req_ids:
        d = runner.requests[req_id].prev_num_draft_len
        if d and batch.req_id_to_index.get(req_id) is not None:
            ids.append(req_id)
            rows.append(batch.prev_req_id_to_index[req_id])
            drafts.append(d)
    return Optimistic(tuple(ids), tuple(rows), tuple(drafts))


def settle_host(runner, st: RunnerState) -> None:
    """The host's books of the optimistic requests, once their count is on the host."""
    opt, st.optimistic = st.optimistic, None
    if opt is None:
        return
    runner.valid_sampled_token_count_event.synchronize()  # recorded before the last draft: a wait, not a cost
    t0 = time.perf_counter()
    _settle(runner, st, opt)
    if st.choice.add_cost(st.correction_s + time.perf_counter() - t0):
        st.stats["choice"] = st.choice.verdict()
        logger().info("vllm-k2: async-spec-zero-bubble: %s", st.stats["choice"])
        if not st.choice.skip_wait:
            st.off = "measured: " + st.stats["choice"]


def _settle(runner, st: RunnerState, opt: Optimistic) -> None:
    for req_id, r in zip(opt.req_ids, opt.rejected(runner.valid_sampled_token_count_cpu), strict=True):
        if not r:
            continue
        req = runner.requests[req_id]
        tail = req.output_token_ids[-r:]
        if any(t != -1 for t in tail):
            raise RuntimeError(
                f"vllm-k2: async-spec-zero-bubble: request {req_id!r}: the last {r} output tokens "
                f"{tail} are not the placeholders of its rejected drafts (vLLM {_version()})"
            )
        del req.output_token_ids[-r:]
        req.num_computed_tokens -= r
        row = runner.input_batch.req_id_to_index.get(req_id)
        if row is not None:
            runner.input_batch.num_computed_tokens_cpu[row] -= r
        st.stats["requests_corrected"] += 1
        st.stats["drafts_rejected"] += r


def _wrap_update_states(original):
    def _update_states(self, scheduler_output):
        st = state(self)
        settle_host(self, st)  # a step that never sampled leaves its books to here
        st.scheduler_output = scheduler_output
        try:
            return original(self, scheduler_output)
        finally:
            st.scheduler_output = None

    return _update_states


def _wrap_counts(original):
    def _get_valid_sampled_token_count(self):
        st = state(self)
        count, st.count = st.count, None
        sched = st.scheduler_output
        prev = self.input_batch.prev_sampled_token_ids
        if count is None or sched is None or prev is None or not _decide(self, st):
            st.stats["steps_waited"] += prev is not None
            return original(self)
        if _step_needs_exact_tokens(self, sched):
            st.stats["steps_waited"] += 1
            return original(self)
        if st.choice.measuring_waits():  # vLLM's way, timed: how long the host waits for the GPU
            t0 = time.perf_counter()
            out = original(self)
            st.choice.add_wait(time.perf_counter() - t0)
            st.stats["steps_waited"] += 1
            return out
        opt = optimistic_requests(self, sched)
        st.correction_s = 0.0
        if len(opt):
            st.optimistic = opt
            st.stats["steps_without_wait"] += 1
        st.count = count  # for the correction in _prepare_inputs
        return opt.counts_all_accepted(prev.shape[0])

    return _get_valid_sampled_token_count


def _wrap_prepare_inputs(original):
    def _prepare_inputs(self, scheduler_output, *args, **kwargs):
        out = original(self, scheduler_output, *args, **kwargs)
        st = state(self)
        count, st.count = st.count, None
        opt = st.optimistic
        if opt is not None and count is not None:
            t0 = time.perf_counter()
            batch = self.input_batch
            rows = [batch.req_id_to_index[r] for r in opt.req_ids]
            qsl = self.query_start_loc.np
            correct_on_device(
                rows=rows,
                starts=[int(qsl[i]) for i in rows],
                ends=[int(qsl[i + 1]) for i in rows],
                prev_rows=list(opt.prev_rows),
                drafts=list(opt.drafts),
                count=count,
                positions=self.positions.gpu,
                seq_lens=self.seq_lens.gpu,
                tables=[(t.block_table.gpu, t.slot_mapping.gpu, t.block_size) for t in batch.block_table.block_tables],
            )
            st.correction_s = time.perf_counter() - t0
        return out

    return _prepare_inputs


def _wrap_copy_count(original):
    def _copy_valid_sampled_token_count(self, next_token_ids, valid_sampled_tokens_count):
        st = state(self)
        settle_host(self, st)  # before this step's count overwrites the last one's on the host
        original(self, next_token_ids, valid_sampled_tokens_count)
        st.count = valid_sampled_tokens_count  # freshly allocated per step: safe to hold
        return None

    return _copy_valid_sampled_token_count


def _wrap_sample_tokens(original):
    def sample_tokens(self, *args, **kwargs):
        settle_host(self, state(self))  # the forward is queued; the host's books before sampling
        return original(self, *args, **kwargs)

    return sample_tokens


def _no_cuda() -> str | None:
    return no_cuda("no speculative decoding on CPU in vLLM 0.16")


class _Waited(Exception):
    pass


class _Nothing:
    """What the probe's runner holds where the probe set nothing: empty, false, callable."""

    def __getattr__(self, name):
        return self

    def __call__(self, *args, **kwargs):
        return self

    def __iter__(self):
        return iter(())

    def __bool__(self) -> bool:
        return False

    def __len__(self) -> int:
        return 0


class _Stub(SimpleNamespace):
    """Set fields, and nothing for every other one."""

    def __getattr__(self, name):
        return _Nothing()


def _upstream_does_not_wait() -> bool:
    """A bare runner whose previous step sampled, given a step with nothing scheduled: 0.16's
    ``_update_states`` waits for the accepted count (the stand-in event raises); an upstream that
    corrects on the GPU waits only for requests that carried drafts, so it returns."""
    import importlib

    module = importlib.import_module(RUNNER)
    cls = module.GPUModelRunner
    nothing = _Nothing()
    probe_cls = type("ProbeRunner", (cls,), {"__getattr__": lambda self, name: nothing})
    probe = probe_cls.__new__(probe_cls)

    def waited():
        raise _Waited

    batch = _Stub(
        req_id_to_index={},
        prev_req_id_to_index={},
        prev_sampled_token_ids=object(),
        remove_request=lambda req_id: None,
        condense=lambda: None,
        refresh_metadata=lambda: None,
    )
    probe.__dict__.update(
        requests={},
        num_prompt_logprobs={},
        encoder_cache={},
        input_batch=batch,
        use_async_scheduling=True,
        valid_sampled_token_count_event=_Stub(synchronize=waited),
        valid_sampled_token_count_cpu=nothing,
    )
    cached = _Stub(req_ids=[], resumed_req_ids=set(), new_block_ids=[], num_computed_tokens=[])
    sched = _Stub(
        finished_req_ids=set(),
        free_encoder_mm_hashes=[],
        num_scheduled_tokens={},
        scheduled_new_reqs=[],
        scheduled_cached_reqs=cached,
        scheduled_spec_decode_tokens={},
    )
    pp = getattr(module, "get_pp_group", None)
    if pp is not None:  # no process groups here: a single stage, for this call only
        module.get_pp_group = lambda: _Stub(is_last_rank=True, is_first_rank=True, world_size=1)
    try:
        cls._update_states(probe, sched)
    except _Waited:
        return False
    except Exception as e:  # noqa: BLE001 - a runner this probe cannot drive: not known to be upstream
        logger().debug("vllm-k2: async-spec-zero-bubble probe: %s: %s", type(e).__name__, e)
        return False
    finally:
        if pp is not None:
            module.get_pp_group = pp
    return True


def _version() -> str:
    from ..patching.versions import vllm_version_string

    return vllm_version_string() or "?"


def logger():
    return get_logger("async_spec")


@REGISTRY.patch(
    name=PATCH_NAME,
    feature="async_spec",
    target=f"{RUNNER}:GPUModelRunner._update_states",
    applies_to=">=0.16,<0.17",
    model_runner=RUNNER_V1,
    why_range_ends="written and measured against vLLM 0.16's _update_states only",
    only_if=_no_cuda,
    already_upstream=_upstream_does_not_wait,
    upstream="vllm-project/vllm#32951 (zero-bubble async scheduling + spec decoding)",
    why="0.16 waits for the previous verify's accepted count before preparing each speculative step",
    remove_when="vLLM prepares speculative steps without that wait (the probe: _update_states returns unwaited)",
)
def _apply(ctx: PatchContext) -> None:
    import importlib

    ctx.target()
    runner = importlib.import_module(RUNNER).GPUModelRunner
    ctx.wrap(runner, "_update_states", _wrap_update_states)
    ctx.wrap(runner, "_get_valid_sampled_token_count", _wrap_counts)
    ctx.wrap(runner, "_prepare_inputs", _wrap_prepare_inputs)
    ctx.wrap(runner, "_copy_valid_sampled_token_count", _wrap_copy_count)
    ctx.wrap(runner, "sample_tokens", _wrap_sample_tokens)
