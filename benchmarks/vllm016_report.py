"""Tables for vLLM 0.16 on the H200 (routes B and C) from the cases' raw JSON (suites v16tiny, v16deep,
v16prof, gguf of gpu_engine_e2e.py; each file written by the case that measured it, command and
date inside; one sub-folder of raw/ per device call) into OUT/README.md and OUT/summary.json.

    python benchmarks/vllm016_report.py benchmarks/results/vllm016_h200/raw --out benchmarks/results/vllm016_h200
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gpu_engine_e2e import CONTEXTS, compare_greedy, gpu_patches, graph_modes, tau  # noqa: E402

from vllm_k2_plugin import fileio  # noqa: E402

GREEDY = [
    ("v16-tiny-stock-graphs", "v16-tiny-ours-graphs", "our MLA backend (full decode graphs) vs stock 0.16"),
    ("v16-tiny-stock-graphs", "v16-tiny-ours-fault-smem", "self-check failed on purpose: stock fallback vs stock"),
    ("v16-tiny-ours-eagle3-k3-stockdraft", "v16-tiny-ours-eagle3-k3-draftgraph", "draft-step graph vs 0.16's proposer"),
    ("v16-tiny-ours-graphs", "v16-tiny-ours-eagle3-k3-draftgraph", "greedy EAGLE-3 (every patch) vs greedy plain"),
    ("v16-tiny-stock-graphs", "v16-tiny-stock-eagle3-k3", "stock 0.16: greedy EAGLE-3 vs greedy plain"),
    (
        "v16-tiny-ours-eagle3-k3-draftgraph-waits",
        "v16-tiny-ours-eagle3-k3-draftgraph",
        "async-spec-zero-bubble vs 0.16's wait for the accepted count",
    ),
]
GPU_PATCHES = tuple(gpu_patches())  # every patch a "stock" case turns off


def _natural(p: Path) -> list:
    """Sort key: call10 after call9."""
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", str(p))]


def load_calls(raw: Path) -> dict[str, dict[str, dict]]:
    """Raw files by device call: one sub-folder of ``raw`` per call (its name sorts by date), one
    file per case. Ratios are only ever taken between cases of one call."""
    calls: dict[str, dict[str, dict]] = {}
    for p in sorted(raw.rglob("*.json"), key=_natural):
        if not p.name.endswith(".case.json"):
            r = json.loads(p.read_text())
            calls.setdefault(p.parent.name, {})[r["case"]["name"]] = r
    return calls


def load(raw: Path) -> dict[str, dict]:
    """Every case's latest run (later calls win)."""
    runs: dict[str, dict] = {}
    for call in load_calls(raw).values():
        runs.update(call)
    return runs


def _fmt_greedy(c: dict) -> str:
    parts = ", ".join(f"{d['prompt']}:{d['token']} {d['margins'][0]}/{d['margins'][1]}" for d in c["divergences"])
    return f"{c['identical']}/{c['prompts']}" + (f" (prompt:token margins {parts})" if parts else "")


def route(runs: dict) -> str:
    """The engine route a call ran on ("route B" / "route C"), from its cases' files."""
    return "; ".join(sorted({r.get("engine_route", "?").split(":")[0] for r in runs.values()}))


def not_quite_stock(runs: dict) -> list[str]:
    """A line naming the "stock" cases with a GPU patch of ours applied, from the states each case
    recorded (the stock list once lacked draft-attention-tile and tp-pcie-oneshot-allreduce; it is
    read from the patch registry since)."""
    leaks = []
    for name, r in sorted(runs.items()):
        on = [p for p in GPU_PATCHES if r["case"].get("backend") == "stock" and r["patches"].get(p) == "applied"]
        if on:
            leaks.append(f"{name} ({', '.join(on)})")
    if not leaks:
        return []
    why = "as each engine recorded it; whether the patch acted there is in the case's log, where committed"
    return ["", f"'Stock' engines with a GPU patch of ours in state 'applied' ({why}): " + "; ".join(leaks) + ".", ""]


