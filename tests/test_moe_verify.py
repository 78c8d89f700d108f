"""Patch ``moe-group-tokens-by-expert``: multi-token batches reach Triton fused_moe sorted by
expert; one token keeps vLLM's unsorted path.

CPU (latest engine): the upstream probe and the single-token path run vLLM's own
``_prepare_expert_assignment`` (the sort is a CUDA op, so the multi-token path is proven
on the GPU). GPU (`gpu` marker, the device run): vLLM's ``fused_experts`` at K2.5's per-GPU
expert shapes, stock and patched, against a float32 reference, for verify-sized batches
whose tokens share experts and whose tokens do not.
"""

from __future__ import annotations

import importlib

import pytest

torch = pytest.importorskip("torch")

MODULE = "vllm.model_executor.layers.fused_moe.fused_moe"
EXPERTS, TOP_K, HIDDEN, INTER = 384, 8, 7168, 2048 // 8  # K2.5 at TP 8


@pytest.fixture(autouse=True)
def _any_model(monkeypatch):
    """These drive the patch's wrappers on bare vLLM objects, outside any engine: no engine
    config for the model gate to read, so it is told to let any model through
    (tests/test_model_scope.py covers the gate)."""
    monkeypatch.setenv("VLLM_K2_ANY_MODEL", "1")


def _installed():
    """The module with the wrapper installed (undone by the caller)."""
    from vllm_k2_plugin.moe_verify.patch import _wrap_prepare

    fm = importlib.import_module(MODULE)
    stock = fm._prepare_expert_assignment
    fm._prepare_expert_assignment = _wrap_prepare(stock)
    return fm, stock


@pytest.mark.vllm_latest
def test_upstream_probe_sees_the_sort():
    from vllm_k2_plugin.moe_verify.patch import _upstream_sorts_small_batches

    assert _upstream_sorts_small_batches() is False
    fm, stock = _installed()
    try:
        assert _upstream_sorts_small_batches() is True
    finally:
        fm._prepare_expert_assignment = stock


@pytest.mark.vllm_latest
def test_one_token_keeps_the_unsorted_path():
    fm, stock = _installed()
    try:
        ids = torch.arange(TOP_K, dtype=torch.int32).view(1, TOP_K)
        sorted_ids, expert_ids, padded = fm._prepare_expert_assignment(
            ids, {"BLOCK_SIZE_M": 16}, 1, TOP_K, EXPERTS, None
        )
    finally:
        fm._prepare_expert_assignment = stock
    assert sorted_ids is None and expert_ids.tolist() == list(range(TOP_K)) and int(padded) == TOP_K * 16


def _routing(tokens: int, shared: bool, gen: torch.Generator) -> torch.Tensor:
    """top-k expert ids per token: every token on the same experts, or distinct random draws."""
    if shared:
        row = torch.randperm(EXPERTS, generator=gen)[:TOP_K]
        return row.repeat(tokens, 1)
    return torch.stack([torch.randperm(EXPERTS, generator=gen)[:TOP_K] for _ in range(tokens)])


def _reference(x, w1, w2, weights, ids):
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = w1[e].float() @ x[t].float()
            act = torch.nn.functional.silu(h[:INTER]) * h[INTER:]
            out[t] += weights[t, j].float() * (w2[e].float() @ act)
    return out


@pytest.mark.gpu
def test_gpu_grouped_experts_match_the_reference_and_stock():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    fm = importlib.import_module(MODULE)
    gen = torch.Generator().manual_seed(0)
    dev = torch.device("cuda")
    w1 = (torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=gen) / HIDDEN**0.5).to(dev, torch.bfloat16)
    w2 = (torch.randn(EXPERTS, HIDDEN, INTER, generator=gen) / INTER**0.5).to(dev, torch.bfloat16)
    sorts = []
    for tokens in (2, 4, 8):
        for shared in (True, False):
            x = torch.randn(tokens, HIDDEN, generator=gen).to(dev, torch.bfloat16)
            ids = _routing(tokens, shared, gen).to(dev, torch.int32)
            weights = torch.rand(tokens, TOP_K, generator=gen).to(dev, torch.float32)
            ref = _reference(x, w1, w2, weights, ids)
            stock_out = fm.fused_experts(x, w1, w2, weights, ids).float()
            _, stock = _installed()
            sort = fm.moe_align_block_size
            fm.moe_align_block_size = lambda *a, n=tokens, s=sort, **kw: sorts.append(n) or s(*a, **kw)
            try:
                ours = fm.fused_experts(x, w1, w2, weights, ids).float()
            finally:
                fm._prepare_expert_assignment, fm.moe_align_block_size = stock, sort
            scale = ref.abs().max()
            for name, out in (("stock", stock_out), ("grouped", ours)):
                err = float((out - ref).abs().max() / scale)
                assert err < 2e-2, (name, tokens, shared, err)
    assert sorted(set(sorts)) == [2, 4, 8]  # the patched runs took the sorted path
