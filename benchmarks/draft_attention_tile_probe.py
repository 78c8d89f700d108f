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


def _decode_tile(stock, tile: int):
    """vLLM's tile choice with the decode (3D kernel) tile set to ``tile``."""

    def get_tile_size(head_size, sliding_window, element_size, is_prefill):
        return stock(head_size, sliding_window, element_size, is_prefill) if is_prefill else tile

    return get_tile_size


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--contexts", default=",".join(map(str, CONTEXTS)))
    ap.add_argument("--report", help="results folder to render (no GPU)")
    args = ap.parse_args(argv)
    if args.report:
        return report(args.report)
    if not args.out:
        ap.error("--out is required unless --report is given")

    import torch
    import triton
    import vllm

    from vllm_k2_plugin.mla.bench import Timer

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
        for rows in (1, 4):
            segs_ok = [s for s in SEGMENTS if s == 16 or rows * HEADS_KV * s <= sms]
            kv, q, seq, bt, cu = _inputs(torch, rows, ctx, gen)
            ref = _reference(torch, kv, q, seq, bt, scale)
            kc, vc = kv.unbind(1)
            ones = torch.ones(1, dtype=torch.float32, device="cuda").expand(rows, HEADS_KV)
            for tile in TILES:
                ua._get_tile_size = _decode_tile(stock_tile, tile)
                for segs in segs_ok:
                    out = torch.empty_like(q)
                    scratch = (
                        torch.empty(rows, HEADS_Q, segs, HEAD, dtype=torch.float32, device="cuda"),
                        torch.empty(rows, HEADS_Q, segs, dtype=torch.float32, device="cuda"),
                        torch.empty(rows, HEADS_Q, segs, dtype=torch.float32, device="cuda"),
                    )
                    kw = dict(
                        q=q, k=kc, v=vc, out=out, cu_seqlens_q=cu, max_seqlen_q=1, seqused_k=seq,
                        max_seqlen_k=ctx, softmax_scale=scale, causal=True, window_size=(-1, -1),
                        block_table=bt, softcap=0.0, q_descale=None, k_descale=ones, v_descale=ones,
                        seq_threshold_3D=16, num_par_softmax_segments=segs, softmax_segm_output=scratch[0],
                        softmax_segm_max=scratch[1], softmax_segm_expsum=scratch[2],
                    )  # fmt: skip
                    kw = {k: v for k, v in kw.items() if k in accepted}
                    run = lambda kw=kw: ua.unified_attention(**kw)  # noqa: E731
                    try:
                        run()
                        torch.cuda.synchronize()
                        err = float((out.float() - ref).norm() / ref.norm())
                        times = timer.kernel_us(run)
                    except Exception as e:  # noqa: BLE001 - a config the kernel refuses: recorded
                        rows_out.append({"ctx": ctx, "rows": rows, "tile": tile, "segments": segs,
                                         "error": f"{type(e).__name__}: {str(e)[:200]}"})  # fmt: skip
                        print("ERR", ctx, rows, tile, segs, e, flush=True)
                        continue
                    us = sum(v for k, v in times.items())
                    mb = 2 * ctx * HEADS_KV * HEAD * 2 / 1e6
                    rec = {"ctx": ctx, "rows": rows, "tile": tile, "segments": segs, "us": round(us, 2),
                           "kernels": {k: round(v, 2) for k, v in times.items()}, "rel_err": err,
                           "tb_s": round(mb / us, 3)}  # fmt: skip
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


def report(folder: str) -> int:
    """README.md of a results folder: the probe's table per context and rows, and the engine cases."""
    import glob

    d = json.load(open(os.path.join(folder, "dattn_tile_probe.json")))
    L = [
        "# TRITON_ATTN's split-KV decode by tile size at a K2.5 drafter's TP-8 shape (H200)",
        "",
        f"Written by `python3 benchmarks/draft_attention_tile_probe.py --report {folder}` from "
        f"`dattn_tile_probe.json` (written on the device by `{d['command']}`, {d['date']}; vLLM {d['vllm']}, "
        f"{d['engine_route']}, torch {d['torch']}, Triton {d['triton']}, {d['gpu']}).",
        "",
        f"{d['what']}. vLLM's own `unified_attention` (3D kernel + its reduce), the decode tile overridden, "
        "kernel-only us (torch.profiler, median of 15, L2 flushed between calls); 1 row = a chained draft pass, "
        "4 rows = the first pass as decode rows of one request (patch draft-prefill-as-decode). vLLM's choice: "
        "tile 16; 16 segments stock, more with patch draft-attention-segments. Every output within the stated "
        "relative L2 difference of a float32 reference. TB/s = the context's K and V bytes / time.",
        "",
        "| context | rows | tile | segments | us | TB/s | rel. L2 vs float32 |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in d["rows"]:
        if "error" in r:
            L.append(f"| {r['ctx']} | {r['rows']} | {r['tile']} | {r['segments']} | {r['error']} | | |")
        else:
            L.append(f"| {r['ctx']} | {r['rows']} | {r['tile']} | {r['segments']} | {r['us']} | {r['tb_s']} | "
                     f"{r['rel_err']:.1e} |")  # fmt: skip
    runs = {}
    for p in sorted(glob.glob(os.path.join(folder, "raw", "*.json"))):
        r = json.load(open(p))
        runs[r["case"]["name"]] = r
    if runs:
        dates = sorted(r["date"] for r in runs.values())
        plain = next(r for n, r in runs.items() if n.endswith("-plain"))
        L += [
            "",
            f"## In the engine: 24-layer K2.5 slice, every patch, one device call ({dates[0]} .. {dates[-1]})",
            "",
            f"vLLM {plain['vllm']} ({plain['engine_route']}); ms per engine step as in gpu_engine_e2e.py (`steps`); "
            "dummy weights, so every EAGLE-3 step verifies 3 drafts and drafts 3. Raw files in `raw/`.",
            "",
            "| case | draft-attention-tile | "
            + " | ".join(f"{int(c) // 1024}k ms (/ plain)" for c in plain["contexts"])
            + " |",
            "|---|---|" + "---:|" * len(plain["contexts"]),
        ]  # fmt: skip
        for n, r in runs.items():
            ms = {c: r["contexts"][c]["step_ms"] for c in plain["contexts"]}
            cells = [f"{ms[c]} ({ms[c] / plain['contexts'][c]['step_ms']:.3f})" for c in plain["contexts"]]
            L.append(f"| {n} | {r['patches'].get('draft-attention-tile')} | " + " | ".join(cells) + " |")
        logs = [x for r in runs.values() for x in r.get("log_lines", []) if "draft-attention-tile:" in x]
        if logs:
            L += ["", "The start-up measurement's log line: `" + logs[0].split("vllm-k2: ", 1)[-1] + "`"]
    from vllm_k2_plugin import fileio

    fileio.write_text(os.path.join(folder, "README.md"), "\n".join(L) + "\n")
    print("\n".join(L))
    return 0


if __name__ == "__main__":
    sys.exit(main())
