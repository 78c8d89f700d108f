"""Probe launch variants of the MLA split kernel beside the launcher's choice (row tiles
of 16/32, the 512 latent columns as one dot or four 128-wide ones (D_SPLIT), bf16 split
partials), on the H200, kernel-only µs (profiler, L2 flushed),
each at a ladder of split counts; the best count is reported per variant. Every
variant's output is compared with the launcher's own (relative L2 difference).
``--ncu`` runs Nsight Compute on the launcher's choice at NCU_CASES (occupancy, stall
reasons, DRAM throughput); ``--ncu-source DIR`` samples warp stalls per SASS instruction of
each case and ranks instructions and opcodes by where warps wait. Each writes its raw output
and a Markdown report itself.

    python3 benchmarks/mla_tile_probe.py --out benchmarks/results/mla_tile_probe_h200_dsplit.json
    python3 benchmarks/mla_tile_probe.py --ncu benchmarks/results/mla_tile_probe_h200_ncu.txt
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

NCU_SECTIONS = (
    "SpeedOfLight",
    "Occupancy",
    "LaunchStats",
    "WarpStateStats",
    "SchedulerStats",
    "MemoryWorkloadAnalysis",
)

VARIANTS = {  # (block_m, warps, block_n, stages, d_split): the launcher's own first, then D_SPLIT forms
    "bf16": [
        (16, 4, 32, 5, False),
        (16, 4, 32, 5, True),
        (16, 8, 64, 2, False),
        (16, 8, 64, 2, True),
        (16, 4, 32, 2, True),
        (16, 8, 32, 5, True),
        (32, 8, 32, 2, False),
        (32, 8, 32, 2, True),
    ],
    "fp8": [
        (16, 8, 64, 2, False),
        (16, 8, 64, 2, True),
        (16, 8, 32, 5, True),
        (16, 4, 32, 5, True),
        (32, 8, 32, 2, False),
        (32, 8, 32, 2, True),
    ],
}
PROBES = (  # (batch, context, heads, q_len)
    (1, 8192, 8, 1),
    (1, 32768, 8, 1),
    (1, 131072, 8, 1),
    (8, 32768, 8, 1),
    (64, 8192, 8, 1),
    (1, 8192, 8, 4),
    (1, 32768, 8, 4),
    (1, 131072, 8, 4),
    (8, 8192, 8, 4),
    (8, 32768, 8, 4),
    (8, 131072, 8, 4),
    (64, 8192, 8, 4),
    (1, 32768, 64, 1),
    (64, 8192, 64, 1),
    (1, 32768, 64, 4),
    (64, 8192, 64, 4),
)
#: rows of 8 heads x q_len 1 fit one 16-row tile only; there the probe is bf16 partials
PARTIAL_PROBES = ((1, 8192, 8, 1), (1, 32768, 8, 1), (1, 131072, 8, 1), (8, 32768, 8, 1))
#: (batch, context, heads, q_len, KV) launched once each with the launcher's own choice
NCU_CASES = (
    (1, 32768, 8, 1, "bf16"),
    (1, 32768, 8, 1, "fp8"),
    (8, 32768, 8, 1, "bf16"),
    (8, 32768, 8, 4, "bf16"),
    (64, 8192, 8, 1, "bf16"),
)


def ladder(batch: int, row_blocks: int, ctx: int) -> list[int]:
    programs = batch * row_blocks
    cands = [s for s in (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256) if s * programs <= 1056 and s <= ctx // 256]
    return cands or [1]


def main() -> int:
    import torch

    from vllm_k2_plugin.mla import configs, launcher
    from vllm_k2_tools.mla_bench import bench

    p = argparse.ArgumentParser()
    p.add_argument("--out", help="raw JSON of the probe; the Markdown report is written beside it")
    p.add_argument("--ncu", metavar="TXT", help="run Nsight Compute on NCU_CASES, write its report here")
    p.add_argument("--ncu-cases", action="store_true", help="only launch NCU_CASES (what --ncu profiles)")
    p.add_argument(
        "--ncu-stalls",
        action="store_true",
        help="with --ncu: stall reasons, issue activity, resident warps (not its sections)",
    )
    p.add_argument(
        "--ncu-source",
        metavar="DIR",
        help="per NCU_CASES case: SASS with warp-stall samples (CSV) and a ranking (source.md)",
    )
    p.add_argument("--kv", choices=sorted(VARIANTS), action="append", help="only these KV dtypes (default: all)")
    p.add_argument("--probes", help="only these probes: 'batch,context,heads,q_len;...' (default: PROBES)")
    p.add_argument("--no-partials", action="store_true", help="skip the split-partials comparison")
    p.add_argument(
        "--variant",
        action="append",
        metavar="KV:M,W,N,S[,D_SPLIT]",
        help="probe these variants of KV (bf16|fp8) instead of VARIANTS' (flags as 0/1); "
        "the launcher's own variant is always probed first",
    )
    args = p.parse_args()
    if args.ncu_source:
        return ncu_source(args.ncu_source)
    if args.ncu:
        return ncu(args.ncu, args.ncu_stalls)
    if not args.ncu_cases and not args.out:
        p.error("--out, --ncu or --ncu-cases is required")
    variants_by_kv = dict(VARIANTS)
    if args.variant:
        variants_by_kv = {}
        for text in args.variant:
            kv, _, nums = text.partition(":")
            v = [int(x) for x in nums.split(",")]
            if kv not in VARIANTS or len(v) not in (4, 5):
                p.error(f"--variant {text!r}: expected bf16|fp8:M,W,N,S[,D_SPLIT]")
            variants_by_kv.setdefault(kv, [VARIANTS[kv][0]]).append(tuple(v[:4]) + tuple(bool(x) for x in v[4:]))
    dev = torch.device("cuda")
    timer = bench.Timer(torch, reps=11)
    n_pages = -(-64 * 32768 // bench.PAGE)
    g = torch.Generator(device=dev).manual_seed(0)
    pool = torch.randn(n_pages, bench.PAGE, 576, generator=g, device=dev).to(torch.bfloat16)
    pools = {"bf16": pool, "fp8": (pool.float() * 4).to(torch.float8_e4m3fn)}
    k_scale = torch.tensor([0.25], device=dev)
    limits = launcher.device_limits(0)
    if args.ncu_cases:
        for batch, ctx, heads, ql, kv in NCU_CASES:
            q, bt, sl, _ = bench._case(torch, dev, g, n_pages, batch, ctx, heads, ql)
            launcher.mla_decode(
                q, pools[kv], bt, sl, bench.SM_SCALE, q_len=ql, k_scale=k_scale if kv == "fp8" else None
            )
            torch.cuda.synchronize()
            print("case", batch, ctx, heads, ql, kv, launcher.plan(batch, heads, ql, ctx, 16, kv == "fp8", limits))
        return 0
    probes = [tuple(int(x) for x in p.split(",")) for p in args.probes.split(";")] if args.probes else PROBES
    records = []
    t0 = time.time()
    for batch, ctx, heads, ql in probes:
        q, bt, sl, _ = bench._case(torch, dev, g, n_pages, batch, ctx, heads, ql)
        for kv, variants in variants_by_kv.items():
            if args.kv and kv not in args.kv:
                continue
            fp8 = kv == "fp8"
            ks = k_scale if fp8 else None
            ref, _ = launcher.mla_decode(q, pools[kv], bt, sl, bench.SM_SCALE, q_len=ql, k_scale=ks)
            chosen = launcher.plan(batch, heads, ql, ctx, bench.PAGE, fp8, limits)
            for variant in variants:
                bm, w, bn, st = variant[:4]
                cfg = configs.SplitConfig(bench.PAGE, bm, bn, w, st, fp8, *variant[4:])
                is_pick = cfg == chosen.split
                rb = configs.row_blocks(heads * ql, bm)
                times, diff = {}, None
                for s in sorted(set(ladder(batch, rb, ctx)) | ({chosen.num_splits} if is_pick else set())):
                    ws = launcher.Workspace(dev)

                    def fn(s=s, cfg=cfg, ws=ws, kv=kv, ks=ks, q=q, bt=bt, sl=sl, ql=ql):
                        return launcher.mla_decode(
                            q,
                            pools[kv],
                            bt,
                            sl,
                            bench.SM_SCALE,
                            q_len=ql,
                            k_scale=ks,
                            num_splits=s,
                            config=cfg,
                            workspace=ws,
                        )

                    try:
                        out, _ = fn()
                        d = float(((out.float() - ref.float()).norm() / ref.float().norm()).item())
                        diff = d if diff is None else max(diff, d)
                        times[s] = sum(timer.kernel_us(fn).values())
                    except Exception as e:  # noqa: BLE001 - a variant that does not compile is a finding
                        times[s] = repr(e)[:120]
                num = {s: t for s, t in times.items() if isinstance(t, float)}
                best = min(num, key=num.get) if num else None
                rec = dict(
                    batch=batch,
                    context=ctx,
                    heads=heads,
                    q_len=ql,
                    kv=kv,
                    variant=list(variant),
                    launcher_variant=is_pick,
                    launcher_splits=chosen.num_splits if is_pick else None,
                    best_splits=best,
                    best_us=num.get(best),
                    max_rel_diff=diff,
                    kernel_us=times,
                )
                records.append(rec)
                print(json.dumps(rec), flush=True)
    for batch, ctx, heads, ql in () if args.no_partials else PARTIAL_PROBES:
        q, bt, sl, _ = bench._case(torch, dev, g, n_pages, batch, ctx, heads, ql)
        for kv in args.kv or ("bf16", "fp8"):
            ks = k_scale if kv == "fp8" else None
            ref, _ = launcher.mla_decode(q, pools[kv], bt, sl, bench.SM_SCALE, q_len=ql, k_scale=ks)
            pick = launcher.plan(batch, heads, ql, ctx, bench.PAGE, kv == "fp8", limits).num_splits
            for ws_dtype in (torch.float32, torch.bfloat16):
                ws = launcher.Workspace(dev, batch * ql * heads * pick)
                ws.out = ws.out.to(ws_dtype)

                def fn(ws=ws, kv=kv, ks=ks, q=q, bt=bt, sl=sl, ql=ql):
                    return launcher.mla_decode(q, pools[kv], bt, sl, bench.SM_SCALE, q_len=ql, k_scale=ks, workspace=ws)

                out, _ = fn()
                d = float(((out.float() - ref.float()).norm() / ref.float().norm()).item())
                k = timer.kernel_us(fn)
                rec = dict(
                    batch=batch,
                    context=ctx,
                    heads=heads,
                    q_len=ql,
                    kv=kv,
                    partials=str(ws_dtype),
                    splits=pick,
                    kernel_us=k,
                    graph_us=timer.graph_us(fn),
                    max_rel_diff=d,
                )
                records.append(rec)
                print(json.dumps(rec), flush=True)
    result = {
        "date": _now(),
        "command": _command(),
        "wall_s": time.time() - t0,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": _triton_version(),
        "records": records,
    }
    write_report(result, args.out)
    print("wall", time.time() - t0)
    return 0


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def _command() -> str:
    return "python3 " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__)] + sys.argv[1:])


def _triton_version() -> str:
    import triton

    return triton.__version__


def _variant(v) -> str:
    # pf / ca: the PREFETCH and CVT_ASM switches of commit c95ace6 (its committed probe results)
    flags = [name for name, on in zip(("d4", "pf", "ca"), v[4:], strict=False) if on]
    return "/".join(["m{}/w{}/n{}/s{}".format(*v[:4]), *flags])


def write_report(result: dict, path: str) -> None:
    """The raw JSON and, beside it, per probe the variants' best kernel-only µs against the
    launcher's choice, then the split-partials comparison."""
    from vllm_k2_plugin.fileio import write_text

    write_text(path, json.dumps(result, indent=1) + "\n")
    md = [
        f"# MLA split-kernel tile probe on {result['device']}",
        "",
        f"Command: `{result['command']}`",
        f"Date: {result['date']} (torch {result['torch']}, triton {result['triton']})",
        "",
        __doc__.split("\n\n")[0].replace("\n", " "),
        "",
        "Per probe (batch × heads × context × q_len, KV dtype): each variant's best kernel-only µs over its "
        "split ladder (best split count), its ratio to what the launcher runs (its variant at its split "
        "count; < 1: faster), and its largest relative L2 difference from the launcher's output.",
        "",
        "| probe | KV | variant (m/w/n/s; d4: D_SPLIT, pf: PREFETCH, ca: CVT_ASM) | launcher's | best splits "
        "| best µs | / launcher's "
        "| rel. diff |",
        "|---|---|---|---|---:|---:|---:|---:|",
    ]
    tiles = [r for r in result["records"] if "variant" in r]
    for r in tiles:
        base = next((_launcher_us(x) for x in tiles if x["launcher_variant"] and _same_probe(x, r)), None)
        ratio = f"{r['best_us'] / base:.2f}" if base and r["best_us"] else "n/a"
        md.append(
            f"| b{r['batch']}×h{r['heads']}×{r['context']}×q{r['q_len']} | {r['kv']} | {_variant(r['variant'])} | "
            f"{'yes (' + str(r['launcher_splits']) + ' splits)' if r['launcher_variant'] else ''} | "
            f"{r['best_splits'] if r['best_splits'] is not None else 'failed'} | "
            f"{r['best_us']:.1f} | {ratio} | {r['max_rel_diff']:.1e} |"
            if r["best_us"] is not None
            else f"| b{r['batch']}×h{r['heads']}×{r['context']}×q{r['q_len']} | {r['kv']} | "
            f"{_variant(r['variant'])} | | failed: {next(iter(r['kernel_us'].values()))} | | | |"
        )
    parts = [r for r in result["records"] if "partials" in r]
    if parts:
        md += [
            "",
            "## Split partials in fp32 vs bf16 (launcher's variant and split count)",
            "",
            "| probe | KV | partials | splits | kernel µs (per kernel) | graph µs | rel. diff |",
            "|---|---|---|---:|---|---:|---:|",
        ]
        md += [
            f"| b{r['batch']}×h{r['heads']}×{r['context']}×q{r['q_len']} | {r['kv']} | {r['partials']} | "
            f"{r['splits']} | {', '.join(f'{k} {v:.1f}' for k, v in r['kernel_us'].items())} | {r['graph_us']:.1f} | "
            f"{r['max_rel_diff']:.1e} |"
            for r in parts
        ]
    write_text(os.path.splitext(path)[0] + ".md", "\n".join(md) + "\n")


