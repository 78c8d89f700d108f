"""AOT compile (no GPU) of every configuration the MLA launcher can choose.

The sm_120 claim rests on this test: Triton's compiler for GPUTarget("cuda", 120, 32)
reports each configuration's shared memory, which must fit sm_120's 101,376 B opt-in
limit (fp8 included) and stay within the table the launcher chooses from.
"""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed in this venv", allow_module_level=True)

from vllm_k2_plugin.mla import aot, configs  # noqa: E402

SM120_LIMIT = 101_376


@pytest.mark.parametrize("arch", [120, 90])
def test_every_launcher_config_compiles_and_fits(arch):
    limit = configs.SMEM_LIMITS[arch]
    split_cfgs = configs.all_split_configs(limit)
    assert {c.fp8 for c in split_cfgs} == {False, True}
    report = []
    for cfg in split_cfgs:
        for direct in (False, True):
            shared, _, _ = aot.compile_one("split", cfg, arch, direct=direct)
            report.append((cfg, direct, shared))
            assert shared <= limit, f"{cfg} direct={direct}: {shared} B > {limit} B on sm_{arch}"
            assert shared <= configs.table_smem(cfg), f"{cfg}: {shared} B exceeds the launcher's table"
            if arch == 120:
                assert shared <= SM120_LIMIT
    if arch == 120:  # every preferred variant (a smaller-smem device falls back along the list)
        for fp8, prefs in configs.PREFERENCE.items():
            for warps, block_n, stages in prefs:
                cfg = configs.SplitConfig(16, configs.BLOCK_M, block_n, warps, stages, fp8, configs.D_SPLIT[fp8])
                for direct in (False, True):
                    shared, regs, _ = aot.compile_one("split", cfg, arch, direct=direct, ptxas=True)
                    assert shared <= configs.table_smem(cfg) <= SM120_LIMIT, f"{cfg}: {shared} B"
                    # the launcher's resident-slot count must never overestimate
                    assert regs is not None and regs <= configs.table_regs(cfg), (cfg, regs)
        for fp8 in (False, True):  # the 32-row tile
            cfg = configs.split_config(16, fp8, SM120_LIMIT, configs.WIDE_FROM_ROWS[fp8])
            assert cfg.block_m == configs.WIDE_BLOCK_M
            for direct in (False, True):
                shared, regs, spill = aot.compile_one("split", cfg, arch, direct=direct, ptxas=True)
                assert shared <= configs.table_smem(cfg) <= SM120_LIMIT, f"{cfg}: {shared} B"
                assert regs is not None and regs <= configs.table_regs(cfg) and not spill, (cfg, regs, spill)
    for cfg in configs.all_reduce_configs():
        shared, _, _ = aot.compile_one("reduce", cfg, arch)
        assert shared <= limit
        report.append((cfg, None, shared))
    print(f"\nsm_{arch} shared memory (B):")
    for cfg, direct, shared in report:
        print(f"  {cfg} direct={direct}: {shared}")
