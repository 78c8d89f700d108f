"""MODELLED, not measured: the users' rig (8x RTX PRO 6000, TP 8 over PCIe, Kimi-K2.5)
single-stream tok/s, plain and EAGLE-3 k=3, with the tensor-parallel all-reduce on
untuned NCCL, tuned NCCL, and the one-shot path (tp-pcie-oneshot-allreduce). Every
input is printed with its source; nothing here ran on that hardware.

    python3 benchmarks/pcie_allreduce_model.py --out benchmarks/results/pcie_allreduce_model.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

KIB = 1024
INPUTS = {
    # name: (value, unit, source)
    "plain_tok_s": (82.5, "tok/s", "users' report (issue 36): TP 8 single stream, vLLM 0.16, NCCL"),
    "ar_share": (0.515, "of the step", "users' report (issue 36): all-reduce share of the decode step"),
    "ar_per_token": (122, "all-reduces", "issue 36: ~2 per layer of 61 (attention + MoE outputs)"),
    "oneshot_14k_us": (11.8, "us", "published [M]: rtx6kpro, fused one-stage at 14,336 B on 8x RTX PRO 6000"),
    "oneshot_8k_us": (
        9.2,
        "us",
        "published [M]: rtx6kpro hardware/pcie-bandwidth.md, one-shot 8 KB, 8-GPU switch host",
    ),
    "oneshot_32k_us": (16.5, "us", "published [M]: same source, one-shot 32 KB"),
    "nccl_tuned_us": (23.0, "us", "published [M]: 20-26 us tuned NCCL, flat to 64 KB on switches (midpoint)"),
    "tau_k3": (3.28, "tokens/step", "ours [M]: trained tiny pair, unseen prompts, k=3"),
    "k": (3, "draft tokens", "EAGLE-3 k"),
    "draft_ar_per_pass": (2, "all-reduces", "one-layer drafter at TP 8: attention + MLP outputs"),
}


RESULTS = Path(__file__).resolve().parent / "results"


def _ratio_0_16(call: str = "2026-12-04-call2", column: str = "ours EAGLE-3 k=3, rope as 0.16") -> float:
    summary = json.loads((RESULTS / "vllm016_h200" / "summary.json").read_text())
    return summary[f"deep24 {call} 4096"][f"{column} / ours plain"]


def _ratio_0_20(call: str, case: str) -> float:
    raw = RESULTS / "draft_attention_tile_h200" / "raw" / call
    ms = lambda name: json.loads((raw / f"{name}.json").read_text())["contexts"]["4096"]["step_ms"]  # noqa: E731
    return round(ms(case) / ms("dg24t-plain"), 3)


def scenarios() -> dict[str, tuple[float, str]]:
    """t_spec(k=3) / t_plain at 4k, ours, every patch, 24-layer K2.5 slice, H200, read from the
    committed results (each a ratio of two cases of one device call)."""
    return {
        "vLLM 0.16 (route C)": (
            _ratio_0_16(),
            "ours [M]: benchmarks/results/vllm016_h200, call 2026-12-04-call2 (before async-spec-zero-bubble)",
        ),
        "vLLM 0.16 (route B)": (
            _ratio_0_16("2026-12-04-call7", "ours EAGLE-3 k=3"),
            "ours [M]: benchmarks/results/vllm016_h200, call 2026-12-04-call7 (0.16's own kernels, every patch)",
        ),
        "vLLM 0.20, call 4": (
            _ratio_0_20("2026-12-04-call4", "dg24t-eagle3-k3-ownhead"),
            "ours [M]: benchmarks/results/draft_attention_tile_h200, call 2026-12-04-call4 (tile 128, one wave)",
        ),
        "vLLM 0.20, call 5": (
            _ratio_0_20("2026-12-04-call5", "dg24t-eagle3-k3-ownhead-2waves"),
            "ours [M]: same folder, call 2026-12-04-call5 (tile 128 and the first pass in two waves: today's defaults)",
        ),
        "vLLM 0.20, call 6": (
            _ratio_0_20("2026-12-04-call6", "dg24t-eagle3-k3-ownhead"),
            "ours [M]: same folder, call 2026-12-04-call6 (today's defaults, graph-timed tile check)",
        ),
    }


def v(name: str) -> float:
    return INPUTS[name][0]


def oneshot_us(nbytes: int) -> float:
    """14 KiB: the published point; other sizes: linear through the published 8 / 32 KB points."""
    if nbytes == 14 * KIB:
        return v("oneshot_14k_us")
    slope = (v("oneshot_32k_us") - v("oneshot_8k_us")) / 24
    return v("oneshot_8k_us") + (nbytes / KIB - 8) * slope


def model(spec_over_plain: float) -> tuple[list[dict], float, float, float]:
    step_ms = 1000 / v("plain_tok_s")
    nccl_us = step_ms * v("ar_share") * 1000 / v("ar_per_token")
    compute_ms = step_ms * (1 - v("ar_share"))
    k = int(v("k"))
    token, verify = 14 * KIB, 14 * KIB * (1 + k)
    paths = {
        "NCCL untuned (users' measurement)": lambda n: nccl_us,
        "NCCL tuned (published)": lambda n: v("nccl_tuned_us"),
        "one-shot where faster, untuned NCCL above": lambda n: min(oneshot_us(n), nccl_us),
        "one-shot where faster, tuned NCCL above": lambda n: min(oneshot_us(n), v("nccl_tuned_us")),
    }
    rows = []
    for name, ar in paths.items():
        plain_ms = compute_ms + v("ar_per_token") * ar(token) / 1000
        spec_ms = (
            compute_ms * spec_over_plain
            + v("ar_per_token") * ar(verify) / 1000
            + k * v("draft_ar_per_pass") * ar(token) / 1000
        )
        rows.append(
            {
                "path": name,
                "ar_token_us": ar(token),
                "ar_verify_us": ar(verify),
                "plain_ms": plain_ms,
                "plain_tok_s": 1000 / plain_ms,
                "spec_ms": spec_ms,
                "spec_tok_s": v("tau_k3") * 1000 / spec_ms,
            }
        )
    return rows, step_ms, nccl_us, compute_ms


def render(command: str) -> str:
    cases = scenarios()
    _, step_ms, nccl_us, compute_ms = model(1.0)
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    L = [
        "# The users' rig, MODELLED: TP-8 all-reduce paths (not measured on that hardware)",
        "",
        f"Written by `{command}` on {date}.",
        "",
        "## Inputs",
        "",
        "| input | value | source |",
        "|---|---|---|",
    ]
    L += [f"| {k} | {val} {unit} | {src} |" for k, (val, unit, src) in INPUTS.items()]
    L += [
        f"| spec_over_plain, {name} | {val} x | t_spec(k=3)/t_plain, 4k, 24-layer K2.5 slice, H200; {src} |"
        for name, (val, src) in cases.items()
    ]
    L += [
        "",
        "## Derived",
        "",
        f"- step = 1000 / plain_tok_s = {step_ms:.2f} ms; all-reduce on NCCL = step x ar_share / ar_per_token "
        f"= {nccl_us:.1f} us each; the rest of the step (compute) = {compute_ms:.2f} ms",
        "- one-shot at the verify size (4 tokens, 56 KiB): linear through the published 8 / 32 KB points "
        f"= {oneshot_us(56 * KIB):.1f} us (extrapolated; the start-up check would measure it)",
        "- plain step = compute + ar_per_token x t_ar(14 KiB)",
        "- EAGLE-3 step = compute x spec_over_plain + ar_per_token x t_ar(56 KiB)"
        " + k x draft_ar_per_pass x t_ar(14 KiB)",
        "- tok/s: plain 1 / plain step; EAGLE-3 tau_k3 / EAGLE-3 step",
        "- compute is the users' stock vLLM 0.16 compute: what our GPU patches save on sm_120 is not modelled",
        "",
        "## Result (modelled)",
        "",
        "| spec_over_plain from | all-reduce path | t_ar 14 KiB (us) | t_ar 56 KiB (us) | plain ms | plain tok/s "
        "| EAGLE-3 ms | EAGLE-3 tok/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    for name, (ratio, _src) in cases.items():
        rows = model(ratio)[0]
        L += [
            f"| {name} ({ratio}x) | {r['path']} | {r['ar_token_us']:.1f} | {r['ar_verify_us']:.1f} | "
            f"{r['plain_ms']:.2f} | {r['plain_tok_s']:.0f} | {r['spec_ms']:.2f} | {r['spec_tok_s']:.0f} |"
            for r in rows
        ]
        oneshot = max(r["spec_tok_s"] for r in rows if r["path"].startswith("one-shot"))
        verdicts.append(f"{name}: {oneshot:.0f} tok/s ({'met' if oneshot >= 300 else 'not met'})")
    L += [
        "",
        "Issue 36's goal, EAGLE-3 >= 300 tok/s single stream with the one-shot path, by the step ratio the "
        "model takes: " + "; ".join(verdicts) + ". Our users run vLLM 0.16. The verify step's 56 KiB "
        "all-reduces dominate what is left of the all-reduce: 122 of them per step.",
        "",
    ]
    return "\n".join(L)


# --------------------------------------------------------------------------- per weight format
#: Kimi-K2.5: 61 layers, the first dense (config first_k_dense_replace = 1)
MOE_LAYERS = 60
#: the users' GGUF (README's example, issue 46): the routed experts of a Q2_K_XL GGUF
USERS_FORMAT = "gguf-q2_k_xl"
#: published on the users' hardware class (K2.6, INT4 experts, 8x RTX PRO 6000, vLLM of April 2026):
#: best EAGLE-3 run, short context (source: shared/research/field-2026-12.md section 3.2)
PUBLISHED_K26 = {"plain_tok_s": 86.9, "eagle3_tok_s": 117.1}
DEFAULT_QUANT = RESULTS / "quant_moe" / "h100_vllm020_stock.json"


def _slice_non_moe_ratio(moe_bf16_1_us: float) -> tuple[float, str]:
    """t_spec / t_plain of the slice's step without its routed experts: the 24-layer bf16 slice of
    call 6 (4k), whose dummy router sent a 4-token verify to 8.4 distinct experts (recorded in the
    case), taken as 8.42 / 8 of one token's MoE time per layer (assumed), 23 MoE layers."""
    raw = RESULTS / "draft_attention_tile_h200" / "raw" / "2026-12-04-call6"
    load = lambda n: json.loads((raw / f"{n}.json").read_text())  # noqa: E731
    plain, spec = load("dg24t-plain"), load("dg24t-eagle3-k3-ownhead")
    experts = spec["experts_dummy_router"]["mean_distinct_experts"]
    p_ms, s_ms = plain["contexts"]["4096"]["step_ms"], spec["contexts"]["4096"]["step_ms"]
    moe1 = 23 * moe_bf16_1_us / 1000
    ratio = (s_ms - moe1 * experts / 8) / (p_ms - moe1)
    how = (
        f"({s_ms} - 23 x {moe_bf16_1_us:.1f} us x {experts:.2f}/8) / ({p_ms} - 23 x {moe_bf16_1_us:.1f} us): "
        "slice steps on the H200 (vLLM 0.20, call 2026-12-04-call6, 4k), bf16 MoE time on the quant_moe device"
    )
    return ratio, how


