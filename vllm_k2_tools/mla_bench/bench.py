"""`vllm-k2 bench mla`: our kernel vs vLLM 0.16's stock Triton decode vs the memory
roofline, one run, one GPU.

Per (batch, context, heads, q_len, KV dtype), side by side in one process:
- graph µs: median CUDA-graph replay (triton.testing.do_bench, L2 flushed between reps),
  launch included: what vLLM's decode graphs pay;
- kernel µs: kernel-only time from torch.profiler (L2 flushed before each rep), split and
  reduce kernels separately;
- roofline µs: kernel-only time of a plain streaming read of the same paged bytes
  (`roofline.paged_stream_read`, best of a few program shapes), measured in the same run;
  "of roofline" = roofline µs / our kernel µs;
- stock: 0.16's `decode_attention_fwd` with its fixed 4 splits, called as
  `TritonMLAImpl.forward_mqa` does (q_len > 1: the 0.32-style flattening on the same
  kernel); no fp8 KV (n/a).
``--runs 2`` measures every row twice and reports the largest run-to-run difference.
``--pick-variant`` first times every variant that fits on probes of each row class with
the launcher's own split choice, and keeps the committed preference unless another
variant is faster by more than PICK_MARGIN (so the choice is stable from run to run).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time

from vllm_k2_plugin.mla import configs

SM_SCALE = 1.0 / math.sqrt(192)
PAGE = 16
#: The stock kernel computes element offsets in int32: pages beyond this index are read
#: from wrapped addresses (its defect #6). Block tables draw from these pages when the
#: configuration fits, so both kernels read the same, valid, data.
STOCK_SAFE_PAGES = (2**31 - 1) // (PAGE * 576)
#: (programs per request, BLOCK_N, warps) tried for the roofline read; the best counts.
ROOF_SHAPES = ((1056, 16, 4), (528, 16, 4), (264, 32, 8), (132, 64, 8))
#: A challenger variant must beat the committed one by this much (geomean) to be picked.
PICK_MARGIN = 0.05
#: (batch, context, heads, q_len) per row class the variants are chosen on.
VARIANT_PROBES = ((1, 32768, 8, 1), (8, 32768, 8, 1), (64, 8192, 8, 1), (8, 32768, 8, 4))
#: (batch, context, heads, q_len) the split-count sweep times at many split counts.
SPLIT_PROBES = (
    (1, 8192, 8, 1),
    (1, 32768, 8, 1),
    (1, 131072, 8, 1),
    (8, 32768, 8, 1),
    (16, 32768, 8, 1),
    (64, 8192, 8, 1),
    (64, 32768, 8, 1),
    (1, 32768, 8, 4),
    (8, 32768, 8, 4),
    (1, 32768, 64, 1),
    (8, 8192, 64, 4),
    (64, 8192, 64, 4),
)
SPLIT_COUNTS = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
#: The users' GPU for the decode-attention model (vendor figure; an assumption).
RTX_PRO_6000 = {"name": "RTX PRO 6000 Blackwell", "hbm_gbps": 1800.0}
K25 = {"layers": 61, "context": 150_000, "heads_per_gpu": 8}
#: Vendor memory bandwidth of the GPUs we measure on, to carry the streaming-read
#: efficiency over to the users' GPU (an assumption, stated in the output).
VENDOR_GBPS = {"NVIDIA H200": 4800.0}


class Timer:
    """Graph-replay and profiler (kernel-only) timings with L2 flushed between reps."""

    def __init__(self, torch, reps: int = 15):
        self.torch, self.reps = torch, reps
        self.flush = torch.empty(512 << 20, dtype=torch.int8, device="cuda")

    def graph_us(self, fn, rep_ms: int = 40) -> float:
        import triton

        torch = self.torch
        fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return 1e3 * triton.testing.do_bench(graph.replay, warmup=10, rep=rep_ms, return_mode="median")

    def kernel_us(self, fn) -> dict[str, float]:
        """Median kernel-only µs per kernel name (the flush's own fill kernel left out)."""
        torch = self.torch
        fn()
        torch.cuda.synchronize()
        acts = [torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(self.reps):
                self.flush.zero_()
                fn()
            torch.cuda.synchronize()
        per: dict[str, list[float]] = {}
        for e in prof.events():
            if e.device_type != torch.autograd.DeviceType.CUDA or "fill" in e.name.lower():
                continue
            per.setdefault(short_name(e.name), []).append(e.time_range.elapsed_us())
        return {k: sorted(v)[len(v) // 2] for k, v in per.items()}


def short_name(kernel: str) -> str:
    for name in ("mla_decode_split", "mla_decode_reduce", "paged_stream_read"):
        if name in kernel:
            return name
    return "stock_stage2" if "stage2" in kernel else "stock_stage1" if "stage1" in kernel else kernel[:40]


def roofline_us(timer: Timer, pool, bt, ctx: int) -> float:
    from .roofline import stream_read

    batch = bt.shape[0]
    best = float("inf")
    for progs, block_n, warps in ROOF_SHAPES:
        per_req = max(1, min(progs // batch, ctx // block_n))  # short contexts: one tile per program
        k = timer.kernel_us(lambda p=per_req, b=block_n, w=warps: stream_read(pool, bt, ctx, p, b, w))
        best = min(best, k["paged_stream_read"])
    return best


def copy_bandwidth(torch, nbytes: int = 2 << 30) -> float:
    import triton

    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    return 2 * nbytes / (ms * 1e-3) / 1e9


def _case(torch, dev, g, pool_pages: int, batch: int, ctx: int, heads: int, q_len: int):
    pages_per = -(-ctx // PAGE)
    safe = min(STOCK_SAFE_PAGES, pool_pages)
    span = safe if batch * pages_per <= safe else pool_pages
    bt = torch.randperm(span, device=dev)[: batch * pages_per].view(batch, pages_per).to(torch.int32)
    sl = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
    q = torch.randn(batch * q_len, heads, 576, generator=g, device=dev).to(torch.bfloat16)
    return q, bt, sl, span


def pick_variants(torch, timer: Timer, pools: dict, k_scale, pool_pages: int) -> list[dict]:
    """Time every variant that fits on VARIANT_PROBES (launcher's split choice); move a
    variant to the front of configs.PREFERENCE only if it beats the committed first one
    by PICK_MARGIN (geomean). Returns one record per (KV dtype, variant)."""
    from vllm_k2_plugin.mla import launcher

    dev = torch.device("cuda")
    limits = launcher.device_limits(0)
    g = torch.Generator(device=dev).manual_seed(1)
    cases = [_case(torch, dev, g, pool_pages, b, c, h, ql) + (ql,) for b, c, h, ql in VARIANT_PROBES]
    records = []
    for kv_name, pool in pools.items():
        fp8 = kv_name == "fp8"
        ks = k_scale if fp8 else None
        committed = configs.PREFERENCE[fp8]
        scores = {}
        for variant, smem in configs.VARIANT_SMEM[fp8].items():
            if smem > limits.smem_per_block:
                continue
            configs.PREFERENCE[fp8] = [variant]
            times = []
            for q, bt, sl, _, ql in cases:
                ws = launcher.Workspace(dev)
                k = timer.kernel_us(
                    lambda q=q, bt=bt, sl=sl, ql=ql, ws=ws, pool=pool, ks=ks: launcher.mla_decode(
                        q, pool, bt, sl, SM_SCALE, q_len=ql, k_scale=ks, workspace=ws
                    )
                )
                times.append(sum(k.values()))
            scores[variant] = math.exp(sum(math.log(t) for t in times) / len(times))
            records.append({"kv": kv_name, "variant": list(variant), "kernel_us": times, "geomean": scores[variant]})
            print(json.dumps(records[-1]), flush=True)
        configs.PREFERENCE[fp8] = committed
        incumbent = committed[0]
        best = min(scores, key=scores.get)
        if incumbent not in scores or scores[best] < (1 - PICK_MARGIN) * scores[incumbent]:
            configs.PREFERENCE[fp8] = [best] + [v for v in committed if v != best]
    return records


def split_sweep(torch, timer: Timer, pools: dict, k_scale, pool_pages: int) -> list[dict]:
    """Kernel-only time of SPLIT_PROBES at many split counts (and the launcher's pick)."""
    from vllm_k2_plugin.mla import launcher

    dev = torch.device("cuda")
    limits = launcher.device_limits(0)
    g = torch.Generator(device=dev).manual_seed(2)
    out = []
    for kv_name, pool in pools.items():
        ks = k_scale if kv_name == "fp8" else None
        for batch, ctx, heads, ql in SPLIT_PROBES:
            q, bt, sl, _ = _case(torch, dev, g, pool_pages, batch, ctx, heads, ql)
            plan = launcher.plan(batch, heads, ql, ctx, PAGE, kv_name == "fp8", limits)
            pick = plan.num_splits
            programs = batch * configs.row_blocks(heads * ql, plan.split.block_m)
            slots = configs.resident_slots(plan.split, limits)
            # the launcher's pick, the counts that fill the SMs once / the slots once, and a ladder
            fills = {max(1, limits.sm_count // programs), max(1, slots // programs)}
            times = {}
            for s in sorted({pick, *fills, *(c for c in SPLIT_COUNTS if c <= -(-ctx // 16))}):
                ws = launcher.Workspace(dev)
                k = timer.kernel_us(
                    lambda s=s, q=q, bt=bt, sl=sl, ql=ql, ws=ws, pool=pool, ks=ks: launcher.mla_decode(
                        q, pool, bt, sl, SM_SCALE, q_len=ql, k_scale=ks, num_splits=s, workspace=ws
                    )
                )
                times[str(s)] = sum(k.values())
            rec = {"batch": batch, "context": ctx, "heads": heads, "q_len": ql, "kv": kv_name, "pick": pick}
            rec["kernel_us"] = times
            out.append(rec)
            print(json.dumps(rec), flush=True)
    return out


def run(
    batches=(1, 8, 64),
    contexts=(1024, 8192, 32768, 131072),
    heads=(8, 64),
    q_lens=(1, 4),
    kv_dtypes=("bf16", "fp8"),
    max_tokens: int = 64 * 131072,
    stock: bool = True,
    variants: bool = False,
    runs: int = 1,
    splits: bool = False,
) -> dict:
    import torch
    import triton

    from vllm_k2_plugin.mla import launcher

    from .stock import flatten_spec, load, stock_decode

    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    limits = launcher.device_limits(0)
    mod = load() if stock else None
    timer = Timer(torch)
    bw = copy_bandwidth(torch)
    pool_tokens = min(max_tokens, max(b * c for b in batches for c in contexts))
    n_pages = -(-pool_tokens // PAGE)
    g = torch.Generator(device=dev).manual_seed(0)
    pool_bf16 = torch.randn(n_pages, PAGE, 576, generator=g, device=dev).to(torch.bfloat16)
    pools = {"bf16": pool_bf16}
    if "fp8" in kv_dtypes:
        pools["fp8"] = (pool_bf16.float() * 4).to(torch.float8_e4m3fn)
    k_scale = torch.tensor([0.25], device=dev)
    variant_rows = pick_variants(torch, timer, pools, k_scale, n_pages) if variants else []
    split_rows = split_sweep(torch, timer, pools, k_scale, n_pages) if splits else []
    rows, roofs = [], {}
    for batch in batches:
        for ctx in contexts:
            if batch * ctx > pool_tokens:
                continue
            for h in heads:
                for ql in q_lens:
                    q, bt, sl, span = _case(torch, dev, g, n_pages, batch, ctx, h, ql)
                    for kvd in kv_dtypes:
                        rows.append(
                            _row(
                                torch,
                                timer,
                                launcher,
                                pools,
                                k_scale,
                                mod,
                                limits,
                                roofs,
                                batch,
                                ctx,
                                h,
                                ql,
                                kvd,
                                q,
                                bt,
                                sl,
                                span,
                                runs,
                                bw,
                                flatten_spec,
                                stock_decode,
                            )
                        )
                        print(json.dumps(rows[-1]), flush=True)
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "device": props.name,
        "sm_count": limits.sm_count,
        "max_shared_mem": limits.smem_per_block,
        "device_limits": dataclasses.asdict(limits),
        "shared_mem_per_sm": limits.smem_per_sm,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "copy_gbps": bw,
        "page_size": PAGE,
        "runs": runs,
        "rows": rows,
        "variant_sweep": variant_rows,
        "split_sweep": split_rows,
        "preference": {("fp8" if k else "bf16"): [list(v) for v in p] for k, p in configs.PREFERENCE.items()},
    }


def _row(
    torch,
    timer,
    launcher,
    pools,
    k_scale,
    mod,
    limits,
    roofs,
    batch,
    ctx,
    h,
    ql,
    kvd,
    q,
    bt,
    sl,
    span,
    runs,
    bw,
    flatten_spec,
    stock_decode,
) -> dict:
    dev = q.device
    kv = pools[kvd]
    ks = k_scale if kvd == "fp8" else None
    ws = launcher.Workspace(dev)
    out = torch.empty(batch * ql, h, 512, dtype=torch.bfloat16, device=dev)
    lse = torch.empty(batch * ql, h, dtype=torch.float32, device=dev)

    def ours():
        return launcher.mla_decode(q, kv, bt, sl, SM_SCALE, q_len=ql, k_scale=ks, out=out, lse=lse, workspace=ws)

    p = launcher.plan(batch, h, ql, ctx, PAGE, kvd == "fp8", limits)
    row = dict(
        batch=batch,
        context=ctx,
        heads=h,
        q_len=ql,
        kv=kvd,
        splits=p.num_splits,
        slots=configs.resident_slots(p.split, limits),
        variant=f"m{p.split.block_m}/w{p.split.num_warps}/n{p.split.block_n}/s{p.split.num_stages}",
    )
    samples = []
    for _ in range(runs):
        k = timer.kernel_us(ours)
        samples.append(
            {"graph_us": timer.graph_us(ours), "kernel_us": sum(k.values()), "split_us": k["mla_decode_split"]}
        )
    row.update({key: samples[0][key] for key in samples[0]})
    if runs > 1:
        row["run_to_run"] = max(
            abs(s[key] / samples[0][key] - 1) for s in samples[1:] for key in ("graph_us", "kernel_us")
        )
        row["runs_us"] = samples
    key = (batch, ctx, kvd)
    if key not in roofs:
        roofs[key] = roofline_us(timer, kv, bt, ctx)
    row["roofline_us"] = roofs[key]
    if mod is not None and kvd == "bf16":
        if span > STOCK_SAFE_PAGES:
            row["stock"] = "not run: int32 offsets overflow"
            return derive(row, bw)
        sbt, ssl = flatten_spec(bt, sl, ql) if ql > 1 else (bt, sl)  # outside the graph

        def base():
            return stock_decode(mod, q, kv, sbt, ssl, SM_SCALE)

        so, _ = base()
        oo, _ = ours()
        row["rel_diff_vs_stock"] = float(((so.float() - oo.float()).norm() / so.float().norm()).item())
        sk = timer.kernel_us(base)
        row["stock_graph_us"] = timer.graph_us(base)
        row["stock_kernel_us"] = sum(sk.values())
    return derive(row, bw)


def derive(row: dict, copy_gbps: float) -> dict:
    """Fields computed from a row's measured times (recomputed by the results test)."""
    kv_bytes = row["batch"] * row["context"] * 576 * (1 if row["kv"] == "fp8" else 2)
    row["kernel_gbps"] = kv_bytes / (row["kernel_us"] * 1e-6) / 1e9
    row["pct_copy"] = 100 * row["kernel_gbps"] / copy_gbps
    row["of_roofline"] = row["roofline_us"] / row["kernel_us"]
    row["split_vs_roofline"] = row["split_us"] / row["roofline_us"]
    if "stock_kernel_us" in row:
        row["speedup"] = row["stock_graph_us"] / row["graph_us"]
        row["kernel_speedup"] = row["stock_kernel_us"] / row["kernel_us"]
    return row


def compare(result: dict, previous: dict) -> float:
    """Per-row ratio of kernel and graph times to a previous run of the same rows; the
    largest deviation (also stored in each row as ``vs_previous``)."""
    key = ("batch", "context", "heads", "q_len", "kv")
    prev = {tuple(r[k] for k in key): r for r in previous["rows"]}
    worst = 0.0
    for r in result["rows"]:
        p = prev.get(tuple(r[k] for k in key))
        if p is None:
            continue
        r["vs_previous"] = {f: r[f] / p[f] for f in ("kernel_us", "graph_us")}
        worst = max(worst, *(abs(v - 1) for v in r["vs_previous"].values()))
    result["previous_run"] = {"date": previous["date"], "max_deviation": worst}
    return worst


def batch1_breakdown(result: dict) -> list[str]:
    """Where the time of the batch 1 x 8 heads x 32k rows goes, from their measurements."""
    out = []
    for r in result["rows"]:
        if (r["batch"], r["heads"], r["context"], r["q_len"]) == (1, 8, 32768, 1):
            out.append(
                f"- {r['kv']}: graph replay {r['graph_us']:.1f} µs = kernels {r['kernel_us']:.1f} (split "
                f"{r['split_us']:.1f} + reduce {r['kernel_us'] - r['split_us']:.1f}) + launch and gaps "
                f"{r['graph_us'] - r['kernel_us']:.1f}; a streaming read of the same bytes {r['roofline_us']:.1f} µs; "
                f"split kernel / streaming read = {r['split_vs_roofline']:.2f}×"
            )
    return out


def users_model(result: dict) -> list[dict]:
    """K2.5 decode attention per token on one RTX PRO 6000 at 150k context (61 layers, 8
    heads per GPU: the latent cache is read whole by every GPU), from the fraction of the
    streaming-read roofline our kernel reached here at batch 1 x 8 heads x the longest
    context, and the streaming read's share of this GPU's vendor bandwidth."""
    vendor = VENDOR_GBPS.get(result["device"])
    out = []
    for kv, width in (("bf16", 2), ("fp8", 1)):
        cands = [r for r in result["rows"] if r["batch"] == 1 and r["heads"] == 8 and r["q_len"] == 1 and r["kv"] == kv]
        if not cands or vendor is None:
            continue
        r = max(cands, key=lambda r: r["context"])
        read_bytes = r["context"] * 576 * width
        stream_share = read_bytes / (r["roofline_us"] * 1e-6) / 1e9 / vendor
        layer_bytes = K25["context"] * 576 * width
        stream_gbps = RTX_PRO_6000["hbm_gbps"] * stream_share
        per_layer_us = layer_bytes / (stream_gbps * 1e3 * r["of_roofline"])
        out.append(
            {
                "kv": kv,
                "from_row": {"context": r["context"], "of_roofline": r["of_roofline"]},
                "streaming_share_of_vendor_bw": stream_share,
                "bytes_per_token": layer_bytes * K25["layers"],
                "per_layer_us": per_layer_us,
                "per_token_ms": per_layer_us * K25["layers"] / 1e3,
            }
        )
    return out


def _f(x, fmt: str) -> str:
    return format(x, fmt) if isinstance(x, (int, float)) else "n/a"


def table(result: dict) -> str:
    lines = [
        f"{result['device']} ({result['sm_count']} SMs, {result['max_shared_mem']} B smem/block, "
        f"{result['shared_mem_per_sm']} B/SM), torch {result['torch']}, triton {result['triton']}, {result['date']}",
        f"copy bandwidth {result['copy_gbps']:.0f} GB/s (read+write); page {result['page_size']}; KV read once; "
        f"runs per row {result['runs']}",
        "",
        "| batch | heads | ctx | q_len | KV | splits | slots | variant | graph µs | kernel µs | split µs | roofline µs "
        "| of roofline | stock graph µs | stock kernel µs | speedup (graph) | speedup (kernel) | run-to-run |",
        "|---:|---:|---:|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        stock_g = "†" if "stock" in r else _f(r.get("stock_graph_us"), ".1f")
        lines.append(
            f"| {r['batch']} | {r['heads']} | {r['context']} | {r['q_len']} | {r['kv']} | {r['splits']} | "
            f"{r['slots']} | "
            f"{r['variant']} | {r['graph_us']:.1f} | {r['kernel_us']:.1f} | {r['split_us']:.1f} | "
            f"{r['roofline_us']:.1f} | {100 * r['of_roofline']:.0f} % | {stock_g} | "
            f"{_f(r.get('stock_kernel_us'), '.1f')} | {_f(r.get('speedup'), '.2f')}{'×' if 'speedup' in r else ''} | "
            f"{_f(r.get('kernel_speedup'), '.2f')}{'×' if 'kernel_speedup' in r else ''} | "
            f"{_f(100 * r['run_to_run'] if 'run_to_run' in r else None, '.1f')}{' %' if 'run_to_run' in r else ''} |"
        )
    if any("stock" in r for r in result["rows"]):
        lines += [
            "",
            "† stock not run: its int32 element offsets overflow beyond "
            f"{STOCK_SAFE_PAGES} pages of 16 tokens (wrong reads; an illegal address on the H200)",
        ]
    return "\n".join(lines)


def write(result: dict, path: str, command: str) -> None:
    """The raw JSON (with the command) and, beside it, the Markdown report."""
    from vllm_k2_plugin.fileio import write_text

    result = {**result, "command": command, "users_model": users_model(result)}
    write_text(path, json.dumps(result, indent=1) + "\n")
    md = [f"# `vllm-k2 bench mla` on {result['device']}", "", f"Command: `{command}`", f"Date: {result['date']}", ""]
    md += [__doc__.split("\n\n", 1)[1].strip(), "", table(result), ""]
    if result.get("previous_run"):
        md += [
            f"Against the previous run ({result['previous_run']['date']}): largest row deviation "
            f"{100 * result['previous_run']['max_deviation']:.1f} % (kernel or graph µs).",
            "",
        ]
    if batch1_breakdown(result):
        md += ["## Batch 1 × 8 heads × 32k", ""] + batch1_breakdown(result) + [""]
    if result["variant_sweep"]:
        md += [
            "## Variant sweep (kernel-only µs on the probes "
            + ", ".join(f"b{b}×h{h}×{c}×q{q}" for b, c, h, q in VARIANT_PROBES)
            + ")",
            "",
            "| KV | warps/BLOCK_N/stages | probes (µs) | geomean |",
            "|---|---|---|---:|",
        ]
        md += [
            f"| {v['kv']} | {'/'.join(map(str, v['variant']))} | {', '.join(f'{t:.1f}' for t in v['kernel_us'])} | "
            f"{v['geomean']:.1f} |"
            for v in result["variant_sweep"]
        ]
        md += ["", f"Preference after the sweep (kept unless beaten by {PICK_MARGIN:.0%}): {result['preference']}", ""]
    if result.get("split_sweep"):
        md += ["## Split-count sweep (kernel-only µs; **bold** = the launcher's pick)", ""]
        for rec in result["split_sweep"]:
            best = min(rec["kernel_us"].values())
            cells = ", ".join(
                (f"**{s}: {t:.1f}**" if int(s) == rec["pick"] else f"{s}: {t:.1f}") for s, t in rec["kernel_us"].items()
            )
            md.append(
                f"- b{rec['batch']}×h{rec['heads']}×{rec['context']}×q{rec['q_len']} {rec['kv']}: pick/best "
                f"{rec['kernel_us'][str(rec['pick'])] / best:.3f}; {cells}"
            )
        md.append("")
    if result["users_model"]:
        md += [
            f"## Model: K2.5 decode attention per token on one {RTX_PRO_6000['name']} "
            f"({RTX_PRO_6000['hbm_gbps']:.0f} GB/s vendor), {K25['context']:,} context, {K25['layers']} layers, "
            f"{K25['heads_per_gpu']} heads per GPU",
            "",
            "Assumptions: the streaming read reaches the same share of vendor bandwidth there as here, and our "
            "kernel the same fraction of the streaming read as in the batch 1 x 8 heads row named.",
            "",
            "| KV | from row (ctx, of roofline) | streaming read / vendor BW | bytes per token | per layer µs "
            "| per token ms |",
            "|---|---|---:|---:|---:|---:|",
        ]
        md += [
            f"| {m['kv']} | {m['from_row']['context']}, {100 * m['from_row']['of_roofline']:.0f} % | "
            f"{100 * m['streaming_share_of_vendor_bw']:.0f} % | {m['bytes_per_token'] / 1e9:.2f} GB | "
            f"{m['per_layer_us']:.1f} | {m['per_token_ms']:.2f} |"
            for m in result["users_model"]
        ]
    write_text(os.path.splitext(path)[0] + ".md", "\n".join(md) + "\n")


def main(args) -> int:
    def ints(s):
        return tuple(int(x) for x in s.split(","))

    result = run(
        batches=ints(args.batch),
        contexts=ints(args.context),
        heads=ints(args.heads),
        q_lens=ints(args.q_len),
        kv_dtypes=tuple(args.kv.split(",")),
        stock=not args.no_stock,
        variants=args.pick_variant,
        runs=args.runs,
        splits=args.split_sweep,
    )
    if args.compare:
        with open(args.compare) as f:
            compare(result, json.load(f))
    if args.out:
        import shlex
        import sys

        write(result, args.out, "vllm-k2 " + " ".join(shlex.quote(a) for a in sys.argv[1:]))
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(table(result))
    return 0
