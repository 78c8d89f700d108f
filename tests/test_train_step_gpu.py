"""The fused training-step paths (flash TTT attention, LM-head + soft CE with its gradient
formed in the forward) against the eager references they replace.

CPU tests (unmarked, seconds): the fused paths run on the CPU too (the CPU flash-attention
kernel stands in for the CUDA one), so they are checked there against the reference in
float64/float32, on a whole TTT loss and its gradients. GPU tests (marked ``gpu``, skipped
in CI): the same on CUDA in bf16, and one benchmark step at small dimensions.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from vllm_k2_tools.train import draft_model as dm
from vllm_k2_tools.train import ttt


def small_cfg(rep: int = 2) -> dm.DraftConfig:
    return dm.DraftConfig(
        hidden_size=64,
        target_hidden_size=48,
        num_attention_heads=4,
        num_key_value_heads=4 // rep,
        head_dim=16,
        intermediate_size=96,
        draft_vocab_size=50,
        vocab_size=200,
        aux_layer_ids=[1, 2, 3],
    )


def _bench():
    """benchmarks/train_step.py (a script, not a package module), for its configs."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "train_step.py"
    spec = importlib.util.spec_from_file_location("train_step_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def make(cfg, device="cpu", dtype=torch.float32, b=2, t=23, seed=0):
    g = torch.Generator().manual_seed(seed)
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=g)
    d2t = torch.zeros(cfg.draft_vocab_size, dtype=torch.long)
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[: cfg.draft_vocab_size] = True
    torch.manual_seed(seed)
    model = dm.Eagle3Draft(cfg, embed, d2t, t2d).to(device, dtype)
    with torch.no_grad():  # non-trivial norm weights so their gradients are checked too
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn(p.shape, generator=g).to(device, dtype))
    mask = (torch.rand(b, t, generator=g) > 0.2).long()
    batch = ttt.Batch(
        torch.randint(0, cfg.vocab_size, (b, t), generator=g),
        torch.randn(b, t, cfg.num_aux * cfg.target_hidden_size, generator=g),
        torch.randn(b, t, cfg.target_hidden_size, generator=g),
        mask,
    ).to(device, dtype)
    verifier_w = torch.randn(cfg.draft_vocab_size, cfg.target_hidden_size, generator=g).to(device, dtype)
    return model, batch, verifier_w


@contextlib.contextmanager
def impls(attn: str, loss: str):
    old = dm.ATTENTION_IMPL, ttt.LOSS_IMPL
    dm.ATTENTION_IMPL, ttt.LOSS_IMPL = attn, loss
    try:
        yield
    finally:
        dm.ATTENTION_IMPL, ttt.LOSS_IMPL = old


def loss_and_grads(model, batch, verifier_w, steps=4, chunk=16, autocast=None):
    model.zero_grad(set_to_none=True)
    ctx = torch.autocast(batch.aux.device.type, dtype=autocast) if autocast else contextlib.nullcontext()
    with ctx:
        loss, metrics = ttt.ttt_loss(model, batch, verifier_w, steps=steps, chunk=chunk)
    loss.backward()
    grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters()}
    return float(loss.detach()), metrics, grads


