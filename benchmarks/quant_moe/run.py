"""vLLM's MoE kernels for quantized experts at decode/verify token counts, against their floor.

On the device (vLLM importable, one CUDA GPU):
    python3 benchmarks/quant_moe/run.py --out OUT.json [--cases a,b] [--tokens 1,2,4]
For each case (cases.py) and token count T: `calls` MoE calls over `layers` layers' worth of
random valid expert weights (weights.py), each call with a fresh routing of T random hidden
states, captured in one CUDA graph and replayed; time per call = replay time / calls. Floor =
bytes of the distinct experts the call must read (gate+up and down, scales included) over the
device-to-device copy bandwidth measured in the same run. Also: distinct experts per call against
a uniform router's expectation, and per-kernel device time (torch.profiler, eager calls).
gguf cases also run our grouped kernel (vllm_k2_plugin.gguf_moe: each touched expert read once) over
the same routed calls, timed the same way (`ours_*` keys), and its output against vLLM's
`_fused_moe_gguf` on the same inputs (`ours_max_abs_diff`, `ours_rel_diff`); an error of ours is
recorded in the row (`ours_error`) and the run goes on.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
import traceback

import torch

BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, BENCHMARKS)
sys.path.insert(0, os.path.dirname(BENCHMARKS))  # the repository: our kernel without an install
from quant_moe import cases as C  # noqa: E402
from quant_moe import weights as W  # noqa: E402
from vllm_k2_plugin.gguf_moe import blocks as B  # noqa: E402
from vllm_k2_plugin.gpu_timing import graph_replay_times_us  # noqa: E402


def copy_bandwidth(dev) -> float:
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device=dev).random_(0, 255)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return 2 * n / statistics.median(times)


class MoE:
    """One case's weights for `layers` layers and its call into vLLM's kernel."""

    def __init__(self, case: dict, layers: int, dev, gen):
        self.case, self.layers = case, layers
        e, h, i = C.EXPERTS, C.HIDDEN, C.INTERMEDIATE_TP8
        kind = case["kind"]
        if kind == "bf16":
            self.w = [(W.bf16_experts(e, 2 * i, h, dev, gen), W.bf16_experts(e, h, i, dev, gen)) for _ in range(layers)]
            self.expert_bytes = (2 * i * h + h * i) * 2
        elif kind == "w4a16":
            g = case["group"]
            self.w = [
                (*W.w4a16_marlin(e, h, 2 * i, g, dev, gen), *W.w4a16_marlin(e, i, h, g, dev, gen))
                for _ in range(layers)
            ]
            q1, s1, q2, s2 = self.w[0]
            self.expert_bytes = q1[0].numel() * 4 + s1[0].numel() * 2 + q2[0].numel() * 4 + s2[0].numel() * 2
            from vllm.model_executor.layers.quantization.utils.marlin_utils import marlin_make_workspace_new

            self.workspace = marlin_make_workspace_new(dev, 4)
        else:
            t13, t2 = case["gate_up"], case["down"]
            self.types = (B.type_id(t13), B.type_id(t2))
            self.w = [
                (B.random_blocks(e, 2 * i, h, t13, dev, gen), B.random_blocks(e, h, i, t2, dev, gen))
                for _ in range(layers)
            ]
            self.expert_bytes = self.w[0][0][0].numel() + self.w[0][1][0].numel()

    def __call__(self, layer: int, x, topk_w, topk_ids):
        kind = self.case["kind"]
        if kind == "bf16":
            from vllm.model_executor.layers.fused_moe import fused_experts

            w1, w2 = self.w[layer]
            return fused_experts(x, w1, w2, topk_w, topk_ids)
        if kind == "w4a16":
            from vllm.model_executor.layers.fused_moe.fused_marlin_moe import fused_marlin_moe
            from vllm.scalar_type import scalar_types

            q1, s1, q2, s2 = self.w[layer]
            return fused_marlin_moe(
                x,
                q1,
                q2,
                None,
                None,
                s1,
                s2,
                topk_w,
                topk_ids,
                quant_type_id=scalar_types.uint4b8.id,
                global_num_experts=C.EXPERTS,
                workspace=self.workspace,
            )
        from vllm.model_executor.layers.quantization.gguf import _fused_moe_gguf

        w1, w2 = self.w[layer]
        return _fused_moe_gguf(x, w1, w2, topk_w, topk_ids, self.types[0], self.types[1], "silu")

    def ours(self, layer: int, x, topk_w, topk_ids, **launch):
        """Our grouped kernel on the same weights (gguf cases only)."""
        from vllm_k2_plugin.gguf_moe.ops import fused_moe_gguf_grouped

        w1, w2 = self.w[layer]
        return fused_moe_gguf_grouped(x, w1, w2, topk_w, topk_ids, self.types[0], self.types[1], **launch)


def make_plan(layers: int, router: W.Router, tokens: int, calls: int, dev, gen):
    """`calls` routed calls (layer, x, topk weights, topk ids) and each one's distinct experts."""
    xs = [torch.randn((tokens, C.HIDDEN), device=dev, generator=gen).to(torch.bfloat16) for _ in range(calls)]
    routes = [router.route(x) for x in xs]
    distinct = [int(torch.unique(ids).numel()) for _, ids in routes]
    return [(c % layers, xs[c], *routes[c]) for c in range(calls)], distinct


