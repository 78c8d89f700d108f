"""What vLLM's CUDA rotary op (``_C::rotary_embedding``) costs with a bf16 vs a float32
cos/sin cache, on the GPU machine with a vLLM bundle (0.20, or 0.16 by route B/C): the kernels one call launches
(torch.profiler, kernel-only µs), and whether the float32 copy of the bf16 cache gives
bit-identical rotated query/key. Shapes: the K2.5 drafter's per-GPU share (8 query / 8 or
1 KV heads of 128, 4 tokens), cache of 262,144 positions x 128 (K2.5's max positions).

    PYTHONPATH=/tmp/site python3 benchmarks/rope_cache_probe.py --out benchmarks/results/rope_cache_h200.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shlex
import sys
import time


def cache_f32(positions: int, rot: int, base: float):
    import torch

    inv = 1.0 / (base ** (torch.arange(0, rot, 2, dtype=torch.float, device="cuda") / rot))
    freqs = torch.outer(torch.arange(positions, dtype=torch.float, device="cuda"), inv)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


def kernels(fn, reps: int = 10) -> dict[str, dict]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    us, calls = collections.Counter(), collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            us[e.name[:120]] += e.time_range.elapsed_us()
            calls[e.name[:120]] += 1
    return {k: {"calls_per_op": calls[k] / reps, "us_per_op": round(us[k] / reps, 2)} for k in us}


def main() -> int:
    import torch
    import vllm._custom_ops as ops

    from vllm_k2_plugin.fileio import write_text

    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    a = p.parse_args()
    torch.manual_seed(0)
    head, rot, tokens, base = 128, 128, 4, 1e6
    positions = torch.tensor([4093, 4094, 4095, 4096], device="cuda")
    rows = []
    for n_pos in (262_144, 8_192):
        c32 = cache_f32(n_pos, rot, base)
        c16 = c32.to(torch.bfloat16)
        for kv_heads in (8, 1):
            q0 = torch.randn(tokens, 8 * head, device="cuda", dtype=torch.bfloat16)
            k0 = torch.randn(tokens, kv_heads * head, device="cuda", dtype=torch.bfloat16)
            out = {}
            for name, cache in (("bf16 cache", c16), ("float32 copy of the bf16 cache", c16.float())):
                q, k = q0.clone(), k0.clone()
                try:
                    ops.rotary_embedding(positions, q, k, head, cache, True)
                except Exception as e:  # noqa: BLE001 - an op that refuses this cache is a finding
                    rows.append({"positions": n_pos, "kv_heads": kv_heads, "cache": name, "error": repr(e)[:300]})
                    continue
                out[name] = (q, k)
                qq, kk = q0.clone(), k0.clone()
                ks = kernels(
                    lambda qq=qq, kk=kk, cache=cache: ops.rotary_embedding(positions, qq, kk, head, cache, True)
                )
                rows.append(
                    {
                        "positions": n_pos,
                        "kv_heads": kv_heads,
                        "cache": name,
                        "kernels": ks,
                        "us_per_op": round(sum(v["us_per_op"] for v in ks.values()), 2),
                    }
                )
            if len(out) == 2:
                (qa, ka), (qb, kb) = out.values()
                rows[-1]["bit_identical_to_bf16_cache"] = bool(torch.equal(qa, qb) and torch.equal(ka, kb))
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "python3 " + " ".join(shlex.quote(x) for x in [os.path.relpath(__file__)] + sys.argv[1:]),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "vllm": __import__("vllm").__version__,
        "engine_route": os.environ.get("E2E_ENGINE_ROUTE", "vLLM's own wheel"),
        "rows": rows,
    }
    write_text(a.out, json.dumps(result, indent=1) + "\n")
    md = [
        f"# vLLM's CUDA rotary op: bf16 vs float32 cos/sin cache on {result['device']}",
        "",
        f"Command: `{result['command']}`",
        f"Date: {result['date']} (vLLM {result['vllm']}, torch {result['torch']})",
        "",
        __doc__.split("\n\n")[0].replace("\n", " "),
        "",
        "| cache positions | KV heads | cache given to the op | µs per call (kernels) | kernels per call | "
        "same q/k as the bf16 cache |",
        "|---:|---:|---|---:|---|---|",
    ]
    for r in rows:
        if "error" in r:
            md.append(f"| {r['positions']:,} | {r['kv_heads']} | {r['cache']} | error: {r['error']} | | |")
            continue
        ks = "; ".join(f"{v['calls_per_op']:g} x {k[:60]} {v['us_per_op']:.1f} µs" for k, v in r["kernels"].items())
        same = {True: "bit-identical", False: "DIFFERENT"}.get(r.get("bit_identical_to_bf16_cache"), "(itself)")
        md.append(f"| {r['positions']:,} | {r['kv_heads']} | {r['cache']} | {r['us_per_op']:.1f} | {ks} | {same} |")
    write_text(os.path.splitext(a.out)[0] + ".md", "\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
