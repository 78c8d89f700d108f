"""Report of the draft-step measurements on the H200 (vLLM 0.20, gpu_engine_e2e.py suites
hostprof, dgtiny, dgslice, dgmoe, dgprof, dgrope, dgdepth, dgdepthprof, dgdeep with one folder of raw
cases per device call under raw/dgdeep/, dgbackend under raw/dgbackend/, dg12, dg24 and dg24stock with
one folder per device call under raw/dg12/, raw/dg24/ and raw/dg24stock/):
README.md + summary.json from the raw case files.

    python benchmarks/draft_step_report.py benchmarks/results/draft_step_h200/raw \\
        --out benchmarks/results/draft_step_h200
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_engine_e2e as e2e  # noqa: E402

DRAFTERS = ("stockdraft", "draftgraph", "draftgraph-prefill2d")


SLICE = {
    "ours_plain": "dg-slice-ours-plain",
    "ours_eagle3_stockdraft": "dg-slice-ours-eagle3-k3-stockdraft",
    "ours_eagle3_draftgraph": "dg-slice-ours-eagle3-k3-draftgraph",
    "ours_eagle3_draftgraph_prefill2d": "dg-slice-ours-eagle3-k3-draftgraph-prefill2d",
    "ours_eagle3_draftgraph_kv1": "dg-slice-ours-eagle3-k3-draftgraph-kv1",
    "stock_plain": "dg-slice-stock-plain",
    "stock_eagle3": "dg-slice-stock-eagle3-k3",
}
MOE = {
    "plain": "dg-moe-slice-ours-plain",
    "sorted": "dg-moe-slice-ours-eagle3-k3",
    "unsorted": "dg-moe-slice-ours-eagle3-k3-unsorted",
}
ROPE = {
    "plain": "dg-rope-slice-ours-plain",
    "float32_cache": "dg-rope-slice-ours-eagle3-k3",
    "stock_rope": "dg-rope-slice-ours-eagle3-k3-ropestock",
    "tp8_drafter": "dg-rope-slice-ours-eagle3-k3-tp8draft",
}
EAGER = "dg-prof-slice-eagle3-k3-eager"
#: suite dgdepthprof (profiled, 4k) and dgdepth (request-timed): the slice at 6 and 12 layers
DEPTH_PROF = {
    6: {"plain": "dg-depthprof6-plain", "eagle3": "dg-depthprof6-eagle3-k3"},
    12: {"plain": "dg-depthprof12-plain", "eagle3": "dg-depthprof12-eagle3-k3"},
}
DEPTH_STEPS = {
    6: {"plain": "dg-depth6-plain", "eagle3": "dg-depth6-eagle3-k3"},
    12: {"plain": "dg-depth12-plain", "eagle3": "dg-depth12-eagle3-k3"},
}
K25_LAYERS = 61
#: suite dgdeep: the 24-layer slice, one folder of raw cases per device call (lease)
DEEP_DIR = "dgdeep"
DEEP_LAYERS = 24
DEEP_PLAIN, DEEP_PROF_PLAIN = "dg-deep24-plain", "dg-deepprof24-plain"
DEEP_PROF_OWN = "dg-deepprof24-eagle3-k3-ownhead"
#: suite dgbackend: the platform's priority list asked for FLASH_ATTN for non-MLA layers
BACKEND_DIR = "dgbackend"
BACKEND = {
    "plain": "dg-backend-tiny-ours-plain",
    "ours": "dg-backend-tiny-ours-eagle3-k3-draftgraph",
}
BACKEND_PATCHES = ("draft-attention-triton", "draft-step-graph", "deepseek-eagle3-final-layer-aux")
#: suites dg12 / dg24: the 12- and 24-layer slices, the TP-8 drafter with its own head; two rounds
#: of plain and EAGLE-3 per device call (one folder per call, named by how many engines ran at
#: once), and dg12's profiled pair
HOST_BOUND_DIRS = {"dg12": 12, "dg24": 24}
HOST_BOUND_ROUNDS = {"round 1": ("plain", "eagle3-k3-ownhead"), "round 2": ("plain-r2", "eagle3-k3-ownhead-r2")}
H12_PROF = {"plain": "dg12prof-plain", "eagle3": "dg12prof-eagle3-k3-ownhead"}
#: suite dg24stock: stock vLLM 0.20 (none of our GPU patches) against every patch of ours on the
#: 24-layer slice, request-timed steps per device call, one call profiled
STOCK24_DIR = "dg24stock"
STOCK24 = {
    ("ours", "plain"): "ours-plain",
    ("ours", "eagle3"): "ours-eagle3-k3-ownhead",
    ("stock", "plain"): "stock-plain",
    ("stock", "eagle3"): "stock-eagle3-k3-ownhead",
}
#: kernels of a step by role (names as the profiler gives them; matched by substring)
KERNEL_ROLES = {
    "MoE experts": ("fused_moe_kernel",),
    "target attention, decode kernels": ("mla_decode_split", "mla_decode_reduce", "_fwd_grouped_kernel_stage"),
    "target attention, prefill path (verify)": ("FlashAttnFwd", "gather_and_maybe_dequant_cache", "merge_attn_states"),
    "drafter attention": ("kernel_unified_attention",),
}


def depth_fit(runs: dict[str, dict]) -> dict:
    """GPU busy per step = fixed + layers x per-layer, fit through the 6- and 12-layer slices
    and carried to K2.5's 61 layers; the non-GPU part of a step (wall - GPU busy) is taken
    as measured at 12 layers. MODELLED beyond the two measured depths."""
    out: dict = {"measured": {}, "fit": {}}
    for layers, cases in DEPTH_PROF.items():
        out["measured"][layers] = {
            mode: {
                "wall_ms_per_step": runs[name]["wall_ms_per_step"],
                "gpu_busy_ms_per_step": runs[name]["profile"]["gpu_busy_ms_per_step"],
                "kernels_per_step": runs[name]["profile"]["kernels_per_step"],
            }
            for mode, name in cases.items()
        }
    m = out["measured"]
    for mode in ("plain", "eagle3"):
        b6, b12 = m[6][mode]["gpu_busy_ms_per_step"], m[12][mode]["gpu_busy_ms_per_step"]
        per_layer = (b12 - b6) / 6
        fixed = b6 - 6 * per_layer
        busy = fixed + K25_LAYERS * per_layer
        off_gpu = m[12][mode]["wall_ms_per_step"] - b12
        out["fit"][mode] = {
            "per_layer_ms": round(per_layer, 4),
            "fixed_ms": round(fixed, 3),
            "off_gpu_ms_at_12": round(off_gpu, 3),
            "gpu_busy_ms_at_61": round(busy, 3),
            "step_ms_at_61": round(busy + off_gpu, 3),
        }
    f = out["fit"]
    out["spec_over_plain"] = {
        "gpu_busy_12_measured": round(
            m[12]["eagle3"]["gpu_busy_ms_per_step"] / m[12]["plain"]["gpu_busy_ms_per_step"], 2
        ),
        "wall_12_measured": round(m[12]["eagle3"]["wall_ms_per_step"] / m[12]["plain"]["wall_ms_per_step"], 2),
        "gpu_busy_61_modelled": round(f["eagle3"]["gpu_busy_ms_at_61"] / f["plain"]["gpu_busy_ms_at_61"], 2),
        "step_61_modelled": round(f["eagle3"]["step_ms_at_61"] / f["plain"]["step_ms_at_61"], 2),
    }
    out["request_timed"] = {
        layers: {
            mode: {ctx: runs[name]["contexts"][ctx]["step_ms"] for ctx in runs[name]["contexts"]}
            for mode, name in cases.items()
        }
        for layers, cases in DEPTH_STEPS.items()
    }
    return out


def deep_summary(leases: dict[str, dict[str, dict]], fit: dict) -> dict:
    """Per device call: request-timed steps and profiled steps of the 24-layer slice, each
    EAGLE-3 case over the same call's plain case; and the depth fit's GPU busy at 24 layers
    beside the measured one (the fit is from the 6- and 12-layer slices)."""
    out: dict = {}
    for lease, runs in sorted(leases.items()):
        plain = runs.get(DEEP_PLAIN)
        rec: dict = {
            "dates": sorted({r["date"][:16] for r in runs.values()}),
            "steps": {},
            "profiled": {},
            "code": {name: _code(r) for name, r in runs.items()},
        }
        # plain first: the rows of a call read against it
        for name, r in sorted(runs.items(), key=lambda kv: (kv[0] not in (DEEP_PLAIN, DEEP_PROF_PLAIN), kv[0])):
            if "contexts" in r and isinstance(r["contexts"], dict) and r["case"]["task"] == "steps":
                rec["steps"][name] = {
                    ctx: {
                        "step_ms": v["step_ms"],
                        "over_plain": round(v["step_ms"] / plain["contexts"][ctx]["step_ms"], 2) if plain else None,
                    }
                    for ctx, v in r["contexts"].items()
                }
            elif "profile" in r:
                busy = r["profile"]["gpu_busy_ms_per_step"]
                top = r["profile"].get("top_kernels_ms_per_step", {})
                row = {
                    "context": (r["case"].get("contexts") or [4096])[0],
                    "wall_ms_per_step": r["wall_ms_per_step"],
                    "gpu_busy_ms_per_step": busy,
                    "kernels_per_step": r["profile"]["kernels_per_step"],
                    "attention_ms": {k: top.get(k) for k in ATTENTION_KERNELS},
                }
                pplain = _profiled_plain(runs, r)
                if pplain is not None and "spec" in r["case"]:
                    row["wall_over_plain"] = round(r["wall_ms_per_step"] / pplain["wall_ms_per_step"], 2)
                    row["busy_over_plain"] = round(busy / pplain["profile"]["gpu_busy_ms_per_step"], 2)
                rec["profiled"][name] = row
            if "experts_dummy_router" in r:
                rec.setdefault("experts_dummy_router", {})[name] = round(
                    r["experts_dummy_router"]["mean_distinct_experts"], 2
                )
            if r["case"].get("routing") == "spread":
                rec.setdefault("experts_spread_router", {})[name] = round(
                    r["experts_spread_router"]["mean_distinct_experts"], 1
                )
        out[lease] = rec
    out["fit_at_24"] = {mode: round(f["fixed_ms"] + DEEP_LAYERS * f["per_layer_ms"], 3) for mode, f in fit.items()}
    out["noisy_rounds"] = noisy_rounds(leases)
    out["attention_32k"] = attention_32k(out)
    out["host_over_plain"] = host_over_plain(leases)
    return out


def noisy_rounds(leases: dict[str, dict[str, dict]], spread: float = 1.2) -> list[dict]:
    """Request-timed rows whose long requests (every round after the first, which captures
    graphs) differ by more than ``spread`` slowest over fastest: a median that the host moved."""
    rows = []
    for lease, runs in sorted(leases.items()):
        for name, r in sorted(runs.items()):
            if r["case"]["task"] != "steps":
                continue
            for ctx, v in r["contexts"].items():
                long = [t for k, ts in v["request_s"].items() if k != "1" for t in ts[1:]]
                if max(long) > spread * min(long):
                    rows.append({"lease": lease, "case": name, "context": ctx, "request_s": long})
    return rows


def attention_32k(deep: dict) -> dict | None:
    """The profiled EAGLE-3 step at 32k before and after D_SPLIT + segments (the last call of
    each), with the plain step of the 'before' call."""
    found = {}
    for lease in sorted(k for k in deep if k.startswith("lease")):
        for name, r in deep[lease]["profiled"].items():
            if r["context"] == 32768 and name in DEEP_LABELS:
                kind = "plain" if "plain" in name else deep[lease]["code"][name]
                found[kind] = {"lease": lease, **r}
    before, after, plain = (found.get(k) for k in (CODE_LABELS["absent"], CODE_LABELS["applied"], "plain"))
    if not (before and after and plain):
        return None
    return {
        "before": before,
        "after": after,
        "plain": plain,
        "busy_over_plain": [
            round(x["gpu_busy_ms_per_step"] / plain["gpu_busy_ms_per_step"], 2) for x in (before, after)
        ],
    }


#: The verify step's MLA kernel and the drafter's attention (TRITON_ATTN), as the profiler names them.
ATTENTION_KERNELS = ("mla_decode_split", "kernel_unified_attention")
#: The code a case ran, from its patch states: the draft-attention-segments patch came with the
#: MLA kernel's D_SPLIT form (one commit), so its absence marks the earlier kernel.
SEGMENTS_PATCH = "draft-attention-segments"
CODE_LABELS = {"absent": "before D_SPLIT", "applied": "D_SPLIT, segments on", "disabled": "D_SPLIT, segments off"}


def _code(r: dict) -> str:
    state = r.get("patches", {}).get(SEGMENTS_PATCH, "absent")
    return CODE_LABELS.get(state, f"D_SPLIT, segments {state}")


def _profiled_plain(runs: dict[str, dict], r: dict) -> dict | None:
    """The same call's profiled plain case (no drafter) of the same model and context."""
    return next(
        (
            p
            for p in runs.values()
            if p is not r
            and "profile" in p
            and "spec" not in p["case"]
            and p["case"]["model"] == r["case"]["model"]
            and p["case"].get("contexts") == r["case"].get("contexts")
        ),
        None,
    )


