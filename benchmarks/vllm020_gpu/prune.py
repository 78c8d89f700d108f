# Shrink CUDA fat binaries inside vLLM's .so files for an sm_90 (H100/H200) device, keeping file size and layout.
# An entry that an sm_90 device can never load (ELF for another arch; PTX newer than 90; PTX in a fatbin that
# already holds sm_90 ELF), or any entry of a translation unit (TU, one .cu file) that is not on the keep-list below,
# is overwritten with a tiny valid empty-kernel cubin of the same arch (zstd-compressed when the original was),
# zero-padded. A kernel whose TU was replaced is simply absent: launching it fails loudly ("invalid device function"),
# it never runs wrong code. `python3 prune.py --list LIB.so` prints every TU with its sm_90 bytes and kernel names.
import struct, subprocess, sys, re, os
HERE = os.path.dirname(os.path.abspath(__file__))

# TUs kept (sm_90 ELF only), per library. Everything else is quantized-GEMM / other-model / other-backend code that a
# bf16 DeepSeek-V3 (MLA + MoE) + Llama EAGLE-3 engine on TRITON_MLA / TRITON_ATTN / FA3-prefill never launches
# (see README "What was removed and why"). GGUF kernels stay: the plugin runs vLLM's in-tree GGUF path.
KEEP = {
    "_C": {
        "cache_kernels",          # reshape_and_cache(_flash), concat_and_cache_mla, cp_gather_cache, concat_mla_q, convert_fp8
        "cache_kernels_fused",    # concat_and_cache_mla_rope_fused
        "merge_attn_states",      # MLA chunked-prefill / cascade merge
        "pos_encoding_kernels",   # rotary_embedding
        "activation_kernels",     # silu_and_mul & co (two TUs share the name; both kept)
        "layernorm_kernels",      # rms_norm, fused_add_rms_norm
        "sampler",                # apply_repetition_penalties (+ top_k_per_row)
        "dsv3_fused_a_gemm",      # DeepSeek-V3 fused q_a/kv_a GEMM (bf16, small batch)
        "custom_all_reduce",      # TP > 1
        "cuda_view",              # get_cuda_view_from_cpu_tensor
        "common",                 # scaled_fp8_quant family (fp8 KV cache)
        "gguf_kernel",            # ggml_* (vLLM's in-tree GGUF, used by the plugin)
        "gptq_marlin_repack",     # W4A16 experts: compressed-tensors' int4 weights repacked for Marlin MoE at load
    },
    "_moe_C": {
        "moe_align_sum_kernels",  # moe_align_block_size, moe_sum: used by the Triton fused_moe path
        "topk_softmax_kernels",   # topk_softmax, topk_sigmoid
        "grouped_topk_kernels",   # grouped_topk (DeepSeek-V3 noaux_tc routing)
        "dsv3_router_gemm_bf16_out", "dsv3_router_gemm_float_out", "dsv3_router_gemm_entry", "router_gemm",
        "moe_permute_unpermute_kernel", "moe_permute_unpermute_op",
        # W4A16 experts (the official Kimi-K2.5 checkpoint's format, compressed-tensors group 32): vLLM's Marlin MoE
        # GEMM for bf16 activations x uint4b8 weights. The wheel has it as sm_80 ELF + PTX only, so on sm_90 the
        # driver compiles the PTX at first use (kept because PTX <= 90 and no sm_90 ELF exists).
        "sm80_kernel_bfloat16_u4b8_bfloat16", "ops", "moe_wna16",
    },
    "_C_stable_libtorch": set(),  # all CUTLASS scaled_mm / fp4 / fp8 / int8 / w4a8 GEMMs and quant helpers
    "_vllm_fa3_C": {              # FA3 only serves MLA prefill: q/k head 192, v head 128, bf16, varlen, no paging
        "flash_fwd_combine", "flash_prepare_scheduler",
        "flash_fwd_hdim192_128_bf16_sm90", "flash_fwd_hdim192_128_bf16_split_sm90",
    },
}


def section(path):
    out = subprocess.check_output(["readelf", "-SW", path], text=True)
    for line in out.splitlines():
        m = re.search(r"\]\s+\.nv_fatbin\s+\S+\s+([0-9a-f]+)\s+([0-9a-f]+)\s+([0-9a-f]+)", line)
        if m: return int(m.group(2), 16), int(m.group(3), 16)