def _launcher_us(rec: dict) -> float | None:
    """The launcher's variant at the launcher's split count (JSON keys are strings)."""
    us = rec["kernel_us"].get(rec["launcher_splits"], rec["kernel_us"].get(str(rec["launcher_splits"])))
    return us if isinstance(us, float) else None


def _same_probe(a: dict, b: dict) -> bool:
    return all(a[k] == b[k] for k in ("batch", "context", "heads", "q_len", "kv"))


NCU_STALL_METRICS = (
    r"regex:smsp__warp_issue_stalled_.*_per_warp_active\.pct",  # share of a warp's cycles, by stall reason
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "sm__warps_active.avg.per_cycle_active",
    "smsp__inst_executed.sum",
    "dram__bytes_read.sum",
    "gpu__time_duration.sum",
)


def ncu(path: str, stalls: bool = False) -> int:
    """Nsight Compute over NCU_CASES (one split-kernel launch each): NCU_SECTIONS, or with
    ``stalls`` NCU_STALL_METRICS; its text report is written atomically under a header
    with the command and date."""
    from vllm_k2_plugin.fileio import write_text

    exe = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    if not os.path.exists(exe):
        raise SystemExit(f"--ncu: Nsight Compute ('ncu') not found on PATH or at {exe}")
    cmd = [exe, "--clock-control", "none", "-k", "regex:mla_decode_split", "--launch-skip", "0"]
    cmd += ["--metrics", ",".join(NCU_STALL_METRICS)] if stalls else [a for s in NCU_SECTIONS for a in ("--section", s)]
    cmd += [sys.executable, os.path.abspath(__file__), "--ncu-cases"]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode:
        raise SystemExit(f"--ncu: {shlex.join(cmd)} exited {run.returncode}:\n{run.stdout[-4000:]}{run.stderr[-4000:]}")
    header = f"# Command: {_command()}\n# Runs: {shlex.join(cmd)}\n# Date: {_now()}\n\n"
    write_text(path, header + run.stdout)
    return 0