def rel(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def compare(model, batch, verifier_w, tol_loss, tol_grad, autocast=None, steps=4):
    with impls("reference", "reference"):
        ref = loss_and_grads(model, batch, verifier_w, steps=steps, autocast=autocast)
    with impls("fused", "fused"):
        fused = loss_and_grads(model, batch, verifier_w, steps=steps, autocast=autocast)
    assert abs(fused[0] - ref[0]) <= tol_loss * abs(ref[0]), (fused[0], ref[0])
    for k in ref[1]:
        if k.startswith(("n_", "acc_")):
            assert fused[1][k] == pytest.approx(ref[1][k], abs=0.05 if autocast else 1e-9), k
    worst = max((rel(fused[2][n], ref[2][n]), n) for n in ref[2])
    assert worst[0] <= tol_grad, worst
    return worst


@pytest.mark.parametrize("rep", [1, 2])
def test_fused_step_equals_reference_fp32_cpu(rep):
    model, batch, vw = make(small_cfg(rep))
    compare(model, batch, vw, tol_loss=1e-6, tol_grad=1e-5)


def test_fused_step_equals_reference_bf16_autocast_cpu():
    model, batch, vw = make(small_cfg(), seed=3)
    compare(model, batch, vw, tol_loss=2e-2, tol_grad=5e-2, autocast=torch.bfloat16)


def test_fused_attention_equals_reference_float64_cpu():
    torch.manual_seed(1)
    b, h, t, d = 2, 3, 29, 16
    q = torch.randn(b, h, t, d, dtype=torch.float64, requires_grad=True)
    cache = [
        (torch.randn_like(q).requires_grad_(), torch.randn_like(q).requires_grad_()) for _ in range(4)
    ]  # step 0 + three diagonal steps
    leaves = [q] + [x for kv in cache for x in kv]
    g = torch.randn_like(q)
    outs = []
    for f in (dm.ttt_attention_reference, dm.ttt_attention_fused):
        for x in leaves:
            x.grad = None
        o = f(q, cache, d**-0.5)
        (o * g).sum().backward()
        outs.append([o.detach()] + [x.grad.clone() for x in leaves])
    for a, r in zip(outs[1], outs[0], strict=True):
        assert rel(a, r) < 1e-6  # the CPU flash kernel accumulates in float32


def test_bad_impl_names():
    model, batch, vw = make(small_cfg())
    with impls("flex", "reference"), pytest.raises(ValueError, match="ATTENTION_IMPL"):
        ttt.ttt_loss(model, batch, vw, steps=1)
    with impls("reference", "liger"), pytest.raises(ValueError, match="LOSS_IMPL"):
        ttt.ttt_loss(model, batch, vw, steps=1)


@pytest.mark.gpu
def test_fused_step_equals_reference_bf16_cuda():
    model, batch, vw = make(_bench().small_config(), device="cuda", b=2, t=512, seed=5)
    batch = ttt.Batch(batch.input_ids, batch.aux.bfloat16(), batch.final.bfloat16(), batch.loss_mask)
    model.embed_tokens = model.embed_tokens.bfloat16()
    # bf16 operands: ~1e-2 relative on gradients (METHOD.md's bf16 band), loss to 1e-3
    compare(model, batch, vw.bfloat16(), tol_loss=2e-3, tol_grad=3e-2, autocast=torch.bfloat16, steps=7)


@pytest.mark.gpu
def test_fused_attention_equals_reference_cuda_fp64_ref():
    torch.manual_seed(2)
    b, h, t, d = 2, 8, 300, 128
    q = torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    cache = [(torch.randn_like(q).requires_grad_(), torch.randn_like(q).requires_grad_()) for _ in range(7)]
    leaves = [q] + [x for kv in cache for x in kv]
    g = torch.randn_like(q)
    o = dm.ttt_attention_fused(q, cache, d**-0.5)
    (o.float() * g.float()).sum().backward()
    got = [o.detach()] + [x.grad.clone() for x in leaves]
    q64 = q.detach().double().requires_grad_()
    c64 = [(k.detach().double().requires_grad_(), v.detach().double().requires_grad_()) for k, v in cache]
    l64 = [q64] + [x for kv in c64 for x in kv]
    o64 = dm.ttt_attention_reference(q64, c64, d**-0.5)
    (o64 * g.double()).sum().backward()
    ref = [o64.detach()] + [x.grad for x in l64]
    for a, r in zip(got, ref, strict=True):
        assert rel(a.double(), r) < 1e-2


@pytest.mark.gpu
def test_benchmark_step_runs_small_cuda():
    bench = _bench()
    res = bench.bench_single(bench.small_config(), batch=1, seq=256, steps=7, warmup=1, iters=2)
    assert res["tokens_per_s"] > 0 and res["peak_mem_gib"] > 0
    assert res["model_flops_per_step"] == bench.step_flops(bench.small_config(), 1, 256, 7)["total"]
