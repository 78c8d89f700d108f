"""A serving load on an in-process vLLM engine: ``concurrency`` requests in flight at all times.

For engines that cannot run ``vllm serve`` (the GPU bundles carry no HTTP server: no uvicorn), the
load that ``vllm-k2 bench ab --prompts load:N`` puts on a server is put on ``LLM.llm_engine``
directly: each finished request is replaced by the next at once, so the scheduler sees the
same batch sizes, chunked prefills, prefix-cache hits and preemptions a server would.

Per request, from the engine's own outputs (``RequestOutputKind.DELTA``: one output per engine
step in which the request got tokens): time to first token, time per output token and the
tokens each decode step gave it (1 + accepted drafts with speculation: its acceptance length).
Per concurrency, from vLLM's own counters: drafts, draft tokens, accepted per position,
preemptions.
"""

from __future__ import annotations

import statistics
import time

COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted",
    "vllm:num_preemptions": "preemptions",
}


def counters(llm) -> dict:
    out = {v: 0 for v in COUNTERS.values()} | {"per_pos": []}
    for m in llm.get_metrics():
        if m.name in COUNTERS:
            out[COUNTERS[m.name]] = m.value
        elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            out["per_pos"] = list(m.values)
    return out


def delta(a: dict, b: dict) -> dict:
    per_pos = [y - x for x, y in zip(a["per_pos"] or [0] * len(b["per_pos"]), b["per_pos"], strict=False)]
    return {k: b[k] - a[k] for k in COUNTERS.values()} | {"per_pos": per_pos}


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def run_load(llm, prompts: list[dict], concurrency: int, max_tokens: int) -> dict:
    """Serve ``prompts`` ({"prompt", optional "temperature", "seed"}) with ``concurrency`` in flight."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    engine = llm.llm_engine
    before = counters(llm)
    pending = list(enumerate(prompts))
    live: dict[str, dict] = {}
    done: list[dict] = []
    t0 = time.perf_counter()

    def submit():
        i, p = pending.pop(0)
        params = SamplingParams(
            temperature=p.get("temperature", 0.0),
            seed=p.get("seed"),
            max_tokens=max_tokens,
            ignore_eos=True,
            output_kind=RequestOutputKind.DELTA,
        )
        rid = f"c{concurrency}-{i}"
        engine.add_request(rid, p["prompt"], params)
        live[rid] = {"i": i, "greedy": not p.get("temperature"), "t_submit": time.perf_counter(), "steps": []}

    while pending and len(live) < concurrency:
        submit()
    while live:
        for out in engine.step():
            r = live.get(out.request_id)
            if r is None:
                continue
            now = time.perf_counter()
            new = list(out.outputs[0].token_ids) if out.outputs else []
            if new:
                r.setdefault("t_first", now)
                r["steps"].append(new)
            if out.finished:
                r["t_end"] = now
                done.append(live.pop(out.request_id))
                if pending:
                    submit()
    wall = time.perf_counter() - t0
    d = delta(before, counters(llm))
    reqs = []
    for r in sorted(done, key=lambda r: r["i"]):
        tokens = [t for s in r["steps"] for t in s]
        decode_steps = r["steps"][1:]  # the first output comes from the prefill
        n = len(tokens)
        reqs.append(
            {
                "i": r["i"],
                "greedy": r["greedy"],
                "tokens": tokens if r["greedy"] else None,
                "n": n,
                "ttft_s": round(r["t_first"] - r["t_submit"], 4),
                "tpot_ms": round(1e3 * (r["t_end"] - r["t_first"]) / max(n - 1, 1), 3),
                # tokens per decode step; the last step may be cut short by max_tokens
                "acceptance_length": round(sum(len(s) for s in decode_steps) / max(len(decode_steps), 1), 3),
            }
        )
    n_out = sum(r["n"] for r in reqs)
    tpot = [r["tpot_ms"] for r in reqs]
    ttft = [r["ttft_s"] for r in reqs]

    def acc(rows):
        return round(statistics.mean(r["acceptance_length"] for r in rows), 3) if rows else None

    return {
        "concurrency": concurrency,
        "requests": len(reqs),
        "wall_s": round(wall, 3),
        "tok_s": round(n_out / wall, 1),
        "ttft_s": {"p50": _pct(ttft, 0.5), "p99": _pct(ttft, 0.99)},
        "tpot_ms": {"p50": _pct(tpot, 0.5), "p99": _pct(tpot, 0.99)},
        "acceptance_length": {
            "greedy": acc([r for r in reqs if r["greedy"]]),
            "sampled": acc([r for r in reqs if not r["greedy"]]),
        },
        "counters": d,
        "per_request": reqs,
    }


# --------------------------------------------------------------------------- report


def _identity(plain: dict, other: dict) -> str:
    """Greedy requests whose tokens equal the plain engine's at the same concurrency."""
    a = {r["i"]: r["tokens"] for r in plain["per_request"] if r["greedy"]}
    b = {r["i"]: r["tokens"] for r in other["per_request"] if r["greedy"]}
    same = sum(1 for i in a if a[i] == b.get(i))
    return f"{same}/{len(a)}"


