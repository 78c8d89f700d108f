"""Ahead-of-time compile of the grouped GGUF MoE kernels for every ggml type, as ``ops`` launches
them at Kimi-K2.5's per-GPU shapes (TP 8: hidden 7168, intermediate 256).

No sm_120 GPU is available here: Triton's own compiler, targeting ``GPUTarget("cuda", 120, 32)``,
must build both kernels of every type and report shared memory within the device's opt-in limit
(sm_90, the H100/H200 the kernels were timed on, is compiled too). Runs on a CPU-only machine.

    python -m vllm_k2_plugin.gguf_moe.aot            # table for sm_120 and sm_90
"""

from __future__ import annotations

import argparse
import inspect

#: Kimi-K2.5 at TP 8: hidden size, per-GPU expert intermediate size, experts per token
HIDDEN, INTERMEDIATE, TOP_K = 7168, 256, 8
#: the device's opt-in shared memory per block (B)
SMEM_LIMITS = {120: 101_376, 90: 232_448}
#: the launch ops.fused_moe_gguf_grouped uses by default
DEFAULT_LAUNCH = {
    "block_n1": 32,
    "ksplit1": 8,
    "block_n2": 64,
    "block_m": 16,
    "num_warps1": 4,
    "num_warps2": 4,
    "word_block_m": 1,
}


def _signature(fn, pointers: dict[str, str], constexprs: dict) -> dict:
    """Every parameter of ``fn``: the pointers' element types as given, constexprs as such,
    the rest 32-bit integers (counts and strides, as Triton's JIT types them at these shapes)."""
    sig = {}
    for name in inspect.signature(fn.fn).parameters:
        sig[name] = pointers.get(name) or ("constexpr" if name in constexprs else "i32")
    return sig


def sources(type_name: str, tokens: int = 1, launch: dict | None = None) -> list[tuple[str, object, dict]]:
    """(kernel, Triton ASTSource, compile options) of both kernels for ``tokens`` tokens of one type."""
    import triton

    from . import blocks, ops
    from .kernel import down_kernel, gate_up_kernel
    from .kernel_words import TYPE_IDS

    launch = {**DEFAULT_LAUNCH, **(launch or {})}
    type_id = blocks.type_id(type_name)
    g1 = ops._geometry(type_id, type_name, HIDDEN, "w1", "a row")
    g2 = ops._geometry(type_id, type_name, INTERMEDIATE, "w2", "a row")
    p_pad = max(16, triton.next_power_of_2(tokens * TOP_K))
    if type_id in TYPE_IDS:  # what ops launches for the 256-weight K-quants
        return _word_sources(type_id, g1, p_pad, launch)
    steps = HIDDEN // g1["QK"] // g1["STEP"]
    ksplit = triton.cdiv(steps, triton.cdiv(steps, max(1, min(launch["ksplit1"], steps))))
    common = {
        "grid_table": "*fp32",
        "signs": "*u8",
        "kvalues": "*fp32",
        "w": "*u8",
        "sorted_ids": "*i32",
        "order": "*i64",
    }
    c1 = {
        "TOP_K": TOP_K,
        "P_PAD": p_pad,
        **g1,
        "BLOCK_N": launch["block_n1"],
        "BLOCK_M": launch["block_m"],
        "DOT_F32": False,
        "KSPLIT": ksplit,
    }
    s1 = _signature(gate_up_kernel, {**common, "x": "*bf16", "act": "*fp32" if ksplit > 1 else "*bf16"}, c1)
    c2 = {"P_PAD": p_pad, **g2, "BLOCK_N": launch["block_n2"], "BLOCK_M": launch["block_m"], "DOT_F32": False}
    s2 = _signature(down_kernel, {**common, "act": "*bf16", "topk_weights": "*fp32", "y": "*fp32"}, c2)
    stages = launch.get("num_stages") or ops.default_stages(type_name)
    return _pair((gate_up_kernel, s1, c1), (down_kernel, s2, c2), launch, stages)


def _pair(gate_up: tuple, down: tuple, launch: dict, stages: int) -> list[tuple[str, object, dict]]:
    """(name, ASTSource, options) of a gate/up and a down kernel: each (kernel, signature, constexprs)."""
    from triton.compiler import ASTSource

    out = []
    for name, (fn, sig, consts), warps in (("gate_up", gate_up, "num_warps1"), ("down", down, "num_warps2")):
        source = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=_aligned(sig))
        out.append((name, source, {"num_warps": launch[warps], "num_stages": stages}))
    return out


def _word_sources(type_id: int, g1: dict, p_pad: int, launch: dict) -> list[tuple[str, object, dict]]:
    import triton

    from .kernel_words import down_words_kernel, gate_up_words_kernel

    blocks_per_row = HIDDEN // 256
    ksplit = triton.cdiv(blocks_per_row, triton.cdiv(blocks_per_row, max(1, min(launch["ksplit1"], blocks_per_row))))
    common = {"b8": "*u8", "b16": "*i16", "b32": "*i32", "sorted_ids": "*i32", "order": "*i64"}
    geometry = {"TYPE": type_id, "BYTES": g1["BYTES"], "BLOCK_M": launch["word_block_m"]}
    c1 = {"TOP_K": TOP_K, "P_PAD": p_pad, **geometry, "BLOCK_N": launch["block_n1"], "KSPLIT": ksplit}
    s1 = _signature(gate_up_words_kernel, {**common, "x": "*bf16", "act": "*fp32" if ksplit > 1 else "*bf16"}, c1)
    c2 = {"P_PAD": p_pad, **geometry, "BLOCK_N": launch["block_n2"]}
    s2 = _signature(down_words_kernel, {**common, "act": "*bf16", "topk_weights": "*fp32", "y": "*fp32"}, c2)
    return _pair((gate_up_words_kernel, s1, c1), (down_words_kernel, s2, c2), launch, launch.get("num_stages") or 3)


def _aligned(sig: dict) -> dict:
    """What Triton's JIT specialises at run time: every pointer (torch allocations are 256-B
    aligned) is a multiple of 16; counts and strides are left unaligned (worst case)."""
    return {(i,): [["tt.divisibility", 16]] for i, ty in enumerate(sig.values()) if ty.startswith("*")}


def compile_type(type_name: str, arch: int, tokens: int = 1, launch: dict | None = None) -> dict[str, int]:
    """Shared memory (B) of each kernel of this type, compiled for ``arch`` (raises if it does not build)."""
    import triton
    from triton.backends.compiler import GPUTarget

    out = {}
    for kernel, src, options in sources(type_name, tokens, launch):
        compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
        out[kernel] = compiled.metadata.shared
    return out


def main(argv: list[str] | None = None) -> int:
    from .ops import SUPPORTED

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", type=int, action="append", help="compute capability x10 (default: 120 and 90)")
    p.add_argument("--tokens", type=int, default=1)
    args = p.parse_args(argv)
    bad = 0
    print(f"{'type':8} {'arch':>4} {'gate_up B':>10} {'down B':>8} {'limit':>7}")
    for arch in args.arch or [120, 90]:
        for name in SUPPORTED:
            shared = compile_type(name, arch, args.tokens)
            fits = max(shared.values()) <= SMEM_LIMITS[arch]
            bad += not fits
            print(
                f"{name:8} {arch:>4} {shared['gate_up']:>10} {shared['down']:>8} {SMEM_LIMITS[arch]:>7}"
                f"{'' if fits else '  OVER'}"
            )
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
