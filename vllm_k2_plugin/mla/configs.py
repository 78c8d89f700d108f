"""Launch configurations: block sizes, warps, pipeline stages, split count.

Shared memory: the split kernel's shared memory is the latent tile(s) (BLOCK_N x 576,
2 B bf16 / 1 B fp8), the staged query and layout-conversion scratch. ``VARIANT_SMEM``
holds Triton's own numbers per variant (checked by ``aot`` in tests/test_mla_aot.py);
the launcher takes the most preferred variant whose number fits the device's opt-in
limit, read at run time from Triton's device properties. That is what keeps fp8 inside
sm_120's 101,376 B (upstream's fp8 path needed 102,400 B at 2 stages, vLLM #53748).

Split count (``num_splits_for``): the programs a launch can keep resident at once (its
"slots": SMs x blocks per SM, from the variant's shared memory and registers against the
device's per-SM limits) are filled in whole waves, never by a fraction of a wave, and
each split's walk is as short as ``launch_cost_us`` says pays (its constants were fit to
the committed H200 split sweep). Under CUDA graphs the caller passes the maximum
context, so the count is a function of the captured batch size alone.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Opt-in shared memory per block (bytes) of the targets we compile for.
SMEM_LIMITS = {120: 101_376, 90: 232_448}
PAGES = (16, 64)  # vLLM's KV block sizes for MLA on these GPUs (16 default, 64 FlashMLA-style)
#: One row block = 16 (query token, head) rows, the smallest dot tile. Larger blocks
#: (32/64 rows x 512 fp32 accumulator) spill registers on sm_120 (ptxas, measured by
#: aot); more rows take more row blocks, which run side by side and share the latent
#: tiles through L2 (program axis 0 is the row block).
BLOCK_M = 16
#: Shared memory (bytes) of the split kernel per (num_warps, BLOCK_N, num_stages), as
#: Triton 3.6 and 3.9 compile it for sm_120 and sm_90 (identical numbers; ``aot``
#: recompiles each entry and tests/test_mla_aot.py fails if the installed Triton needs
#: more). Only variants whose split path has no register spills on sm_120 (ptxas -v)
#: #: are listed: BLOCK_N = 64 at 4 warps and 32/64-row blocks spill. fp8 (8, 64, 2) spills
#: 12 B in its one-split (DIRECT) form (Triton 3.9), which only large batches use. Triton's pipeliner keeps the
#: latent tile single-buffered up to 4 stages and double-buffers it at 5.
VARIANT_SMEM = {
    False: {
        (4, 32, 2): 56_320,
        (4, 32, 3): 56_576,
        (4, 32, 5): 93_696,
        (8, 32, 2): 56_320,
        (8, 32, 5): 93_696,
        (8, 64, 2): 94_208,
        (8, 64, 3): 94_720,
        (4, 16, 2): 37_376,
        (4, 16, 5): 56_064,
    },
    True: {  # fp8 KV (dots in fp16)
        (8, 32, 2): 53_248,
        (8, 32, 5): 55_552,
        (8, 64, 2): 88_064,
        (8, 64, 3): 88_320,
        (4, 16, 2): 35_840,
        (4, 16, 5): 36_992,
    },
}
#: Launcher preference per KV dtype, best first; the first variant whose shared memory
#: fits the device's limit is used. From the H200 variant sweep in
#: benchmarks/results/mla_h200.md (kernel-only geomean over four probes, with the
#: launcher's split choice; tests/test_mla_results.py checks the first entries against it).
PREFERENCE = {
    False: [(4, 32, 5), (8, 64, 2), (8, 32, 5), (4, 32, 2), (4, 16, 2)],
    True: [(8, 64, 2), (8, 32, 5), (8, 32, 2), (4, 16, 2)],
}
MAX_SPLITS = 512
#: Cost model of one launch (µs), fit to the H200 split sweep (benchmarks/results/
#: mla_h200.md; it picks within 2.5 % of the best measured split count in every series):
#: each program co-resident on an SM adds a fixed part (launch ramp, query and block-table
#: loads, partial write), and a tile walk costs the larger of a latency floor and the
#: tile's share of the memory bandwidth at the launch's concurrency.
FIXED_US_PER_RESIDENT = 2.0
TILE_LATENCY_US = 1.5
#: Share of the DRAM peak (from memory clock x bus width) a streaming read reaches.
STREAM_EFFICIENCY = 0.82
#: When programs already exceed the slots, splitting only evens out the waves (and from
#: this many waves on, not at all).
MAX_SPLITS_OVER_A_WAVE = 8
#: Registers per thread of each variant: the largest of sm_120 (ptxas via aot, both the
#: split and the one-split form, Triton 3.6 and 3.9) and the H200 compile (Triton 3.6),
#: rounded up to the allocation unit of 8; tests/test_mla_aot.py fails if a compile needs more.
VARIANT_REGS = {
    False: {
        (4, 32, 2): 256,
        (4, 32, 3): 256,
        (4, 32, 5): 256,
        (8, 32, 2): 152,
        (8, 32, 5): 168,
        (8, 64, 2): 176,
        (8, 64, 3): 192,
        (4, 16, 2): 200,
        (4, 16, 5): 200,
    },
    True: {
        (8, 32, 2): 216,
        (8, 32, 5): 216,
        (8, 64, 2): 256,
        (8, 64, 3): 256,
        (4, 16, 2): 248,
        (4, 16, 5): 256,
    },
}
#: The 512 latent columns of a 16-row tile as four 128-wide dots (the kernel's D_SPLIT)
#: instead of one chain of MMAs over 576 columns, per KV dtype. In the H200 tile probe with
#: it (benchmarks/results/mla_tile_probe_h200_dsplit.md) the launcher's bf16 variant took
#: 0.84-0.96x its one-dot time (8 heads, batch 1-64, q_len 1 and 4, 32k-128k), each form at
#: its best split count of the probe's ladder; fp8's took 1.10-1.15x (its compile's shared
#: memory falls from 88,064 to 38,912 B: by that number the tile is no longer staged there).
#: The bf16 register counts in VARIANT_REGS bound both forms (aot, Triton 3.9).
D_SPLIT = {False: True, True: False}
#: 32-row tiles: one latent tile feeds twice the rows of a program (fewer, larger dots).
#: In the H200 tile probe (benchmarks/results/mla_tile_probe_h200.md), rows per request
#: being query tokens x heads: bf16 at 256 rows (64 heads x q_len 4) the 16-row tile took
#: 1.21-1.23x the 32-row one's time at batch 64, 0.98-1.02x at batch 1-8; at 32 rows the
#: 32-row tile took 1.2-2x the 16-row one's. fp8 from 64 rows: the 16-row tile took 0.98-1.13x.
#: With D_SPLIT the launcher's bf16 16-row variant took 0.91x / 0.99x the 32-row tile's time
#: at 256 rows, batch 1 / 64 (its other variants down to 0.60x): kept until the split sweep
#: is re-run with D_SPLIT (the launcher's split counts there were fit to these tiles).
WIDE_BLOCK_M = 32
WIDE_FROM_ROWS = {False: 256, True: 64}
#: (num_warps, BLOCK_N, num_stages) of the 32-row tile, its shared memory and registers
#: (largest of sm_120 and sm_90, split and one-split forms, Triton 3.6 and 3.9; no spills).
WIDE_VARIANT = {False: (8, 32, 2), True: (8, 32, 2)}
WIDE_SMEM = {False: 75_776, True: 71_680}
WIDE_REGS = {False: 200, True: 256}
REDUCE_SPLITS_P2 = tuple(2**i for i in range(1, 8))  # 2 .. 128: the chunk the reduction loads at once
#: Shared memory the CUDA runtime reserves per resident block (sm_80 and later).
SMEM_RESERVED_PER_BLOCK = 1024


@dataclass(frozen=True)
class Device:
    """What the launcher needs to know of a GPU (from torch's device properties)."""

    sm_count: int
    smem_per_block: int  # opt-in limit of one block
    smem_per_sm: int
    regs_per_sm: int = 65536
    threads_per_sm: int = 1536
    mem_gbps: float = 1800.0  # DRAM peak


@dataclass(frozen=True)
class SplitConfig:
    page: int
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    fp8: bool
    d_split: bool = False  # the kernel's D_SPLIT: four 128-column dots per tile instead of one 512-wide


@dataclass(frozen=True)
class ReduceConfig:
    splits_p2: int
    block_dv: int
    num_warps: int


def row_blocks(rows: int, block_m: int = BLOCK_M) -> int:
    return -(-rows // block_m)


def split_config(page: int, fp8: bool, max_smem: int, rows: int = 1) -> SplitConfig:
    """The 32-row tile from WIDE_FROM_ROWS rows per request on (if it fits ``max_smem``),
    else the most preferred 16-row variant whose measured shared memory fits."""
    if rows >= WIDE_FROM_ROWS[fp8] and WIDE_SMEM[fp8] <= max_smem:
        warps, block_n, stages = WIDE_VARIANT[fp8]
        return SplitConfig(page, WIDE_BLOCK_M, block_n, warps, stages, fp8)
    table = VARIANT_SMEM[fp8]
    fits = [v for v in PREFERENCE[fp8] if table[v] <= max_smem]
    warps, block_n, stages = fits[0] if fits else min(table, key=table.get)
    return SplitConfig(page, BLOCK_M, block_n, warps, stages, fp8, D_SPLIT[fp8])


def all_split_configs(max_smem: int) -> list[SplitConfig]:
    """Every variant the launcher can choose under ``max_smem``: 16- and 32-row tiles."""
    return [
        split_config(page, fp8, max_smem, rows)
        for page in PAGES
        for fp8 in (False, True)
        for rows in sorted({1, WIDE_FROM_ROWS[fp8]})
    ]


def table_smem(cfg: SplitConfig) -> int:
    if cfg.block_m == WIDE_BLOCK_M:
        return WIDE_SMEM[cfg.fp8]
    return VARIANT_SMEM[cfg.fp8][(cfg.num_warps, cfg.block_n, cfg.num_stages)]


def table_regs(cfg: SplitConfig) -> int:
    if cfg.block_m == WIDE_BLOCK_M:
        return WIDE_REGS[cfg.fp8]
    return VARIANT_REGS[cfg.fp8][(cfg.num_warps, cfg.block_n, cfg.num_stages)]


def resident_slots(cfg: SplitConfig, device: Device) -> int:
    """Programs of ``cfg`` the whole device keeps resident at once."""
    threads = 32 * cfg.num_warps
    by_smem = device.smem_per_sm // (table_smem(cfg) + SMEM_RESERVED_PER_BLOCK)
    by_regs = device.regs_per_sm // (table_regs(cfg) * threads)
    by_threads = device.threads_per_sm // threads
    return device.sm_count * max(1, min(by_smem, by_regs, by_threads))


def reduce_config(num_splits: int) -> ReduceConfig:
    chunk = min(REDUCE_SPLITS_P2[-1], max(2, 1 << (num_splits - 1).bit_length()))
    # keep the [chunk x block_dv] fp32 tile at <= 8K elements (64 registers/thread)
    block_dv = max(64, min(512, 8192 // chunk))
    return ReduceConfig(chunk, block_dv, 4)


def all_reduce_configs() -> list[ReduceConfig]:
    return [reduce_config(p2) for p2 in REDUCE_SPLITS_P2]


def launch_cost_us(batch: int, rows: int, context: int, splits: int, cfg: SplitConfig, device: Device) -> float:
    """Modelled time of one split-kernel launch (see the cost model's constants)."""
    slots = resident_slots(cfg, device)
    programs = batch * row_blocks(rows, cfg.block_m) * splits
    waves = -(-programs // slots)
    concurrent = min(programs, slots)
    per_sm = -(-concurrent // device.sm_count)
    per_split = -(-context // splits)
    tiles = -(-per_split // cfg.block_n)  # the kernel rounds a split up to whole tiles
    tile_bytes = cfg.block_n * 576 * (1 if cfg.fp8 else 2)
    stream_us = concurrent * tile_bytes / (STREAM_EFFICIENCY * device.mem_gbps * 1e3)
    return waves * (FIXED_US_PER_RESIDENT * per_sm + tiles * max(TILE_LATENCY_US, stream_us))


def num_splits_for(batch: int, rows: int, context: int, cfg: SplitConfig, device: Device) -> int:
    """KV splits per request: never a fraction of a wave more than needed (at most one
    wave when the requests alone fit in one), the cheapest by ``launch_cost_us``; ties
    go to fewer splits (less reduction work).

    A 32-row tile runs the 16-row plan's grid: per 16-row split, two splits of half the
    length (the same programs, each with the same tokens x rows of work, and half the
    latent tile loads). The cost model was fit to 16-row tiles only; in the tile probe
    this grid was within 3 % of the 32-row tile's best split count, the model's own
    pick for it up to 1.4x slower."""
    if cfg.block_m != BLOCK_M:
        narrow = split_config(cfg.page, cfg.fp8, device.smem_per_block)
        if batch * row_blocks(rows) >= resident_slots(narrow, device) * MAX_SPLITS_OVER_A_WAVE:
            return 1
        per_narrow = cfg.block_m // BLOCK_M
        return min(
            MAX_SPLITS,
            max(1, -(-context // cfg.block_n)),
            per_narrow * num_splits_for(batch, rows, context, narrow, device),
        )
    slots = resident_slots(cfg, device)
    programs = batch * row_blocks(rows, cfg.block_m)
    if programs >= slots * MAX_SPLITS_OVER_A_WAVE:
        return 1  # many waves: the last one's idle share is small already
    tiles = -(-max(context, 1) // cfg.block_n)
    limit = slots // programs if programs <= slots else MAX_SPLITS_OVER_A_WAVE
    best, best_cost = 1, float("inf")
    for s in range(1, max(1, min(limit, tiles, MAX_SPLITS)) + 1):
        cost = launch_cost_us(batch, rows, context, s, cfg, device)
        if cost < best_cost * (1 - 1e-9):
            best, best_cost = s, cost
    return best
