"""vLLM's TRITON_ATTN split-KV (3D) decode kernel at a K2.5 drafter's TP-8 shape, by tile size
and segment count: where its time goes at long contexts (issue 37 item 4).

Profiled inside an engine (0.16 route C, 24-layer slice, 128k), the drafter's attention took
3 x 176 us per EAGLE-3 step for 67 MB a call (~0.4 TB/s). vLLM decodes with 16-key tiles
(``_get_tile_size``: 16 for 16-bit KV) and the default pipeline; this probe runs vLLM's own
``unified_attention`` with the tile size overridden (16 / 32 / 64 / 128) and the segment count of
the 3D grid set (16 = stock, up to what fills the SMs: patch draft-attention-segments), for a
chained draft pass (1 row) and the first pass as decode rows (4 rows of one request, causal
limits S-3..S: patch draft-prefill-as-decode), and compares every output with a float32
reference. Kernel-only us (torch.profiler, L2 flushed between calls), 3D kernel + its reduce.

    python3 benchmarks/draft_attention_tile_probe.py --out $OUT/dattn_tile_probe.json
    python3 benchmarks/draft_attention_tile_probe.py --report benchmarks/results/draft_attention_tile_h200

``--report DIR`` writes DIR/README.md from DIR/dattn_tile_probe.json and, where present, the
engine cases in DIR/raw/ (suite dg24tile of gpu_engine_e2e.py: the 24-layer slice with every
patch, EAGLE-3 with and without patch draft-attention-tile, one device call).
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import os
import sys

HEADS_Q, HEADS_KV, HEAD, PAGE = 8, 1, 128, 16
CONTEXTS = (4096, 32768, 131072)
TILES = (16, 32, 64, 128)
SEGMENTS = (16, 32, 64, 128)


def _inputs(torch, rows: int, ctx: int, gen):
    pages = ctx // PAGE + 1
    kv = torch.randn(pages, 2, PAGE, HEADS_KV, HEAD, generator=gen, device="cuda").to(torch.bfloat16)
    perm = torch.randperm(pages, generator=gen, device="cuda").to(torch.int32)
    q = torch.randn(rows, HEADS_Q, HEAD, generator=gen, device="cuda").to(torch.bfloat16)
    # rows of one request: row i sees the first ctx - (rows - 1 - i) keys (the verify tokens' causal limits)
    seq = torch.tensor([ctx - (rows - 1 - i) for i in range(rows)], dtype=torch.int32, device="cuda")
    bt = perm[None, :].expand(rows, -1).contiguous()
    cu = torch.arange(rows + 1, dtype=torch.int32, device="cuda")
    return kv, q, seq, bt, cu


def _reference(torch, kv, q, seq, bt, scale):
    out = []
    for i in range(q.shape[0]):
        n = int(seq[i])
        ids = bt[i, : (n + PAGE - 1) // PAGE].long()
        k = kv[ids, 0].reshape(-1, HEADS_KV, HEAD)[:n, 0].float()
        v = kv[ids, 1].reshape(-1, HEADS_KV, HEAD)[:n, 0].float()
        p = torch.softmax(q[i].float() @ k.T * scale, dim=-1)
        out.append(p @ v)
    return torch.stack(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--contexts", default=",".join(map(str, CONTEXTS)))
    ap.add_argument("--tiles", default=",".join(map(str, TILES)))
    ap.add_argument("--rows", default="1,4")
    ap.add_argument("--waves", type=int, default=1, help="segments up to this many waves of the SMs (several rows)")
    ap.add_argument("--report", help="results folder to render (no GPU)")
    args = ap.parse_args(argv)
    if args.report:
        return report(args.report)
    if not args.out:
        ap.error("--out is required unless --report is given")

    import torch
    import triton
    import vllm

    from vllm_k2_plugin.draft_attention.tile import fixed_decode_tile
    from vllm_k2_tools.mla_bench.bench import Timer

    try:
        from vllm.v1.attention.ops import triton_unified_attention as ua
    except ImportError:
        from vllm.attention.ops import triton_unified_attention as ua
    accepted = set(inspect.signature(ua.unified_attention).parameters)
    stock_tile = ua._get_tile_size

    timer = Timer(torch, reps=15)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    gen = torch.Generator(device="cuda").manual_seed(0)
    scale = HEAD**-0.5
    rows_out = []
    for ctx in map(int, args.contexts.split(",")):
        for rows in map(int, args.rows.split(",")):
            waves = args.waves if rows > 1 else 1  # scratch as vLLM sizes it: 16 rows x 16 segments
            segs_ok = [s for s in SEGMENTS if s == 16 or (rows * HEADS_KV * s <= sms * waves and rows * s <= 256)]
            kv, q, seq, bt, cu = _inputs(torch, rows, ctx, gen)
            ref = _reference(torch, kv, q, seq, bt, scale)
            kc, vc = kv.unbind(1)
            ones = torch.ones(1, dtype=torch.float32, device="cuda").expand(rows, HEADS_KV)
            for tile in map(int, args.tiles.split(",")):
                ua._get_tile_size = fixed_decode_tile(stock_tile, tile)
                for segs in segs_ok:
                    out = torch.empty_like(q)
                    scratch = (
                        torch.empty(rows, HEADS_Q, segs, HEAD, dtype=torch.float32, device="cuda"),
                        torch.empty(rows, HEADS_Q, segs, dtype=torch.float32, device="cuda"),
                        torch.empty(rows, HEADS_Q, segs, dtype=torch.float32, device="cuda"),
                    )
                    kw = dict(
                        q=q,
                        k=kc,
                        v=vc,
                        out=out,
                        cu_seqlens_q=cu,
                        max_seqlen_q=1,
                        seqused_k=seq,
                        max_seqlen_k=ctx,
                        softmax_scale=scale,
                        causal=True,
                        window_size=(-1, -1),
                        block_table=bt,
                        softcap=0.0,
                        q_descale=None,
                        k_descale=ones,
                        v_descale=ones,
                        seq_threshold_3D=16,
                        num_par_softmax_segments=segs,
                        softmax_segm_output=scratch[0],
                        softmax_segm_max=scratch[1],
                        softmax_segm_expsum=scratch[2],
                    )
                    kw = {k: v for k, v in kw.items() if k in accepted}
                    run = lambda kw=kw: ua.unified_attention(**kw)  # noqa: E731
                    try:
                        run()
                        torch.cuda.synchronize()
                        err = float((out.float() - ref).norm() / ref.norm())
                        times = timer.kernel_us(run)
                    except Exception as e:  # noqa: BLE001 - a config the kernel refuses: recorded
                        rows_out.append(
                            {
                                "ctx": ctx,
                                "rows": rows,
                                "tile": tile,
                                "segments": segs,
                                "error": f"{type(e).__name__}: {str(e)[:200]}",
                            }
                        )
                        print("ERR", ctx, rows, tile, segs, e, flush=True)
                        continue
                    us = sum(v for k, v in times.items())
                    mb = 2 * ctx * HEADS_KV * HEAD * 2 / 1e6
                    rec = {
                        "ctx": ctx,
                        "rows": rows,
                        "tile": tile,
                        "segments": segs,
                        "us": round(us, 2),
                        "kernels": {k: round(v, 2) for k, v in times.items()},
                        "rel_err": err,
                        "tb_s": round(mb / us, 3),
                    }
                    rows_out.append(rec)
                    print(json.dumps(rec), flush=True)
            ua._get_tile_size = stock_tile
    result = {
        "what": "vLLM TRITON_ATTN 3D decode kernel, K2.5 drafter TP-8 shape (8 q heads, 1 KV head, head 128, page 16)",
        "vllm": vllm.__version__,
        "engine_route": os.environ.get("E2E_ENGINE_ROUTE", "vLLM's own wheel"),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "gpu": torch.cuda.get_device_name(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]]),
        "rows": rows_out,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1)
    os.replace(tmp, args.out)
    return 0


def _probe_table(d: dict, name: str) -> list[str]:
    L = [
        f"## `{name}`: `{d['command']}`, {d['date']}",
        "",
        f"vLLM {d['vllm']} ({d['engine_route']}), torch {d['torch']}, Triton {d['triton']}, {d['gpu']}.",
        "",
        "| context | rows | tile | segments | us | TB/s | rel. L2 vs float32 |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in d["rows"]:
        if "error" in r:
            L.append(f"| {r['ctx']} | {r['rows']} | {r['tile']} | {r['segments']} | {r['error']} | | |")
        else:
            L.append(
                f"| {r['ctx']} | {r['rows']} | {r['tile']} | {r['segments']} | {r['us']} | {r['tb_s']} | "
                f"{r['rel_err']:.1e} |"
            )
    return L + [""]


#: bench-only patches whose state tells an engine case's configuration apart
CASE_PATCHES = ("draft-attention-tile", "bench-draft-segments-two-waves", "bench-draft-segments-one-wave")


def _tile_check(log_path: str) -> str:
    """What the engine's start-up check decided, from the case's own log (written by the run)."""
    import re

    if not os.path.exists(log_path):
        return "no log"
    for line in open(log_path, errors="replace"):
        m = re.search(r"draft-attention-tile: .*?: tile 128 ([\d.]+) us, vLLM's ([\d.]+) us, .*?: (.*)$", line)
        if m:
            used = "128" if "128 used" in m.group(3) else "vLLM's 16"
            return f"{used} ({m.group(1)} / {m.group(2)} µs)"
    return "no check"


def _call_table(call: str, runs: dict, folder: str) -> list[str]:
    dates = sorted(r["date"] for r in runs.values())
    plain = next(r for n, r in runs.items() if n.endswith("-plain"))
    L = [
        f"### Call {call} ({dates[0]} .. {dates[-1]}), vLLM {plain['vllm']} ({plain['engine_route']})",
        "",
        "| case | "
        + " | ".join(CASE_PATCHES)
        + " | decode tile used (check: ours / vLLM's) | "
        + " | ".join(f"{int(c) // 1024}k ms (/ plain)" for c in plain["contexts"])
        + " |",
        "|---|" + "---|" * (len(CASE_PATCHES) + 1) + "---:|" * len(plain["contexts"]),
    ]
    for n, r in runs.items():
        ms = {c: r["contexts"][c]["step_ms"] for c in plain["contexts"]}
        cells = [f"{ms[c]} ({ms[c] / plain['contexts'][c]['step_ms']:.3f})" for c in plain["contexts"]]
        states = [str(r["patches"].get(p, "absent")) for p in CASE_PATCHES]
        check = _tile_check(os.path.join(folder, "raw", call, f"{n}.log"))
        L.append(f"| {n} | " + " | ".join(states) + f" | {check} | " + " | ".join(cells) + " |")
    return L + [""]


def report(folder: str) -> int:
    """README.md of a results folder: each probe file's table, and the engine cases of each
    device call (raw/<call>/), ratios within a call only."""
    import glob

    L = [
        "# TRITON_ATTN's split-KV decode by tile size at a K2.5 drafter's TP-8 shape (H200)",
        "",
        f"Written by `python3 benchmarks/draft_attention_tile_probe.py --report {folder}` from the probe files "
        "(`dattn_tile_probe*.json`, each written on the device by the command it names) and the engine cases in "
        "`raw/` (one folder per device call, each file written by `gpu_engine_e2e.py case`).",
        "",
        "Probe: 8 query heads, 1 KV head, head 128, page 16 (a K2.5 drafter at TP 8). vLLM's own "
        "`unified_attention` (3D kernel + its reduce), the decode tile overridden, kernel-only us (torch.profiler, "
        "median of 15, L2 flushed between calls); 1 row = a chained draft pass, 4 rows = the first pass as decode "
        "rows of one request (patch draft-prefill-as-decode). vLLM's choice: tile 16; 16 segments stock, more with "
        "patch draft-attention-segments (4 rows x 64 segments = two waves of the H200's 132 SMs). Every output "
        "within the stated relative L2 difference of a float32 reference. TB/s = the context's K and V bytes / time.",
        "",
    ]
    for p in sorted(glob.glob(os.path.join(folder, "dattn_tile_probe*.json"))):
        L += _probe_table(json.load(open(p)), os.path.basename(p))
    calls: dict[str, dict] = {}
    for p in sorted(glob.glob(os.path.join(folder, "raw", "*", "*.json"))):
        r = json.load(open(p))
        calls.setdefault(os.path.basename(os.path.dirname(p)), {})[r["case"]["name"]] = r
    if calls:
        L += [
            "## In the engine: 24-layer K2.5 slice, every patch, own-head TP-8 drafter",
            "",
            "ms per engine step as in gpu_engine_e2e.py (`steps`); dummy weights, so every EAGLE-3 step verifies "
            "3 drafts and drafts 3; ratios to the plain step of the same call. In call 5, when one wave of the SMs "
            "was the default for the first pass's rows, `bench-draft-segments-two-waves` let them fill it twice; "
            "two waves are the default since (`bench-draft-segments-one-wave`, benchmarks/draft_segment_waves.py, "
            "now runs the old rule). 'decode tile used' is the start-up check's decision in that engine, read from "
            "the case's log (`raw/<call>/<case>.log`); in calls 4 and 5 the check timed eager calls (host launch "
            "cost included): in call 5 the one-wave case's check kept vLLM's 16-key tile, so call 5 compares tile 16 "
            "with one wave against tile 128 with two waves, not the waves alone. From call 6 on the check times "
            "CUDA-graph replays (its log line says so).",
            "",
        ]
        for call, runs in calls.items():
            L += _call_table(call, runs, folder)
    from vllm_k2_plugin import fileio

    fileio.write_text(os.path.join(folder, "README.md"), "\n".join(L) + "\n")
    print("\n".join(L))
    return 0


if __name__ == "__main__":
    sys.exit(main())
