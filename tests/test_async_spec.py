"""Patch ``async-spec-zero-bubble``: speculative steps prepared without 0.16's wait for the
previous accepted count, corrected on the device.

CPU (0.16 engine venv): the correction against vLLM 0.16's own ``BlockTable`` slot formula and
exact positions; the host-side books with vLLM's own ``CachedRequestState``; the device
self-check fails when the correction is broken; the upstream probe (0.16 waits, the latest
does not). The patch's effect inside a speculative engine runs on the GPU only (0.16 has no
CPU speculative decoding): gpu_engine_e2e.py's v16tiny / v16deep cases, with it on and off.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")


def _block_table(block_size=16, reqs=4, width=8):
    from vllm.v1.worker.block_table import BlockTable

    table = BlockTable(block_size, reqs, width, 64, False, torch.device("cpu"), block_size, 1)
    gen = np.random.default_rng(1)
    for row in range(reqs):
        table.add_row([int(b) for b in gen.choice(200, width, replace=False) + 1], row)
    table.commit_block_table(reqs)
    return table


def _prepare(table, computed, scheduled):
    """What 0.16's _prepare_inputs computes from the host's computed tokens (vLLM's own slot formula)."""
    req = np.repeat(np.arange(len(scheduled)), scheduled)
    pos = np.concatenate([np.arange(c, c + s) for c, s in zip(computed, scheduled, strict=True)])
    table.compute_slot_mapping(req, pos)
    table.commit_slot_mapping(len(pos))
    n = len(pos)
    return (
        torch.from_numpy(pos.astype(np.int64)),
        torch.from_numpy((np.asarray(computed) + scheduled).astype(np.int32)),
        table.slot_mapping.gpu[:n].clone(),
    )


@pytest.mark.vllm016
def test_correction_gives_what_exact_counts_would():
    from vllm_k2_plugin.async_spec.correction import correct_on_device

    table = _block_table()
    exact = np.array([40, 7, 100, 63])
    scheduled = np.array([4, 1, 4, 3])
    drafts = np.array([3, 0, 3, 2])  # carried into the previous step
    accepted = np.array([1, 0, 3, 0])
    want = _prepare(table, exact, scheduled)
    positions, seq_lens, _ = _prepare(table, exact + drafts - accepted, scheduled)  # all accepted
    slots = table.slot_mapping.gpu  # vLLM's buffer, as the runner's correction sees it
    rows = [0, 2, 3]  # with drafts; their rows in the previous batch were [3, 0, 1]
    count = torch.tensor([accepted[2] + 1, accepted[3] + 1, 1, accepted[0] + 1], dtype=torch.int32)
    ends = np.cumsum(scheduled)
    correct_on_device(
        rows=rows,
        starts=[int(ends[i] - scheduled[i]) for i in rows],
        ends=[int(ends[i]) for i in rows],
        prev_rows=[3, 0, 1],
        drafts=[int(drafts[i]) for i in rows],
        count=count,
        positions=positions,
        seq_lens=seq_lens,
        tables=[(table.block_table.gpu, slots, table.block_size)],
    )
    n = int(ends[-1])
    assert positions.tolist() == want[0].tolist()
    assert seq_lens.tolist() == want[1].tolist()
    assert slots[:n].tolist() == want[2].tolist()
    assert slots[:n].tolist() != _prepare(table, exact + drafts - accepted, scheduled)[2].tolist()


@pytest.mark.vllm016
def test_self_check_passes_and_fails_with_a_broken_correction(monkeypatch):
    from vllm_k2_plugin.async_spec import correction

    assert correction.self_check(torch.device("cpu")) is None
    real = correction.correct_on_device

    def slots_left_alone(**kw):  # positions and lengths corrected, KV slots not
        real(**{**kw, "tables": [(t, s.clone(), b) for t, s, b in kw["tables"]]})

    monkeypatch.setattr(correction, "correct_on_device", slots_left_alone)
    assert correction.self_check(torch.device("cpu")).startswith("slot_mapping:")


def _runner_with(requests, prev_rows, rows):
    batch = SimpleNamespace(
        prev_req_id_to_index=prev_rows,
        req_id_to_index=rows,
        num_computed_tokens_cpu=np.zeros(4, np.int32),
    )
    return SimpleNamespace(requests=requests, input_batch=batch)


@pytest.mark.vllm016
def test_host_books_follow_the_count():
    from vllm.v1.worker.gpu_input_batch import CachedRequestState

    from vllm_k2_plugin.async_spec import patch

    def request(req_id, computed, outputs, drafts):
        r = CachedRequestState(
            req_id=req_id,
            prompt_token_ids=[1, 2, 3],
            mm_features=[],
            sampling_params=None,
            generator=None,
            block_ids=([0],),
            num_computed_tokens=computed,
            output_token_ids=list(outputs),
        )
        r.prev_num_draft_len = drafts
        return r

    reqs = {"a": request("a", 20, [5, -1], 3), "b": request("b", 9, [7], 0), "c": request("c", 30, [8, -1], 2)}
    runner = _runner_with(reqs, prev_rows={"a": 1, "b": 2, "c": 0}, rows={"a": 0, "b": 1, "c": 2})
    sched = SimpleNamespace(scheduled_cached_reqs=SimpleNamespace(req_ids=["c", "a", "b"]))
    opt = patch.optimistic_requests(runner, sched)
    assert (opt.req_ids, opt.prev_rows, opt.drafts) == (("c", "a"), (0, 1), (2, 3))
    assert opt.counts_all_accepted(3) == [3, 4, 1]
    # what 0.16's _update_states does with those counts: a placeholder per draft, taken as
    # accepted; the scheduler's computed tokens (which count every draft) stand
    for req_id, d in (("a", 3), ("c", 2)):
        reqs[req_id].output_token_ids.extend([-1] * d)
    runner.input_batch.num_computed_tokens_cpu[:3] = [20, 9, 30]
    # the previous step: "a" accepted 1 of 3 (count 2), "c" all 2 (count 3)
    runner.valid_sampled_token_count_event = SimpleNamespace(synchronize=lambda: None)
    runner.valid_sampled_token_count_cpu = torch.tensor([3, 2, 1], dtype=torch.int32)
    st = patch.RunnerState()
    st.optimistic = opt
    patch.settle_host(runner, st)
    assert reqs["a"].output_token_ids == [5, -1, -1] and reqs["a"].num_computed_tokens == 18
    assert reqs["c"].output_token_ids == [8, -1, -1, -1] and reqs["c"].num_computed_tokens == 30
    assert runner.input_batch.num_computed_tokens_cpu[:3].tolist() == [18, 9, 30]
    assert st.optimistic is None and st.stats["drafts_rejected"] == 2 and st.stats["requests_corrected"] == 1


@pytest.mark.vllm016
def test_host_books_refuse_a_real_token_where_a_placeholder_should_be():
    from vllm_k2_plugin.async_spec import patch
    from vllm_k2_plugin.async_spec.correction import Optimistic

    req = SimpleNamespace(output_token_ids=[5, 6, 7], num_computed_tokens=10)
    runner = _runner_with({"a": req}, prev_rows={"a": 0}, rows={"a": 0})
    runner.valid_sampled_token_count_event = SimpleNamespace(synchronize=lambda: None)
    runner.valid_sampled_token_count_cpu = torch.tensor([1], dtype=torch.int32)
    st = patch.RunnerState()
    st.optimistic = Optimistic(("a",), (0,), (2,))
    with pytest.raises(RuntimeError, match="request 'a': the last 2 output tokens"):
        patch.settle_host(runner, st)


def test_upstream_probe_tells_016_from_the_latest():
    import vllm

    from vllm_k2_plugin.async_spec.patch import _upstream_does_not_wait

    pytest.importorskip("vllm.v1.worker.gpu_model_runner")
    assert _upstream_does_not_wait() is (not vllm.__version__.startswith("0.16"))


def test_choice_skips_the_wait_only_where_the_host_waits_longer_than_the_correction_costs():
    from vllm_k2_plugin.async_spec.choice import WaitOrCorrect

    gpu_bound, host_bound = WaitOrCorrect(steps=4), WaitOrCorrect(steps=4)
    for choice, wait in ((gpu_bound, 2e-3), (host_bound, 3e-5)):
        for _ in range(4):
            assert choice.measuring_waits()
            choice.add_wait(wait)
        assert not choice.measuring_waits()
        done = [choice.add_cost(2e-4) for _ in range(4)]
        assert done == [False, False, False, True] and not choice.add_cost(1.0)  # decided once
    assert gpu_bound.skip_wait is True and "2000 us" in gpu_bound.verdict()
    assert host_bound.skip_wait is False and "kept" in host_bound.verdict()


def _one_request_runner(count_cpu: int, choice_steps: int):
    """A runner's state with one request that carried one draft; the count says accepted or not.
    Returns it, the request, the step's scheduler output, the wrapped count function and the
    list of vLLM's own (waiting) count reads."""
    from vllm_k2_plugin.async_spec import patch
    from vllm_k2_plugin.async_spec.choice import WaitOrCorrect

    waited = []
    counts = patch._wrap_counts(lambda runner: waited.append(1) or [2])
    req = SimpleNamespace(prev_num_draft_len=1, output_token_ids=[-1, -1], num_computed_tokens=5)
    runner = _runner_with({"a": req}, prev_rows={"a": 0}, rows={"a": 0})
    runner.input_batch.prev_sampled_token_ids = torch.zeros(1, 1)
    runner.input_batch.sampling_metadata = SimpleNamespace(output_token_ids=[])
    runner.valid_sampled_token_count_event = SimpleNamespace(synchronize=lambda: None)
    runner.valid_sampled_token_count_cpu = torch.tensor([count_cpu], dtype=torch.int32)
    st = patch.state(runner)
    st.off, st.choice = "", WaitOrCorrect(steps=choice_steps)  # the runner's checks passed
    sched = SimpleNamespace(scheduled_cached_reqs=SimpleNamespace(req_ids=["a"]), has_structured_output_requests=False)
    return runner, req, sched, counts, waited


@pytest.mark.vllm016
def test_a_runner_waits_while_it_measures_then_follows_the_choice():
    from vllm_k2_plugin.async_spec import patch

    runner, req, sched, counts, waited = _one_request_runner(count_cpu=1, choice_steps=2)  # draft rejected
    st = patch.state(runner)

    def step():
        st.count, st.scheduler_output = torch.ones(1), sched
        got = counts(runner)
        patch.settle_host(runner, st)
        req.output_token_ids[:] = [-1, -1]
        return got

    assert [step(), step()] == [[2], [2]] and len(waited) == 2  # vLLM's own counts, waited for
    st.choice.waits = [0.0, 0.0]  # as if the GPU were always done first: any correction costs more
    assert step() == [2] and len(waited) == 2 and st.stats["steps_without_wait"] == 1  # all accepted, no wait
    assert req.num_computed_tokens == 4  # the host's books followed the count (its draft rejected)
    assert step() == [2] and st.choice.skip_wait is False and st.off.startswith("measured: ")
    assert step() == [2] and len(waited) == 3  # back to vLLM's wait


@pytest.mark.vllm016
def test_a_gpu_bound_runner_keeps_skipping_the_wait():
    from vllm_k2_plugin.async_spec import patch

    runner, req, sched, counts, waited = _one_request_runner(count_cpu=2, choice_steps=1)  # draft accepted
    st = patch.state(runner)
    st.choice.waits = [10.0]  # the host blocked 10 s a step: far more than any correction costs
    sched = SimpleNamespace(scheduled_cached_reqs=SimpleNamespace(req_ids=["a"]), has_structured_output_requests=False)
    for _ in range(3):
        st.count, st.scheduler_output = torch.ones(1), sched
        assert counts(runner) == [2]
        patch.settle_host(runner, st)
    assert not waited and st.choice.skip_wait is True and st.off == "" and st.stats["steps_without_wait"] == 3
    assert req.num_computed_tokens == 5 and "skipped" in st.stats["choice"]
