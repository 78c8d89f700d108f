"""Launch configurations: block sizes, warps, pipeline stages, split count.

Shared memory: the split kernel's shared memory is the latent tile(s) (BLOCK_N x 576,
2 B bf16 / 1 B fp8), the staged query and layout-conversion scratch. ``VARIANT_SMEM``
holds Triton's own numbers per variant (checked by ``aot`` in tests/test_mla_aot.py);
the launcher takes the most preferred variant whose number fits the device's opt-in
limit, read at run time from Triton's device properties. That is what keeps fp8 inside
sm_120's 101,376 B (upstream's fp8 path needed 102,400 B at 2 stages, vLLM #53748).

Split count: enough (request x row-block x split) programs to fill the GPU twice over,
but no split shorter than MIN_SPLIT_TOKENS (a split costs a partial write and a
reduction read of 2 KiB per row). Under CUDA graphs the caller passes the maximum
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
#: are listed: BLOCK_N = 64 at 4 warps and 32/64-row blocks spill. (4, 32, 5) spills
#: 16 B in its one-split (DIRECT) form, which only large batches use. Triton's pipeliner keeps the
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
#: fits the device's limit is used. Order from the H200 variant sweep (CUDA-graph
#: timings, benchmarks/results/mla_h200.md): bf16 (4, 32, 5) was fastest (geomean of
#: three probes 168 us vs 201 us for (8, 32, 5)); for fp8 (8, 64, 2) was fastest (173 vs
#: 247 us) but its numerics were not checked on a GPU yet, so fp8 stays on the
#: GPU-verified (8, 32, 5) until they are.
PREFERENCE = {
    False: [(4, 32, 5), (8, 64, 2), (8, 32, 5), (4, 32, 2), (4, 16, 2)],
    True: [(8, 32, 5), (8, 64, 2), (8, 32, 2), (4, 16, 2)],
}
MIN_SPLIT_TOKENS = 256
MAX_SPLITS = 256
CTAS_PER_SM = 2
REDUCE_SPLITS_P2 = tuple(2**i for i in range(1, 9))  # 2 .. 256


@dataclass(frozen=True)
class SplitConfig:
    page: int
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    fp8: bool


@dataclass(frozen=True)
class ReduceConfig:
    splits_p2: int
    block_dv: int
    num_warps: int


def row_blocks(rows: int) -> int:
    return -(-rows // BLOCK_M)


def split_config(page: int, fp8: bool, max_smem: int) -> SplitConfig:
    """The most preferred variant whose measured shared memory fits ``max_smem``."""
    table = VARIANT_SMEM[fp8]
    fits = [v for v in PREFERENCE[fp8] if table[v] <= max_smem]
    warps, block_n, stages = fits[0] if fits else min(table, key=table.get)
    return SplitConfig(page, BLOCK_M, block_n, warps, stages, fp8)


def all_split_configs(max_smem: int) -> list[SplitConfig]:
    return [split_config(page, fp8, max_smem) for page in PAGES for fp8 in (False, True)]


def table_smem(cfg: SplitConfig) -> int:
    return VARIANT_SMEM[cfg.fp8][(cfg.num_warps, cfg.block_n, cfg.num_stages)]


def reduce_config(num_splits: int) -> ReduceConfig:
    p2 = max(2, 1 << (num_splits - 1).bit_length())
    # keep the [splits x block_dv] fp32 tile at <= 16K elements (128 registers/thread)
    block_dv = max(64, min(512, 16384 // p2))
    return ReduceConfig(p2, block_dv, 4)


def all_reduce_configs() -> list[ReduceConfig]:
    return [reduce_config(p2) for p2 in REDUCE_SPLITS_P2]


def num_splits_for(batch: int, rows: int, context: int, sm_count: int) -> int:
    """KV splits per request: fill CTAS_PER_SM x SMs programs, splits >= MIN_SPLIT_TOKENS."""
    programs = batch * row_blocks(rows)
    target = CTAS_PER_SM * sm_count
    if programs >= target or context <= MIN_SPLIT_TOKENS:
        return 1
    want = -(-target // programs)
    return max(1, min(want, context // MIN_SPLIT_TOKENS, MAX_SPLITS))
