"""Write the quantized-MoE report (markdown) from run.py's JSON.

python3 benchmarks/quant_moe/report.py RESULT.json OUT.md
"""

from __future__ import annotations

import json
import os
import sys


def ours(x: dict) -> str:
    if "ours_error" in x:
        return f"error: {x['ours_error'][:80]}"
    if "ours_us_per_call" not in x:
        return ""
    return (
        f"{x['ours_us_per_call']:.1f} us, x{x['ours_us_per_call'] / x['floor_us']:.2f}, "
        f"rel diff {x['ours_rel_diff']:.2g}"
    )


def render(r: dict) -> str:
    bw = r["copy_bandwidth_bytes_per_s"]
    out = [
        "# vLLM's MoE kernels for quantized experts against their floor",
        "",
        f"Written by `benchmarks/quant_moe/report.py` from `{r['command']}` ({r['date']}; {r['device']}, "
        f"vLLM {r['vllm']}, torch {r['torch']}).",
        "",
        f"Shape: one GPU of TP 8 for Kimi-K2.5's routed experts ({r['shape']}); random valid weights; "
        f"time per MoE call from CUDA-graph replays rotating over several layers' weights; floor = bytes of the "
        f"distinct experts the call must read / measured copy bandwidth ({bw / 1e12:.2f} TB/s, read + write).",
        "",
        "Ours: our grouped GGUF kernel (vllm_k2_plugin.gguf_moe) on the same calls, timed the same way: us per "
        "call, x floor, and its largest relative difference from vLLM's output over the calls.",
        "",
        "| format | T | us per call | floor us | x floor | distinct experts (uniform router) | top kernels (us) "
        "| ours |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in r["cases"]:
        name = row["case"]["name"]
        if "error" in row or "skipped" in row:
            out.append(f"| {name} | - | {row.get('error') or row.get('skipped')} | | | | | |")
            continue
        for x in row["rows"]:
            ks = "; ".join(f"{k[:40]} {v:.1f}" for k, v in list(x["kernels_us"].items())[:3])
            out.append(
                f"| {name} | {x['tokens']} | {x['us_per_call']:.1f} | {x['floor_us']:.1f} | {x['over_floor']:.2f} | "
                f"{x['distinct_experts_mean']:.1f} ({x['distinct_experts_uniform']:.1f}) | {ks} | {ours(x)} |"
            )
    return "\n".join(out) + "\n"


def main() -> int:
    src, dst = sys.argv[1], sys.argv[2]
    with open(src) as f:
        text = render(json.load(f))
    tmp = dst + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, dst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