def ncu_source(out_dir: str) -> int:
    """Warp-stall samples per SASS instruction of the split kernel, one NCU_CASES case per
    profile (``--launch-skip i``): each case's SASS CSV as ncu prints it, and ``source.md``
    ranking instructions and opcodes by their share of the case's stall samples."""
    import csv
    import io

    from vllm_k2_plugin.fileio import write_text

    exe = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    if not os.path.exists(exe):
        raise SystemExit(f"--ncu-source: Nsight Compute ('ncu') not found on PATH or at {exe}")
    os.makedirs(out_dir, exist_ok=True)
    lines = [
        "# Warp-stall samples per SASS instruction of `mla_decode_split`",
        "",
        f"Command: `{_command()}`",
        f"Date: {_now()}",
        "",
    ]
    for i, case in enumerate(NCU_CASES):
        rep = os.path.join(out_dir, f"case{i}")
        prof = [
            exe,
            "--clock-control",
            "none",
            "-k",
            "regex:mla_decode_split",
            "--launch-skip",
            str(i),
            "--launch-count",
            "1",
            "--section",
            "SourceCounters",
            "--section",
            "WarpStateStats",
            "-f",
            "-o",
            rep,
            sys.executable,
            os.path.abspath(__file__),
            "--ncu-cases",
        ]
        run = subprocess.run(prof, capture_output=True, text=True)
        if run.returncode:
            raise SystemExit(
                f"--ncu-source: {shlex.join(prof)} exited {run.returncode}:\n{run.stdout[-4000:]}{run.stderr[-4000:]}"
            )
        show = [exe, "-i", rep + ".ncu-rep", "--page", "source", "--csv", "--print-source", "sass"]
        run = subprocess.run(show, capture_output=True, text=True)
        if run.returncode:
            raise SystemExit(
                f"--ncu-source: {shlex.join(show)} exited {run.returncode}:\n{run.stdout[-4000:]}{run.stderr[-4000:]}"
            )
        os.remove(rep + ".ncu-rep")
        write_text(os.path.join(out_dir, f"case{i}_sass.csv"), run.stdout)
        header = run.stdout.find('"Address"')
        if header < 0:
            raise SystemExit(f'--ncu-source: case {i}: {shlex.join(show)} printed no SASS table (no "Address" header)')
        rows = list(csv.DictReader(io.StringIO(run.stdout[header:])))
        lines += [f"## case {i}: batch, context, heads, q_len, KV = {case}", ""]
        lines += _rank_stalls(rows)
    write_text(os.path.join(out_dir, "source.md"), "\n".join(lines) + "\n")
    return 0


