"""Report of the draft-step measurements on the H200 (vLLM 0.20, gpu_engine_e2e.py suites
hostprof, dgtiny, dgslice): README.md + summary.json from the raw case files.

    python benchmarks/draft_step_report.py benchmarks/results/draft_step_h200/raw \\
        --out benchmarks/results/draft_step_h200
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_engine_e2e as e2e  # noqa: E402

DRAFTERS = ("stockdraft", "draftgraph")


def _load(raw: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(raw.glob("*.json"))}


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
    a, b = (runs[f"dg-tiny-ours-eagle3-k3-{d}"] for d in DRAFTERS)
    s["tiny"]["drafters_agree"] = {"greedy": e2e.compare_greedy(a, b), "spec_counts_equal": a["spec"] == b["spec"]}
    names = {
        "ours_plain": "dg-slice-ours-plain",
        "ours_eagle3_stockdraft": "dg-slice-ours-eagle3-k3-stockdraft",
        "ours_eagle3_draftgraph": "dg-slice-ours-eagle3-k3-draftgraph",
        "stock_plain": "dg-slice-stock-plain",
        "stock_eagle3": "dg-slice-stock-eagle3-k3",
    }
    for ctx in runs["dg-slice-ours-plain"]["contexts"]:
        step = {k: runs[v]["contexts"][ctx]["step_ms"] for k, v in names.items()}
        s["slice"][ctx] = {
            "step_ms": step,
            "spec_over_plain": {
                "ours_draftgraph": round(step["ours_eagle3_draftgraph"] / step["ours_plain"], 2),
                "ours_stockdraft": round(step["ours_eagle3_stockdraft"] / step["ours_plain"], 2),
                "stock": round(step["stock_eagle3"] / step["stock_plain"], 2),
            },
            "draftgraph_over_stockdraft": round(step["ours_eagle3_draftgraph"] / step["ours_eagle3_stockdraft"], 2),
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
    labels = ("EAGLE-3 k=3, stock drafter passes", "EAGLE-3 k=3, draft step as one graph")
    for d, label in zip(DRAFTERS, labels, strict=True):
        r = t[d]
        g = r["greedy_vs_plain"]
        lines.append(
            f"| {label} | {r['tok_s']} | **{r['vs_plain']:.2f}** | {r['step_ms']} | {r['spec']['drafts']} | "
            f"{r['spec']['accepted']} | {r['spec']['per_pos']} | {e2e._fmt_div(g)} |"
        )
    agree, same = t["drafters_agree"]["greedy"], t["drafters_agree"]["spec_counts_equal"]
    dg = t["draftgraph"]["draft_graphs"]
    lines += [
        "",
        f"Draft graph vs stock drafter: greedy identical on {agree['identical']}/{agree['prompts']} "
        f"prompts, acceptance counts {'identical' if same else 'DIFFERENT'}; graphs captured "
        f"for batch sizes {dg['captured']}, {dg['replays']} replays, {dg['failed']} shapes left stock.",
        "",
        "## K2.5-sized slice, dummy weights, single stream (suite dgslice)",
        "",
        "12 layers at K2.5's per-GPU share of TP 8; dummy weights accept no draft, so every EAGLE-3 step is a full "
        "verify + draft step. Milliseconds per engine step, best of 2.",
        "",
        "| context | ours plain | ours EAGLE-3 stock drafter | ours EAGLE-3 draft graph | stock plain | stock EAGLE-3 "
        "| t_spec/t_plain ours (graph) | ours (stock drafter) | stock | graph / stock drafter |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for ctx, r in s["slice"].items():
        st, ratio = r["step_ms"], r["spec_over_plain"]
        lines.append(
            f"| {int(ctx) // 1024}k | {st['ours_plain']} | {st['ours_eagle3_stockdraft']} | "
            f"{st['ours_eagle3_draftgraph']} | {st['stock_plain']} | {st['stock_eagle3']} | "
            f"**{ratio['ours_draftgraph']}** | {ratio['ours_stockdraft']} | {ratio['stock']} | "
            f"{r['draftgraph_over_stockdraft']} |"
        )
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


def report(raw: Path, out: Path, command: str) -> dict:
    from vllm_k2_plugin.fileio import write_text

    runs = _load(raw)
    s = summarize(runs)
    write_text(out / "summary.json", json.dumps(s, indent=1) + "\n")
    write_text(out / "README.md", markdown(s, runs) + f"\nReport command: `{command}`\n")
    return s


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    report(a.raw, a.out, " ".join(["python", *sys.argv]))


if __name__ == "__main__":
    main()
