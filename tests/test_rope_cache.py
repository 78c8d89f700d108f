"""Patch ``rope-float32-cache``: the CUDA rotary op gets a float32 copy of a half cache.

CPU (latest engine): the upstream probe and the wrapper's choice of cache, with vLLM's op
stood in for by a recorder (the op is CUDA-only). GPU (`gpu` marker, the device run with
vLLM 0.20): a real K2.5-drafter-sized module built with the patch, against stock's
forward_cuda: bit-identical q/k, and no cast kernel in the patched call.
"""

from __future__ import annotations

import importlib

import pytest

torch = pytest.importorskip("torch")

MODULE = "vllm.model_executor.layers.rotary_embedding.base"


@pytest.fixture(autouse=True)
def _any_model(monkeypatch):
    """These drive the patch's wrappers on bare vLLM objects, outside any engine: no engine
    config for the model gate to read, so it is told to let any model through
    (tests/test_model_scope.py covers the gate)."""
    monkeypatch.setenv("VLLM_K2_ANY_MODEL", "1")


def _bare(base, cache_dtype=torch.bfloat16):
    m = base.__new__(base)
    torch.nn.Module.__init__(m)
    m.head_size, m.rotary_dim, m.is_neox_style, m.use_flashinfer = 8, 8, True, False
    m.register_buffer("cos_sin_cache", torch.randn(16, 8).to(cache_dtype), persistent=False)
    return m


def _recording_op(monkeypatch):
    from vllm import _custom_ops

    seen = []
    monkeypatch.setattr(_custom_ops, "rotary_embedding", lambda pos, q, k, head, cache, neox, *a: seen.append(cache))
    return seen


@pytest.mark.vllm_latest
def test_upstream_probe_sees_a_float_cache(monkeypatch):
    from vllm_k2_plugin.rope_cache.patch import _upstream_hands_float_cache

    base = importlib.import_module(MODULE).RotaryEmbedding
    assert _upstream_hands_float_cache() is False
    from vllm import _custom_ops

    def upstream_like(self, positions, query, key=None):  # what a fixed upstream would do
        _custom_ops.rotary_embedding(positions, query, key, self.head_size, self.cos_sin_cache.float(), True)
        return query, key

    monkeypatch.setattr(base, "forward_cuda", upstream_like)
    assert _upstream_hands_float_cache() is True


@pytest.mark.vllm_latest
def test_wrapper_hands_the_copy_and_falls_back_to_stock(monkeypatch):
    from vllm_k2_plugin.rope_cache import patch

    base = importlib.import_module(MODULE).RotaryEmbedding
    forward = patch._wrap_forward_cuda(base.forward_cuda)
    m = _bare(base)
    f32 = m.cos_sin_cache.float()
    m.register_buffer(patch.ATTR, f32, persistent=False)
    object.__setattr__(m, patch.SOURCE, m.cos_sin_cache)
    seen = _recording_op(monkeypatch)
    q = torch.zeros(2, 8, dtype=torch.bfloat16)
    forward(m, torch.zeros(2, dtype=torch.long), q, q.clone())
    assert seen[-1] is f32
    # a replaced cache (stock's own dtype matching, a move) means the copy is stale: stock path
    m.cos_sin_cache = m.cos_sin_cache.clone()
    forward(m, torch.zeros(2, dtype=torch.long), q, q.clone())
    assert seen[-1] is m.cos_sin_cache
    # no copy attached (CPU, flashinfer, a class with its own forward_cuda): stock path
    plain = _bare(base)
    forward(plain, torch.zeros(2, dtype=torch.long), q, q.clone())
    assert seen[-1] is plain.cos_sin_cache


@pytest.mark.vllm_latest
def test_no_copy_off_cuda():
    from vllm_k2_plugin.rope_cache import patch

    base = importlib.import_module(MODULE).RotaryEmbedding
    m = _bare(base)
    patch._attach(m, base)  # a CPU cache: never touched
    assert getattr(m, patch.ATTR, None) is None


@pytest.mark.gpu
def test_gpu_float_copy_is_bit_identical_and_casts_nothing():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from torch.profiler import ProfilerActivity, profile
    from vllm.config import VllmConfig, set_current_vllm_config

    from vllm_k2_plugin.rope_cache import patch

    mod = importlib.import_module(MODULE)
    base = mod.RotaryEmbedding
    stock_init, stock_forward = base.__init__, base.forward_cuda
    base.forward_cuda = patch._wrap_forward_cuda(stock_forward)
    base.__init__ = patch._wrap_init(stock_init, base)
    try:
        with set_current_vllm_config(VllmConfig()), torch.device("cuda"):
            # K2.5's drafter rope: 262,144 positions x 128, neox, bf16
            rope = base(128, 128, 262_144, 1e6, True, torch.bfloat16)
        assert getattr(rope, patch.ATTR).dtype == torch.float32
        gen = torch.Generator(device="cuda").manual_seed(0)
        pos = torch.tensor([0, 4095, 131_072, 262_143], device="cuda")
        q0 = torch.randn(4, 8 * 128, generator=gen, device="cuda").to(torch.bfloat16)
        k0 = torch.randn(4, 128, generator=gen, device="cuda").to(torch.bfloat16)
        outs, casts = [], []
        for fwd in (stock_forward, base.forward_cuda):
            q, k = q0.clone(), k0.clone()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                fwd(rope, pos, q, k)
                torch.cuda.synchronize()
            outs.append((q, k))
            casts.append(sum("direct_copy" in e.name for e in prof.events()))
        (qs, ks), (qp, kp) = outs
        assert torch.equal(qs, qp) and torch.equal(ks, kp)
        assert not torch.equal(qs, q0)  # the rotation ran
        assert casts == [1, 0], casts  # stock converts the cache per call; the copy needs none
    finally:
        base.__init__, base.forward_cuda = stock_init, stock_forward