def _rank_stalls(rows: list[dict]) -> list[str]:
    """Stall samples by region (before, inside, after the KV loop: the most executed
    backward branch), by opcode inside the loop with its top stall reasons, and the top
    instructions; columns are found by name (ncu versions differ in the rest)."""
    if not rows:
        return ["(ncu printed no SASS rows)", ""]
    cols = [c for c in rows[0] if c]  # each line ends in a comma: one unnamed column
    samples = next((c for c in cols if c.startswith("Warp Stall Sampling (All")), None)
    if samples is None:
        return [f"(no 'Warp Stall Sampling (All ...)' column; columns: {cols})", ""]
    reasons = [c for c in cols if c.startswith("stall_") and "Not Issued" not in c]

    def num(v: str | None) -> float:
        try:
            return float((v or "").replace(",", ""))
        except ValueError:
            return 0.0

    def opcode(r: dict) -> str:
        words = r.get("Source", "").split()
        words = words[1:] if words and words[0].startswith("@") else words  # predicated
        return words[0].split(".")[0] if words else "?"

    def top_reasons(rs: list[dict], n: int = 3) -> str:
        by = {c[len("stall_") :]: sum(num(r.get(c)) for r in rs) for c in reasons}
        return ", ".join(f"{k} {v:.0f}" for k, v in sorted(by.items(), key=lambda kv: -kv[1])[:n] if v)

    total = sum(num(r[samples]) for r in rows) or 1.0
    addr = [int(r.get("Address", "0"), 16) for r in rows]
    back = [
        (num(r.get("Instructions Executed")), i)
        for i, r in enumerate(rows)
        if opcode(r) == "BRA"
        and r["Source"].split()[-1].startswith("0x")
        and int(r["Source"].split()[-1], 16) < addr[i]
    ]
    out = [f"{len(rows)} SASS instructions, {total:.0f} stall samples", ""]
    if back:
        end = max(back)[1]
        start = addr.index(int(rows[end]["Source"].split()[-1], 16))
        regions = (("before the loop", rows[:start]), ("KV loop", rows[start : end + 1]), ("after", rows[end + 1 :]))
        out += ["| region | instructions | share | top stall reasons (samples) |", "|---|---:|---:|---|"]
        out += [
            f"| {name} | {len(rs)} | {sum(num(r[samples]) for r in rs) / total:.1%} | {top_reasons(rs)} |"
            for name, rs in regions
        ]
        ops: dict[str, list[dict]] = {}
        for r in regions[1][1]:
            ops.setdefault(opcode(r), []).append(r)
        ranked = sorted(ops.items(), key=lambda kv: -sum(num(r[samples]) for r in kv[1]))[:12]
        out += [
            "",
            "KV loop by opcode:",
            "",
            "| opcode | in loop | share of all | top stall reasons |",
            "|---|---:|---:|---|",
        ]
        out += [
            f"| {op} | {len(rs)} | {sum(num(r[samples]) for r in rs) / total:.1%} | {top_reasons(rs)} |"
            for op, rs in ranked
        ]
    out += ["", "| address | instruction | share | top stall reasons |", "|---|---|---:|---|"]
    for r in sorted(rows, key=lambda r: -num(r[samples]))[:20]:
        out.append(
            f"| {r.get('Address', '')} | `{r.get('Source', '').strip()}` | {num(r[samples]) / total:.1%} "
            f"| {top_reasons([r], 2)} |"
        )
    return out + [""]


if __name__ == "__main__":
    raise SystemExit(main())
