# Which of vLLM 0.26.0's files the bundle leaves out (paths relative to the unpacked wheel; tar -X reads stdout).
#   python3 srcprune026.py UNPACKED_WHEEL_DIR [REPO_DIR] > exclude.txt      (summary and review list on stderr)
# 0.20's srcprune.py pruned only model files; 0.26's Python tree is larger (5.9 MB xz whole), so this one prunes the
# whole tree by one rule: a .py file stays if the engine can reach it, i.e. if it is in the static closure from SEEDS
# (the offline engine's entry modules, both model runners, the kept models, and every vllm.* module that the repo's
# own package names in an import or a string), following EVERY import statement (module level, inside functions, in
# try blocks, under ALIASES' names) and every "vllm.a.b" string naming a module. The closure stops only at BARRIERS:
# code that the engine we run never executes although some kept file names it (each one has its reason below).
# The script fails (exit 1) if
#   * a kept module imports a barrier module at module level outside a try block (that would fail at import), unless
#     it also imports a package that is not on the device at all (NOT_ON_DEVICE: then it cannot be imported there
#     with the whole wheel either);
#   * a module in SEEDS does not exist in this wheel;
#   * a kept module's package __init__ is not kept.
# References to barrier modules from inside kept functions are printed (stderr) as the review list: each such function
# belongs to a path the engine we run does not take (FA4, DeepGEMM, serving). check.sh then imports what is kept.
# Non-.py files: kept unless in DROP_DATA (fused-MoE tuning tables other than H100/H200 bf16, quantized-GEMM tables,
# compiled extensions (they travel pruned, separately), the serve front end, DeepGEMM / Blackwell sources).
import ast
import os
import re
import sys

ROOT = sys.argv[1]
REPO = sys.argv[2] if len(sys.argv) > 2 else None

# the registry's infrastructure, and the architectures the repo's models use (DeepseekV3ForCausalLM, KimiK25ForCondi-
# tionalGeneration, Eagle3DeepseekV2/V3ForCausalLM, LlamaForCausalLMEagle3 / Eagle3LlamaForCausalLM, MTP drafters)
KEEP_MODELS = re.compile(
    r"^vllm\.model_executor\.models\.(__init__|registry|interfaces.*|utils|adapters|module_mapping|"
    r"vision|config|extract_hidden_states|deepseek_v2|deepseek_eagle3?|deepseek_mtp|kimi_k25.*|"
    r"llama|llama_eagle3?)$"
)
SEEDS = """vllm vllm.entrypoints.llm vllm.v1.engine.core vllm.v1.engine.core_client vllm.v1.engine.llm_engine
vllm.v1.engine.async_llm vllm.v1.executor.uniproc_executor vllm.v1.executor.multiproc_executor vllm.v1.worker.gpu_worker
vllm.v1.worker.gpu_model_runner vllm.v1.worker.gpu.model_runner vllm.platforms.cuda
vllm.v1.attention.backends.mla.triton_mla vllm.v1.attention.backends.triton_attn vllm.v1.attention.backends.flash_attn
vllm.v1.attention.backends.registry vllm.v1.attention.backends.mla.prefill.flash_attn
vllm.v1.attention.backends.fa_utils
vllm.v1.spec_decode.eagle vllm.v1.core.sched.scheduler vllm.v1.core.sched.async_scheduler
vllm.model_executor.model_loader vllm.model_executor.model_loader.default_loader vllm.transformers_utils.config
vllm.engine.arg_utils vllm.config.speculative vllm.v1.structured_output vllm.compilation.cuda_graph
vllm.compilation.backends vllm.compilation.decorators vllm.v1.sample.sampler vllm.v1.sample.rejection_sampler
vllm.model_executor.layers.fused_moe vllm.model_executor.layers.fused_moe.fused_moe vllm.vllm_flash_attn
vllm.device_allocator.cumem vllm.distributed.parallel_state vllm.v1.metrics.loggers vllm.usage.usage_lib""".split()

