"""Our Triton MLA decode kernel against the float64 reference.

CPU (TRITON_INTERPRET=1, in one subprocess: the interpreter must be chosen before
triton is first imported, which other test files do through vLLM): small random
cases over head counts, contexts across page boundaries, page sizes, random block
tables, query lengths, bf16/fp8 KV and split
counts; outputs are poisoned with NaN so an unwritten element fails. Note: the
interpreter's bf16 dot is wrong (Triton 3.6 and 3.9), so interpreted runs widen the
dot operands to fp32 (DOT_F32); the bf16 dot itself is covered by the `gpu` tests.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed in this venv", allow_module_level=True)

import torch  # noqa: E402

from vllm_k2_plugin.mla import configs  # noqa: E402
from vllm_k2_plugin.mla.reference import mismatch, mla_decode_reference, random_case  # noqa: E402

pytestmark = pytest.mark.vllm_independent

SM_SCALE = 0.1147  # 1/sqrt(192 * 0.4) order, like DeepSeek with YaRN mscale


def make_case(heads, seqs, page, q_len, fp8, device="cpu", seed=0, pad_pages=2, page_stride_extra=0):
    return random_case(heads, seqs, page, q_len, fp8, device, seed, pad_pages, page_stride_extra)


def check(q, kv, bt, sl, k_scale, q_len, splits, tol=1e-2):
    from vllm_k2_plugin.mla.launcher import mla_decode

    out = torch.full((q.shape[0], q.shape[1], 512), float("nan"), dtype=q.dtype, device=q.device)
    lse = torch.full((q.shape[0], q.shape[1]), float("nan"), dtype=torch.float32, device=q.device)
    o, got_lse = mla_decode(q, kv, bt, sl, SM_SCALE, q_len=q_len, k_scale=k_scale, num_splits=splits, out=out, lse=lse)
    assert o.data_ptr() == out.data_ptr()
    ro, rl = mla_decode_reference(q, kv, bt, sl, SM_SCALE, q_len=q_len, k_scale=k_scale)
    why = mismatch(o, got_lse, ro, rl, tol)
    assert why is None, why


# (heads, seqs, page, q_len, fp8, splits): contexts 1..~300 across page edges
CASES = [
    (8, [1, 16, 17], 16, 1, False, 1),
    (8, [31, 33, 200], 16, 4, False, 3),
    (8, [64, 65], 64, 2, True, 2),
    (16, [15, 129], 16, 3, False, 4),
    (16, [1, 2, 3], 64, 3, True, 1),  # q_len 3 over 1-2 tokens: rows with no visible key
    (64, [47, 96], 16, 1, True, 5),
    (64, [300], 64, 2, False, 8),
    (128, [5, 70], 16, 1, False, 2),
    (128, [130], 64, 4, True, 3),
    (8, [1, 5000, 999], 16, 2, False, 300),  # 157 live splits > one reduce chunk (128); empty splits
]


# Other launcher variants (warps, BLOCK_N, stages): the interpreter ignores warps and
# stages, but BLOCK_N changes the split rounding and tile masks.
VARIANT_CASES = [
    (8, [70, 130], 16, 2, False, 3, (8, 64, 2)),
    (16, [33, 90], 64, 1, True, 2, (8, 64, 2)),
    (8, [20, 47], 16, 3, False, 2, (4, 16, 2)),
]


def run_case(i: int, variant: tuple | None = None) -> str:
    heads, seqs, page, q_len, fp8, splits = CASES[i] if variant is None else VARIANT_CASES[i][:6]
    saved = configs.PREFERENCE[fp8]
    if variant is not None:
        configs.PREFERENCE[fp8] = [variant]
    try:
        check(*make_case(heads, seqs, page, q_len, fp8, seed=17 * i + 1), q_len, splits)
    except AssertionError as e:
        return f"FAIL {e}"
    finally:
        configs.PREFERENCE[fp8] = saved
    return "ok"


def run_stride_case() -> str:
    """Page stride != PAGE * 576 (cross-layer layout) and the launcher's own split choice."""
    q, kv, bt, sl, ks = make_case(8, [40, 250], 16, 2, False, seed=7, page_stride_extra=576 * 3)
    assert kv.stride(0) == 16 * 576 + 576 * 3
    try:
        check(q, kv, bt, sl, ks, 2, None)
    except AssertionError as e:
        return f"FAIL {e}"
    return "ok"


