"""JSON, Markdown and PNG plots of an A/B run."""

from __future__ import annotations

import json
import os

from vllm_k2_plugin import fileio


def _fmt(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"


def _sampled(prompts: list[dict]) -> str:
    n = sum(1 for p in prompts if p.get("temperature", 0.0) > 0)
    return "greedy" if not n else f"{len(prompts) - n} greedy and {n} sampled with their own seeds"


def markdown(result: dict) -> str:
    cfg, summary = result["config"], result["summary"]
    lines = [
        f"# bench ab: {cfg['model']}",
        "",
        *([f"Command: `{result['command']}`", f"Date: {result['date']}", ""] if "command" in result else []),
        *(
            ["Environment: `" + " ".join(f"{k}={v}" for k, v in result["environment"].items()) + "`", ""]
            if result.get("environment")
            else []
        ),
        f"{cfg['rounds']} round(s), modes alternating; {len(cfg['prompts'])} prompts, max_tokens {cfg['max_tokens']}, "
        f"{_sampled(cfg['prompts'])}. Ratios are per round against the baseline, median [min, max]; "
        "lossless compares the greedy requests' outputs.",
        "",
        "| mode | concurrency | tok/s per request | ratio vs baseline | acceptance rate | mean acceptance length | "
        "per-position acceptance | lossless |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in cfg["modes"]:
        e = summary[m["name"]]
        acc = e["acceptance"]
        mism = summary["lossless"][m["name"]]
        lossless = "-" if mism is None else ("yes" if not mism else f"NO: prompts {sorted(set(mism))}")
        for c in map(str, cfg["concurrency"]):
            s = e[c]
            lo, hi = _fmt(s["ratio_vs_baseline_min"]), _fmt(s["ratio_vs_baseline_max"])
            ratio = f"{_fmt(s['ratio_vs_baseline_median'])} [{lo}, {hi}]"
            per_pos = ", ".join(_fmt(p) for p in acc["per_position_acceptance"]) or "-"
            lines.append(
                f"| {m['name']} | {c} | {_fmt(s['tok_per_s_median'], 1)} | {ratio} | {_fmt(acc['acceptance_rate'])} | "
                f"{_fmt(acc['mean_acceptance_length'])} | {per_pos} | {lossless} |"
            )
        for err in e["errors"]:
            lines.append(f"\n**{m['name']} failed**: `{err.splitlines()[0][:300]}`")
    lines += [
        "",
        "Under load, per concurrency (medians over rounds): throughput of the whole load, latency "
        "percentiles over its requests, acceptance length measured at that concurrency, preemptions, "
        "and the tokens the server's KV cache holds (a drafter's layers take part of the same space).",
        "",
        "| mode | concurrency | tok/s, all requests | ratio vs baseline | TTFT p50 / p99 (s) | TPOT p50 / p99 (ms) | "
        "mean acceptance length | preemptions | KV cache (tokens) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m in cfg["modes"]:
        e = summary[m["name"]]
        for c in map(str, cfg["concurrency"]):
            s = e[c]
            tpot = [None if x is None else 1e3 * x for x in (s.get("tpot_s_p50_median"), s.get("tpot_s_p99_median"))]
            lines.append(
                f"| {m['name']} | {c} | {_fmt(s.get('aggregate_tok_per_s_median'), 1)} | "
                f"{_fmt(s.get('aggregate_ratio_vs_baseline_median'))} | "
                f"{_fmt(s.get('ttft_s_p50_median'))} / {_fmt(s.get('ttft_s_p99_median'))} | "
                f"{_fmt(tpot[0], 1)} / {_fmt(tpot[1], 1)} | {_fmt(s.get('mean_acceptance_length_median'))} | "
                f"{_fmt(s.get('preemptions'), 0)} | {_fmt(e.get('kv_cache_tokens'), 0)} |"
            )
    return "\n".join(lines) + "\n"


def plots(result: dict, out_dir: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg, summary = result["config"], result["summary"]
    names = [m["name"] for m in cfg["modes"]]
    paths = []
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(1, len(cfg["concurrency"]))
    for j, c in enumerate(map(str, cfg["concurrency"])):
        vals = [summary[n][c]["tok_per_s_median"] or 0 for n in names]
        ax.bar([i + j * width for i in range(len(names))], vals, width, label=f"concurrency {c}")
    ax.set_xticks([i + width * (len(cfg["concurrency"]) - 1) / 2 for i in range(len(names))], names)
    ax.set_ylabel("output tok/s per request (median)")
    ax.set_title("Throughput by mode")
    ax.legend()
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "tok_per_s.png"))
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 4))
    for n in names:
        per_pos = summary[n]["acceptance"]["per_position_acceptance"]
        if per_pos:
            ax.plot(range(1, len(per_pos) + 1), per_pos, marker="o", label=n)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance (accepted / drafts)")
    ax.set_ylim(0, 1.05)
    ax.set_title("Per-position acceptance")
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "acceptance_per_position.png"))
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    # under load: the whole load's throughput and the slowest requests' time per token, by concurrency
    conc = [int(c) for c in cfg["concurrency"]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for n in names:
        agg = [summary[n][str(c)].get("aggregate_tok_per_s_median") for c in conc]
        p99 = [summary[n][str(c)].get("tpot_s_p99_median") for c in conc]
        left.plot(conc, [a or 0 for a in agg], marker="o", label=n)
        right.plot(conc, [1e3 * (p or 0) for p in p99], marker="o", label=n)
    for ax, label, title in (
        (left, "output tok/s, all requests", "Throughput under load"),
        (right, "time per output token, p99 (ms)", "Slowest requests"),
    ):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel(label)
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "load.png"))
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths


def write_all(result: dict, out_dir: str) -> dict:
    os.makedirs(out_dir, exist_ok=True)
    files = {"json": os.path.join(out_dir, "bench_ab.json"), "markdown": os.path.join(out_dir, "bench_ab.md")}
    for key, text in (("json", json.dumps(result, indent=1)), ("markdown", markdown(result))):
        fileio.write_text(files[key], text)
    files["plots"] = plots(result, out_dir)
    return files