def measure(moe, plan: list, distinct: list, router: W.Router, tokens: int, replays: int, expert_bytes: int) -> dict:
    """Time `moe` (any callable taking a plan entry) over the plan: profile, then CUDA graph replays."""
    calls = len(plan)
    for args in plan[:2]:
        moe(*args)
    torch.cuda.synchronize()
    # per-kernel device time, eager
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for args in plan:
            moe(*args)
        torch.cuda.synchronize()
    kernels: dict[str, float] = {}
    for ev in prof.events():
        if ev.device_type.name == "CUDA" and ev.device_time > 0:
            name = ev.name[:90]
            kernels[name] = kernels.get(name, 0.0) + ev.device_time / calls  # us per call

    # graph replay timing: the whole plan per replay
    def run_plan():
        for args in plan:
            moe(*args)

    times = graph_replay_times_us(run_plan, replays=1, batches=replays, calls_per_fn=calls)
    return {
        "tokens": tokens,
        "us_per_call": statistics.median(times),
        "us_spread": [min(times), max(times)],
        "distinct_experts_mean": statistics.mean(distinct),
        "distinct_experts_uniform": router.expected_distinct(tokens),
        "pairs": tokens * C.TOP_K,
        "bytes_distinct_mean": statistics.mean(distinct) * expert_bytes,
        "kernels_us": dict(sorted(kernels.items(), key=lambda kv: -kv[1])),
    }


def launches(a) -> list[dict]:
    """The launch configurations of our kernel to measure: the --ours-* defaults, then each of
    --ours-sweep's ("block_n1=16,ksplit1=16;block_n2=128,num_warps2=8": each overrides the defaults)."""
    base = {
        "block_n1": a.ours_block_n1,
        "ksplit1": a.ours_ksplit1,
        "block_n2": a.ours_block_n2,
        "num_warps1": a.ours_warps1,
        "num_warps2": a.ours_warps2,
        "words": a.ours_words,
        "word_block_m": a.ours_word_block_m,
    }
    out = [base]
    for spec in filter(None, (a.ours_sweep or "").split(";")):
        cfg = dict(base)
        for item in spec.split(","):
            key, _, value = item.partition("=")
            if key.strip() not in base:
                raise SystemExit(f"--ours-sweep: unknown launch key {key.strip()!r}; keys: {', '.join(base)}")
            cfg[key.strip()] = int(value)
        out.append(cfg)
    return out


def measure_ours_best(moe: MoE, plan: list, distinct: list, router: W.Router, tokens: int, a) -> dict:
    """measure_ours for every launch configuration; the fastest one's keys, and every one's time
    under `ours_sweep` when there are several."""
    runs = [measure_ours(moe, plan, distinct, router, tokens, a, launch) for launch in launches(a)]
    ok = [r for r in runs if "ours_error" not in r]
    best = dict(min(ok, key=lambda r: r["ours_us_per_call"]) if ok else runs[0])
    if len(runs) > 1:
        best["ours_sweep"] = [
            {
                "launch": r["ours_launch"],
                "us_per_call": r.get("ours_us_per_call"),
                "rel_diff": r.get("ours_rel_diff"),
                "error": r.get("ours_error"),
            }
            for r in runs
        ]
    return best