@pytest.fixture(scope="module")
def interpreted_results(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("mla") / "results.json"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent.parent), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, __file__, str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize(
    "i", range(len(CASES)), ids=[f"h{c[0]}-s{c[1]}-p{c[2]}-q{c[3]}-{'fp8' if c[4] else 'bf16'}-k{c[5]}" for c in CASES]
)
def test_matches_float64_reference(interpreted_results, i):
    assert interpreted_results[str(i)] == "ok"


@pytest.mark.parametrize("i", range(len(VARIANT_CASES)), ids=[f"n{c[6][1]}" for c in VARIANT_CASES])
def test_other_block_n_variants(interpreted_results, i):
    assert interpreted_results[f"v{i}"] == "ok"


def test_real_page_stride_and_auto_splits(interpreted_results):
    assert interpreted_results["stride"] == "ok"


H200 = configs.Device(132, 232_448, 233_472, regs_per_sm=65_536, threads_per_sm=2048, mem_gbps=4_917)
SM120 = configs.Device(188, 101_376, 102_400, regs_per_sm=65_536, threads_per_sm=1536, mem_gbps=1_792)


def _plan(batch, heads, q_len, ctx, device, fp8=False):
    from vllm_k2_plugin.mla.launcher import plan

    return plan(batch, heads, q_len, ctx, 16, fp8, device)


def test_resident_slots_from_smem_and_registers():
    cfg = configs.split_config(16, False, H200.smem_per_block)
    assert (cfg.num_warps, cfg.block_n, cfg.num_stages) == (4, 32, 5)
    assert configs.resident_slots(cfg, H200) == 264  # 2 per SM: 93.7 KB shared, 256 regs x 128 threads
    assert configs.resident_slots(cfg, SM120) == 188  # 1 per SM: 100 KB per SM


def test_split_choice_measured_optima():
    # the H200 sweeps' best split counts for these shapes (benchmarks/results/mla_h200.md)
    assert _plan(64, 8, 1, 8192, H200).num_splits == 4  # 256 programs; 5 would be 1.2 waves
    assert _plan(8, 8, 1, 32768, H200).num_splits in (32, 33)  # 32 tiles per split either way
    assert _plan(16, 8, 1, 32768, H200).num_splits == 16
    assert _plan(1, 8, 1, 8192, H200).num_splits == 128  # 1 per SM beat 2 per SM (256) here
    assert 200 <= _plan(1, 8, 1, 32768, H200).num_splits <= 264  # and lost at 32k
    assert _plan(1, 8, 1, 200, H200).num_splits <= 7  # one 32-token tile per split at most
    assert _plan(128, 64, 1, 8192, H200).num_splits == 1  # 512 programs already