def host_over_plain(leases: dict[str, dict[str, dict]], top: int = 14) -> dict:
    """The last call with both profiled cases: cProfile's inclusive ms per step of the
    EAGLE-3 step's top functions beside the plain step's (None: not in the plain step's
    top list), largest first."""
    lease = next(
        (k for k in sorted(leases, reverse=True) if DEEP_PROF_PLAIN in leases[k] and DEEP_PROF_OWN in leases[k]), None
    )
    if lease is None:
        return {}
    spec, plain = (leases[lease][n]["host"] for n in (DEEP_PROF_OWN, DEEP_PROF_PLAIN))
    base = {r["fn"]: r["incl_ms"] for r in plain["by_inclusive"]}
    rows = [
        {
            "fn": "/".join(r["fn"].split("/")[-2:]),
            "calls": r["calls"],
            "spec_ms": r["incl_ms"],
            "plain_ms": base.get(r["fn"]),
        }
        for r in spec["by_inclusive"][:top]
    ]
    return {
        "lease": lease,
        "profiled_ms_per_step": {
            "eagle3": spec["wall_ms_per_step_profiled"],
            "plain": plain["wall_ms_per_step_profiled"],
        },
        "rows": rows,
    }


def _load_leases(raw: Path) -> dict[str, dict[str, dict]]:
    return {d.name: _load(d) for d in sorted((raw / DEEP_DIR).glob("*")) if d.is_dir()}


def _load(raw: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(raw.glob("*.json"))}


def backend_summary(raw: Path) -> dict | None:
    """Suite dgbackend: per case tok/s, drafter attention, patch states, greedy vs plain; a
    case without a result file is reported with its log's last error line."""
    d = raw / BACKEND_DIR
    if not d.is_dir():
        return None
    runs, out = _load(d), {}
    plain = runs.get(BACKEND["plain"])
    for key, name in BACKEND.items():
        r = runs.get(name)
        if r is None:
            log = (d / f"{name}.log").read_text(errors="replace").splitlines() if (d / f"{name}.log").exists() else []
            errors = [ln.strip() for ln in log if "Error" in ln]
            out[key] = {"ran": False, "error": errors[-1][-300:] if errors else "no result and no error line"}
            continue
        row = {
            "ran": True,
            "date": r["date"],
            "tok_s": r["single_stream"]["tok_s"],
            "patches": {p: r["patches"].get(p) for p in BACKEND_PATCHES},
            "log": [ln for ln in r.get("log_lines", []) if "EAGLE drafter attention" in ln],
        }
        if key != "plain":
            row.update(
                vs_plain=round(r["single_stream"]["tok_s"] / plain["single_stream"]["tok_s"], 3),
                spec=r["spec"],
                greedy_vs_plain=e2e.compare_greedy(plain, r),
                drafter_attention=r.get("drafter_attention"),
                draft_graphs=r.get("draft_graphs"),
            )
        out[key] = row
    return out


