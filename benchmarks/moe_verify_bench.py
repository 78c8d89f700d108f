"""Triton fused_moe at speculative-verify sizes on the GPU (vLLM >= 0.20): vLLM's unsorted
"naive block" path (stock) vs the same batch sorted by expert (patch
moe-group-tokens-by-expert), K2.5's per-GPU expert shapes at TP 8, bf16.

Per (tokens, routing): CUDA-graph replay of ``fused_experts`` (L2 flushed before each rep,
median), the experts the batch touches, and the bandwidth floor: those experts' weight
bytes at the copy bandwidth measured in the same run. Writes JSON + Markdown with the
command and date.

    python benchmarks/moe_verify_bench.py --out benchmarks/results/moe_verify_h200
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MODULE = "vllm.model_executor.layers.fused_moe.fused_moe"
EXPERTS, TOP_K, HIDDEN, INTER = 384, 8, 7168, 2048 // 8
TOKENS = (1, 2, 4, 8)


def _graph_us(torch, fn) -> float:
    import triton

    fn()  # compile/tune outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return 1e3 * triton.testing.do_bench(g.replay, warmup=25, rep=200, return_mode="median")


def _exact_grid(prepare, ids_cpu):
    """The sorted assignment cut to the blocks the batch fills (an oracle: the block count is
    read from the routing on the host, which a CUDA graph of the engine cannot do). vLLM
    launches M x top-k x BLOCK_M rows for a small sorted batch; what this saves is what the
    programs past the filled blocks (they exit at once) cost."""

    def prepare_exact(topk_ids, config, *args, **kwargs):
        sorted_ids, expert_ids, padded = prepare(topk_ids, config, *args, **kwargs)
        bm = config["BLOCK_SIZE_M"]
        counts = ids_cpu.flatten().bincount()
        blocks = int(((counts[counts > 0] + bm - 1) // bm).sum())
        return sorted_ids[: blocks * bm], expert_ids[:blocks], padded

    return prepare_exact


def measure() -> dict:
    import torch

    from vllm_k2_plugin.moe_verify.patch import _wrap_prepare
    from vllm_k2_tools.mla_bench.bench import copy_bandwidth

    fm = importlib.import_module(MODULE)
    stock = fm._prepare_expert_assignment
    gen = torch.Generator().manual_seed(0)
    dev = torch.device("cuda")
    w1 = torch.randn(EXPERTS, 2 * INTER, HIDDEN, device=dev, dtype=torch.bfloat16) / HIDDEN**0.5
    w2 = torch.randn(EXPERTS, HIDDEN, INTER, device=dev, dtype=torch.bfloat16) / INTER**0.5
    expert_bytes = (w1[0].numel() + w2[0].numel()) * 2
    gbps = copy_bandwidth(torch)
    rows = []
    for tokens in TOKENS:
        for routing in ("shared", "random") if tokens > 1 else ("random",):
            if routing == "shared":
                ids = torch.randperm(EXPERTS, generator=gen)[:TOP_K].repeat(tokens, 1)
            else:
                ids = torch.stack([torch.randperm(EXPERTS, generator=gen)[:TOP_K] for _ in range(tokens)])
            ids = ids.to(dev, torch.int32)
            x = torch.randn(tokens, HIDDEN, device=dev, dtype=torch.bfloat16)
            weights = torch.rand(tokens, TOP_K, device=dev)
            run = lambda x=x, w=weights, i=ids: fm.fused_experts(x, w1, w2, w, i)  # noqa: E731
            stock_us = _graph_us(torch, run)
            fm._prepare_expert_assignment = _wrap_prepare(stock)
            try:
                grouped_us = _graph_us(torch, run)
                exact_us = None
                if tokens > 1:
                    fm._prepare_expert_assignment = _exact_grid(_wrap_prepare(stock), ids.cpu())
                    exact_us = round(_graph_us(torch, run), 1)
            finally:
                fm._prepare_expert_assignment = stock
            distinct = int(ids.unique().numel())
            floor_us = distinct * expert_bytes / (gbps * 1e3)
            rows.append(
                {
                    "tokens": tokens,
                    "routing": routing,
                    "experts": distinct,
                    "stock_us": round(stock_us, 1),
                    "grouped_us": round(grouped_us, 1),
                    "grouped_over_stock": round(grouped_us / stock_us, 3),
                    "grouped_exact_grid_us": exact_us,
                    "floor_us": round(floor_us, 1),
                }
            )
            print(rows[-1], flush=True)
    one = next(r for r in rows if r["tokens"] == 1)
    for r in rows:
        r["stock_over_one_token"] = round(r["stock_us"] / one["stock_us"], 2)
        r["grouped_over_one_token"] = round(r["grouped_us"] / one["stock_us"], 2)
    import vllm

    return {
        "device": torch.cuda.get_device_name(),
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "copy_gbps": round(gbps),
        "expert_mb": round(expert_bytes / 1e6, 2),
        "rows": rows,
    }


def markdown(r: dict) -> str:
    lines = [
        "# Triton fused_moe at verify sizes: unsorted (stock) vs sorted by expert",
        "",
        f"Command: `{r['command']}`  ",
        f"Date: {r['date']}; {r['device']}, vLLM {r['vllm']}, torch {r['torch']}",
        "",
        f"K2.5's experts at TP 8: {EXPERTS} experts, top {TOP_K}, hidden {HIDDEN}, expert intermediate {INTER}, "
        f"bf16 ({r['expert_mb']} MB of weights per expert). CUDA-graph replay of vLLM's `fused_experts`, L2 flushed, "
        f"median. Floor: the touched experts' bytes at the copy bandwidth measured in this run "
        f"({r['copy_gbps']} GB/s).",
        "",
        "| tokens | routing | experts touched | stock µs | sorted µs | sorted / stock | sorted, exact grid µs "
        "| floor µs | stock / 1 token | sorted / 1 token |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for x in r["rows"]:
        exact = x.get("grouped_exact_grid_us")
        lines.append(
            f"| {x['tokens']} | {x['routing']} | {x['experts']} | {x['stock_us']} | {x['grouped_us']} | "
            f"{x['grouped_over_stock']} | {'-' if exact is None else exact} | {x['floor_us']} | "
            f"{x['stock_over_one_token']} | {x['grouped_over_one_token']} |"
        )
    return "\n".join(lines) + (
        "\nSorted, exact grid: the sorted assignment cut to the blocks the batch fills, the block count read "
        "from the routing on the host (an oracle; an engine's CUDA graph cannot). vLLM launches "
        "tokens x top-k x BLOCK_M rows for a small sorted batch; the difference to the sorted column is what the "
        "programs past the filled blocks cost.\n"
    )


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for moe_verify.json and README.md")
    a = ap.parse_args(argv)
    from vllm_k2_plugin import fileio

    r = measure()
    r["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    r["command"] = "python benchmarks/moe_verify_bench.py " + " ".join(sys.argv[1:] if argv is None else argv)
    a.out.mkdir(parents=True, exist_ok=True)
    fileio.write_json(str(a.out / "moe_verify.json"), r)
    fileio.write_text(str(a.out / "README.md"), markdown(r))
    print(markdown(r))


if __name__ == "__main__":
    main()
