# vLLM 0.26.0's keep-lists for the sm_90 fatbin pruning of ../vllm020_gpu/prune.py (used unchanged: same entry format,
# same placeholder cubins e*.cubin, same rule that an entry an sm_90 device can never load is replaced).
# What differs from 0.20: the libraries are _C_stable_libtorch / _moe_C_stable_libtorch (0.26 has no _C / _moe_C), and
# some TUs carry no internal symbol that names their .cu file (prune.py calls them "?"): here such a TU is named
# "k:<first kernel symbol>" so a keep-list can name it (the router GEMMs below).
#   python3 prune026.py LIB.so ...        prune in place (keep-lists below); every name on a list must match a TU
#   python3 prune026.py --list LIB.so     every TU: sm_90 bytes, name, kernels
#   python3 prune026.py --check ORIG.so PRUNED.so   fatbin in place, same dynamic symbols, kept TUs' entries identical,
#                                                   every replaced entry a valid placeholder (zstd frames decode)
#   python3 prune026.py --dynsym ORIG.so STRIPPED.so  the dynamic symbols (what the loader and torch use) unchanged
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "vllm020_gpu"))
import prune as P  # noqa: E402  (0.20's prune.py)

_tu_name_020 = P.tu_name


def tu_name(data, ents):
    n = _tu_name_020(data, ents)
    if n != "?":
        return n
    e = next((e for e in ents if e["kind"] == 2), None)
    ks = (
        sorted(
            re.sub(rb"I.*", b"", k).decode()  # cut at the template arguments, as prune.py --list prints them
            for k in re.findall(rb"\.text\.([A-Za-z0-9_]+)", P.body(data, e))
        )
        if e
        else []
    )
    return "k:" + ks[0] if ks else "?"


P.tu_name = tu_name  # prune.prune() and prune.listing() look it up at call time

# TUs kept (sm_90 ELF, or PTX <= 90 where the TU has no sm_90 ELF), per library. A bf16 DeepSeek-V3 (MLA + MoE) +
# Llama EAGLE-3 engine on TRITON_MLA / TRITON_ATTN with FA3 for MLA prefill, one GPU, launches nothing else.
# Each Python caller of a dropped TU is a quantized / other-model / other-backend / multi-GPU path (README.md).
KEEP = {
    "_C_stable_libtorch": {
        "cache_kernels",  # reshape_and_cache_flash, concat_and_cache_mla, cp_gather_cache, gather_and_maybe_
        # dequant_cache (MLA chunked prefill), concat_mla_q, convert_fp8
        "cache_kernels_fused",  # concat_and_cache_mla_rope_fused
        "merge_attn_states",  # MLA chunked-context prefill merge
        "pos_encoding_kernels",  # rotary_embedding
        "activation_kernels",  # silu_and_mul & co (two TUs share the name; both kept)
        "layernorm_kernels",  # rms_norm, fused_add_rms_norm
        "sampler",  # apply_repetition_penalties_ (+ top_k_per_row of the sparse indexer)
        "dsv3_fused_a_gemm",  # DeepSeek-V3 fused q_a/kv_a projection (bf16, small batch)
        "cuda_view",  # get_cuda_view_from_cpu_tensor (UVA buffers of the model runners)
        "common",  # scaled_fp8_quant family (an fp8 KV cache)
    },
    "_moe_C_stable_libtorch": {
        "moe_align_sum_kernels",  # moe_align_block_size, moe_sum: the Triton fused_moe path
        "topk_softmax_kernels",  # topk_softmax, topk_sigmoid
        "grouped_topk_kernels",  # grouped_topk (DeepSeek-V3 noaux_tc routing)
        "dsv3_router_gemm_entry",
        "k:_Z31router_gemm_kernel_float_output",
        "k:_Z30router_gemm_kernel_bf16_output",
        # dsv3_router_gemm: GateLinear at K2's hidden 7168 x 384 experts, M <= 16
        "moe_permute_unpermute_kernel",
        "moe_permute_unpermute_op",  # moe_permute/unpermute (small; kept as 0.20 did)
    },
    "_vllm_fa3_C": {  # FA3 only serves MLA prefill: q/k head 192, v head 128, bf16, varlen, no paging
        "flash_fwd_combine",
        "flash_prepare_scheduler",
        "flash_fwd_hdim192_128_bf16_sm90",
        "flash_fwd_hdim192_128_bf16_split_sm90",
    },
}


