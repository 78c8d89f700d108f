"""Full CUDA graphs for the guard's k = 0 steps (spec_guard/decode_graphs.py), checked in vLLM's
own cudagraph dispatcher and runner methods (the installed release's code; the CPU engines
capture no graphs, so the capture itself is recorded at vLLM's dummy run): a decode step of one
token per request in a k = 3 engine reaches a full graph at the sizes an engine without
speculation pads to; steps of 1 + k tokens keep vLLM's graphs; each graph is captured with
the query length it will replay; a failed capture of ours leaves vLLM's graphs serving."""

from __future__ import annotations

import pytest

K = 3


@pytest.fixture
def patched(monkeypatch):
    """The patch's wrappers on vLLM's classes for this test (the stand-in runner has no model
    config: the model gate is told to let any model through)."""
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_k2_plugin.spec_guard import decode_graphs as graphs

    monkeypatch.setenv("VLLM_K2_ANY_MODEL", "1")
    for owner, attr, wrap in (
        (CudagraphDispatcher, "initialize_cudagraph_keys", graphs._wrap_initialize_keys),
        (GPUModelRunner, "_capture_cudagraphs", graphs._wrap_capture_cudagraphs),
        (GPUModelRunner, "_determine_batch_execution_and_padding", graphs._wrap_determine),
    ):
        monkeypatch.setattr(owner, attr, wrap(getattr(owner, attr)))
    return graphs


def _full_keys(runner) -> set:
    from vllm.config import CUDAGraphMode

    return set(runner.cudagraph_dispatcher.cudagraph_keys[CUDAGraphMode.FULL])


def test_probe_sees_stock_dispatch_one_token_steps_to_no_full_graph():
    from vllm.config import CUDAGraphMode

    from vllm_k2_plugin.spec_guard import decode_graphs as graphs

    runner = graphs.stand_in_runner(num_spec_tokens=K)
    assert all(graphs.dispatch_one_token_step(runner, n)[0] != CUDAGraphMode.FULL for n in range(1, 17))
    assert graphs._upstream_has_one_token_graphs() is False


def test_one_token_steps_reach_full_graphs_and_verify_steps_keep_vllms(patched):
    import numpy as np
    from vllm.config import CUDAGraphMode
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    graphs = patched
    assert graphs._upstream_has_one_token_graphs() is True
    runner = graphs.stand_in_runner(num_spec_tokens=K, max_num_seqs=16, capture_sizes=(4, 8, 12, 16))
    # vLLM rounded its capture sizes to multiples of 1 + k; one-token steps pad as without speculation
    expected_pad = {1: 1, 2: 2, 3: 4, 4: 4, 5: 8, 8: 8, 9: 12, 13: 16, 16: 16}
    for n, pad in expected_pad.items():
        mode, desc = graphs.dispatch_one_token_step(runner, n)
        assert mode == CUDAGraphMode.FULL, (n, mode)
        assert (desc.num_tokens, desc.num_reqs, desc.uniform) == (pad, pad, True), (n, desc)
    # verify steps of 1 + k tokens per request: vLLM's own graphs, as before
    for reqs in (1, 2, 4):
        tokens = np.full(reqs, 1 + K, dtype=np.int32)
        mode, desc = GPUModelRunner._determine_batch_execution_and_padding(
            runner, reqs * (1 + K), reqs, tokens, 1 + K, False
        )[:2]
        assert mode == CUDAGraphMode.FULL and (desc.num_tokens, desc.num_reqs) == (reqs * (1 + K), reqs)
    # a mixed batch is not a one-token decode batch
    mode, _ = GPUModelRunner._determine_batch_execution_and_padding(runner, 3, 2, np.array([1, 2]), 2, False)[:2]
    assert mode != CUDAGraphMode.FULL
    # the runner and dispatcher see vLLM's query length again after each dispatch
    assert runner.uniform_decode_query_len == runner.cudagraph_dispatcher.uniform_decode_query_len == 1 + K
    # one-token keys never coincide with vLLM's (they differ in requests per token)
    ours = graphs._graphs(runner).keys
    assert all(key.num_reqs == key.num_tokens for key in ours)
    assert all(key.num_reqs * (1 + K) == key.num_tokens for key in _full_keys(runner) - set(ours))