def tiny(arch):
    f = f"{HERE}/e{arch}.cubin"
    if not os.path.exists(f):
        subprocess.check_call(["nvcc", "-cubin", f"-arch=sm_{arch}", "-o", f, f"{HERE}/e.cu"])
    return open(f, "rb").read()
def zc(b): return subprocess.run(["zstd", "-3", "-q", "-c", "--no-check"], input=b, capture_output=True, check=True).stdout
def zd(b): return subprocess.run(["zstd", "-d", "-q", "-c"], input=b, capture_output=True, check=True).stdout
def entries(data, off, size):
    p, end = off, off + size
    while p < end:
        magic, ver, hsz, fsz = struct.unpack_from("<IHHQ", data, p)
        if magic != 0xBA55ED50: p += 8; continue
        q, qend, ents = p + hsz, p + hsz + fsz, []
        while q < qend:
            kind, _v, ehsz, psz = struct.unpack_from("<HHIQ", data, q)
            ents.append(dict(q=q, kind=kind, ehsz=ehsz, psz=psz, arch=struct.unpack_from("<I", data, q + 28)[0],
                             comp=data[q + ehsz: q + ehsz + 4] == b"\x28\xb5\x2f\xfd"))
            q += ehsz + psz
        yield ents
        p = qend
def body(data, e):
    b = bytes(data[e["q"] + e["ehsz"]: e["q"] + e["ehsz"] + e["psz"]])
    return zd(b[:struct.unpack_from("<I", data, e["q"] + 16)[0]]) if e["comp"] else b
def tu_name(data, ents):  # name of the translation unit, read from its first ELF
    e = next((e for e in ents if e["kind"] == 2), ents[0])
    m = re.search(rb"_INTERNAL_[0-9a-f]+_\d+_([A-Za-z0-9_]+?)_cu_", body(data, e))
    return m.group(1).decode() if m else "?"
def prune(path, keep_tu=None):
    off, size = section(path)
    data = bytearray(open(path, "rb").read())
    kept = dropped = 0
    for ents in entries(data, off, size):
        has90 = any(e["kind"] == 2 and e["arch"] == 90 for e in ents)
        keep_all = keep_tu is None or keep_tu(tu_name(data, ents))
        for e in ents:
            q, ehsz, psz = e["q"], e["ehsz"], e["psz"]
            drop = (not keep_all) or (e["kind"] == 2 and e["arch"] != 90) or (e["kind"] == 1 and (e["arch"] > 90 or has90))
            if not drop: kept += psz; continue
            dropped += psz
            if e["kind"] == 1:
                repl = b"//\n.version 8.0\n.target sm_%d\n.address_size 64\n\0" % e["arch"]
            else:
                repl = tiny(e["arch"])
            raw = repl
            if e["comp"]: repl = zc(raw)
            if len(repl) > psz:  # too small to bother: keep the original entry
                dropped -= psz; kept += psz; continue
            if e["comp"]:
                struct.pack_into("<I", data, q + 16, len(repl)); struct.pack_into("<Q", data, q + 56, len(raw))
            data[q + ehsz: q + ehsz + psz] = repl + bytes(psz - len(repl))
    open(path, "wb").write(data)
    print(f"{os.path.basename(path)}: fatbin {size} kept {kept} replaced {dropped}")
def listing(path):
    off, size = section(path)
    data = open(path, "rb").read()
    for ents in entries(data, off, size):
        e90 = [e for e in ents if e["kind"] == 2 and e["arch"] == 90]
        ks = sorted({re.sub(rb"I.*", b"", k).decode() for e in e90 for k in re.findall(rb"\.text\.([A-Za-z0-9_]+)", body(data, e))})
        print(sum(e["psz"] for e in e90), tu_name(data, ents), " ".join(ks)[:300])
if __name__ == "__main__":
    if sys.argv[1] == "--list":
        listing(sys.argv[2]); sys.exit()
    for f in sys.argv[1:]:
        lib = os.path.basename(f).split(".")[0]
        prune(f, keep_tu=(lambda n, k=KEEP[lib]: n in k) if lib in KEEP else None)
