"""The grouped GGUF MoE kernel against a float32 reference built from gguf-py's dequantizers.

CPU (TRITON_INTERPRET=1, in one subprocess: the interpreter must be chosen before triton is first
imported, which other test files do through vLLM): for every supported ggml type, random valid
blocks (gguf_moe.blocks) for w1 and w2, random routing with repeated experts, and the kernel's
output against: dequantize w1 / w2 with gguf.quants.dequantize to float32, then a per-token loop
over its top-k in torch float32. The interpreter's bf16 dot is wrong (Triton 3.6), so interpreted
runs widen the dot operands to fp32 (the launcher's DOT_F32); the bf16 dot itself runs on GPU only.
The 256-weight K-quants run the word-load kernels (kernel_words: fp32 on the CUDA cores) unless a
case turns them off ("-tc": the tensor-core kernels for those types).

Tolerance: relative error of the output's norm < 1e-2 and every element within 2e-2 of the
output's largest magnitude. The only roundings are x's bf16 values (shared by both sides) and the
SiLU-and-mul output stored in bf16 between the projections (as vLLM stores it): ~2^-9 relative
per element, so a correct kernel sits near 4e-3 (seen: 3.3e-3 to 3.8e-3); a wrong scale, sign,
grid index or bit offset for even some groups of one block type moves whole groups of weights
and lands above 1e-2 (a wrong byte for the top bits of half of Q4_K's mins gave 2.8e-2).

Needs gguf and triton 3.6: the vLLM 0.16 venv has both.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

if importlib.util.find_spec("triton") is None or importlib.util.find_spec("gguf") is None:
    pytest.skip("needs triton and gguf", allow_module_level=True)

import torch  # noqa: E402

pytestmark = pytest.mark.vllm016

ORDER = (
    "Q4_K",
    "Q2_K",
    "Q3_K",
    "Q5_K",
    "Q6_K",
    "Q8_0",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "IQ4_NL",
    "IQ4_XS",
    "IQ2_XXS",
    "IQ2_XS",
    "IQ2_S",
    "IQ3_XXS",
    "IQ3_S",
    "IQ1_S",
    "IQ1_M",
)
EXPERTS, HIDDEN, INTERMEDIATE = 8, 512, 256  # intermediate 256: one K-quant block per w2 row
# (name, gate_up type, down type, tokens, top_k): every type once as both tensors, token counts
# 1 / 3 / 8 and top-k 2..4 in turn; then a mix (Q2_K_XL's), the 32-weight types' single-block step,
# and experts holding more tokens than one pass takes
CASES = [(t, t, t, (1, 3, 8)[i % 3], 2 + i % 3) for i, t in enumerate(ORDER)]
CASES += [
    ("Q2_K+Q3_K", "Q2_K", "Q3_K", 8, 4),
    ("Q8_0-h96", "Q8_0", "Q4_0", 3, 2),
    ("Q4_1-t40", "Q4_1", "Q4_1", 40, 4),
    ("Q4_K+Q3_K-tc", "Q4_K", "Q3_K", 3, 2),  # the K-quants through the tensor-core kernels (words off)
]  # ~20 tokens per expert: more than one 16-token pass


def reference(x, w1, w2, topk_weights, topk_ids, t1: str, t2: str) -> torch.Tensor:
    import gguf

    def deq(w, t):
        return torch.from_numpy(gguf.quants.dequantize(w.numpy(), gguf.GGMLQuantizationType[t])).float()

    d1, d2 = deq(w1, t1), deq(w2, t2)
    n = d1.shape[1] // 2
    out = torch.zeros(x.shape, dtype=torch.float32)
    for t in range(x.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[t, j])
            h = d1[e] @ x[t].float()
            out[t] += float(topk_weights[t, j]) * (d2[e] @ (torch.nn.functional.silu(h[:n]) * h[n:]))
    return out


def make_case(t1: str, t2: str, tokens: int, top_k: int, hidden: int, seed: int):
    from vllm_k2_plugin.gguf_moe.blocks import random_blocks

    gen = torch.Generator().manual_seed(seed)
    w1 = random_blocks(EXPERTS, 2 * INTERMEDIATE, hidden, t1, "cpu", gen)
    w2 = random_blocks(EXPERTS, hidden, INTERMEDIATE, t2, "cpu", gen)
    x = torch.randn((tokens, hidden), generator=gen).to(torch.bfloat16)
    # distinct experts per token, drawn from few experts so tokens share them
    ids = torch.stack([torch.randperm(EXPERTS, generator=gen)[:top_k] for _ in range(tokens)]).to(torch.int32)
    weights = torch.rand((tokens, top_k), generator=gen) + 0.1
    return x, w1, w2, weights, ids


def run_case(i: int) -> str:
    from vllm_k2_plugin.gguf_moe.ops import fused_moe_gguf_grouped

    name, t1, t2, tokens, top_k = CASES[i]
    hidden = 96 * 32 // 8 if name.endswith("h96") else HIDDEN  # 384 weights: 12 blocks, not 8 per step
    x, w1, w2, weights, ids = make_case(t1, t2, tokens, top_k, hidden, seed=i + 1)
    # wide row tiles (gate/up: 4 tiles, down: 2): fewer interpreted programs, still several per expert;
    # the gate/up rows split over K (fp32 partials summed after) in every other case, whole in the rest
    got = fused_moe_gguf_grouped(
        x,
        w1,
        w2,
        weights,
        ids,
        t1,
        t2,
        block_n1=64,
        block_n2=256,
        ksplit1=1 if i % 2 else 8,
        words=not name.endswith("-tc"),
    )
    ref = reference(x, w1, w2, weights, ids, t1, t2)
    if got.shape != ref.shape or got.dtype != x.dtype:
        return f"FAIL shape/dtype {tuple(got.shape)} {got.dtype}"
    diff = got.float() - ref
    rel = float(diff.norm() / ref.norm())
    worst = float(diff.abs().max() / ref.abs().max())
    if not (rel < 1e-2 and worst < 2e-2):
        return f"FAIL relative error {rel:.3g}, worst element {worst:.3g} of the largest"
    return "ok"


@pytest.fixture(scope="module")
def interpreted_results(tmp_path_factory) -> dict:
    # Two interpreter processes, every other case each: the interpreter runs on one core.
    tmp = tmp_path_factory.mktemp("gguf_moe")
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent.parent), env.get("PYTHONPATH")]))
    procs = []
    for part in range(2):
        cases = [str(i) for i in range(part, len(CASES), 2)]
        log = open(tmp / f"part{part}.log", "w")
        cmd = [sys.executable, __file__, str(tmp / f"part{part}.json"), *cases]
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True), log, part))
    results = {}
    for proc, log, part in procs:
        rc = proc.wait(timeout=900)
        log.close()
        assert rc == 0, (tmp / f"part{part}.log").read_text()[-6000:]
        results |= json.loads((tmp / f"part{part}.json").read_text())
    return results


@pytest.mark.parametrize("i", range(len(CASES)), ids=[f"{c[0]}-t{c[3]}-k{c[4]}" for c in CASES])
def test_matches_gguf_py_reference(interpreted_results, i):
    assert interpreted_results[str(i)] == "ok"


def test_bad_arguments_name_the_argument():
    from vllm_k2_plugin.gguf_moe.ops import fused_moe_gguf_grouped

    x, w1, w2, weights, ids = make_case("Q4_K", "Q4_K", 2, 2, HIDDEN, seed=0)
    with pytest.raises(ValueError, match="qtype2: ggml type Q8_1"):
        fused_moe_gguf_grouped(x, w1, w2, weights, ids, "Q4_K", 9)
    with pytest.raises(ValueError, match="qtype1: 77 is not a ggml"):
        fused_moe_gguf_grouped(x, w1, w2, weights, ids, 77, "Q4_K")
    with pytest.raises(ValueError, match="x: want"):
        fused_moe_gguf_grouped(x.float(), w1, w2, weights, ids, "Q4_K", "Q4_K")
    with pytest.raises(ValueError, match="w1: .* bytes per row"):
        fused_moe_gguf_grouped(x, w1[..., :-144], w2, weights, ids, "Q4_K", "Q4_K")
    with pytest.raises(ValueError, match="w2: want"):
        fused_moe_gguf_grouped(x, w1, w2[:, :-1], weights, ids, "Q4_K", "Q4_K")
    with pytest.raises(ValueError, match="topk_weights"):
        fused_moe_gguf_grouped(x, w1, w2, weights[:, :1], ids, "Q4_K", "Q4_K")


GPU_PAIRS = [
    ("Q4_K", "Q4_K"),
    ("Q2_K", "Q3_K"),
    ("Q6_K", "Q6_K"),
    ("Q8_0", "Q4_0"),
    ("IQ2_XXS", "IQ2_XS"),
    ("IQ4_XS", "IQ4_NL"),
    ("IQ1_M", "IQ1_S"),
    ("IQ3_S", "IQ2_S"),
    ("Q5_K", "IQ3_XXS"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("t1,t2", GPU_PAIRS, ids=[f"{a}+{b}" for a, b in GPU_PAIRS])
def test_gpu_kimi_shape(t1, t2):
    """Kimi-K2.5's per-GPU expert shape at TP 8 (hidden 7168, intermediate 256, top 8; 16 experts
    so tokens share them) with the compiled bf16 dot, against the float32 reference."""
    from vllm_k2_plugin.gguf_moe.blocks import random_blocks
    from vllm_k2_plugin.gguf_moe.ops import fused_moe_gguf_grouped

    gen = torch.Generator().manual_seed(3)
    experts, hidden, n, tokens, top_k = 16, 7168, 256, 5, 8
    w1 = random_blocks(experts, 2 * n, hidden, t1, "cpu", gen)
    w2 = random_blocks(experts, hidden, n, t2, "cpu", gen)
    x = torch.randn((tokens, hidden), generator=gen).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)]).to(torch.int32)
    weights = torch.rand((tokens, top_k), generator=gen) + 0.1
    ref = reference(x, w1, w2, weights, ids, t1, t2)
    got = fused_moe_gguf_grouped(*(a.cuda() for a in (x, w1, w2, weights, ids)), t1, t2).float().cpu()
    assert float((got - ref).norm() / ref.norm()) < 1e-2
    assert float((got - ref).abs().max() / ref.abs().max()) < 2e-2


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_equals_eager():
    from vllm_k2_plugin.gguf_moe.blocks import random_blocks
    from vllm_k2_plugin.gguf_moe.ops import fused_moe_gguf_grouped

    gen = torch.Generator(device="cuda").manual_seed(0)
    experts, hidden, n, tokens, top_k = 64, 1024, 256, 4, 8
    w1 = random_blocks(experts, 2 * n, hidden, "Q4_K", "cuda", gen)
    w2 = random_blocks(experts, hidden, n, "Q4_K", "cuda", gen)
    x = torch.randn((tokens, hidden), device="cuda", generator=gen).to(torch.bfloat16)
    ids = torch.zeros((tokens, top_k), dtype=torch.int32, device="cuda")
    weights = torch.rand((tokens, top_k), device="cuda", generator=gen)

    def route(seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        ids.copy_(torch.rand((tokens, experts), device="cuda", generator=g).topk(top_k, dim=1).indices)
        x.copy_(torch.randn(x.shape, device="cuda", generator=g).to(x.dtype))

    route(1)
    fused_moe_gguf_grouped(x, w1, w2, weights, ids, "Q4_K", "Q4_K")  # compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe_gguf_grouped(x, w1, w2, weights, ids, "Q4_K", "Q4_K")
    for seed in range(2, 5):  # new routing and activations, same shapes
        route(seed)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, fused_moe_gguf_grouped(x, w1, w2, weights, ids, "Q4_K", "Q4_K"))


if __name__ == "__main__":  # the interpreted run (see interpreted_results)
    assert os.environ.get("TRITON_INTERPRET") == "1"
    only = [int(a) for a in sys.argv[2:]]  # case numbers, for a quick look at one
    results = {}
    for i in only or range(len(CASES)):
        t0 = time.time()
        try:
            results[str(i)] = run_case(i)
        except Exception as e:  # noqa: BLE001 - one type's error must not hide the others'
            results[str(i)] = f"FAIL {type(e).__name__}: {e}"
        print(f"{CASES[i][0]}: {results[str(i)]} ({time.time() - t0:.1f} s)", flush=True)
    Path(sys.argv[1]).write_text(json.dumps(results))