def lib_of(path):
    return os.path.basename(path).split(".")[0]


def names(path):
    off, size = P.section(path)
    data = open(path, "rb").read()
    return [tu_name(data, ents) for ents in P.entries(data, off, size)]


def do_prune(path):
    keep = KEEP[lib_of(path)]
    missing = keep - set(names(path))
    if missing:  # a renamed TU would otherwise be dropped without a word
        sys.exit(f"prune026: {os.path.basename(path)}: no TU named {sorted(missing)}")
    P.prune(path, keep_tu=lambda n: n in keep)


def dynsyms(path):
    out = subprocess.check_output(["readelf", "--dyn-syms", "-W", path], text=True)
    return sorted(" ".join(line.split()[1:]) for line in out.splitlines() if re.match(r"\s*\d+:", line))


def check(orig, pruned):
    """The pruned library is the original with only unwanted fatbin entries replaced."""
    a, b = open(orig, "rb").read(), open(pruned, "rb").read()
    off, size = P.section(orig)  # PRUNED may be stripped too: strip moves no loaded section
    assert P.section(pruned) == (off, size), "fatbin section moved"
    keep, lib = KEEP[lib_of(orig)], os.path.basename(pruned)
    kept = replaced = bad = 0
    seen = set()
    for ea, eb in zip(P.entries(a, off, size), P.entries(b, off, size), strict=True):
        name = tu_name(a, ea)
        seen.add(name)
        assert len(ea) == len(eb), (name, "entry count changed")
        for x, y in zip(ea, eb, strict=True):
            sa = a[x["q"] : x["q"] + x["ehsz"] + x["psz"]]
            sb = b[y["q"] : y["q"] + y["ehsz"] + y["psz"]]
            loadable = (x["kind"] == 2 and x["arch"] == 90) or (
                x["kind"] == 1 and x["arch"] <= 90 and not any(e["kind"] == 2 and e["arch"] == 90 for e in ea)
            )
            if name in keep and loadable:
                if sa != sb:
                    bad += 1
                    print(f"{lib}: kept entry of {name} (kind {x['kind']} sm_{x['arch']}) changed")
                kept += 1
                continue
            if sa == sb:
                kept += 1
                continue  # an entry too small to replace stays as it was
            replaced += 1
            try:
                body = P.body(b, y)  # decompresses zstd frames (raises if a frame is broken)
                ok = body.startswith(b"\x7fELF") if y["kind"] == 2 else body.startswith(b"//")
            except subprocess.CalledProcessError:
                ok = False
            if not ok:
                bad += 1
                print(f"{lib}: replaced entry of {name} (kind {y['kind']} sm_{y['arch']}) is not valid")
    missing = keep - seen
    if missing:
        bad += 1
        print(f"{lib}: kept TUs absent: {sorted(missing)}")
    if dynsyms(orig) != dynsyms(pruned):
        bad += 1
        print(f"{lib}: dynamic symbol table differs")
    print(
        f"{lib}: {kept} entries unchanged, {replaced} replaced, kept TUs present: {len(keep & seen)}/{len(keep)}, "
        f"bad {bad}"
    )
    return bad == 0


if __name__ == "__main__":
    if sys.argv[1] == "--list":
        P.listing(sys.argv[2])
    elif sys.argv[1] == "--dynsym":  # ORIG STRIPPED: strip --strip-unneeded must leave the dynamic symbols alone
        same = dynsyms(sys.argv[2]) == dynsyms(sys.argv[3])
        print(f"{os.path.basename(sys.argv[3])}: dynamic symbols {'unchanged' if same else 'DIFFER'}")
        sys.exit(0 if same else 1)
    elif sys.argv[1] == "--check":
        sys.exit(0 if check(sys.argv[2], sys.argv[3]) else 1)
    else:
        for f in sys.argv[1:]:
            do_prune(f)