def quant_section(path: Path) -> list[str]:
    """The rig's plain and EAGLE-3 k=3 steps per expert format: the users' step with their MoE time
    replaced by each format's measured MoE kernel time at 1 and 1 + k tokens (vLLM's, and ours
    where the run has it). MODELLED; the kernel times were measured on another GPU."""
    data = json.loads(path.read_text())
    rows = {c["case"]["name"]: {r["tokens"]: r for r in c.get("rows", [])} for c in data["cases"]}
    k = int(v("k"))
    step_ms = 1000 / v("plain_tok_s")
    nccl_us = step_ms * v("ar_share") * 1000 / v("ar_per_token")
    ar_plain = v("ar_per_token") * nccl_us / 1000
    ar_spec = ar_plain + k * v("draft_ar_per_pass") * nccl_us / 1000  # NCCL flat to 64 KiB (published)
    users = rows[USERS_FORMAT]
    other_ms = step_ms - ar_plain - MOE_LAYERS * users[1]["us_per_call"] / 1000
    r_other, how = _slice_non_moe_ratio(rows["bf16"][1]["us_per_call"])
    taus = {"tau 3.28 (ours, tiny pair)": v("tau_k3"), "tau 2.94 (published K2.5 MLA drafter, MT-Bench)": 2.94}
    L = [
        "",
        "## Per expert format (MODELLED from MoE kernels measured on another GPU)",
        "",
        f"Kernel times: `{path.relative_to(RESULTS.parent.parent) if path.is_absolute() else path}` "
        f"({data['device']}, vLLM {data['vllm']}, {data['date']}; K2.5's TP-8 expert shapes, a near-uniform "
        "router). Not measured on the users' GPU: RTX PRO 6000 has more SMs (188 vs 132) and less memory "
        "bandwidth (1.79 vs 3.35 TB/s spec sheets) than an H100, so a kernel at its memory floor there takes "
        "longer and one far from it may not; the times are used as measured.",
        "",
        "| input | value | source |",
        "|---|---|---|",
        f"| MoE layers | {MOE_LAYERS} | K2.5 config: 61 layers, first_k_dense_replace 1 |",
        f"| users' expert format | {USERS_FORMAT} | users' GGUF (README example; issue 46) |",
        f"| users' MoE time per step | {MOE_LAYERS} x {users[1]['us_per_call']:.1f} us = "
        f"{MOE_LAYERS * users[1]['us_per_call'] / 1000:.2f} ms | vLLM's GGUF MoE at 1 token, measured above |",
        f"| the rest of the step (not MoE, not all-reduce) | {other_ms:.2f} ms | users' step - all-reduce - MoE |",
        f"| EAGLE-3 / plain for that rest | {r_other:.3f} x | {how} |",
        f"| all-reduce per step | plain {ar_plain:.2f} ms, EAGLE-3 {ar_spec:.2f} ms | users' NCCL (above); "
        "verify messages assumed as fast (NCCL flat to 64 KiB, published) plus the drafter's passes |",
        "",
        "| expert format | MoE path | MoE us at 1 / 4 tokens (per layer) | plain ms | plain tok/s | EAGLE-3 ms "
        + "".join(f"| EAGLE-3 tok/s, {t} " for t in taus)
        + "|",
        "|---|---|---|---|---|---|" + "---|" * len(taus),
    ]
    for name, by_t in rows.items():
        if 1 not in by_t or 1 + k not in by_t:
            continue
        paths = [("vLLM's kernel", "us_per_call")] + (
            [("ours", "ours_us_per_call")] if by_t[1].get("ours_us_per_call") else []
        )
        for label, key in paths:
            m1, m4 = by_t[1][key], by_t[1 + k][key]
            plain = other_ms + MOE_LAYERS * m1 / 1000 + ar_plain
            spec = other_ms * r_other + MOE_LAYERS * m4 / 1000 + ar_spec
            L.append(
                f"| {name} | {label} | {m1:.1f} / {m4:.1f} | {plain:.2f} | {1000 / plain:.0f} | {spec:.2f} "
                + "".join(f"| {t * 1000 / spec:.0f} " for t in taus.values())
                + "|"
            )
    L += [
        "",
        f"Published beside it (K2.6, INT4 experts through Marlin, 8x RTX PRO 6000, a vLLM of April 2026): plain "
        f"{PUBLISHED_K26['plain_tok_s']} tok/s, best EAGLE-3 {PUBLISHED_K26['eagle3_tok_s']} tok/s. What differs "
        "from the w4a16-g32 rows: their all-reduce and non-MoE time (unknown: not published per part), their "
        "drafter's acceptance (unknown), their Marlin MoE on sm_120 (not measured here). The model's rows take "
        "the users' GGUF rig as the base, so they are not a prediction of that published rig.",
        "",
    ]
    return L


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument(
        "--quant-moe",
        type=Path,
        default=DEFAULT_QUANT,
        help="benchmarks/quant_moe/run.py's JSON: MoE kernel times per expert format",
    )
    a = ap.parse_args()
    text = render(" ".join(["python3", "benchmarks/pcie_allreduce_model.py", *sys.argv[1:]]))
    text += "\n".join(quant_section(a.quant_moe.resolve()))
    print(text)
    if a.out:
        from vllm_k2_plugin.fileio import write_text

        write_text(str(a.out), text)


if __name__ == "__main__":
    main()