def tiny_sections(calls: dict, summary: dict) -> list[str]:
    """One section per device call that ran a tiny case with a stock part (stock 0.16, or 0.16's
    proposer) beside ours: greedy tokens are only compared between engines of one call (one route)."""
    L = []
    for call, runs in calls.items():
        if any(n.startswith("v16-tiny") and "stock" in n for n in runs):
            L += tiny_section(call, runs, summary)
    return L


def tiny_section(call: str, runs: dict, summary: dict) -> list[str]:
    L = [
        f"## Trained tiny pair (8 layers, hidden 256; the committed bench drafter), call {call} ({route(runs)})",
        "",
        "Single stream; each case its own engine.",
        "",
        "| case | MLA impl | CUDA graphs (vLLM's log) | tok/s (256 tokens, best of 3) | drafts | accepted "
        "| per position | tau |",
        "|---|---|---|---:|---:|---:|---|---:|",
    ]
    for name in sorted(n for n in runs if n.startswith("v16-tiny")):
        r = runs[name]
        sp = r.get("spec") or {}
        k = len(sp.get("per_pos") or [])
        acc = [round(x / sp["drafts"], 3) for x in sp["per_pos"]] if sp.get("drafts") else []
        L.append(
            f"| {name} | {r['impls']} | {graph_modes(r)} | {r['single_stream']['tok_s']} | "
            f"{sp.get('drafts') or '-'} | {sp.get('accepted') or '-'} | {sp.get('per_pos') or '-'} | "
            f"{round(tau(acc, k), 3) if acc else '-'} |"
        )
        summary[f"{call} {name}"] = {"tok_s": r["single_stream"]["tok_s"], "spec": sp, "impl": r["impls"]}
    L += [
        "",
        "Greedy tokens, 12 held-out prompts x 64 tokens (batched); where runs part, the top-1 vs top-2 "
        "logprob margin at that token in each run (0.0: a bf16 tie):",
        "",
        "| runs compared | what it shows | prompts identical |",
        "|---|---|---|",
    ]
    for a, b, what in GREEDY:
        if a in runs and b in runs:
            c = compare_greedy(runs[a], runs[b])
            summary[f"{call} greedy {a} vs {b}"] = c
            L.append(f"| {a} vs {b} | {what} | {_fmt_greedy(c)} |")
    L += not_quite_stock({n: r for n, r in runs.items() if n.startswith("v16-tiny")})
    fault = runs.get("v16-tiny-ours-fault-smem")
    if fault:
        line = next((ln for ln in fault.get("log_lines", []) if "elf-check failed" in ln), "(no self-check line)")
        L += [
            "",
            f"Self-check fallback (`tests/mla_faults.py`, `MLA_FAULT=smem`): impl {fault['impls']}, log: `...{line}`",
        ]
    dg = runs.get("v16-tiny-ours-eagle3-k3-draftgraph", {}).get("draft_graphs")
    if dg:
        L += [
            "",
            f"Draft step graphs (0.16's EagleProposer): captured for batch sizes {dg['captured']}, "
            f"{dg['replays']} replays, {dg['failed']} shapes left on the stock path.",
        ]
    return L + [""]


#: slice cases and their columns; "as 0.16" = route C's rotary cast taken out (benchmarks/vllm016_gpu/route_c_rope.py)
DEEP = {
    "ours plain": "v16-deep24-ours-plain",
    "ours EAGLE-3 k=3": "v16-deep24-ours-eagle3-k3-ownhead",
    "ours EAGLE-3 k=3, rope as 0.16": "v16-deep24-ours-eagle3-k3-ownhead-rope016",
    "stock plain": "v16-deep24-stock-plain",
    "stock EAGLE-3 k=3": "v16-deep24-stock-eagle3-k3-ownhead",
    "stock EAGLE-3 k=3, rope as 0.16": "v16-deep24-stock-eagle3-k3-ownhead-rope016",
    "ours EAGLE-3 k=3, rope as 0.16, 0.16's wait": "v16-deep24-ours-eagle3-k3-ownhead-rope016-waits",
    "ours EAGLE-3 k=3, rope as 0.16, bound (no wait)": "v16-deep24-ours-eagle3-k3-ownhead-rope016-nosyncbound",
}
#: patches whose state distinguishes the calls' EAGLE-3 runs
CALL_PATCHES = ("bench-route-c-rope-as-016", "bench-async-spec-nosync-bound")