@pytest.mark.parametrize("device", [H200, SM120], ids=["h200", "sm120"])
def test_split_choice_never_a_fraction_of_a_wave(device):
    for fp8 in (False, True):
        for heads, q_len in ((8, 1), (8, 4), (16, 2), (64, 1), (128, 4)):
            for batch in (1, 2, 3, 5, 8, 13, 32, 64, 100, 256):
                for ctx in (1, 300, 8192, 131072):
                    p = _plan(batch, heads, q_len, ctx, device, fp8)
                    grid = batch * configs.row_blocks(heads * q_len, p.split.block_m) * p.num_splits
                    # a 32-row tile runs the 16-row plan's grid: the waves are the 16-row variant's
                    narrow = configs.split_config(16, fp8, device.smem_per_block)
                    programs = batch * configs.row_blocks(heads * q_len)
                    slots = configs.resident_slots(narrow, device)
                    tiles = -(-ctx // p.split.block_n)
                    assert 1 <= p.num_splits <= max(1, tiles)
                    if programs <= slots:
                        assert grid <= slots, (batch, heads, q_len, ctx, p.num_splits)


def test_row_tile_follows_rows_per_request():
    # 32-row tiles (one dot) from WIDE_FROM_ROWS rows on (H200 tile probe), with the 16-row plan's
    # grid; 16-row bf16 tiles run D_SPLIT
    narrow = _plan(8, 8, 4, 32768, H200).split
    assert (narrow.block_m, narrow.d_split) == (16, True)  # 32 rows: 16-row tiles were faster (bf16)
    wide = _plan(64, 64, 4, 8192, H200)
    assert (wide.split.block_m, wide.num_splits, wide.split.d_split) == (32, 2, False)  # the probe's best
    assert _plan(8, 64, 1, 8192, H200, fp8=True).split.block_m == 32
    assert not _plan(1, 8, 1, 8192, H200, fp8=True).split.d_split
    assert _plan(8, 8, 4, 32768, H200, fp8=True).split.block_m == 16
    small = configs.Device(132, 60_000, 233_472)  # no room for the 32-row tile: 16-row tiles
    assert _plan(64, 64, 4, 8192, small).split.block_m == 16


def test_plan_follows_a_reordered_preference():
    # sweeps and tests reorder configs.PREFERENCE; a cached plan must not outlive that
    saved = configs.PREFERENCE[False]
    try:
        first = _plan(1, 8, 1, 8192, H200).split
        configs.PREFERENCE[False] = [(8, 64, 2)]
        again = _plan(1, 8, 1, 8192, H200).split
    finally:
        configs.PREFERENCE[False] = saved
    assert (first.num_warps, first.block_n, first.num_stages) == saved[0]
    assert (again.num_warps, again.block_n, again.num_stages) == (8, 64, 2)


def test_workspace_bound_covers_every_choice():
    from vllm_k2_plugin.mla.launcher import Workspace

    for heads, q_len in ((8, 1), (8, 4), (64, 2)):
        bound = Workspace.bound(heads, q_len, H200, max_batch=4096)
        worst = max(
            b * heads * q_len * _plan(b, heads, q_len, 1 << 30, H200, fp8).num_splits
            for b in range(1, 600)
            for fp8 in (False, True)
        )
        assert bound >= worst


@pytest.mark.parametrize("limit", [configs.SMEM_LIMITS[120], configs.SMEM_LIMITS[90], 60_000])
def test_stage_choice_fits_limit(limit):
    for cfg in configs.all_split_configs(limit):
        assert configs.table_smem(cfg) <= limit or cfg.num_stages == 1


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [8, 16, 64, 128])
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("q_len", [1, 4])
def test_gpu_real_sizes(heads, fp8, q_len):
    seqs = [1, 4097, 8191, 33000][: 4 if heads <= 16 else 3]
    check(*make_case(heads, seqs, 16, q_len, fp8, device="cuda", seed=heads + q_len), q_len, None)
    check(*make_case(heads, [2049, 40], 64, q_len, fp8, device="cuda", seed=3), q_len, 7)


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_equals_eager():
    from vllm_k2_plugin.mla.launcher import Workspace, device_limits, mla_decode

    q, kv, bt, sl, ks = make_case(8, [3000, 9000], 16, 4, True, device="cuda", seed=11)
    ws = Workspace("cuda", Workspace.bound(8, 4, device_limits(0), max_batch=2))
    out = torch.empty(q.shape[0], 8, 512, dtype=q.dtype, device="cuda")
    lse = torch.empty(q.shape[0], 8, dtype=torch.float32, device="cuda")
    ctx = 16384  # the graph's context bound: the split count is fixed by it

    def run():
        mla_decode(q, kv, bt, sl, SM_SCALE, q_len=4, k_scale=ks, context=ctx, out=out, lse=lse, workspace=ws)

    run()  # compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for seed in range(3):  # new contents and lengths, same shapes: replay must equal eager
        g = torch.Generator(device="cuda").manual_seed(seed)
        q.copy_(torch.randn(q.shape, generator=g, device="cuda").to(q.dtype))
        sl.copy_(torch.randint(1, 9000, (2,), generator=g, device="cuda").to(torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        got_o, got_l = out.clone(), lse.clone()
        eo, el = mla_decode(q, kv, bt, sl, SM_SCALE, q_len=4, k_scale=ks, context=ctx)
        assert torch.equal(got_o, eo) and torch.equal(got_l, el)
        ro, _ = mla_decode_reference(q, kv, bt, sl, SM_SCALE, q_len=4, k_scale=ks)
        assert (got_o.double().cpu() - ro).norm() / ro.norm() < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True])
def test_gpu_untuned_shapes_launcher_choice(fp8):
    """Shapes nobody tuned for, with the launcher's own split and variant choice."""
    check(*make_case(16, [7777], 64, 3, fp8, device="cuda", seed=5), 3, None)
    check(*make_case(128, [3001, 17], 16, 2, fp8, device="cuda", seed=6), 2, None)
    check(*make_case(8, [1, 300, 4097, 20000, 65537], 16, 1, fp8, device="cuda", seed=7), 1, None)


if __name__ == "__main__":  # the interpreted run (see interpreted_results)
    assert os.environ.get("TRITON_INTERPRET") == "1"
    results = {str(i): run_case(i) for i in range(len(CASES))}
    results.update({f"v{i}": run_case(i, VARIANT_CASES[i][6]) for i in range(len(VARIANT_CASES))})
    results["stride"] = run_stride_case()
    Path(sys.argv[1]).write_text(json.dumps(results))