# Never followed into, though kept files name them (module-name prefixes, with the reason). Kept short on purpose:
# each one is a claim that no code path of our engine runs there. Left OFF this list although nothing of ours uses
# them, because a path we run imports them (found by this script's module-level check or by reading the callers):
# vllm.models (kernel_warmup imports the MiniMax-M3 warmup, which imports vllm.models.minimax_m3 at module level;
# get_quantization_config imports vllm.models.deepseek_v4), kernels.linear.cute_dsl (GateLinear asks it whether the
# CuTe DSL is there, on Hopper), the ROCm / CPU / XPU / TPU platform files (small).
BARRIERS = {
    "vllm.benchmarks": "`vllm bench` CLI",
    "vllm.entrypoints.cli": "the `vllm` command (serve, bench, ...); the engine is started through LLM()",
    "vllm.entrypoints.openai.api_server": "the HTTP server (uvicorn is not bundled)",
    "vllm.third_party.deep_gemm": "DeepGEMM (fp8 GEMMs); utils.deep_gemm falls back to None when it is absent",
    "vllm.third_party.fmha_sm100": "Blackwell attention",
    "vllm.third_party.tml_fa4": "FA4 (CuTe DSL, needs nvidia-cutlass-dsl, not on the image)",
    "vllm.vllm_flash_attn.cute": "FA4 (CuTe DSL): without cute/interface.py FA4_AVAILABLE is False, FA3 serves sm_90",
    "vllm.kernels.helion": "Helion kernels (need the helion package, not on the image)",
}
# Names under which vLLM imports its own vendored packages (vllm.utils.import_utils registers the alias).
ALIASES = {"triton_kernels": "vllm.third_party.triton_kernels"}
# Packages neither the image nor the bundle has: a module that imports one at module level cannot be imported on
# the device with the whole wheel either, so its imports of barrier modules change nothing (they go to the review).
NOT_ON_DEVICE = {"cutlass", "quack", "tilelang", "flashinfer"}
# Non-.py paths left out (regex on the path relative to ROOT).
DROP_DATA = [
    (r"vllm/.*\.so$", "compiled extensions travel pruned and separately (build.sh step 1); the others are not used"),
    (r"vllm/vllm-rs$", "Rust front-end binary of `vllm serve`"),
    (r"vllm/third_party/deep_gemm/", "DeepGEMM's JIT sources and .so"),
    (r"vllm/third_party/fmha_sm100/", "Blackwell attention sources"),
    (
        r"vllm/model_executor/layers/fused_moe/configs/(?!E=[^/]*device_name=NVIDIA_H(100|200)[^,/]*\.json$)",
        "fused-MoE tuning tables of other GPUs and of quantized (fp8/int8/int4) experts",
    ),
    (r"vllm/model_executor/layers/quantization/utils/configs/", "fp8/int8 block-GEMM tuning tables"),
    (r"vllm/model_executor/layers/mamba/ops/configs/", "Mamba tuning tables"),
    (r"vllm/kernels/helion/", "Helion kernels and configs"),
    (r"vllm/entrypoints/serve/instrumentator/static/", "the server's swagger-ui"),
    (r"vllm/distributed/kv_transfer/.*\.(jpg|png)$", "a documentation image"),
    (r"vllm-[0-9.]+\.dist-info/RECORD$", "pip's file list (not read at run time; it would list the dropped files)"),
    (r".*/__pycache__/.*", "bytecode caches"),
]

mods = {}
for dp, _dn, fn in os.walk(os.path.join(ROOT, "vllm")):
    for f in fn:
        if f.endswith(".py"):
            p = os.path.join(dp, f)
            m = os.path.relpath(p, ROOT)[:-3].replace(os.sep, ".")
            mods[m[:-9] if m.endswith(".__init__") else m] = p


def barrier(m):
    if m.startswith("vllm.model_executor.models.") and not KEEP_MODELS.match(m):
        return None  # models: reachable-by-import ones are kept (0.20's rule)
    for b in BARRIERS:
        if m == b or m.startswith(b if b.endswith((".", "_")) else b + "."):
            return b
    return None


def resolve(name):
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


STR_MOD = re.compile(r"[\"'](vllm(?:\.[A-Za-z0-9_]+)+)")


