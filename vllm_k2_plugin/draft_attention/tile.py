"""Patch ``draft-attention-tile``: TRITON_ATTN's split-KV (3D) decode kernel walks its segment
128 keys at a time instead of 16, where a start-up measurement finds that correct and faster.

Why: vLLM decodes 16-bit KV with 16-key tiles (``_get_tile_size``), and each program of the 3D
kernel loads one tile per step of its loop. At a K2.5 drafter's TP-8 shape (8 query heads, one
KV head, head 128) on the H200 that streams the context at 0.1-0.7 TB/s; with 128-key tiles one
row at 128k takes 37.9 against 95.0 µs (128 segments) and the first pass's 4 rows 111 against
349 µs (32 segments): benchmarks/results/draft_attention_tile_h200/. In the engine (0.16 route C,
24-layer slice, 128k) the drafter's attention was 0.53 ms of each EAGLE-3 step.

Before a tile replaces vLLM's, each process measures, at its first TRITON_ATTN metadata
builder on a CUDA device (engine start-up, before graph capture): vLLM's own
``unified_attention`` decodes one row over a long synthetic context at the builder's KV shape,
with the segments a one-row decode gets, once with vLLM's tile and once with ours (outputs from
eager calls; GPU times from replays of each call captured in a CUDA graph). Ours is used for
that head size and dtype only if its output matches vLLM's within bf16 rounding and it is
faster; anything else (an error, a failed capture, a mismatch, slower) keeps vLLM's tile. One log line says
which and the two times. Sliding-window and fp8 decodes, and prefills, keep vLLM's tile.
"""

from __future__ import annotations

import functools

from ..gpu_timing import graph_replay_us
from ..log import get_logger
from ..patching import REGISTRY, PatchContext, scope
from ..platform import no_cuda

OPS = "vllm.v1.attention.ops.triton_unified_attention"
BUILDER = "vllm.v1.attention.backends.triton_attn"
PATCH_NAME = "draft-attention-tile"
CANDIDATE = 128
#: a candidate must beat vLLM's tile by this factor (timing noise must not flip the choice)
MARGIN = 0.95
#: relative L2 difference allowed between the two tiles' outputs (bf16 outputs, fp32 softmax)
TOLERANCE = 2e-2
#: KV bytes of the synthetic context: well above the H200's 50 MB L2, so the timing streams
#: from memory as a long context does
CHECK_KV_BYTES = 96 << 20
MAX_CHECK_CONTEXT = 131072
PAGE = 16

#: (head size, element size) -> decode tile chosen by the start-up measurement
CHOSEN: dict[tuple[int, int], int] = {}
#: what each measurement found, for `vllm-k2 doctor` and the tests
MEASURED: dict[tuple[int, int], dict] = {}


def decide(stock_us: float, ours_us: float, rel_err: float) -> bool:
    """Whether our tile replaces vLLM's: correct within TOLERANCE and faster by MARGIN."""
    return rel_err == rel_err and rel_err <= TOLERANCE and ours_us < stock_us * MARGIN


def decode_tile(stock_tile, head_size: int, sliding_window: int, element_size: int, is_prefill: bool) -> int:
    """Our decode tile where the measurement chose it, else vLLM's."""
    if is_prefill or sliding_window or element_size < 2:
        return stock_tile
    return CHOSEN.get((head_size, element_size), stock_tile)


def _wrap_get_tile_size(original):
    def _get_tile_size(head_size, sliding_window, element_size, is_prefill):
        stock = original(head_size, sliding_window, element_size, is_prefill)
        return decode_tile(stock, head_size, sliding_window, element_size, is_prefill)

    return _get_tile_size


def fixed_decode_tile(stock, tile: int):
    """vLLM's ``_get_tile_size`` (``stock``) with the decode tile fixed to ``tile``."""

    def get_tile_size(head_size, sliding_window, element_size, is_prefill):
        return stock(head_size, sliding_window, element_size, is_prefill) if is_prefill else tile

    return get_tile_size