def report(paths: list, out, command: str, keep_raw: bool = False) -> str:
    """Markdown + JSON + plot from the load cases' result files (one engine each, one run)."""
    import datetime
    import gzip
    import json
    import re
    from pathlib import Path

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = [
        f for p in map(Path, paths) for f in (sorted([*p.glob("*.json"), *p.glob("*.json.gz")]) if p.is_dir() else [p])
    ]
    files = [f for f in files if not f.name.endswith(".case.json")]
    cases = [json.loads(gzip.decompress(f.read_bytes()) if f.suffix == ".gz" else f.read_text()) for f in files]
    cases = [c for c in cases if "load" in c]
    if keep_raw:  # the cases' own result files beside the report, compressed (per-request tokens)
        (out / "raw").mkdir(exist_ok=True)
        for c in cases:
            data = json.dumps(c, separators=(",", ":")).encode()
            (out / "raw" / f"{c['case']['name']}.json.gz").write_bytes(gzip.compress(data, mtime=0))
    if not cases:
        raise ValueError(f"no load results among {[str(p) for p in paths]}")
    cases.sort(key=lambda c: (c["case"].get("spec") is not None, c["case"]["name"]))
    plain = next((c for c in cases if not c["case"].get("spec")), None)
    base = {row["concurrency"]: row for row in plain["load"]} if plain else {}
    first = cases[0]
    gpus = sorted(
        {
            m.group(1)
            for c in cases
            for ln in c.get("log_lines", [])
            if (m := re.search(r"self-check passed on (.+?) \(sm_", ln))
        }
    )
    lines = [
        f"# Speculation under a serving load: vLLM {first['vllm']} ({first['engine_route']}) on "
        f"{', '.join(gpus) or 'an unnamed device'}",
        "",
        f"Command: `{command}`",
        f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC (cases measured "
        f"{min(c['date'] for c in cases)} … {max(c['date'] for c in cases)})",
        "",
        "One engine per mode, measured one at a time on the same GPU. Concurrency c: c requests in flight,",
        "each finished one replaced at once (benchmarks/engine_load.py). Ratios against the plain engine at",
        "the same concurrency. Acceptance length: tokens per decode step, per request (from the engine's",
        "outputs), mean over greedy and over sampled requests. Greedy identical: greedy requests whose",
        "tokens equal the plain engine's at the same concurrency.",
        "",
        "| mode | c | requests | tok/s | ratio | TTFT p50 / p99 (s) | TPOT p50 / p99 (ms) "
        "| acceptance length greedy / sampled | draft tokens per output token | preemptions | greedy identical |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    summary = []
    for c in cases:
        name = c["case"]["name"]
        for row in c["load"]:
            b = base.get(row["concurrency"])
            ratio = row["tok_s"] / b["tok_s"] if b else None
            n_out = sum(r["n"] for r in row["per_request"])
            dpt = row["counters"]["draft_tokens"] / n_out if n_out else 0
            al = row["acceptance_length"]
            ident = _identity(b, row) if b and c is not plain else "-"
            lines.append(
                f"| {name} | {row['concurrency']} | {row['requests']} | {row['tok_s']} | "
                f"{'-' if ratio is None else f'{ratio:.2f}'} | {row['ttft_s']['p50']} / {row['ttft_s']['p99']} | "
                f"{row['tpot_ms']['p50']} / {row['tpot_ms']['p99']} | {al['greedy']} / {al['sampled']} | "
                f"{dpt:.2f} | {row['counters']['preemptions']} | {ident} |"
            )
            summary.append(
                {
                    "mode": name,
                    "concurrency": row["concurrency"],
                    "tok_s": row["tok_s"],
                    "ratio": ratio,
                    "acceptance_length": al,
                    "draft_tokens_per_output_token": round(dpt, 3),
                    "preemptions": row["counters"]["preemptions"],
                    "greedy_identical": ident,
                }
            )
    captures = [
        f"{c['case']['name']}: {ln.split('[graphs.py')[0].split(' INFO ')[-1].strip()} {ln.split('for ', 1)[-1]}"
        for c in cases
        for ln in c.get("log_lines", [])
        if "draft step captured" in ln
    ]
    if captures:
        lines += [
            "",
            "Draft-step CUDA graphs captured while serving (first use of each batch size; each capture stalls",
            "the engine): compare their times with the cases' measurement windows (`date` in raw/).",
            "",
            "```",
            *captures,
            "```",
        ]
    kv = [f"{c['case']['name']}: {c['kv_cache_tokens']} tokens" for c in cases if c.get("kv_cache_tokens")]
    if kv:
        lines += [
            "",
            "KV cache per engine, in tokens (every engine gets the same kv_cache_memory_bytes; a drafter's",
            "layers take part of it): read beside the preemptions.",
            "",
            "```",
            *kv,
            "```",
        ]
    traced = [c for c in cases if c.get("guard_steps")]
    if traced:
        lines += [
            "",
            "The step times the guard was fed (warm-up and every concurrency; `guard_steps` in raw/), in ms, by",
            "batch-size bucket and k. Where steps overlap the guard times a step as the gap between two outputs:",
            "gaps far below a plain engine's time per output token mean outputs came back close together.",
            "",
            "| mode | requests | k | steps | min | p10 | median | mean | p90 |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for c in traced:
            for bucket, by_k in c["guard_steps"].items():
                for k, st in by_k.items():
                    lines.append(
                        f"| {c['case']['name']} | {bucket} | {k} | {st['n']} | {st['min']} | {st['p10']} | "
                        f"{st['median']} | {st['mean']} | {st['p90']} |"
                    )
    guard_lines = sorted({ln for c in cases for ln in c.get("log_lines", []) if "speculation guard" in ln})
    if guard_lines:
        lines += ["", "The speculation guard's decisions (engine log):", "", "```", *guard_lines, "```"]
    (out / "load.md").write_text("\n".join(lines) + "\n")
    (out / "load.json").write_text(
        json.dumps(
            {"command": command, "vllm": first["vllm"], "route": first["engine_route"], "rows": summary}, indent=1
        )
    )
    fig, ax = plt.subplots(figsize=(7, 4))
    for c in cases:
        xs = [r["concurrency"] for r in c["load"]]
        ax.plot(xs, [r["tok_s"] for r in c["load"]], marker="o", label=c["case"]["name"])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("requests in flight")
    ax.set_ylabel("output tokens/s, all requests")
    ax.set_title(f"vLLM {first['vllm']}: throughput under load")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "load.png", dpi=110)
    return "\n".join(lines)


if __name__ == "__main__":
    import argparse
    import sys

    ap = argparse.ArgumentParser(description="report the load cases of a GPU suite")
    ap.add_argument("results", nargs="+", help="case result files or folders of them")
    ap.add_argument("--out", required=True)
    ap.add_argument("--keep-raw", action="store_true", help="copy the case results into OUT/raw (gzip)")
    a = ap.parse_args()
    print(report(a.results, a.out, " ".join(["python", *sys.argv]), keep_raw=a.keep_raw))