def edges(m):
    """(target module, kind) for each import in m; kind: 'top' (module level, not in try), 'try', 'func'."""
    p = mods[m]
    pkg = m if p.endswith("__init__.py") else m.rpartition(".")[0]
    src = open(p, encoding="utf-8").read()
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return

    def walk(node, kind):
        for n in ast.iter_child_nodes(node):
            k = kind
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                k = "func"
            elif isinstance(n, ast.Try) and kind == "top":
                k = "try"
            elif isinstance(n, ast.If) and kind == "top" and "TYPE_CHECKING" in ast.unparse(n.test):
                k = "typing"
            if isinstance(n, ast.Import):
                for a in n.names:
                    yield a.name, k
                if k == "top" and any(a.name.split(".")[0] in NOT_ON_DEVICE for a in n.names):
                    yield "!", k
            elif isinstance(n, ast.ImportFrom):
                base = n.module or ""
                if n.level:
                    parts = pkg.split(".")[: len(pkg.split(".")) - n.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                yield base, k
                for a in n.names:
                    yield base + "." + a.name, k
                if k == "top" and base.split(".")[0] in NOT_ON_DEVICE:
                    yield "!", k
            yield from walk(n, k)

    for name, k in walk(tree, "top"):
        alias = ALIASES.get(name.split(".")[0])
        if alias:
            name = alias + name[len(name.split(".")[0]) :]
        if name.startswith("vllm") or name == "!":
            yield name, k
    for s in STR_MOD.findall(src):
        yield s, "str"


def main():
    missing_seeds = [s for s in SEEDS if s not in mods]
    kept, stack, refs = set(), SEEDS + [m for m in mods if KEEP_MODELS.match(m)], []
    if REPO:  # every vllm.* module the repo's package names (imports, patch targets in strings)
        for dp, dn, fn in os.walk(REPO):
            dn[:] = [d for d in dn if not d.startswith(".") and d not in ("tests", "__pycache__")]
            for f in fn:
                if f.endswith(".py"):
                    for s in re.findall(
                        r"\b(vllm(?:\.[A-Za-z0-9_]+)+)", open(os.path.join(dp, f), errors="replace").read()
                    ):
                        r = resolve(s)
                        if r and not barrier(r):
                            stack.append(r)
    while stack:
        m = resolve(stack.pop())
        if not m or m in kept or barrier(m):
            continue
        kept.add(m)
        stack.extend(".".join(m.split(".")[:i]) for i in range(1, m.count(".") + 1))  # parent packages
        es = list(edges(m))
        dead = ("!", "top") in es  # imports a package that is not on the device: never importable there
        for name, k in es:
            if name == "!":
                continue
            if dead and k == "top":
                k = "dead"
            t = resolve(name)
            if not t:
                continue
            if barrier(t):
                refs.append((m, t, k))
            else:
                stack.append(t)
    bad = [f"seed not in vLLM 0.26: {s}" for s in missing_seeds]
    bad += sorted({f"{m} imports {t} at module level (barrier {barrier(t)})" for m, t, k in refs if k == "top"})
    out = []
    for m, p in sorted(mods.items()):
        if m not in kept:
            out.append(os.path.relpath(p, ROOT))
    for dp, _dn, fn in os.walk(ROOT):
        for f in fn:
            rel = os.path.relpath(os.path.join(dp, f), ROOT)
            if not rel.endswith(".py") and any(re.match(rx, rel) for rx, _ in DROP_DATA):
                out.append(rel)
    for m in kept:  # a kept module's package __init__ must be kept
        parent = m.rpartition(".")[0]
        if parent and parent not in kept and parent in mods:
            bad.append(f"package {parent} dropped but {m} kept")
    w = sys.stderr.write
    w(f"srcprune026: {len(kept)} of {len(mods)} vllm modules kept, {len(out)} paths left out\n")
    models = sorted(m.rsplit(".", 1)[1] for m in kept if m.startswith("vllm.model_executor.models."))
    w(f"srcprune026: model modules kept ({len(models)}): {' '.join(models)}\n")
    lazy = sorted({(t, m) for m, t, k in refs if k != "top"})
    w(
        f"srcprune026: review: {len(lazy)} references from kept code into barriers (function level, try block, "
        f"string, or in a module that imports {'/'.join(sorted(NOT_ON_DEVICE))}):\n"
    )
    by = {}
    for t, m in lazy:
        by.setdefault(barrier(t), set()).add(m)
    for b, ms in sorted(by.items()):
        w(f"  {b} [{BARRIERS[b]}] <- {' '.join(sorted(ms)[:6])}{' ...' if len(ms) > 6 else ''}\n")
    for x in bad:
        w(f"srcprune026: ERROR {x}\n")
    # tar -X reads shell patterns: escape the metacharacters of names such as "...block_shape=[128,128].json"
    print("\n".join(re.sub(r"([\[\]*?\\])", r"\\\1", p) for p in sorted(set(out))))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