def deep_section(calls: dict, summary: dict) -> list[str]:
    L = [
        "## K2.5 slice, 24 layers (dummy weights), TP-8 drafter with its own head, single stream",
        "",
        "ms per engine step = (median of 5 129-token requests - median of 5 interleaved 1-token requests) / steps; "
        "dummy weights accept no draft, so every EAGLE-3 step is a full verify + draft step. One table per device "
        "call: ratios are taken within a call only. 'rope as 0.16': route C's rotary op (0.20's) casts 0.16's bf16 "
        "cos/sin cache on every call, 0.16's own op does not; these engines hand it a float32 copy made once "
        "(`benchmarks/vllm016_gpu/route_c_rope.py`, stock and ours alike). Route B runs 0.16's own rotary op, "
        "so its calls need no such column.",
        "",
    ]
    for call, runs in calls.items():
        have = {k: runs[v] for k, v in DEEP.items() if v in runs}
        if not have:
            continue
        spec = [k for k in have if k.startswith("ours EAGLE-3")]
        L += [
            f"### Call {call} ({route(runs)})",
            "",
            "| context | "
            + " | ".join(have)
            + "".join(f" | {k} / ours plain" for k in spec)
            + " | plain: stock / ours |",
            "|---|" + "---:|" * (len(have) + len(spec) + 1),
        ]
        for ctx in map(str, CONTEXTS):
            ms = {k: r["contexts"][ctx]["step_ms"] for k, r in have.items() if ctx in r.get("contexts", {})}
            ratios = {k: round(ms[k] / ms["ours plain"], 3) if {k, "ours plain"} <= ms.keys() else "-" for k in spec}
            speed = (
                round(ms["stock plain"] / ms["ours plain"], 2) if {"stock plain", "ours plain"} <= ms.keys() else "-"
            )
            summary[f"deep24 {call} {ctx}"] = {
                **ms,
                **{f"{k} / ours plain": v for k, v in ratios.items()},
                "plain_stock_over_ours": speed,
            }
            cells = " | ".join(str(ms.get(k, "-")) for k in have)
            L.append(
                f"| {int(ctx) // 1024}k | {cells}" + "".join(f" | **{v}**" for v in ratios.values()) + f" | {speed} |"
            )
        L += [
            "",
            "Patches in the engines (worker side): "
            + "; ".join(
                f"{k}: " + ", ".join(f"{p}={r['patches'].get(p, 'absent')}" for p in GPU_PATCHES + CALL_PATCHES)
                for k, r in have.items()
            ),
            "",
        ]
        L += not_quite_stock({n: r for n, r in runs.items() if n.startswith("v16-deep24")})
    return L


ZERO_BUBBLE_TINY = ("v16-tiny-ours-eagle3-k3-draftgraph", "v16-tiny-ours-eagle3-k3-draftgraph-waits")


