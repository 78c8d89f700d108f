"""Start-up check and measured choice of the grouped GGUF MoE path.

Once per process and per expert layout (gate+up type, down type, shapes), on the first GGUF
MoE layer of that layout after the model is loaded, with that layer's own weights:

1. **Check**: ours and vLLM's kernel on random inputs and routings at a few token counts,
   each against a float reference made from vLLM's own dequantization of the touched
   experts. vLLM's kernel quantizes activations to 8 bits, ours keeps them bf16, so the
   tolerance is vLLM's own error on the same inputs (ours may be at most twice it, or 2 %).
   A mismatch, a NaN or any exception keeps vLLM's kernel for the layout.
2. **Choice**: both paths timed per token count (1 ... 64, where vLLM switches to its own
   grouped kernel), each as a CUDA graph of calls with distinct routings (so the experts'
   weights do not stay in L2), ours only where it is faster by more than 3 %. Between two
   measured counts the larger one's answer holds.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..gpu_timing import graph_replay_us

#: token counts timed at start-up; vLLM's GGUF MoE groups by expert itself above 64
TIMED_TOKENS = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64)
#: token counts of the check (the largest touches up to top_k x 8 experts)
CHECK_TOKENS = (1, 3, 8)
#: (token, expert) pairs per timed graph: enough experts that their weights cannot stay in L2
PAIRS_PER_GRAPH, REPLAYS = 256, 5
#: ours must beat vLLM's kernel by this factor to be chosen
MARGIN = 0.97

MoEFn = Callable[..., torch.Tensor]  # (x, w1, w2, topk_weights, topk_ids, type1, type2) -> [T, H]


@dataclass
class Choice:
    """Where ours runs for one expert layout (``ours_up_to[i]`` answers token counts in
    (TIMED_TOKENS[i-1], TIMED_TOKENS[i]]); ``why`` says why it never runs, if so."""

    ours: list[bool] = field(default_factory=list)
    why: str = ""
    timings_us: dict[int, tuple[float, float]] = field(default_factory=dict)  # T -> (vLLM, ours)
    errors: dict[int, tuple[float, float]] = field(default_factory=dict)  # T -> (vLLM, ours) relative

    def use_ours(self, tokens: int) -> bool:
        if not self.ours or tokens > TIMED_TOKENS[-1]:
            return False
        return self.ours[bisect.bisect_left(TIMED_TOKENS, tokens)]

    def summary(self) -> str:
        if self.why:
            return f"vLLM's kernel ({self.why})"
        picked = [t for t, o in zip(TIMED_TOKENS, self.ours, strict=True) if o]
        if not picked:
            return "vLLM's kernel (faster at every timed token count)"
        ratios = ", ".join(f"T={t}: {v / o:.2f}x" for t, (v, o) in self.timings_us.items() if t in picked)
        return f"ours at T in {picked} (vLLM time / ours: {ratios})"


def _routing(tokens: int, experts: int, top_k: int, gen: torch.Generator, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct experts per token, uniformly (what a load-balanced router does on average)."""
    ids = torch.rand((tokens, experts), generator=gen, device=device).topk(top_k, dim=-1).indices
    w = torch.rand((tokens, top_k), generator=gen, device=device) + 0.1
    return (w / w.sum(-1, keepdim=True)).float(), ids.to(torch.int32)


def reference(x, w1, w2, topk_w, topk_ids, t1: int, t2: int, dequantize) -> torch.Tensor:
    """Float32 MoE over the touched experts, weights from ``dequantize(w, type, rows, cols)``."""
    tokens, hidden = x.shape
    two_n = w1.shape[1]
    out = torch.zeros((tokens, hidden), dtype=torch.float32, device=x.device)
    for e in torch.unique(topk_ids).tolist():
        rows, slots = (topk_ids == e).nonzero(as_tuple=True)
        a = dequantize(w1[e], t1, two_n, hidden).float()
        b = dequantize(w2[e], t2, hidden, two_n // 2).float()
        h = x[rows].float() @ a.t()
        g, u = h.chunk(2, dim=-1)
        y = (torch.nn.functional.silu(g) * u) @ b.t()
        out.index_add_(0, rows, y * topk_w[rows, slots, None])
    return out


def _rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    a = a.float()
    if not torch.isfinite(a).all():
        return float("inf")
    return float((a - ref).norm() / ref.norm().clamp_min(1e-30))


def check(w1, w2, t1, t2, top_k: int, vllm_fn: MoEFn, ours_fn: MoEFn, dequantize) -> dict[int, tuple[float, float]]:
    """Relative errors (vLLM, ours) per checked token count; raises AssertionError on a mismatch."""
    device, experts, hidden = w1.device, w1.shape[0], w2.shape[1]
    gen = torch.Generator(device=device).manual_seed(1234)
    errors = {}
    for t in CHECK_TOKENS:
        x = torch.randn((t, hidden), generator=gen, device=device).to(torch.bfloat16)
        topk_w, topk_ids = _routing(t, experts, top_k, gen, device)
        ref = reference(x, w1, w2, topk_w, topk_ids, t1, t2, dequantize)
        ev = _rel_err(vllm_fn(x, w1, w2, topk_w, topk_ids, t1, t2), ref)
        eo = _rel_err(ours_fn(x, w1, w2, topk_w, topk_ids, t1, t2), ref)
        errors[t] = (ev, eo)
        if not eo <= max(2.0 * ev, 0.02):
            raise AssertionError(f"T={t}: relative error {eo:.4f} against vLLM's own {ev:.4f}")
    return errors


def _graph_time_us(fn: MoEFn, calls: list[tuple]) -> float:
    def run_all():
        for args in calls:
            fn(*args)

    return graph_replay_us(run_all, replays=1, batches=REPLAYS, calls_per_fn=len(calls))


def choose(w1, w2, t1, t2, top_k: int, vllm_fn: MoEFn, ours_fn: MoEFn, dequantize, always: bool = False) -> Choice:
    """Check, then time both paths per token count (``always``: ours wherever the check passed,
    timings still taken for the log). Never raises: a failure is the answer."""
    choice = Choice()
    try:
        choice.errors = check(w1, w2, t1, t2, top_k, vllm_fn, ours_fn, dequantize)
    except Exception as e:  # any failure of ours keeps vLLM's kernel
        choice.why = f"self-check failed: {type(e).__name__}: {e}"[:300]
        return choice
    try:
        device, experts, hidden = w1.device, w1.shape[0], w2.shape[1]
        gen = torch.Generator(device=device).manual_seed(99)
        for t in TIMED_TOKENS:
            calls = []
            for _ in range(max(4, -(-PAIRS_PER_GRAPH // (t * top_k)))):
                x = torch.randn((t, hidden), generator=gen, device=device).to(torch.bfloat16)
                calls.append((x, w1, w2, *_routing(t, experts, top_k, gen, device), t1, t2))
            tv, to = _graph_time_us(vllm_fn, calls), _graph_time_us(ours_fn, calls)
            choice.timings_us[t] = (tv, to)
            choice.ours.append(always or to < MARGIN * tv)
    except Exception as e:
        choice.ours, choice.why = [], f"timing failed: {type(e).__name__}: {e}"[:300]
    return choice