def measure_ours(moe: MoE, plan: list, distinct: list, router: W.Router, tokens: int, a, launch: dict) -> dict:
    """Our kernel over the same plan, timed as vLLM's was, and its output against vLLM's on every
    call of the plan. `ours_`-prefixed keys; an exception is recorded, not raised."""
    try:
        worst, rel = 0.0, 0.0
        for args in plan:
            want = moe(*args).float()
            got = moe.ours(*args, **launch).float()
            worst = max(worst, float((got - want).abs().max()))
            rel = max(rel, float((got - want).norm() / want.norm().clamp_min(1e-30)))
        r = measure(
            lambda *args: moe.ours(*args, **launch), plan, distinct, router, tokens, a.replays, moe.expert_bytes
        )
    except Exception as e:  # our kernel failing on one type must not lose the run
        traceback.print_exc()
        torch.cuda.synchronize()
        return {"ours_error": f"{type(e).__name__}: {e}", "ours_launch": launch}
    return {
        "ours_us_per_call": r["us_per_call"],
        "ours_us_spread": r["us_spread"],
        "ours_kernels_us": r["kernels_us"],
        "ours_max_abs_diff": worst,
        "ours_rel_diff": rel,
        "ours_launch": launch,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default=",".join(c["name"] for c in C.CASES))
    ap.add_argument("--tokens", default=",".join(map(str, C.TOKENS)))
    ap.add_argument("--layers", type=int, default=4, help="layers of weights to rotate over (keeps L2 out)")
    ap.add_argument("--calls", type=int, default=16)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--budget", type=float, default=400.0, help="seconds; cases not started by then are skipped")
    ap.add_argument("--no-ours", action="store_true", help="gguf cases: vLLM's kernel only")
    ap.add_argument("--ours-block-n1", type=int, default=32, help="our kernel: gate/up rows per program")
    ap.add_argument("--ours-ksplit1", type=int, default=8, help="our kernel: programs sharing a gate/up row")
    ap.add_argument("--ours-block-n2", type=int, default=64, help="our kernel: down rows per program")
    ap.add_argument(
        "--ours-sweep",
        default="",
        help="more launch configurations of our kernel, ';'-separated "
        "'key=value,...' overrides of the --ours-* defaults; the fastest is reported, all are kept",
    )
    ap.add_argument("--ours-warps1", type=int, default=4, help="our kernel: warps of the gate/up program")
    ap.add_argument("--ours-warps2", type=int, default=4, help="our kernel: warps of the down program")
    ap.add_argument("--ours-words", type=int, default=1, help="our kernel: 1 = word-load kernels for K-quants")
    ap.add_argument("--ours-word-block-m", type=int, default=1, help="our word kernels: tokens per pass")
    a = ap.parse_args()
    from vllm.platforms import current_platform

    dev = torch.device("cuda")
    t0 = time.time()
    gen = torch.Generator(device=dev).manual_seed(0)
    bw = copy_bandwidth(dev)
    import vllm

    result = {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": current_platform.get_device_name(),
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "copy_bandwidth_bytes_per_s": bw,
        "shape": {
            "experts": C.EXPERTS,
            "top_k": C.TOP_K,
            "hidden": C.HIDDEN,
            "per_gpu_intermediate": C.INTERMEDIATE_TP8,
        },
        "cases": [],
    }
    print(f"device {result['device']}, copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    router = W.Router(C.EXPERTS, C.TOP_K, C.HIDDEN, C.ROUTED_SCALING, dev, gen)
    tokens = [int(t) for t in a.tokens.split(",")]
    for name in a.cases.split(","):
        c = C.case(name)
        row = {"case": c, "rows": []}
        result["cases"].append(row)
        if time.time() - t0 > a.budget:
            row["skipped"] = "time budget"
            continue
        try:
            moe = MoE(c, a.layers, dev, gen)
            row["expert_bytes"] = moe.expert_bytes
            for t in tokens:
                plan, distinct = make_plan(moe.layers, router, t, a.calls, dev, gen)
                r = measure(moe, plan, distinct, router, t, a.replays, moe.expert_bytes)
                r["floor_us"] = r["bytes_distinct_mean"] / bw * 1e6
                r["over_floor"] = r["us_per_call"] / r["floor_us"]
                row["rows"].append(r)
                print(
                    f"{name:14s} T={t:2d} {r['us_per_call']:8.1f} us  floor {r['floor_us']:7.1f} us  "
                    f"x{r['over_floor']:.2f}  experts {r['distinct_experts_mean']:.1f} "
                    f"(uniform {r['distinct_experts_uniform']:.1f})",
                    flush=True,
                )
                if c["kind"] == "gguf" and not a.no_ours:
                    r.update(measure_ours_best(moe, plan, distinct, router, t, a))
                    if "ours_error" in r:
                        print(f"{name:14s} T={t:2d} ours: ERROR {r['ours_error'][:200]}", flush=True)
                    else:
                        print(
                            f"{name:14s} T={t:2d} ours {r['ours_us_per_call']:8.1f} us  "
                            f"x{r['ours_us_per_call'] / r['floor_us']:.2f} floor  "
                            f"max|diff| {r['ours_max_abs_diff']:.3g} (rel {r['ours_rel_diff']:.3g})",
                            flush=True,
                        )
            del moe
        except Exception as e:  # one broken case must not lose the others
            row["error"] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
            print(f"{name}: ERROR {row['error'][:200]}", flush=True)
        torch.cuda.empty_cache()
        tmp = a.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1)
        os.replace(tmp, a.out)
    print(f"TOTAL {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
