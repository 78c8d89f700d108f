"""Ahead-of-time compile of every kernel configuration the launcher can choose.

No sm_120 GPU is available here, so the sm_120 claims rest on this: Triton's own
compiler, targeting ``GPUTarget("cuda", 120, 32)``, reports the shared memory of each
configuration, and that must stay within the device's opt-in limit (101,376 B on
sm_120, fp8 included). sm_90 (H100/H200) is compiled too, so the configurations timed
on the H200 are the same code. Runs on a CPU-only machine (ptxas ships with Triton).

    python -m vllm_k2_plugin.mla.aot            # table for sm_120 and sm_90
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
from dataclasses import asdict, dataclass

from . import configs

_PTR = {"bf16": "*bf16", "fp16": "*fp16", "fp8": "*fp8e4nv"}


@dataclass
class AotResult:
    kernel: str
    arch: int
    config: dict
    shared: int
    limit: int
    registers: int | None = None
    spill_bytes: int | None = None

    @property
    def fits(self) -> bool:
        return self.shared <= self.limit


# What Triton's JIT specialises at run time (values % 16 == 0): every pointer (torch
# allocations are 256-B aligned) and the strides that are multiples of 576 or 512. The
# block-table stride and the counts are left unaligned (worst case). Without these hints
# the compile would model 2-byte loads that the real launch never uses.
_SPLIT_ALIGNED = ("stride_q_tok", "stride_q_head", "stride_kv_page", "stride_kv_tok", "stride_o_tok", "stride_o_head")
_REDUCE_ALIGNED = ("stride_o_tok", "stride_o_head")


def _aligned(sig: dict, names: tuple[str, ...]) -> dict:
    return {
        (i,): [["tt.divisibility", 16]]
        for i, (name, ty) in enumerate(sig.items())
        if ty.startswith("*") or name in names
    }


def _split_source(cfg: configs.SplitConfig, q_dtype: str, direct: bool):
    from triton.compiler import ASTSource

    from .kernel import mla_decode_split

    kv = "fp8" if cfg.fp8 else q_dtype
    sig = {
        "Q": _PTR[q_dtype],
        "KV": _PTR[kv],
        "BLOCK_TABLE": "*i32",
        "SEQ_LENS": "*i32",
        "K_SCALE": "*fp32",
        "OUT": _PTR[q_dtype],
        "LSE": "*fp32",
        "WS_OUT": "*fp32",
        "WS_LSE": "*fp32",
        "qk_scale_log2": "fp32",
    }
    for name in (
        "stride_q_tok",
        "stride_q_head",
        "stride_kv_page",
        "stride_kv_tok",
        "stride_bt",
        "stride_o_tok",
        "stride_o_head",
        "num_heads",
        "q_len",
        "num_splits",
    ):
        sig[name] = "i32"
    consts = {
        "PAGE": cfg.page,
        "BLOCK_M": cfg.block_m,
        "BLOCK_N": cfg.block_n,
        "IS_FP8": cfg.fp8,
        "DIRECT": direct,
        "D_SPLIT": cfg.d_split,
        "DOT_F32": False,  # interpreter-only switch; compiled kernels use native dots
    }
    sig.update({k: "constexpr" for k in consts})
    return ASTSource(fn=mla_decode_split, signature=sig, constexprs=consts, attrs=_aligned(sig, _SPLIT_ALIGNED))


def _reduce_source(cfg: configs.ReduceConfig, q_dtype: str):
    from triton.compiler import ASTSource

    from .kernel import mla_decode_reduce

    sig = {"WS_OUT": "*fp32", "WS_LSE": "*fp32", "OUT": _PTR[q_dtype], "LSE": "*fp32"}
    for name in ("stride_o_tok", "stride_o_head", "num_heads", "num_splits"):
        sig[name] = "i32"
    consts = {"SPLITS_P2": cfg.splits_p2, "BLOCK_DV": cfg.block_dv}
    sig.update({k: "constexpr" for k in consts})
    return ASTSource(fn=mla_decode_reduce, signature=sig, constexprs=consts, attrs=_aligned(sig, _REDUCE_ALIGNED))


def _ptxas_report(ptx: str, arch: int) -> tuple[int | None, int | None]:
    """Registers and spill bytes from ptxas -v (Triton's bundled ptxas)."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        try:
            ptxas = get_ptxas(arch).path  # Triton >= 3.5 takes the arch
        except TypeError:
            ptxas = get_ptxas(arch).path if arch >= 100 else get_ptxas().path
    except Exception:  # noqa: BLE001 - the report is optional
        return None, None
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        sm = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
        proc = subprocess.run(
            [ptxas, "-v", f"--gpu-name={sm}", src, "-o", os.path.join(tmp, "k.o")],
            capture_output=True,
            text=True,
        )
    text = proc.stdout + proc.stderr
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.search(r"(\d+) bytes spill stores", text)
    return (int(regs.group(1)) if regs else None, int(spill.group(1)) if spill else None)


def compile_one(kind: str, cfg, arch: int, q_dtype: str = "bf16", direct: bool = False, ptxas: bool = False):
    import triton
    from triton.backends.compiler import GPUTarget

    src = _split_source(cfg, q_dtype, direct) if kind == "split" else _reduce_source(cfg, q_dtype)
    opts = {"num_warps": cfg.num_warps, "num_stages": getattr(cfg, "num_stages", 2)}
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=opts)
    regs, spill = _ptxas_report(compiled.asm["ptx"], arch) if ptxas else (None, None)
    return compiled.metadata.shared, regs, spill


def compile_all(arch: int, ptxas: bool = False) -> list[AotResult]:
    """Every configuration the launcher can choose on a device of this arch's limit."""
    limit = configs.SMEM_LIMITS[arch]
    results = []
    for cfg in configs.all_split_configs(limit):
        for direct in (False, True):
            shared, regs, spill = compile_one("split", cfg, arch, direct=direct, ptxas=ptxas)
            conf = {**asdict(cfg), "direct": direct}
            results.append(AotResult("split", arch, conf, shared, limit, regs, spill))
    for cfg in configs.all_reduce_configs():
        shared, regs, spill = compile_one("reduce", cfg, arch, ptxas=ptxas)
        results.append(AotResult("reduce", arch, asdict(cfg), shared, limit, regs, spill))
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", type=int, action="append", help="compute capability x10 (default: 120 and 90)")
    p.add_argument("--ptxas", action="store_true", help="also report registers and spills")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    rows = []
    for arch in args.arch or [120, 90]:
        rows += compile_all(arch, ptxas=args.ptxas)
    if args.json:
        print(json.dumps([{**asdict(r), "fits": r.fits} for r in rows], indent=1))
    else:
        print(f"{'kernel':7} {'arch':>4} {'config':60} {'shared':>7} {'limit':>7} {'regs':>4} {'spill':>5}")
        for r in rows:
            conf = " ".join(f"{k}={v}" for k, v in r.config.items())
            print(
                f"{r.kernel:7} {r.arch:>4} {conf:60} {r.shared:>7} {r.limit:>7} {r.registers!s:>4} {r.spill_bytes!s:>5}"
            )
    return 0 if all(r.fits for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
