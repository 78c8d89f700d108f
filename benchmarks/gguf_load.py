"""GGUF load benchmark: throughput and peak RSS of the streaming loader for a >= 1 GB
DeepSeek-architecture GGUF (a benchmark, not a test; CPU, vLLM 0.16's gguf-py).

    python benchmarks/gguf_load.py [--workdir DIR]

Writes a scaled-up fixture (8 layers, hidden 1024, 16 experts of 1024) as a
Q8_0/F32 GGUF with split attn_k_b/attn_v_b, then, in a fresh process, streams it
through the loader (force-dequant all, float32) into preallocated parameters of
the final size, the way vLLM's weight loaders copy into model parameters. Peak RSS
is the kernel's VmHWM, reset just before loading (file pages mapped from the GGUF
count too; the loader drops them after each tensor).
Goal: peak RSS <= final weights + 2 x the largest tensor (plus the interpreter's
baseline, measured before loading).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def _status_mb(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # Linux: "5" resets VmHWM to VmRSS
        f.write("5")


def measure(gguf_path: str, config_dir: str) -> dict:
    from collections import Counter

    import torch

    from vllm_k2_plugin.gguf.loader import Options, iter_weights, make_plan
    from vllm_k2_plugin.gguf.names import deepseek2_name_map

    class Text:
        def __init__(self, path):
            self.__dict__.update(json.load(open(os.path.join(path, "config.json"))))

    plan = make_plan([gguf_path], deepseek2_name_map(Text(config_dir)), Options(force=["*"]), on_cpu=True)
    # the model's parameters, allocated up front as vLLM does before load_weights
    shapes = {}
    for name, t in iter_weights(plan, torch.float32, Counter()):  # a dry pass for the shapes
        shapes[name] = tuple(t.shape)
        del t
    params = {n: torch.empty(s) for n, s in shapes.items()}
    for p in params.values():
        p.fill_(0)  # touch the pages: they count as resident
    final_mb = sum(p.numel() * 4 for p in params.values()) / 2**20
    largest_mb = max(p.numel() * 4 for p in params.values()) / 2**20
    baseline = _status_mb("VmRSS")  # interpreter + libraries + the allocated parameters
    _reset_peak()
    t0 = time.perf_counter()
    for name, tensor in iter_weights(plan, torch.float32, Counter()):
        params[name].copy_(tensor)
    dt = time.perf_counter() - t0
    peak = _status_mb("VmHWM")
    file_mb = os.path.getsize(gguf_path) / 2**20
    return {
        "gguf_file_MB": round(file_mb, 1),
        "final_weights_MB": round(final_mb, 1),
        "largest_tensor_MB": round(largest_mb, 1),
        "rss_before_load_MB": round(baseline, 1),
        "peak_rss_MB": round(peak, 1),
        "peak_over_final_weights_MB": round(peak - baseline, 1),
        "goal_MB": round(2 * largest_mb, 1),
        "goal_met": (peak - baseline) <= 2 * largest_mb,
        "load_s": round(dt, 2),
        "throughput_MB_per_s_of_weights": round(final_mb / dt, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", default=os.path.expanduser("~/.cache/vllm-k2-plugin/bench-gguf"))
    ap.add_argument("--measure", nargs=2, metavar=("GGUF", "CONFIG_DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(*args.measure)))
        return
    from vllm_k2_tools.fixtures import FixtureSpec, build_fixture
    from vllm_k2_tools.fixtures.gguf_writer import write_gguf

    spec = FixtureSpec(
        hidden_size=1024, num_hidden_layers=16, n_routed_experts=16, moe_intermediate_size=1024, intermediate_size=4096
    )
    src = build_fixture("text", os.path.join(args.workdir, "model"), spec)
    path = os.path.join(args.workdir, "model.gguf")
    if not os.path.exists(path):  # experts F16, attention Q8_0, the rest F32: a >= 1 GB file
        write_gguf(src, path, types={"blk.*.ffn_*_exps.weight": "F16", "blk.*.attn_*.weight": "Q8_0"})
    # fresh process: peak RSS must not include the writer's memory
    out = subprocess.run([sys.executable, __file__, "--measure", path, src], capture_output=True, text=True, check=True)
    print(out.stdout.strip())


if __name__ == "__main__":
    main()