def _recording_runner(graphs, monkeypatch, fail_query_len: int | None = None):
    """The stand-in runner with what vLLM's capture loop reads, its dummy run recording the
    query length the runner and dispatcher held at each capture (and failing at one if asked).
    No device here: the loop's device synchronisations do nothing."""
    from types import SimpleNamespace

    import torch

    monkeypatch.setattr(torch.accelerator, "synchronize", lambda *a, **kw: None, raising=False)

    runner = graphs.stand_in_runner(num_spec_tokens=K)
    runner.load_config = SimpleNamespace(use_tqdm_on_load=False)
    runner.parallel_config.use_ubatching = False
    runner.compilation_config.cudagraph_num_of_warmups = 1
    runner.lora_config = None
    runner.maybe_remove_all_loras = lambda config: None
    captured = []

    def dummy_run(num_tokens, *args, is_graph_capturing=False, uniform_decode=False, **kwargs):
        query_len = runner.uniform_decode_query_len
        if is_graph_capturing:
            if query_len == fail_query_len:
                raise RuntimeError("capture failed (planted)")
            captured.append((num_tokens, query_len, runner.cudagraph_dispatcher.uniform_decode_query_len))

    runner._dummy_run = dummy_run
    return runner, captured


def test_each_graph_is_captured_with_the_query_length_it_replays(patched, monkeypatch):
    from vllm.config import CUDAGraphMode
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    graphs = patched
    runner, captured = _recording_runner(graphs, monkeypatch)
    ours = {key.num_tokens for key in graphs._graphs(runner).keys}
    stock = {key.num_tokens for key in _full_keys(runner)} - ours  # vLLM's sizes not shared with ours
    for mode, descs in runner.cudagraph_dispatcher.get_capture_descs():
        if mode == CUDAGraphMode.FULL:
            GPUModelRunner._capture_cudagraphs(runner, descs, mode)
    assert len(captured) == len(_full_keys(runner))
    assert {(n, q) for n, q, _ in captured if q == 1} == {(n, 1) for n in ours}
    assert {n for n, q, _ in captured if q == 1 + K} >= stock
    assert all(q == dispatcher_q for _, q, dispatcher_q in captured)
    assert runner.uniform_decode_query_len == runner.cudagraph_dispatcher.uniform_decode_query_len == 1 + K


def test_a_failed_capture_of_ours_leaves_vllms_graphs_serving(patched, monkeypatch):
    from vllm.config import CUDAGraphMode
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    graphs = patched
    runner, captured = _recording_runner(graphs, monkeypatch, fail_query_len=1)
    ours = set(graphs._graphs(runner).keys)
    for mode, descs in runner.cudagraph_dispatcher.get_capture_descs():
        if mode == CUDAGraphMode.FULL:
            GPUModelRunner._capture_cudagraphs(runner, descs, mode)
    assert captured and all(q == 1 + K for _, q, _ in captured)  # vLLM's own graphs were captured
    assert graphs._graphs(runner) is None and not (_full_keys(runner) & ours)
    assert graphs.dispatch_one_token_step(runner, 3)[0] != CUDAGraphMode.FULL
    assert runner.uniform_decode_query_len == 1 + K


def test_a_dispatcher_this_was_not_written_for_keeps_vllms_keys(patched, monkeypatch):
    """If planning our keys fails (a release whose dispatcher differs), vLLM's keys stand and
    the engine starts."""
    from vllm.config import CUDAGraphMode

    graphs = patched
    monkeypatch.setattr(graphs, "SMALL_SIZES", None)  # planning now raises inside the wrapper
    runner = graphs.stand_in_runner(num_spec_tokens=K)
    assert graphs._graphs(runner) is None
    assert all(key.num_reqs * (1 + K) == key.num_tokens for key in _full_keys(runner))
    assert graphs.dispatch_one_token_step(runner, 3)[0] != CUDAGraphMode.FULL