def _eager_us(torch, fn, reps: int = 9) -> float:
    """Median time of eager ``fn`` calls between CUDA events (includes the host's launch cost)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(1000 * a.elapsed_time(b))
    return sorted(times)[reps // 2]


def measure(device, heads_q: int, heads_kv: int, head: int, dtype, segments: int) -> dict:
    """vLLM's unified_attention, one decode row over a long paged context, with vLLM's decode
    tile and with CANDIDATE: both outputs (eager) and both GPU times (CUDA-graph replays)."""
    import importlib

    import torch

    ops = importlib.import_module(OPS)
    ctx = min(MAX_CHECK_CONTEXT, CHECK_KV_BYTES // (2 * heads_kv * head * torch.tensor([], dtype=dtype).element_size()))
    ctx -= ctx % PAGE
    pages = ctx // PAGE
    g = torch.Generator(device=device).manual_seed(0)
    kv = torch.randn(pages, 2, PAGE, heads_kv, head, generator=g, device=device, dtype=torch.float32).to(dtype)
    k, v = kv.unbind(1)
    q = torch.randn(1, heads_q, head, generator=g, device=device, dtype=torch.float32).to(dtype)
    table = torch.randperm(pages, generator=g, device=device).to(torch.int32)[None]
    i32 = dict(dtype=torch.int32, device=device)
    pad = 1 << (head - 1).bit_length()
    scratch = [torch.empty(1, heads_q, segments, *s, dtype=torch.float32, device=device) for s in ((pad,), (), ())]
    ones = torch.ones(1, 1, dtype=torch.float32, device=device).expand(1, heads_kv)
    cu_seqlens, seq_lens = torch.tensor([0, 1], **i32), torch.tensor([ctx], **i32)  # made before any capture
    outs, times, timing = {}, {}, "CUDA-graph replays"
    stock_get = ops._get_tile_size
    try:
        for name, tile in (("stock", None), ("ours", CANDIDATE)):
            if tile is not None:
                ops._get_tile_size = fixed_decode_tile(stock_get, tile)
            out = torch.empty_like(q)

            def run(out=out):
                ops.unified_attention(
                    q=q,
                    k=k,
                    v=v,
                    out=out,
                    cu_seqlens_q=cu_seqlens,
                    max_seqlen_q=1,
                    seqused_k=seq_lens,
                    max_seqlen_k=ctx,
                    softmax_scale=head**-0.5,
                    causal=True,
                    window_size=(-1, -1),
                    block_table=table,
                    softcap=0,
                    q_descale=None,
                    k_descale=ones,
                    v_descale=ones,
                    seq_threshold_3D=1,
                    num_par_softmax_segments=segments,
                    softmax_segm_output=scratch[0],
                    softmax_segm_max=scratch[1],
                    softmax_segm_expsum=scratch[2],
                )

            run()
            outs[name] = out.float()  # the eager output: what decides correctness
            try:
                times[name] = graph_replay_us(run)
            except Exception as e:  # noqa: BLE001 - no capture here: eager timing (host cost included), said
                timing = f"eager (CUDA-graph capture failed: {type(e).__name__})"
                times[name] = _eager_us(torch, run)
    finally:
        ops._get_tile_size = stock_get
    a, b = outs["stock"], outs["ours"]
    rel = float((b - a).norm() / a.norm().clamp_min(1e-30)) if torch.isfinite(b).all() else float("nan")
    return {
        "context": ctx,
        "segments": segments,
        "stock_us": round(times["stock"], 2),
        "ours_us": round(times["ours"], 2),
        "rel_err": rel,
        "timing": timing,
    }


def _segments_for_one_row(builder, heads_kv: int, sm_count: int) -> int:
    """The segments a one-row decode gets from this builder (widened if that patch is on)."""
    from ..patching.patch import PatchState
    from . import segments

    stock = int(builder.num_par_softmax_segments)
    if not any(p.name == segments.PATCH_NAME and p.state is PatchState.APPLIED for p in REGISTRY):
        return stock
    out = builder.softmax_segm_output
    rows = out.numel() // (out.shape[1] * out.shape[-1])
    return segments.wide_segments(1, heads_kv, sm_count, stock, rows)


@functools.cache
def _check_once(device_index: int, heads_q: int, heads_kv: int, head: int, dtype_name: str, segs: int) -> None:
    import torch

    dtype = getattr(torch, dtype_name)
    key = (head, torch.tensor([], dtype=dtype).element_size())
    if key in CHOSEN or key in MEASURED:
        return  # one decision per head size and dtype (the first builder's shape measured it)
    where = f"{torch.cuda.get_device_name(device_index)}, heads {heads_q}/{heads_kv}, head {head}, {dtype_name}"
    try:
        m = measure(torch.device("cuda", device_index), heads_q, heads_kv, head, dtype, segs)
    except Exception as e:  # noqa: BLE001 - a candidate that fails to compile or run: vLLM's tile
        MEASURED[key] = {"error": f"{type(e).__name__}: {e}"}
        logger().warning("vllm-k2: draft-attention-tile: %s: %s; vLLM's decode tile kept", where, e)
        return
    MEASURED[key] = m
    used = decide(m["stock_us"], m["ours_us"], m["rel_err"])
    if used:
        CHOSEN[key] = CANDIDATE
    logger().info(
        "vllm-k2: draft-attention-tile: %s, one row over %d keys in %d segments: tile %d %.1f us, vLLM's %.1f us, "
        "rel. difference %.1e: %s",
        where,
        m["context"],
        m["segments"],
        CANDIDATE,
        m["ours_us"],
        m["stock_us"],
        m["rel_err"],
        (f"decode tile {CANDIDATE} used" if used else "vLLM's decode tile kept") + f" (timed by {m['timing']})",
    )


def _wrap_init(original):
    def __init__(self, kv_cache_spec, *args, **kwargs):
        original(self, kv_cache_spec, *args, **kwargs)
        try:
            import torch

            dev = getattr(self, "device", None)
            if dev is None or torch.device(dev).type != "cuda" or torch.cuda.is_current_stream_capturing():
                return
            # no measurement, so no tile of ours, for a model outside the family
            if not scope.acts(PATCH_NAME, getattr(self, "vllm_config", None)):
                return
            index = torch.device(dev).index or 0
            heads_kv = int(kv_cache_spec.num_kv_heads)
            heads_q = max(int(self.num_heads_q), heads_kv)
            heads_q -= heads_q % heads_kv
            sms = torch.cuda.get_device_properties(index).multi_processor_count
            segs = _segments_for_one_row(self, heads_kv, sms)
            dtype = str(kv_cache_spec.dtype).removeprefix("torch.")
            if dtype in ("bfloat16", "float16"):
                _check_once(index, heads_q, heads_kv, int(kv_cache_spec.head_size), dtype, segs)
        except Exception as e:  # noqa: BLE001 - the check must never stop an engine: vLLM's tile
            logger().warning("vllm-k2: draft-attention-tile: start-up check failed (%s); vLLM's decode tile kept", e)

    return __init__


def _upstream_tiles_wider() -> bool:
    """vLLM's decode tile for 16-bit KV at head size 128 is already >= CANDIDATE."""
    import importlib

    ops = importlib.import_module(OPS)
    return ops._get_tile_size(128, 0, 2, is_prefill=False) >= CANDIDATE


def _no_cuda() -> str | None:
    return no_cuda("the tile is measured on the GPU")


def logger():
    return get_logger("draft_attention")


@REGISTRY.patch(
    name=PATCH_NAME,
    feature="draft_attention",
    target=f"{OPS}:_get_tile_size",
    applies_to=">=0.16,<0.35",
    only_if=_no_cuda,
    already_upstream=_upstream_tiles_wider,
    upstream="none yet (vLLM decodes 16-bit KV with 16-key tiles)",
    why="16-key tiles stream a long context at 0.1-0.7 TB/s in the drafter's split-KV decode (H200)",
    remove_when="vLLM's decode tile for 16-bit KV is >= 128 (the probe sees it), or it tunes the tile itself",
)
def _apply(ctx: PatchContext) -> None:
    import importlib

    ctx.target()
    ctx.wrap(importlib.import_module(OPS), "_get_tile_size", _wrap_get_tile_size)
    ctx.wrap(importlib.import_module(BUILDER).TritonAttentionMetadataBuilder, "__init__", _wrap_init)