def zero_bubble_section(calls: dict, summary: dict) -> list[str]:
    """Patch async-spec-zero-bubble per call: its counters and choice in every EAGLE-3 engine, and the
    trained tiny pair with it on and off side by side (drafts, acceptance, greedy tokens, tok/s)."""
    L = [
        "## async-spec-zero-bubble: speculative steps prepared without 0.16's wait for the accepted count",
        "",
        "Per EAGLE-3 engine: steps prepared without the wait, steps that waited (the first, those of the "
        "runner's measurement, and all after a choice to keep the wait), requests whose host-side books were "
        "corrected, drafts found rejected, and the runner's measured choice (engines from before the choice "
        "existed show none). The slice's step costs with it on and off are in the tables above "
        "('0.16's wait' = every patch but this one).",
        "",
        "| call | case | without wait | waited | corrected | rejected | choice |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for call, runs in calls.items():
        for name, r in sorted(runs.items()):
            st = r.get("async_spec")
            if st:
                L.append(
                    f"| {call} | {name} | {st['steps_without_wait']} | {st['steps_waited']} | "
                    f"{st['requests_corrected']} | {st['drafts_rejected']} | {st.get('choice') or '-'} |"
                )
                summary[f"async-spec {call} {name}"] = st
    L += [
        "",
        "Trained tiny pair, side by side in one call (12 held-out prompts batched for greedy tokens; "
        "single stream 256 tokens, best of 3):",
        "",
        "| call | engines at once | tok/s on / off | drafts on / off | accepted per position on / off "
        "| greedy tokens on vs off |",
        "|---|---:|---|---|---|---|",
    ]
    on_name, off_name = ZERO_BUBBLE_TINY
    for call, runs in calls.items():
        on, off = runs.get(on_name), runs.get(off_name)
        if not (on and off):
            continue
        c = compare_greedy(off, on)
        summary[f"async-spec tiny {call}"] = {
            "tok_s": [on["single_stream"]["tok_s"], off["single_stream"]["tok_s"]],
            "greedy": c,
        }
        L.append(
            f"| {call} | {on['engines_at_once']} | {on['single_stream']['tok_s']} / {off['single_stream']['tok_s']} "
            f"| {on['spec']['drafts']} / {off['spec']['drafts']} | {on['spec']['per_pos']} / {off['spec']['per_pos']} "
            f"| {_fmt_greedy(c)} |"
        )
    return L + [""]


def gguf_sections(calls: dict, summary: dict) -> list[str]:
    return [line for call, runs in calls.items() for line in gguf_section(call, runs, summary)]


def gguf_section(call: str, runs: dict, summary: dict) -> list[str]:
    kept, ref = runs.get("gguf-q4k-experts-kept"), runs.get("gguf-dequantized-reference")
    if not (kept and ref):
        return []
    c = compare_greedy(ref, kept)
    summary[f"gguf {call}"] = {
        "tok_s": kept["single_stream"]["tok_s"],
        "reference_tok_s": ref["single_stream"]["tok_s"],
        "greedy_identical": [c["identical"], c["prompts"]],
    }
    return [
        f"## GGUF on 0.16 (trained tiny target): experts kept quantized, call {call} ({route(runs)})",
        "",
        "`q4k.gguf`: experts' gate/up Q4_K and down Q8_0 kept quantized (vLLM's GGUF kernels), attention Q8_0 "
        'force-dequantized (`force_dequant: ["blk.*.attn_*"]`); the reference is a safetensors checkpoint of '
        "gguf-py's dequantization of the same file (the `gguf` suite of gpu_engine_e2e.py).",
        "",
        f"- greedy tokens: {_fmt_greedy(c)}",
        f"- single stream: GGUF {kept['single_stream']['tok_s']} tok/s, reference {ref['single_stream']['tok_s']} "
        f"tok/s (impl {kept['impls']}, CUDA graphs {graph_modes(kept)}); loader patch "
        f"gguf-deepseek-force-dequant={kept['patches'].get('gguf-deepseek-force-dequant')}",
        "",
    ]


def host_section(runs: dict, summary: dict, top: int = 12) -> list[str]:
    cases = {n: r for n, r in sorted(runs.items()) if n.startswith("v16hostprof")}
    L = []
    for name, r in cases.items():
        p, h = r["profile"], r["host"]
        summary[name] = {
            "gpu_busy": p["gpu_busy_ms_per_step"],
            "gpu_idle": p["gpu_idle"]["ms_per_step"],
            "host_waits": p["host_waits"]["ms_per_step"],
            "wall_unprofiled": r["wall_ms_per_step"],
        }
        L += [
            f"## Where the host spends a 4k EAGLE-3 step ({name})",
            "",
            f"Unprofiled: {r['wall_ms_per_step']} ms per step (1-token request overhead included). torch.profiler: "
            f"GPU busy {p['gpu_busy_ms_per_step']} ms, GPU idle (gaps >= {p['gpu_idle']['min_gap_us']:.0f} us) "
            f"{p['gpu_idle']['ms_per_step']} ms per step; the host blocked in CUDA synchronisation "
            f"{p['host_waits']['ms_per_step']} ms per step ("
            + ", ".join(f"{w['call']} {w['calls']}x {w['ms']} ms" for w in p["host_waits"]["by_call"][:2])
            + "). cProfile of the engine's thread (inflates host time; per step, inclusive / own ms):",
            "",
            "| function | calls | inclusive ms | own ms |",
            "|---|---:|---:|---:|",
        ]
        for f in h["by_inclusive"][:top]:
            L.append(f"| `{f['fn'].split('site016/')[-1]}` | {f['calls']} | {f['incl_ms']} | {f['own_ms']} |")
        L.append("")
    return L


def prof_sections(calls: dict, summary: dict) -> list[str]:
    return [line for call, runs in calls.items() for line in prof_section(call, runs, summary)]


def prof_section(call: str, runs: dict, summary: dict) -> list[str]:
    cases = {n: runs[n]["profile"] for n in sorted(runs) if n.startswith("v16prof")}
    if not cases:
        return []
    L = [
        f"## Where a step's GPU time goes (torch.profiler, in-process engine, our stack), call {call} ({route(runs)})",
        "",
        "Kernel time per engine step (ms) and calls per step. The profiler slows the host, so wall times here "
        "are above the step table's; GPU-busy time is the union of kernel intervals. Expert sorts: vLLM's "
        "`moe_align_block_size` kernels per step (0.16's Triton experts sort every batch by expert, so patch "
        "moe-group-tokens-by-expert has nothing to do there; absent where the profile predates the count).",
        "",
        "| | " + " | ".join(n.replace("v16prof-deep24-ours-", "") for n in cases) + " |",
        "|---|" + "---:|" * len(cases),
        "| wall ms/step | " + " | ".join(str(p["wall_ms_per_step"]) for p in cases.values()) + " |",
        "| GPU busy ms/step | " + " | ".join(str(p["gpu_busy_ms_per_step"]) for p in cases.values()) + " |",
        "| expert sorts per step (ms) | " + " | ".join(_sorts(p) for p in cases.values()) + " |",
    ]
    kernels: dict[str, float] = {}
    for p in cases.values():
        for k in p["kernels_full_names"]:
            kernels[k["kernel"][:70]] = max(kernels.get(k["kernel"][:70], 0), k["ms"])
    for name in sorted(kernels, key=lambda k: -kernels[k])[:14]:
        cells = []
        for p in cases.values():
            hit = next((k for k in p["kernels_full_names"] if k["kernel"][:70] == name), None)
            cells.append(f"{hit['ms']} ({hit['calls']})" if hit else "-")
        L.append(f"| `{name}` | " + " | ".join(cells) + " |")
    summary[f"profile {call}"] = {
        n: {"wall": p["wall_ms_per_step"], "busy": p["gpu_busy_ms_per_step"], "moe_sort": p.get("moe_sort_per_step")}
        for n, p in cases.items()
    }
    return L + [""]


def _sorts(profile: dict) -> str:
    s = profile.get("moe_sort_per_step")
    return f"{s['calls']} ({s['ms']})" if s else "-"


def rope_sections(probes: Path, summary: dict) -> list[str]:
    """rope_cache_probe.py's runs on a 0.16 engine (one folder per device call, with that call's
    install log naming the route): does 0.16's rotary op convert the cos/sin cache per call?"""
    L = []
    for p in sorted(probes.glob("*/rope_cache_probe.json"), key=_natural):
        r = json.loads(p.read_text())
        install = (p.parent / "install.log").read_text()
        how = next((ln for ln in install.splitlines() if ln.startswith("install016: vllm")), "install016: ?")
        L += [
            f"## vLLM 0.16's rotary op with K2.5's bf16 cos/sin cache, call {p.parent.name}",
            "",
            f"`{r['command']}`, {r['date']}; {how.removeprefix('install016: ')}. Kernels one call launches "
            "(torch.profiler): 0.20's op converts a bf16 cache to float32 on every call "
            "(benchmarks/results/rope_cache_h200.md; patch rope-float32-cache hands it a float32 copy made once); "
            "where 0.16's op launches only its rotary kernel, the patch has nothing to remove, and where 0.16's op "
            "refuses a float32 cache (an error row) the patch must not run: its version range leaves 0.16 out.",
            "",
            "| cache positions | KV heads | cache given to the op | µs per call | kernels per call |",
            "|---:|---:|---|---:|---|",
        ]
        for x in r["rows"]:
            ks = "; ".join(f"{v['calls_per_op']:g} x `{k[:48]}`" for k, v in x.get("kernels", {}).items())
            L.append(
                f"| {x['positions']:,} | {x['kv_heads']} | {x['cache']} | {x.get('us_per_op', '-')} | "
                f"{ks or 'error: ' + x.get('error', '?')[:80]} |"
            )
        summary[f"rope {p.parent.name}"] = [
            [x["positions"], x["kv_heads"], x["cache"], x.get("us_per_op")] for x in r["rows"]
        ]
        L.append("")
    return L


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    calls = load_calls(a.raw)
    runs = load(a.raw)
    dates = sorted(r["date"] for r in runs.values())
    routes = sorted({r.get("engine_route", "?") for r in runs.values()})
    versions = sorted({r.get("vllm", "?") for r in runs.values()})
    summary: dict = {"vllm": versions, "route": routes, "dates": [dates[0], dates[-1]]}
    L = [
        "# vLLM 0.16 on the H200: every GPU patch vs stock 0.16",
        "",
        f"Written by `python benchmarks/vllm016_report.py {a.raw} --out {a.out}` from `raw/` (one file per case, "
        f"written by `gpu_engine_e2e.py case`, its command and date inside; cases ran {dates[0]} .. {dates[-1]}). "
        f"vLLM {', '.join(versions)}; routes: **{'; '.join(routes)}**. Both run 0.16's scheduler, model runner, "
        "proposer, attention builders and model code; route C (benchmarks/vllm016_gpu/build.sh) on 0.20's C++/CUDA "
        "kernels, route B (build_route_b.sh) on 0.16's own, compiled for the machine's torch. Each call's section "
        "names its route; comparisons stay within a call. "
        "bf16, `max_num_seqs=4`, CUDA graphs with `compilation_config={'backend': 'eager'}`; each case its own "
        "engine, measured one at a time. 'stock' = every GPU patch of ours off (`VLLM_K2_DISABLE_PATCHES`), "
        "the model-support patches on (0.16 cannot run K2.5 EAGLE-3 without them).",
        "",
    ]
    L += tiny_sections(calls, summary) + deep_section(calls, summary) + zero_bubble_section(calls, summary)
    L += prof_sections(calls, summary)
    L += host_section(runs, summary) + gguf_sections(calls, summary) + rope_sections(a.raw.parent / "probes", summary)
    a.out.mkdir(parents=True, exist_ok=True)
    fileio.write_text(str(a.out / "README.md"), "\n".join(L))
    fileio.write_json(str(a.out / "summary.json"), summary)
    print("\n".join(L))


if __name__ == "__main__":
    main()
