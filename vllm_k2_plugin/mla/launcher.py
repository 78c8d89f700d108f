"""Torch entry point for the MLA decode kernels: configs, workspaces, launches.

``mla_decode`` never allocates when given ``out``/``lse`` and a ``Workspace`` (CUDA
graphs: the workspace is sized once for the largest split x row product, and the split
count depends only on what the caller passes, never on device data).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os

import torch

from . import configs

#: What an interpreted (CPU) run pretends to be: an sm_120-like GPU with few SMs, so
#: tests see splits.
INTERPRET_DEVICE = configs.Device(sm_count=4, smem_per_block=configs.SMEM_LIMITS[120], smem_per_sm=102_400)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.cache
def device_limits(index: int) -> configs.Device:
    """SM count and per-block / per-SM limits of CUDA device ``index``."""
    if interpreting() or not torch.cuda.is_available():
        return INTERPRET_DEVICE
    import triton

    props = triton.runtime.driver.active.utils.get_device_properties(index)
    tp = torch.cuda.get_device_properties(index)
    return configs.Device(
        sm_count=int(props["multiprocessor_count"]),
        smem_per_block=int(props["max_shared_mem"]),
        smem_per_sm=int(getattr(tp, "shared_memory_per_multiprocessor", props["max_shared_mem"])),
        regs_per_sm=int(getattr(tp, "regs_per_multiprocessor", 65536)),
        threads_per_sm=int(getattr(tp, "max_threads_per_multi_processor", 1536)),
        # DDR: two transfers per clock (kHz) over the bus width (bits)
        mem_gbps=2 * int(props["mem_clock_rate"]) * 1e3 * int(props["mem_bus_width"]) / 8 / 1e9,
    )


@functools.cache
def _kernels(interpret: bool):
    """The two kernels. Under TRITON_INTERPRET a private copy of kernel.py is loaded, so
    its @triton.jit runs in interpreter mode even if kernel.py was imported (compiled
    mode) before the variable was set, e.g. by the AOT tests in the same process."""
    if not interpret:
        from . import kernel
    else:
        import importlib.util

        from . import kernel as compiled

        spec = importlib.util.spec_from_file_location(f"{__package__}._kernel_interpreted", compiled.__file__)
        kernel = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(kernel)
    return kernel.mla_decode_split, kernel.mla_decode_reduce


def _device_index(t: torch.Tensor) -> int:
    return t.device.index if t.device.type == "cuda" and t.device.index is not None else 0


@dataclasses.dataclass(frozen=True)
class Plan:
    split: configs.SplitConfig
    reduce: configs.ReduceConfig | None
    num_splits: int
    rows: int  # query tokens x heads per request


def plan(batch: int, num_heads: int, q_len: int, context: int, page: int, fp8: bool, device: configs.Device) -> Plan:
    """Variant and split count for one launch shape (cached per committed preference, so a
    sweep or test that reorders ``configs.PREFERENCE`` never gets a stale plan)."""
    return _plan(batch, num_heads, q_len, context, page, fp8, device, tuple(configs.PREFERENCE[fp8]))


@functools.lru_cache(maxsize=1024)  # outside a full graph every layer asks again (cProfile: 0.4 ms a call)
def _plan(batch, num_heads, q_len, context, page, fp8, device, preference) -> Plan:
    rows = q_len * num_heads
    cfg = configs.split_config(page, fp8, device.smem_per_block, rows)
    splits = configs.num_splits_for(batch, rows, context, cfg, device)
    reduce = configs.reduce_config(splits) if splits > 1 else None
    return Plan(cfg, reduce, splits, rows)


class Workspace:
    """Grow-only fp32 buffers for the split partials (allocate before graph capture)."""

    def __init__(self, device: torch.device | str, rows_x_splits: int = 0):
        self.device = torch.device(device)
        self.out = torch.empty((0, 512), dtype=torch.float32, device=self.device)
        self.lse = torch.empty((0,), dtype=torch.float32, device=self.device)
        self.reserve(rows_x_splits)

    def reserve(self, n: int) -> None:
        if n > self.lse.numel():
            self.out = torch.empty((n, 512), dtype=torch.float32, device=self.device)
            self.lse = torch.empty((n,), dtype=torch.float32, device=self.device)

    @staticmethod
    def bound(num_heads: int, q_len: int, device: configs.Device, max_batch: int, page: int = 16) -> int:
        """Largest tokens x heads x splits the launcher can ask for, any context, either KV dtype."""
        rows = num_heads * q_len
        worst = 0
        for fp8 in (False, True):
            for batch in range(1, max_batch + 1):
                p = plan(batch, num_heads, q_len, 1 << 40, page, fp8, device)
                worst = max(worst, batch * rows * p.num_splits if p.num_splits > 1 else 0)
                narrow = configs.split_config(page, fp8, device.smem_per_block)  # a 32-row tile follows its plan
                if (
                    batch * configs.row_blocks(rows)
                    >= configs.resident_slots(narrow, device) * configs.MAX_SPLITS_OVER_A_WAVE
                ):
                    break  # num_splits_for gives 1 from here on
        return worst


def mla_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    *,
    q_len: int = 1,
    k_scale: torch.Tensor | None = None,
    num_splits: int | None = None,
    config: configs.SplitConfig | None = None,
    context: int | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    workspace: Workspace | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``q`` [tokens, heads, 576] over the paged latent cache.

    kv_cache: [pages, PAGE, 576] (bf16/fp16, or fp8-e4m3 with ``k_scale``), last dim
    contiguous, any page and token strides. block_table [requests, max_pages] int32,
    seq_lens [requests] int32 (cache length including this step's tokens). Requests
    hold ``q_len`` consecutive query tokens each (uniform spec verify), causal.
    ``num_splits`` overrides the split choice and ``config`` the launch variant (sweeps);
    otherwise both are chosen from the batch, heads and ``context`` (default: the largest
    page capacity of the block table, so no device read). Returns out [tokens, heads, 512] (q's dtype) and lse fp32.
    """
    mla_decode_split, mla_decode_reduce = _kernels(interpreting())
    tokens, heads, width = q.shape
    assert width == 576 and kv_cache.shape[-1] == 576, "MLA latent is 512 + 64"
    assert q.stride(-1) == 1 and kv_cache.stride(-1) == 1
    batch = block_table.shape[0]
    assert tokens == batch * q_len, f"{tokens} query tokens != {batch} requests x q_len {q_len}"
    page = kv_cache.shape[1]
    fp8 = kv_cache.dtype in (torch.float8_e4m3fn,)
    assert not fp8 or k_scale is not None, "fp8 KV needs k_scale"
    if context is None:
        context = block_table.shape[1] * page
    p = plan(batch, heads, q_len, context, page, fp8, device_limits(_device_index(q)))
    if config is not None:
        assert num_splits is not None, "a config override needs its split count"
        p = dataclasses.replace(p, split=config)
    if num_splits is not None:
        p = dataclasses.replace(
            p, num_splits=num_splits, reduce=configs.reduce_config(num_splits) if num_splits > 1 else None
        )

    if out is None:
        out = torch.empty((tokens, heads, 512), dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty((tokens, heads), dtype=torch.float32, device=q.device)
    assert lse.is_contiguous() and out.stride(-1) == 1
    direct = p.num_splits == 1
    if direct:
        ws_out, ws_lse = out, lse  # unused by the kernel
    else:
        need = tokens * heads * p.num_splits
        if workspace is None:
            workspace = Workspace(q.device, need)
        elif torch.cuda.is_current_stream_capturing():
            assert workspace.lse.numel() >= need, "workspace too small inside CUDA-graph capture"
        workspace.reserve(need)
        ws_out, ws_lse = workspace.out, workspace.lse
    scale_t = k_scale if k_scale is not None else lse  # any fp32 pointer when unused

    cfg = p.split
    grid = (configs.row_blocks(p.rows, cfg.block_m), p.num_splits, batch)
    mla_decode_split[grid](
        q,
        kv_cache,
        block_table,
        seq_lens,
        scale_t,
        out,
        lse,
        ws_out,
        ws_lse,
        sm_scale * math.log2(math.e),
        q.stride(0),
        q.stride(1),
        kv_cache.stride(0),
        kv_cache.stride(1),
        block_table.stride(0),
        out.stride(0),
        out.stride(1),
        heads,
        q_len,
        p.num_splits,
        PAGE=page,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        IS_FP8=fp8,
        DIRECT=direct,
        D_SPLIT=cfg.d_split,
        DOT_F32=interpreting() and q.dtype != torch.float32,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    if not direct:
        rc = p.reduce
        mla_decode_reduce[(tokens * heads, 512 // rc.block_dv)](
            ws_out,
            ws_lse,
            out,
            lse,
            out.stride(0),
            out.stride(1),
            heads,
            p.num_splits,
            SPLITS_P2=rc.splits_p2,
            BLOCK_DV=rc.block_dv,
            num_warps=rc.num_warps,
        )
    return out, lse