def backend_markdown(b: dict) -> list[str]:
    labels = {"plain": "plain", "ours": "EAGLE-3 k=3, draft graph, drafter backend from draft-attention-triton"}
    lines = [
        "## The drafter's attention backend (suite dgbackend, one device call)",
        "",
        "The trained tiny pair with the bundle's plugin asking vLLM's priority list for FLASH_ATTN for every non-MLA "
        "layer (`DGPU_BACKENDS=TRITON_MLA,FLASH_ATTN`), as vLLM's own list does on sm_90 and sm_120; the bench "
        "drafter reads target layers (2, 5, 8), 8 being the stream after the 8-layer target's last layer.",
        "",
        "| case | tok/s | vs plain | drafter attention | draft graphs | drafts | accepted | greedy = plain | patches |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, label in labels.items():
        r = b[key]
        if not r["ran"]:
            lines.append(_row(label, "failed", "-", "-", "-", "-", "-", "-", f"`{r['error']}`"))
            continue
        states = ", ".join(f"{p}: {s}" for p, s in r["patches"].items())
        if key == "plain":
            lines.append(_row(label, r["tok_s"], "1.00", "-", "-", "-", "-", "-", states))
            continue
        g = r["draft_graphs"] or {}
        graphs = f"captured {g.get('captured')}, {g.get('replays')} replays, {g.get('failed')} failed" if g else "-"
        lines.append(
            _row(
                label,
                r["tok_s"],
                f"**{r['vs_plain']:.2f}**",
                ", ".join(r["drafter_attention"] or []),
                graphs,
                r["spec"]["drafts"],
                r["spec"]["accepted"],
                e2e._fmt_div(r["greedy_vs_plain"]),
                states,
            )
        )
    said = sorted({ln for r in b.values() if r["ran"] for ln in r["log"]})
    lines += ["", "Log lines of the backend choice:", ""] + [f"    {ln}" for ln in said] + [""]
    return lines


def _step_profile(r: dict) -> dict:
    """Per step of a profiled case: unprofiled wall, GPU busy, GPU idle gaps, host waits, kernels."""
    pr = r["profile"]
    return {
        "wall_ms": r["wall_ms_per_step"],
        "gpu_busy_ms": pr["gpu_busy_ms_per_step"],
        "gpu_idle_ms": pr["gpu_idle"]["ms_per_step"],
        "host_wait_ms": pr["host_waits"]["ms_per_step"],
        "kernels": pr["kernels_per_step"],
    }


def _request_spread(r: dict) -> float:
    """Slowest over fastest long request of a context after the first (warm-up) round."""
    t = r["request_s"][str(e2e.GEN)][1:]
    return round(max(t) / min(t), 2)


def host_bound_summary(raw: Path) -> dict | None:
    """Suites dg12 / dg24: per device call and round, the request-timed step of plain and
    EAGLE-3, their ratio and the spread of their long requests; dg12's profiled pair: per step
    unprofiled wall, GPU busy, GPU idle in gaps >= 20 us, host time blocked in CUDA
    synchronisation, the fused MoE kernel's time; EAGLE-3's largest idle gaps."""
    calls, prof, dates = [], None, []
    for suite, layers in HOST_BOUND_DIRS.items():
        for d in sorted(p for p in (raw / suite).glob("*") if p.is_dir()):
            runs = _load(d)
            dates += [r["date"] for r in runs.values()]
            for label, (plain, spec) in HOST_BOUND_ROUNDS.items():
                p, e = runs[f"{suite}-{plain}"]["contexts"], runs[f"{suite}-{spec}"]["contexts"]
                calls.append(
                    {
                        "layers": layers,
                        "call": d.name,
                        "round": label,
                        "contexts": {
                            c: {
                                "plain_ms": p[c]["step_ms"],
                                "eagle3_ms": e[c]["step_ms"],
                                "ratio": round(e[c]["step_ms"] / p[c]["step_ms"], 2),
                                "spread_plain": _request_spread(p[c]),
                                "spread_eagle3": _request_spread(e[c]),
                                "accepted": e[c]["spec"]["accepted"],
                            }
                            for c in p
                        },
                    }
                )
            if H12_PROF["plain"] in runs:
                prof = {}
                for key, name in H12_PROF.items():
                    r, pr = runs[name], runs[name]["profile"]
                    moe = sum(k["ms"] for k in pr["kernels_full_names"] if k["kernel"] == "fused_moe_kernel")
                    prof[key] = {
                        **_step_profile(r),
                        "profiled_wall_ms": pr["wall_ms_per_step"],
                        "fused_moe_ms": round(moe, 4),
                        "call": d.name,
                        # the first dg12 call profiled with Python stacks (an attribution
                        # of host waits to frames, since dropped: it found none)
                        "python_stacks": bool(r["case"].get("sync_stacks")),
                    }
                prof["eagle3_idle_gaps"] = runs[H12_PROF["eagle3"]]["profile"]["gpu_idle"]["by_neighbours"][:6]
    if not calls:
        return None
    return {"rounds": calls, "profiled_12": prof, "dates": [min(dates), max(dates)]}


def _roles(profile: dict) -> dict[str, float]:
    """ms per step of the step's heaviest kernels (the profile keeps 20) by KERNEL_ROLES."""
    out = {role: 0.0 for role in KERNEL_ROLES}
    for k in profile["kernels_full_names"]:
        for role, names in KERNEL_ROLES.items():
            if any(n in k["kernel"] for n in names):
                out[role] += k["ms"]
    return {role: round(ms, 4) for role, ms in out.items()}


def stock24_summary(raw: Path) -> dict | None:
    """Suite dg24stock: per device call the request-timed steps of stock and ours, plain and
    EAGLE-3, at each context (with the spread of the long requests); the profiled call: per
    step wall, GPU busy, GPU idle, host waits, kernels and the kernels by role."""
    calls, prof, dates, sorts = [], None, [], []
    for d in sorted(p for p in (raw / STOCK24_DIR).glob("*") if p.is_dir()):
        runs = _load(d)
        dates += [r["date"] for r in runs.values()]
        if f"dg24s-{STOCK24['ours', 'plain']}" in runs:
            ctx = {}
            for c in runs[f"dg24s-{STOCK24['ours', 'plain']}"]["contexts"]:
                x = {f"{b}_{m}_ms": runs[f"dg24s-{n}"]["contexts"][c]["step_ms"] for (b, m), n in STOCK24.items()}
                x.update(
                    {
                        f"{b}_{m}_spread": _request_spread(runs[f"dg24s-{n}"]["contexts"][c])
                        for (b, m), n in STOCK24.items()
                    }
                )
                for b in ("ours", "stock"):
                    x[f"{b}_ratio"] = round(x[f"{b}_eagle3_ms"] / x[f"{b}_plain_ms"], 2)
                for m in ("plain", "eagle3"):
                    x[f"speedup_{m}"] = round(x[f"stock_{m}_ms"] / x[f"ours_{m}_ms"], 2)
                ctx[c] = x
            calls.append({"call": d.name, "contexts": ctx})
        for name, r in sorted(runs.items()):  # vLLM's expert sort per step (counted since 2026-12-04)
            pr = r.get("profile", {})
            if "moe_sort_per_step" in pr:
                on = [g for g in e2e.gpu_patches() if r["patches"].get(g) == "applied"]
                sorts.append(
                    {
                        "call": d.name,
                        "case": name,
                        **pr["moe_sort_per_step"],
                        "gpu_patches_applied": on if r["case"].get("backend") == "stock" else len(on),
                        "moe-group-tokens-by-expert": r["patches"].get("moe-group-tokens-by-expert"),
                        "fused_moe_ms": pr["top_kernels_ms_per_step"].get("fused_moe_kernel"),
                    }
                )
        if f"dg24sprof-{STOCK24['ours', 'plain']}" in runs:
            prof = {"call": d.name}
            for (b, m), n in STOCK24.items():
                r = runs[f"dg24sprof-{n}"]
                prof[f"{b}_{m}"] = {**_step_profile(r), "roles": _roles(r["profile"])}
    if not calls:
        return None
    return {"calls": calls, "profiled": prof, "dates": [min(dates), max(dates)], "moe_sorts": sorts}


def stock24_markdown(h: dict) -> list[str]:
    ctxs = list(h["calls"][0]["contexts"])
    lines = [
        "## Before and after on the 24-layer slice: stock vLLM 0.20 against every patch of ours (suite dg24stock)",
        "",
        f"Raw cases {h['dates'][0]} … {h['dates'][1]}, one folder per device call. Stock: vLLM 0.20 with none "
        "of our GPU patches (its TRITON_MLA backend, PIECEWISE graphs: that backend supports no full graph; the "
        "stock drafter passes; unsorted MoE; the model-support patches K2.5 needs stay on); ours: every patch. "
        "The drafter at K2.5's TP-8 share with its own 4,000-row head, dummy weights (no draft accepted), one "
        "engine at a time. Request-timed steps (multiprocess engines), ms per step; spread: slowest over fastest "
        "128-token request after the first round:",
        "",
        "| call | context | ours plain | ours EAGLE-3 | ours t_spec/t_plain | stock plain | stock EAGLE-3 "
        "| stock t_spec/t_plain | stock / ours, plain | stock / ours, EAGLE-3 | spread ours plain / EAGLE-3 "
        "| spread stock plain / EAGLE-3 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for call in h["calls"]:
        for c in ctxs:
            x = call["contexts"][c]
            lines.append(
                _row(
                    call["call"],
                    f"{int(c) // 1024}k",
                    x["ours_plain_ms"],
                    x["ours_eagle3_ms"],
                    f"**{x['ours_ratio']}**",
                    x["stock_plain_ms"],
                    x["stock_eagle3_ms"],
                    x["stock_ratio"],
                    x["speedup_plain"],
                    x["speedup_eagle3"],
                    f"{x['ours_plain_spread']} / {x['ours_eagle3_spread']}",
                    f"{x['stock_plain_spread']} / {x['stock_eagle3_spread']}",
                )
            )
    if h.get("moe_sorts"):
        lines += [
            "",
            "vLLM's expert sort (`moe_align_block_size` kernels per step, 4k, EAGLE-3 k=3; 23 MoE layers verify 4 "
            "tokens each step): stock 0.20 leaves a batch of 4 unsorted (each token-expert pair its own block), "
            "patch moe-group-tokens-by-expert sorts it. fused_moe: `fused_moe_kernel` ms per step.",
            "",
            "| call | case | moe-group-tokens-by-expert | sorts per step | sort ms per step | fused_moe ms per step "
            "| our GPU patches applied (a stock case: which) |",
            "|---|---|---|---|---|---|---|",
        ]
        for x in h["moe_sorts"]:
            on = x["gpu_patches_applied"]
            lines.append(
                _row(
                    x["call"],
                    x["case"],
                    x["moe-group-tokens-by-expert"],
                    x["calls"],
                    x["ms"],
                    x["fused_moe_ms"],
                    ", ".join(on) if isinstance(on, list) else on,
                )
            )
    p = h["profiled"]
    if p is None:
        return lines + [""]
    roles = list(KERNEL_ROLES)
    lines += [
        "",
        f"Per-step breakdown, 4k (call {p['call']}; in-process engines; wall: one unprofiled 128-token request; "
        "under torch.profiler: GPU busy = union of kernel intervals, GPU idle = gaps of at least 20 µs between "
        "kernels, host waits = host time blocked in CUDA synchronisation; kernels by role among each step's 20 "
        "heaviest kernels, ms per step):",
        "",
        "| backend | mode | wall | GPU busy | wall - GPU busy | GPU idle (profiled) | host waits on the GPU "
        "| kernels | " + " | ".join(roles) + " |",
        "|---|---|---|---|---|---|---|---|" + "---|" * len(roles),
    ]
    for b in ("stock", "ours"):
        for m, label in (("plain", "plain"), ("eagle3", "EAGLE-3 k=3")):
            r = p[f"{b}_{m}"]
            lines.append(
                _row(
                    b,
                    label,
                    r["wall_ms"],
                    r["gpu_busy_ms"],
                    round(r["wall_ms"] - r["gpu_busy_ms"], 3),
                    r["gpu_idle_ms"],
                    r["host_wait_ms"],
                    r["kernels"],
                    *(r["roles"][k] or "-" for k in roles),
                )
            )
    so, oo = p["stock_eagle3"], p["ours_eagle3"]
    lines += [
        "",
        f"EAGLE-3 over plain, profiled call: wall stock {round(so['wall_ms'] / p['stock_plain']['wall_ms'], 2)}, "
        f"ours {round(oo['wall_ms'] / p['ours_plain']['wall_ms'], 2)}; GPU busy stock "
        f"{round(so['gpu_busy_ms'] / p['stock_plain']['gpu_busy_ms'], 2)}, ours "
        f"{round(oo['gpu_busy_ms'] / p['ours_plain']['gpu_busy_ms'], 2)}. Which side waits, EAGLE-3 step: stock "
        f"{_waits_for(so)}, ours {_waits_for(oo)}. '-': no kernel of that role among the step's 20 heaviest.",
        "",
    ]
    return lines


def _waits_for(r: dict) -> str:
    """The GPU waits for the host when its idle gaps outweigh the host's blocking on it."""
    if r["gpu_idle_ms"] > r["host_wait_ms"]:
        return f"the GPU waits for the host (idle {r['gpu_idle_ms']} ms, host blocked {r['host_wait_ms']} ms)"
    return f"the host waits for the GPU (blocked {r['host_wait_ms']} ms, GPU idle {r['gpu_idle_ms']} ms)"


def host_bound_markdown(h: dict) -> list[str]:
    ctxs = list(h["rounds"][0]["contexts"])
    lines = [
        "## Where the slice is host-bound: 12 against 24 layers (suites dg12 and dg24)",
        "",
        f"Raw cases {h['dates'][0]} … {h['dates'][1]}, one folder per device call (named by how many engines ran "
        "at once; each case was measured alone either way). Every patch of ours, draft graph on, the drafter at "
        "K2.5's TP-8 share with its own 4,000-row head (`slice-draft-tp8` / `slice24-draft-tp8` + "
        "`benchmarks/dummy_draft_head.py`), dummy weights (no draft accepted). Request-timed steps (multiprocess "
        "engines), ms per step; spread: slowest over fastest 128-token request of a case after its first round:",
        "",
        "| layers | call | round | "
        + " | ".join(
            f"plain {int(c) // 1024}k | EAGLE-3 {int(c) // 1024}k | ratio | spread plain / EAGLE-3" for c in ctxs
        )
        + " |",
        "|---|---|---|" + "---|---|---|---|" * len(ctxs),
    ]
    for r in h["rounds"]:
        cells = []
        for c in ctxs:
            x = r["contexts"][c]
            cells += [x["plain_ms"], x["eagle3_ms"], f"**{x['ratio']}**", f"{x['spread_plain']} / {x['spread_eagle3']}"]
        lines.append(_row(r["layers"], r["call"], r["round"], *cells))
    p = h["profiled_12"]
    if p is None:
        return lines + [""]
    e = p["eagle3"]
    lines += [
        "",
        f"Profiled at 12 layers, 4k (call {e['call']}; in-process engines; wall: one unprofiled 128-token request; "
        f"under torch.profiler{' with Python stacks recorded' if e['python_stacks'] else ''}: GPU busy = union of "
        "kernel intervals, GPU idle = the gaps of at "
        "least 20 µs between kernels (profiler overhead lengthens them), host waits = time in cudaEventSynchronize / "
        "cudaStreamSynchronize / cudaDeviceSynchronize / cudaMemcpy), ms per step:",
        "",
        "| mode | wall | GPU busy | wall - GPU busy | profiled wall | GPU idle (gaps, profiled) "
        "| host waits on the GPU | kernels | fused_moe_kernel |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, r in (("plain", p["plain"]), ("EAGLE-3 k=3", e)):
        lines.append(
            _row(
                label,
                r["wall_ms"],
                r["gpu_busy_ms"],
                round(r["wall_ms"] - r["gpu_busy_ms"], 3),
                r["profiled_wall_ms"],
                r["gpu_idle_ms"],
                r["host_wait_ms"],
                r["kernels"],
                r["fused_moe_ms"],
            )
        )
    lines += [
        "",
        f"EAGLE-3 over plain: wall {round(e['wall_ms'] / p['plain']['wall_ms'], 2)}, GPU busy "
        f"{round(e['gpu_busy_ms'] / p['plain']['gpu_busy_ms'], 2)}. Unprofiled, an EAGLE-3 step lasts "
        f"{round(e['wall_ms'] - e['gpu_busy_ms'], 3)} ms longer than its kernels; under the profiler its host "
        f"blocks on the GPU for {e['host_wait_ms']} ms per step. So at 12 layers the GPU waits for the host (vLLM's "
        "Python around the graphs), not the other way round: the step follows this host's CPU, which is also what "
        "the 12-layer spreads above show, where the 24-layer steps (twice the kernels per step) repeat within a few "
        "percent. EAGLE-3's largest idle gaps under the profiler (which slows the host further), by the kernels "
        "around them:",
        "",
        "| before the gap | after the gap | gaps per step | ms per step |",
        "|---|---|---|---|",
    ]
    for g in p["eagle3_idle_gaps"]:
        lines.append(_row(f"`{g['before']}`", f"`{g['after']}`", g["calls"], g["ms"]))
    return lines + [""]


def _host_share(r: dict, fn: str) -> float:
    """Inclusive ms per step of the first profiled function whose name ends with ``fn``."""
    return next(row["incl_ms"] for row in r["host"]["by_inclusive"] if row["fn"].endswith(fn))


def summarize(runs: dict[str, dict]) -> dict:
    s: dict = {"tiny": {}, "slice": {}, "host_profile": {}}
    plain = runs["dg-tiny-ours-plain"]
    for d in DRAFTERS:
        r = runs[f"dg-tiny-ours-eagle3-k3-{d}"]
        s["tiny"][d] = {
            "tok_s": r["single_stream"]["tok_s"],
            "vs_plain": round(r["single_stream"]["tok_s"] / plain["single_stream"]["tok_s"], 3),
            "step_ms": e2e._step_ms(r),
            "spec": r["spec"],
            "greedy_vs_plain": e2e.compare_greedy(plain, r),
            "draft_graphs": r.get("draft_graphs"),
        }
    s["tiny"]["plain"] = {"tok_s": plain["single_stream"]["tok_s"], "step_ms": e2e._step_ms(plain)}
    a, b, c = (runs[f"dg-tiny-ours-eagle3-k3-{d}"] for d in DRAFTERS)
    s["tiny"]["drafters_agree"] = {"greedy": e2e.compare_greedy(a, b), "spec_counts_equal": a["spec"] == b["spec"]}
    s["tiny"]["prefill_as_decode_agree"] = {
        "greedy": e2e.compare_greedy(c, b),
        "spec_counts_equal": b["spec"] == c["spec"],
    }
    for ctx in runs["dg-slice-ours-plain"]["contexts"]:
        step = {k: runs[v]["contexts"][ctx]["step_ms"] for k, v in SLICE.items()}
        plain = step["ours_plain"]
        s["slice"][ctx] = {
            "step_ms": step,
            "spec_over_plain": {
                "ours_draftgraph": round(step["ours_eagle3_draftgraph"] / plain, 2),
                "ours_draftgraph_prefill2d": round(step["ours_eagle3_draftgraph_prefill2d"] / plain, 2),
                "ours_draftgraph_kv1": round(step["ours_eagle3_draftgraph_kv1"] / plain, 2),
                "ours_stockdraft": round(step["ours_eagle3_stockdraft"] / plain, 2),
                "stock": round(step["stock_eagle3"] / step["stock_plain"], 2),
            },
            "prefill_as_decode": round(step["ours_eagle3_draftgraph"] / step["ours_eagle3_draftgraph_prefill2d"], 2),
            "draftgraph_over_stockdraft": round(step["ours_eagle3_draftgraph"] / step["ours_eagle3_stockdraft"], 2),
        }
    s["moe"] = {}
    for ctx in runs["dg-moe-slice-ours-plain"]["contexts"]:
        step = {k: runs[v]["contexts"][ctx]["step_ms"] for k, v in MOE.items()}
        s["moe"][ctx] = {
            "step_ms": step,
            "spec_over_plain": {k: round(step[k] / step["plain"], 2) for k in ("sorted", "unsorted")},
            "sorted_over_unsorted": round(step["sorted"] / step["unsorted"], 2),
        }
    s["rope"] = {}
    for ctx in runs[ROPE["plain"]]["contexts"]:
        step = {k: runs[v]["contexts"][ctx]["step_ms"] for k, v in ROPE.items()}
        s["rope"][ctx] = {
            "step_ms": step,
            "spec_over_plain": {k: round(step[k] / step["plain"], 2) for k in ROPE if k != "plain"},
            "stock_minus_float32_ms": round(step["stock_rope"] - step["float32_cache"], 3),
        }
    s["depth"] = depth_fit(runs)
    eager = runs[EAGER]["profile"]
    rope_op = next(o for o in eager["eager_ops_ms_per_step"] if o["op"] == "_C::rotary_embedding")
    casts = [k for k in eager["kernels_full_names"] if "direct_copy" in k["kernel"] and "LoadWithCast" in k["kernel"]]
    s["eager_attribution"] = {
        "rotary_op": {"calls": rope_op["calls"], "ms": rope_op["ms"]},
        "float32_casts": {"calls": sum(k["calls"] for k in casts), "ms": round(sum(k["ms"] for k in casts), 4)},
    }
    s["gpu_profile"] = {}
    for name in ("dg-prof-slice-plain", "dg-prof-slice-eagle3-k3-draftgraph"):
        p = runs[name]["profile"]
        s["gpu_profile"][name] = {
            "wall_ms_per_step": runs[name]["wall_ms_per_step"],
            "gpu_busy_ms_per_step": p["gpu_busy_ms_per_step"],
            "kernels_per_step": p["kernels_per_step"],
            "top_kernels": {
                k: {"ms": v, "calls": p["top_kernels_per_step"][k]} for k, v in p["top_kernels_ms_per_step"].items()
            },
            # the first dgprof version wrote full kernel names under the ops' key
            "kernels_full_names": [
                {"kernel": r.get("kernel", r.get("op")), "calls": r["calls"], "ms": r["ms"]}
                for r in p.get("kernels_full_names", p["eager_ops_ms_per_step"])
            ],
        }
    for name in ("hostprof-tiny-eagle3-k3", "hostprof-slice-eagle3-k3"):
        r = runs[name]
        s["host_profile"][name] = {
            "wall_ms_per_step": r["wall_ms_per_step"],
            "gpu_busy_ms_per_step": r["profile"]["gpu_busy_ms_per_step"],
            "profiled_ms_per_step": r["host"]["wall_ms_per_step_profiled"],
            "propose_ms": _host_share(r, ":propose"),
            "config_hash_ms": _host_share(r, ":aot_compile_hash_factors"),
        }
    ngram = runs["hostprof-tiny-ngram-k3"]["host"]["by_inclusive"]
    plan = next(row for row in ngram if row["fn"].endswith("mla/launcher.py:78:plan"))
    s["host_profile"]["mla_plan_before_cache"] = {"calls_per_step": plan["calls"], "incl_ms_per_step": plan["incl_ms"]}
    return s


def markdown(s: dict, runs: dict[str, dict]) -> str:
    dates = sorted(r["date"] for r in runs.values())
    t = s["tiny"]
    lines = [
        "# The EAGLE-3 draft step on the H200: one CUDA graph per decode shape",
        "",
        f'vLLM 0.20.0 from the bundle, bf16, CUDA graphs with compile backend "eager"; raw cases {dates[0]} … '
        f"{dates[-1]} (each written by `gpu_engine_e2e.py case`, its command inside). Cases of one suite ran in "
        "one device call, each in its own engine, measured one at a time.",
        "",
        "## Trained tiny pair, single stream (256 tokens, best of 3; suite dgtiny)",
        "",
        "| mode | tok/s | vs plain | ms per step | drafts | accepted | per position | greedy = plain |",
        "|---|---|---|---|---|---|---|---|",
        f"| plain (our MLA backend, full graphs) | {t['plain']['tok_s']} | 1.00 | {t['plain']['step_ms']} "
        "| - | - | - | - |",
    ]
    labels = (
        "EAGLE-3 k=3, stock drafter passes",
        "EAGLE-3 k=3, draft step as one graph",
        "EAGLE-3 k=3, draft graph, first pass through the 2D kernel (draft-prefill-as-decode off)",
    )
    for d, label in zip(DRAFTERS, labels, strict=True):
        r = t[d]
        g = r["greedy_vs_plain"]
        lines.append(
            f"| {label} | {r['tok_s']} | **{r['vs_plain']:.2f}** | {r['step_ms']} | {r['spec']['drafts']} | "
            f"{r['spec']['accepted']} | {r['spec']['per_pos']} | {e2e._fmt_div(g)} |"
        )
    agree, same = t["drafters_agree"]["greedy"], t["drafters_agree"]["spec_counts_equal"]
    pa = t["prefill_as_decode_agree"]
    dg = t["draftgraph"]["draft_graphs"]
    lines += [
        "",
        f"Draft graph vs stock drafter: greedy identical on {agree['identical']}/{agree['prompts']} "
        f"prompts, acceptance counts {'identical' if same else 'DIFFERENT'}; graphs captured "
        f"for batch sizes {dg['captured']}, {dg['replays']} replays, {dg['failed']} shapes left stock.",
        f"Draft-prefill-as-decode on vs off: greedy identical on {e2e._fmt_div(pa['greedy'])} prompts, "
        "acceptance counts "
        f"{'identical' if pa['spec_counts_equal'] else 'not identical'} (the split kernel sums in another order). "
        "The tiny pair's contexts are a few hundred tokens and its single-stream tok/s moves by several percent from "
        "engine to engine (the same plain case: 614.3 tok/s in the raw files these replaced, commit ab2af6c), so "
        "this table cannot resolve the patch at short context; "
        "the slice's 4k row below can.",
        "",
        "## K2.5-sized slice, dummy weights, single stream (suite dgslice)",
        "",
        "12 layers at K2.5's per-GPU share of TP 8; dummy weights accept no draft, so every EAGLE-3 step is a full "
        "verify + draft step. Milliseconds per engine step: (median of 5 GEN-token requests - median of 5 interleaved "
        "1-token requests) / steps; each case's request times are in its raw file. This suite ran before patch "
        "moe-group-tokens-by-expert existed (dgmoe below has it on and off). The drafter (slice-draft) has 8 KV heads "
        "(4 KiB of KV per token); kv1 is the same drafter with 1 KV head, the per-GPU share at TP 8 of a drafter with "
        "64 query and 8 KV heads.",
        "",
        "| context | ours plain | EAGLE-3 stock drafter | draft graph | draft graph, 2D first pass | draft graph, "
        "kv1 | stock plain | stock EAGLE-3 | t_spec/t_plain ours (graph) | 2D first pass | kv1 | stock drafter "
        "| stock | prefill-as-decode on / off |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for ctx, r in s["slice"].items():
        st, ratio = r["step_ms"], r["spec_over_plain"]
        lines.append(
            f"| {int(ctx) // 1024}k | {st['ours_plain']} | {st['ours_eagle3_stockdraft']} | "
            f"{st['ours_eagle3_draftgraph']} | {st['ours_eagle3_draftgraph_prefill2d']} | "
            f"{st['ours_eagle3_draftgraph_kv1']} | {st['stock_plain']} | {st['stock_eagle3']} | "
            f"**{ratio['ours_draftgraph']}** | {ratio['ours_draftgraph_prefill2d']} | {ratio['ours_draftgraph_kv1']} | "
            f"{ratio['ours_stockdraft']} | {ratio['stock']} | **{r['prefill_as_decode']}** |"
        )
    lines += [
        "",
        "## MoE at verify sizes in the engine (suite dgmoe, one device call)",
        "",
        "The slice with every patch of ours, and the same with patch moe-group-tokens-by-expert off "
        "(4 verify tokens of a dummy router touch "
        f"{runs['dg-moe-slice-ours-eagle3-k3']['experts_dummy_router']['mean_distinct_experts']} distinct experts "
        "per layer on average: they share experts, the case the patch is for). Same step measure as above. "
        "Compare within one table: the unsorted case is dgslice's draft-graph configuration, measured on another "
        f"lease: {s['moe']['4096']['step_ms']['unsorted']} ms here vs "
        f"{s['slice']['4096']['step_ms']['ours_eagle3_draftgraph']} ms there at 4k.",
        "",
        "| context | ours plain | EAGLE-3, sorted by expert | EAGLE-3, unsorted (stock fused_moe) | "
        "t_spec/t_plain sorted | unsorted | sorted / unsorted |",
        "|---|---|---|---|---|---|---|",
    ]
    for ctx, r in s["moe"].items():
        st, ratio = r["step_ms"], r["spec_over_plain"]
        lines.append(
            f"| {int(ctx) // 1024}k | {st['plain']} | {st['sorted']} | {st['unsorted']} | **{ratio['sorted']}** | "
            f"{ratio['unsorted']} | {r['sorted_over_unsorted']} |"
        )
    prof = s["gpu_profile"]
    a, b = prof["dg-prof-slice-plain"], prof["dg-prof-slice-eagle3-k3-draftgraph"]
    lines += [
        "",
        "## Where an EAGLE-3 step's GPU time goes now (suite dgprof, torch.profiler, in-process engine, 4k)",
        "",
        f"Plain: {a['wall_ms_per_step']} ms per step wall, GPU busy {a['gpu_busy_ms_per_step']} ms, "
        f"{a['kernels_per_step']} kernels. EAGLE-3 k=3 (draft graph, prefill-as-decode, MoE sorted): "
        f"{b['wall_ms_per_step']} ms wall, GPU busy {b['gpu_busy_ms_per_step']} ms, {b['kernels_per_step']} kernels: "
        f"the step is GPU-bound now; GPU busy spec / plain = "
        f"{b['gpu_busy_ms_per_step'] / a['gpu_busy_ms_per_step']:.2f}.",
        "",
        "| kernel (first 80 characters) | plain ms per step | calls | EAGLE-3 ms per step | calls |",
        "|---|---|---|---|---|",
    ]

    def order(k):  # EAGLE-3's heaviest first, then plain's, then by name: the same table every run
        return (-b["top_kernels"].get(k, {}).get("ms", 0), -a["top_kernels"].get(k, {}).get("ms", 0), k)

    for k in sorted(set(a["top_kernels"]) | set(b["top_kernels"]), key=order):
        x, y = a["top_kernels"].get(k), b["top_kernels"].get(k)
        cell = lambda v: f"{v['ms']} | {v['calls']}" if v else "- | -"  # noqa: E731
        lines.append(f"| `{k.replace('|', '/')}` | {cell(x)} | {cell(y)} |")
    lines += [
        "",
        "The 80-character prefix merges kernels; by full name, the EAGLE-3 step's copy kernels "
        "(`direct_copy_kernel_cuda`; `{lambda(float)#1}` with `LoadWithCast` is a cast to float32):",
        "",
        "| kernel | output element type | casts | calls per step | ms per step |",
        "|---|---|---|---|---|",
    ]
    for r in b["kernels_full_names"]:
        if "direct_copy" in r["kernel"]:
            out_type = re.search(r"\{lambda\(([^)]*)\)#1\}", r["kernel"])
            lines.append(
                f"| `{r['kernel'].split('<')[0]}` | {out_type.group(1) if out_type else '?'} | "
                f"{'yes' if 'LoadWithCast' in r['kernel'] else 'no'} | {r['calls']} | {r['ms']} |"
            )
    ea, rope = s["eager_attribution"], s["rope"]
    probe = json.loads((Path(__file__).resolve().parent / "results" / "rope_cache_h200.json").read_text())
    big = [r for r in probe["rows"] if r["positions"] == 262_144 and r["kv_heads"] == 8]
    half_us, f32_us = (next(r["us_per_op"] for r in big if r["cache"].startswith(c)) for c in ("bf16", "float32"))
    lines += [
        "",
        f"Attributed in the same suite's case {EAGER} (no CUDA graphs, so every kernel has the op that launched "
        f"it): vLLM's CUDA rotary op `_C::rotary_embedding` (the drafter's rope; the target's DeepSeek rope runs "
        f"natively) {ea['rotary_op']['calls']} calls and {ea['rotary_op']['ms']} ms of kernels per step; the "
        f"float32 casts {ea['float32_casts']['calls']} calls, {ea['float32_casts']['ms']} ms. The op converts a bf16 "
        f"cos/sin cache to float32 on every call: {half_us} µs per call for K2.5's 262,144 positions x 128 with "
        f"the bf16 cache, {f32_us} µs with a float32 one (`benchmarks/rope_cache_probe.py`, "
        "`benchmarks/results/rope_cache_h200.md`). Patch "
        "rope-float32-cache hands it a float32 copy made once (bit-identical q/k; `tests/test_rope_cache.py`).",
        "",
        "## Patch rope-float32-cache in the engine (suite dgrope, one device call)",
        "",
        "Every patch of ours, with the rope patch on and off; and the drafter at K2.5's TP-8 share "
        "(slice-draft-tp8: 1 KV head, draft vocab 32,000 / 8 = 4,000, lm_head vocab-parallel) instead of "
        "slice-draft (8 KV heads, draft vocab 16,384). Same step measure as above; its request times vary by "
        "up to ~10 % within a case (raw files), so differences of a few tenths of a millisecond are near the noise.",
        "",
        "| context | ours plain | EAGLE-3 (float32 rope cache) | EAGLE-3, stock rope | EAGLE-3, TP-8 drafter | "
        "t_spec/t_plain | stock rope | TP-8 drafter | stock - float32 (ms) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for ctx, r in rope.items():
        st, ratio = r["step_ms"], r["spec_over_plain"]
        lines.append(
            f"| {int(ctx) // 1024}k | {st['plain']} | {st['float32_cache']} | {st['stock_rope']} | "
            f"{st['tp8_drafter']} | **{ratio['float32_cache']}** | {ratio['stock_rope']} | "
            f"{ratio['tp8_drafter']} | {r['stock_minus_float32_ms']} |"
        )
    lines += depth_markdown(s["depth"])
    lines += deep_markdown(s["deep"])
    lines += [
        "",
        "## Where an EAGLE-3 step's host time went before (suite hostprof, cProfile of the engine thread)",
        "",
        'The hostprof cases ran before the bench set `VLLM_USE_AOT_COMPILE=0` for its backend-"eager" engines '
        "(vLLM's default then re-hashes the config on every call of a compiled model; Inductor builds do not).",
        "",
        "| case | ms per step | GPU busy | profiled ms per step | in `propose` | in config hashing |",
        "|---|---|---|---|---|---|",
    ]
    plan = s["host_profile"]["mla_plan_before_cache"]
    for name, r in s["host_profile"].items():
        if name == "mla_plan_before_cache":
            continue
        lines.append(
            f"| {name} | {r['wall_ms_per_step']} | {r['gpu_busy_ms_per_step']} | {r['profiled_ms_per_step']} | "
            f"{r['propose_ms']} | {r['config_hash_ms']} |"
        )
    lines += [
        "",
        f"Before the MLA launcher's plan was cached, the n-gram k=3 case (hostprof-tiny-ngram-k3, whose q_len-1 steps "
        f"run piecewise) spent {plan['incl_ms_per_step']} profiled ms per step in `launcher.plan` "
        f"({plan['calls_per_step']} calls per step).",
    ]
    return "\n".join(lines) + "\n"


def _row(*cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def depth_markdown(d: dict) -> list[str]:
    m, f, r = d["measured"], d["fit"], d["spec_over_plain"]
    lines = [
        "",
        "## Fixed vs per-layer cost: the slice at 6 and 12 layers (suites dgdepthprof and dgdepth, one lease)",
        "",
        "Every patch of ours, draft graph on, 4k context, dummy weights (no draft accepted). dgdepthprof (in-process "
        "engines): GPU busy per step is the union of kernel times under torch.profiler over a 128-token request; wall "
        "per step is one unprofiled 128-token request of the same engine; both per step, the request's prefill "
        "included.",
        "",
        "| layers | mode | wall ms per step | GPU busy ms per step | kernels per step |",
        "|---|---|---|---|---|",
    ]
    lines += [
        _row(layers, mode, v["wall_ms_per_step"], v["gpu_busy_ms_per_step"], v["kernels_per_step"])
        for layers, modes in m.items()
        for mode, v in modes.items()
    ]
    lines += [
        "",
        f"GPU busy = fixed + layers x per-layer through the two depths, carried to K2.5's {K25_LAYERS} layers "
        "(MODELLED, not measured; the off-GPU part of a step, wall - GPU busy, taken as measured at 12 layers):",
        "",
        "| mode | per layer (ms) | fixed (ms) | off-GPU at 12 layers (ms) | GPU busy at 61 (ms) | step at 61 (ms) |",
        "|---|---|---|---|---|---|",
    ]
    lines += [_row(mode, *v.values()) for mode, v in f.items()]
    lines += [
        "",
        f"t_spec/t_plain: GPU busy {r['gpu_busy_12_measured']} and wall {r['wall_12_measured']} measured at 12 layers; "
        f"at 61 layers **{r['gpu_busy_61_modelled']}** (GPU busy) and **{r['step_61_modelled']}** (step), modelled. "
        "The fit's fixed term holds what does not grow with the target's depth (the drafter among it); per layer, "
        "verifying 4 tokens costs "
        f"{round(f['eagle3']['per_layer_ms'] / f['plain']['per_layer_ms'], 2)}x a plain layer. The EAGLE-3 step's "
        "off-GPU time (wall - GPU busy) is "
        f"{round(m[12]['eagle3']['wall_ms_per_step'] - m[12]['eagle3']['gpu_busy_ms_per_step'], 2)} ms at 12 layers "
        f"and {round(m[6]['eagle3']['wall_ms_per_step'] - m[6]['eagle3']['gpu_busy_ms_per_step'], 2)} ms at 6, "
        f"against {round(m[12]['plain']['wall_ms_per_step'] - m[12]['plain']['gpu_busy_ms_per_step'], 2)} / "
        f"{round(m[6]['plain']['wall_ms_per_step'] - m[6]['plain']['gpu_busy_ms_per_step'], 2)} ms plain; where "
        "it goes was not measured in these suites.",
        "",
        "Request-timed step (dgdepth, the measure of the tables above, same lease, another device call), ms per step:",
        "",
        "| layers | mode | "
        + " | ".join(f"{int(c) // 1024}k" for c in next(iter(d["request_timed"][6].values())))
        + " |",
        "|---|---|" + "---|" * len(next(iter(d["request_timed"][6].values()))),
    ]
    lines += [
        _row(layers, mode, *ctxs.values())
        for layers, modes in d["request_timed"].items()
        for mode, ctxs in modes.items()
    ]
    lines += [
        "",
        "This measure does not separate the depths: 6 layers came out within its noise of 12 (EAGLE-3 at 4k slower "
        "at 6 layers), while GPU busy per step halves from 12 to 6 layers (plain) in the profiled engines.",
    ]
    return lines


DEEP_LABELS = {
    "dg-deep24-plain": "plain",
    "dg-deep24-eagle3-k3": "EAGLE-3 k=3, drafter on the target's lm_head (dummy-load default)",
    "dg-deep24-eagle3-k3-ownhead": "EAGLE-3 k=3, drafter with its own 4,000-row head",
    "dg-deep24-eagle3-k3-ownhead-spread": "EAGLE-3 k=3, own head, routers redrawn to spread",
    "dg-deepprof24-plain": "plain",
    "dg-deepprof24-eagle3-k3": "EAGLE-3 k=3, drafter on the target's lm_head",
    "dg-deepprof24-eagle3-k3-ownhead": "EAGLE-3 k=3, drafter with its own head",
    "dg-deep24-eagle3-k3-ownhead-segstock": "EAGLE-3 k=3, own head, TRITON_ATTN's stock 16 segments",
    "dg-deepprof24-32k-plain": "plain",
    "dg-deepprof24-32k-eagle3-k3-ownhead": "EAGLE-3 k=3, drafter with its own head",
    "dg-depthprof12-eagle3-k3-tp8": "12 layers: EAGLE-3 k=3, slice-draft-tp8 on the target's lm_head",
}


def deep_markdown(d: dict) -> list[str]:
    leases = [k for k in d if k.startswith("lease")]
    ctxs = sorted({c for k in leases for r in d[k]["steps"].values() for c in r}, key=int)
    lines = [
        "",
        f"## The deepest slice one H200 holds: {DEEP_LAYERS} layers (suite dgdeep, {len(leases)} device calls)",
        "",
        f"The slice at {DEEP_LAYERS} layers (23 MoE layers of bf16 experts, ~100 GB; one engine at a time), every "
        "patch of ours, draft graph on, the drafter at K2.5's TP-8 share (`slice24-draft-tp8`: 1 KV head, draft "
        "vocabulary 32,000 / 8). A dummy load reads no checkpoint, so vLLM gives such a drafter the target's "
        "lm_head (20,480 rows here) for each of its passes, where a trained drafter runs its own draft-vocabulary "
        "head; the own-head cases load `benchmarks/dummy_draft_head.py`, a bench-only patch that keeps the drafter's "
        "own head. Every ratio is over the plain case of the same device call; each call is its own table row "
        "group. Request-timed steps (multiprocess engine, the measure of dgslice), ms per step and over plain:",
        "",
        "| call | case | code | " + " | ".join(f"{int(c) // 1024}k" for c in ctxs) + " |",
        "|---|---|---|" + "---|" * len(ctxs),
    ]
    for lease in leases:
        rec = d[lease]
        for name, r in rec["steps"].items():
            cells = [f"{r[c]['step_ms']}" + (f" ({r[c]['over_plain']}x)" if name != DEEP_PLAIN else "") for c in ctxs]
            lines.append(_row(f"{lease} ({rec['dates'][0]})", DEEP_LABELS.get(name, name), rec["code"][name], *cells))
    lines += [
        "",
        "Code: `before D_SPLIT` = the MLA kernel's one 576-column dot per tile and TRITON_ATTN's stock 16 split-KV "
        "segments; `D_SPLIT` = four 128-column dots (bf16) and, unless off, patch draft-attention-segments.",
        "",
        "Profiled (in-process engine; GPU busy = union of kernel times under torch.profiler, wall = one "
        "unprofiled 128-token request; over plain: the same call's profiled plain case at the same context), "
        f"ms per step, with the attention kernels' share ({' / '.join(ATTENTION_KERNELS)}; '-': not among the "
        "step's 12 largest kernels):",
        "",
        "| call | case | code | context | wall | GPU busy | kernels | attention | wall over plain "
        "| GPU busy over plain |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for lease in leases:
        for name, r in d[lease]["profiled"].items():
            cells = (r["wall_ms_per_step"], r["gpu_busy_ms_per_step"], r["kernels_per_step"])
            attn = " / ".join("-" if v is None else str(v) for v in r["attention_ms"].values())
            over = (r.get("wall_over_plain", "-"), r.get("busy_over_plain", "-"))
            lines.append(
                _row(
                    lease,
                    DEEP_LABELS.get(name, name),
                    d[lease]["code"][name],
                    f"{r['context'] // 1024}k",
                    *cells,
                    attn,
                    *over,
                )
            )
    a = d.get("attention_32k")
    if a:
        (mb, ub), (ma, ua) = (x["attention_ms"].values() for x in (a["before"], a["after"]))
        lines += [
            "",
            f"At 32k, {a['before']['lease']} (before) against {a['after']['lease']} (after), across calls: the "
            f"drafter's attention (3 passes) {ub} -> {ua} ms per step, the verify step's MLA kernel {mb} -> {ma} ms, "
            f"GPU busy {a['before']['gpu_busy_ms_per_step']} -> {a['after']['gpu_busy_ms_per_step']} ms, that is "
            f"{a['busy_over_plain'][0]} -> {a['busy_over_plain'][1]}x the plain step's "
            f"{a['plain']['gpu_busy_ms_per_step']} ms ({a['plain']['lease']}; GPU busy moves little from call "
            "to call: the profiled plain step at 4k measured "
            + ", ".join(
                f"{r['gpu_busy_ms_per_step']} ({k})"
                for k in leases
                for n, r in d[k]["profiled"].items()
                if n == DEEP_PROF_PLAIN
            )
            + " ms).",
        ]
    if d.get("noisy_rounds"):
        lines += [
            "",
            "Rows whose long requests (rounds after the first) spread by more than 20 %, slowest over fastest: "
            + "; ".join(
                f"{n['lease']} {DEEP_LABELS.get(n['case'], n['case'])} at {int(n['context']) // 1024}k: "
                f"{', '.join(str(t) for t in n['request_s'])} s"
                for n in d["noisy_rounds"]
            )
            + ". The code was the same in every round of a row; what moved is not measured.",
        ]
    spread = {n: v for k in leases for n, v in d[k].get("experts_spread_router", {}).items()}
    dummy = {v for k in leases for v in d[k].get("experts_dummy_router", {}).values()}
    fit = d["fit_at_24"]
    lines += [
        "",
        f"The depth fit of the section above (6 and 12 layers) put GPU busy at {DEEP_LAYERS} layers at {fit['plain']} "
        f"ms plain and {fit['eagle3']} ms EAGLE-3 (drafter on the target's head), beside the measured rows above. "
        "Dummy routers pick nearly the same experts for the 4 tokens of a verify step "
        f"({', '.join(map(str, sorted(dummy)))} distinct per layer); "
        + (
            f"redrawn to spread they pick {min(spread.values())} (the spread row; its GPU busy was not profiled). "
            if spread
            else ""
        )
        + "An EAGLE-3 step is host-bound on this slice when its host time exceeds its GPU busy: with the same GPU "
        "busy, its wall moved from call to call with the host (the own-head rows of lease2 and lease3), the plain "
        "step's did not; within lease2 the spread row measured faster than dummy routing, inside that noise.",
    ]
    h = d["host_over_plain"]
    if h:
        p = h["profiled_ms_per_step"]
        lines += [
            "",
            f"Where the host time goes ({h['lease']}, cProfile of the engine thread, inclusive ms per step under the "
            f"profiler: {p['eagle3']} EAGLE-3 against {p['plain']} plain; '-': not among the plain step's top "
            "functions). Not yet attributed further: which of these wait on the GPU and which are Python.",
            "",
            "| function | calls per step | EAGLE-3 | plain |",
            "|---|---|---|---|",
        ]
        lines += [
            _row(f"`{r['fn']}`", r["calls"], r["spec_ms"], "-" if r["plain_ms"] is None else r["plain_ms"])
            for r in h["rows"]
        ]
    return lines


def report(raw: Path, out: Path, command: str) -> dict:
    from vllm_k2_plugin.fileio import write_text

    runs = _load(raw)
    s = summarize(runs)
    s["deep"] = deep_summary(_load_leases(raw), s["depth"]["fit"])
    s["backend"] = backend_summary(raw)
    s["host_bound"] = host_bound_summary(raw)
    s["stock24"] = stock24_summary(raw)
    text = markdown(s, runs)
    if s["backend"] is not None:
        text += "\n" + "\n".join(backend_markdown(s["backend"]))
    if s["host_bound"] is not None:
        text += "\n" + "\n".join(host_bound_markdown(s["host_bound"]))
    if s["stock24"] is not None:
        text += "\n" + "\n".join(stock24_markdown(s["stock24"]))
    write_text(out / "summary.json", json.dumps(s, indent=1) + "\n")
    write_text(out / "README.md", text + f"\nReport command: `{command}`\n")
    return s


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    report(a.raw, a.out, " ".join(["python", *sys.argv]))


if __name__ == "__main__":
    main()
