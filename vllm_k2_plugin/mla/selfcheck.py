"""Start-up self-check: our MLA decode kernel on this GPU against the float64 reference.

Our backend replaces TRITON_MLA by default, on GPUs we may never have run on. So the
first time a process builds it, the kernels this engine will launch (its KV page size
and dtype; the one-split form and every split-reduce form its batch sizes can pick)
are compiled and run on a small random case. Any mismatch, compile error (e.g. shared
memory this architecture lacks) or exception makes the process fall back to vLLM's
stock TRITON_MLA, with one log line saying why. The verdict is cached per process.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..log import get_logger
from ..platform import on_cuda
from . import configs, launcher
from .reference import mismatch, mla_decode_reference, random_case

logger = get_logger("mla")

SM_SCALE = 0.1147
#: cache lengths of the check's requests: one token, across a page edge, several pages
CHECK_SEQS = (1, 37, 300)


@dataclass(frozen=True)
class EngineShape:
    """What the engine will launch our kernel with (defaults: K2.5 at TP 8, page 16)."""

    page: int = 16
    fp8: bool = False
    heads: int = 8
    q_lens: tuple[int, ...] = (1,)
    max_batch: int = 256
    max_context: int = 4096

    @classmethod
    def from_vllm_config(cls, vllm_config) -> EngineShape:
        if vllm_config is None or getattr(vllm_config, "model_config", None) is None:
            return cls()
        model, cache = vllm_config.model_config, vllm_config.cache_config
        spec = getattr(vllm_config, "speculative_config", None)
        k = int(getattr(spec, "num_speculative_tokens", 0) or 0) if spec is not None else 0
        return cls(
            page=int(cache.block_size or 16),
            fp8=str(cache.cache_dtype).startswith("fp8"),
            heads=int(model.get_num_attention_heads(vllm_config.parallel_config)),
            q_lens=tuple(sorted({1, 1 + k})),
            max_batch=int(vllm_config.scheduler_config.max_num_seqs),
            max_context=int(model.max_model_len),
        )


def split_counts(shape: EngineShape, device: configs.Device) -> list[int]:
    """One split count per reduce kernel the launcher can pick for this engine (the reduce
    kernel is compiled per chunk size), the largest such count (the reduction's chunk
    loop at its longest), plus 1 (the one-split form)."""
    by_reduce: dict[configs.ReduceConfig, int] = {}
    for q_len in shape.q_lens:
        for batch in range(1, shape.max_batch + 1):
            s = launcher.plan(batch, shape.heads, q_len, shape.max_context, shape.page, shape.fp8, device).num_splits
            if s > 1:
                rc = configs.reduce_config(s)
                by_reduce[rc] = max(by_reduce.get(rc, 0), s)
    return [1] + sorted(by_reduce.values())


def check(shape: EngineShape, device: torch.device) -> None:
    """Run every kernel form ``shape`` needs on ``device``; raise on the first mismatch."""
    limits = launcher.device_limits(device.index or 0 if device.type == "cuda" else 0)
    for q_len in shape.q_lens:
        seqs = [max(s, q_len) for s in CHECK_SEQS]
        case = random_case(shape.heads, seqs, shape.page, q_len, shape.fp8, device=device, seed=q_len)
        ref = mla_decode_reference(*case[:4], SM_SCALE, q_len=q_len, k_scale=case[4])
        for splits in split_counts(shape, limits):
            q = case[0]
            out = torch.full((q.shape[0], q.shape[1], 512), float("nan"), dtype=q.dtype, device=device)
            lse = torch.full(q.shape[:2], float("nan"), dtype=torch.float32, device=device)
            launcher.mla_decode(*case[:4], SM_SCALE, q_len=q_len, k_scale=case[4], num_splits=splits, out=out, lse=lse)
            why = mismatch(out, lse, *ref)
            if why:
                raise AssertionError(f"q_len {q_len}, {splits} split(s): {why}")


def _device() -> torch.device | None:
    if on_cuda():
        return torch.device("cuda", torch.cuda.current_device())
    if launcher.interpreting():
        return torch.device("cpu")
    return None


def _describe(device: torch.device) -> str:
    if device.type != "cuda":
        return "the Triton interpreter (CPU)"
    major, minor = torch.cuda.get_device_capability(device)
    return f"{torch.cuda.get_device_name(device)} (sm_{major}{minor})"


@functools.cache
def failure(shape: EngineShape | None = None) -> str | None:
    """None when our kernel passed on this process's device; otherwise why it did not.
    Cached: one check (and at most one log line) per process and engine shape."""
    from .vllm_adapter import current_engine_config

    if shape is None:
        shape = EngineShape.from_vllm_config(current_engine_config())
    device = _device()
    if device is None:
        reason = "no CUDA device and TRITON_INTERPRET is off: Triton cannot run here"
    else:
        try:
            check(shape, device)
            logger.info("vllm-k2: MLA self-check passed on %s for %s", _describe(device), shape)
            return None
        except Exception as e:  # noqa: BLE001 - any failure means: do not serve with it
            reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            where = _describe(device)
            reason = f"on {where}: {reason}"
    logger.warning(
        "vllm-k2: triton-mla-k2-decode self-check failed %s; this process uses vLLM's stock TRITON_MLA", reason
    )
    return reason
