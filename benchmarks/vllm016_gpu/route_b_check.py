"""Route B's kernels, checked on the build machine (no GPU): they load into torch 2.11, and every op that
vLLM 0.16.0's Python reaches in a bf16 MLA/MoE engine is registered with 0.16's schema.

    python route_b_check.py BUILD_DIR VLLM_016_SRC
    python route_b_check.py stand-in OUT.so FILE...   (the build's link-time driver stand-in)

The driver library is absent here; a stand-in exporting the driver functions the extensions import
is built for the load only (the device's own libcuda.so.1 resolves them there). The ops named in
0.16's Python calls are read from its ``_custom_ops.py`` (``torch.ops.<namespace>.<op>(``); those of
them the subset must have are ``REQUIRED``; the rest are printed as "not in route B".
"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

#: what a bf16 DeepSeek-V3 engine (TRITON_MLA, grouped top-k MoE, CUDA graphs, compile passes) calls
REQUIRED = {
    "_C": "rms_norm fused_add_rms_norm silu_and_mul rotary_embedding merge_attn_states weak_ref_tensor "
    "get_cuda_view_from_cpu_tensor rms_norm_static_fp8_quant fused_add_rms_norm_static_fp8_quant "
    "rms_norm_dynamic_per_token_quant static_scaled_fp8_quant dynamic_scaled_fp8_quant "
    "dynamic_per_token_scaled_fp8_quant silu_and_mul_quant per_token_group_fp8_quant "
    "ggml_dequantize ggml_mul_mat_a8 ggml_moe_a8",
    "_C_cache_ops": "concat_and_cache_mla reshape_and_cache_flash gather_and_maybe_dequant_cache cp_gather_cache",
    "_C_cuda_utils": "get_device_attribute get_max_shared_memory_per_block_device_attribute",
    "_moe_C": "topk_softmax grouped_topk moe_align_block_size moe_sum",
}


def _driver_imports(path: Path) -> set[str]:
    """CUDA driver functions (``cu*``) an object file or shared library leaves undefined."""
    dynamic = ["-D"] if ".so" in path.suffixes else []
    out = subprocess.run(["nm", *dynamic, "--undefined-only", str(path)], capture_output=True, text=True, check=True)
    return {ln.split()[-1].split("@")[0] for ln in out.stdout.splitlines() if re.search(r"\s+U\s+cu[A-Z]", ln)}


def write_driver_stand_in(files: list[Path], out: Path) -> None:
    """A library named libcuda.so.1 exporting the driver functions ``files`` import: at link time
    it makes the linker (--as-needed) record libcuda.so.1, for the check it lets them load."""
    c = out.with_suffix(".c")
    c.write_text(
        "".join(f"int {name}(void) {{ return 1; }}\n" for name in sorted(set().union(*map(_driver_imports, files))))
    )
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(out), str(c)], check=True)


def _load_problems(build: Path, sos: list[Path]) -> list[str]:
    """A driver import without libcuda.so.1 among the needed libraries fails to load on the device too."""
    import torch

    problems = []
    for so in sorted(build.glob("*.so")):
        needed = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True, check=True).stdout
        if _driver_imports(so) and "[libcuda.so.1]" not in needed:
            problems.append(f"{so.name} imports driver functions but does not need libcuda.so.1")
        try:
            torch.ops.load_library(str(so)) if so in sos else ctypes.CDLL(str(so))
        except OSError as e:
            problems.append(f"{so.name} does not load: {e.__cause__ or e}")
    return problems


def _called_ops(custom_ops: Path) -> dict[str, set[str]]:
    called: dict[str, set[str]] = {}
    for ns, op in re.findall(r"torch\.ops\.(_\w+)\.(\w+)\s*\(", custom_ops.read_text()):
        called.setdefault(ns, set()).add(op)
    return called


def check(build: Path, src: Path) -> int:
    import torch

    sos = sorted(build.glob("_C.*.so")) + sorted(build.glob("_moe_C.*.so"))
    if len(sos) != 2:
        print(f"route_b_check: expected _C and _moe_C in {build}, found {[s.name for s in sos]}")
        return 1
    problems = _load_problems(build, sos)
    for ns, ops in REQUIRED.items():
        for op in ops.split():
            if not hasattr(getattr(torch.ops, ns), op):
                problems.append(f"required op {ns}.{op} missing")
    called = _called_ops(src / "vllm" / "_custom_ops.py")
    absent = sorted(f"{ns}.{op}" for ns, ops in called.items() for op in ops if not hasattr(getattr(torch.ops, ns), op))
    present = sum(len(ops) for ops in called.values()) - len(absent)
    print(f"route_b_check: torch {torch.__version__}; {present} of the ops 0.16's _custom_ops.py calls are registered")
    print(f"route_b_check: not in route B ({len(absent)}): {' '.join(absent)}")
    for p in problems:
        print(f"route_b_check: PROBLEM {p}")
    return 1 if problems else 0


def main() -> int:
    if sys.argv[1:2] == ["stand-in"] and len(sys.argv) > 3:
        write_driver_stand_in([Path(f) for f in sys.argv[3:]], Path(sys.argv[2]))
        return 0
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    if os.environ.get("ROUTE_B_CHECK_CHILD") != "1":  # the stand-in must be on the loader's path at start
        with tempfile.TemporaryDirectory() as d:
            sos = [*Path(sys.argv[1]).glob("*.so")]
            write_driver_stand_in(sos, Path(d) / "libcuda.so.1")
            env = dict(
                os.environ, ROUTE_B_CHECK_CHILD="1", LD_LIBRARY_PATH=f"{d}:{os.environ.get('LD_LIBRARY_PATH', '')}"
            )
            return subprocess.run([sys.executable, *sys.argv], env=env).returncode
    return check(Path(sys.argv[1]), Path(sys.argv[2]))


if __name__ == "__main__":
    sys.exit(main())
