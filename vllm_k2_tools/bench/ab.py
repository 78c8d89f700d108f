"""A/B(/C...) of speculative-decoding modes against one model, in alternating rounds."""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass, field

from tqdm import tqdm

from vllm_k2_plugin.settings import ENV_SPEC_GUARD

from .client import run_load
from .metrics import kv_cache_tokens, scrape
from .server import ServerFailed, vllm_server


@dataclass
class Mode:
    name: str
    spec: dict | None  # --speculative-config, None for the baseline
    url: str | None = None  # a server the user already runs
    env: dict = field(default_factory=dict)  # set for this mode's server

    @classmethod
    def parse(cls, text: str, k: int = 3) -> Mode:
        """baseline | ngram[:k] | eagle3=DRAFT_DIR[:k] | NAME={json} | NAME@http://host:port;
        a speculative mode speculates with its fixed k unless it ends in ``+guard`` (the
        speculation guard picks k per step)."""
        guard = text.endswith("+guard")
        mode = cls._parse(text[: -len("+guard")] if guard else text, k)
        if mode.spec is not None:
            mode.env = {ENV_SPEC_GUARD: "1" if guard else "0"}
            mode.name += "+guard" if guard else ""
        elif guard:
            raise ValueError(f"--mode {text!r}: +guard needs a speculative mode")
        return mode

    @classmethod
    def _parse(cls, text: str, k: int) -> Mode:
        if "@http" in text:
            name, url = text.split("@", 1)
            return cls(name, None, url.rstrip("/"))
        if text == "baseline":
            return cls("baseline", None)
        if text.startswith("ngram"):
            kk = int(text.split(":", 1)[1]) if ":" in text else k
            spec = {"method": "ngram", "num_speculative_tokens": kk, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
            return cls(f"ngram-k{kk}", spec)
        if text.startswith("eagle3="):
            path = text.split("=", 1)[1]
            kk = k
            if ":" in path and path.rsplit(":", 1)[1].isdigit():
                path, kk = path.rsplit(":", 1)[0], int(path.rsplit(":", 1)[1])
            return cls(f"eagle3-k{kk}", {"method": "eagle3", "model": path, "num_speculative_tokens": kk})
        if "=" in text:
            name, raw = text.split("=", 1)
            try:
                return cls(name, json.loads(raw))
            except json.JSONDecodeError as e:
                raise ValueError(f"--mode {name}: invalid --speculative-config JSON ({e})") from e
        raise ValueError(f"--mode {text!r}: expected baseline, ngram[:k], eagle3=DIR[:k], NAME=JSON or NAME@URL")


@dataclass
class ABConfig:
    model: str
    modes: list[Mode]
    prompts: list[dict]
    serve_args: list[str] = field(default_factory=list)
    concurrency: list[int] = field(default_factory=lambda: [1])
    rounds: int = 3
    max_tokens: int = 128
    served_model_name: str = "bench"
    env: dict | None = None


def _percentile(xs: list[float], q: float) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    i = min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))
    return xs[i]


def _summarize(results) -> dict:
    tps = [r.tokens_per_s for r in results]
    ttft = [r.ttft_s for r in results]
    tpot = [r.tpot_s for r in results if r.tpot_s is not None]
    latency = [r.latency_s for r in results]
    out = {
        "requests": len(results),
        "sampled_requests": sum(not r.greedy for r in results),
        "output_tokens": sum(r.output_tokens for r in results),
        "tok_per_s_per_request_median": statistics.median(tps) if tps else None,
        "ttft_s_median": statistics.median(ttft) if ttft else None,
        "tpot_s_median": statistics.median(tpot) if tpot else None,
    }
    for q in (0.5, 0.9, 0.99):
        tag = f"p{round(q * 100)}"
        out[f"ttft_s_{tag}"] = _percentile(ttft, q)
        out[f"tpot_s_{tag}"] = _percentile(tpot, q)
        out[f"latency_s_{tag}"] = _percentile(latency, q)
    return out


def _run_mode(cfg: ABConfig, mode: Mode, url: str) -> dict:
    from .client import chat

    chat(url, cfg.served_model_name, -1, "Hello", 8)  # warm-up, not measured
    before = scrape(url)
    # its KV cache's size in tokens: a drafter's layers share the space, so a speculative server
    # holds fewer tokens in the same memory (read beside its preemptions)
    out = {"by_concurrency": {}, "texts": None, "kv_cache_tokens": kv_cache_tokens(url)}
    for c in cfg.concurrency:
        at_start = scrape(url)
        t0 = time.perf_counter()
        results = run_load(url, cfg.served_model_name, cfg.prompts, c, cfg.max_tokens)
        wall = time.perf_counter() - t0
        s = _summarize(results)
        s["aggregate_tok_per_s"] = s["output_tokens"] / wall if wall > 0 else None
        step = scrape(url) - at_start  # this concurrency's own counters: acceptance under its load
        s["acceptance"], s["preemptions"] = step.derived(), step.preemptions
        out["by_concurrency"][str(c)] = s
        if out["texts"] is None:  # greedy requests' texts (sampled ones may differ between modes)
            out["texts"] = [r.text if r.greedy else None for r in sorted(results, key=lambda r: r.prompt_index)]
    delta = scrape(url) - before
    out["spec_counters"] = {
        "preemptions": delta.preemptions,
        "drafts": delta.drafts,
        "draft_tokens": delta.draft_tokens,
        "accepted_tokens": delta.accepted,
        "accepted_per_position": [delta.per_position[k] for k in sorted(delta.per_position)],
    }
    out["acceptance"] = delta.derived()
    return out


def run_ab(cfg: ABConfig, progress: bool = True) -> dict:
    rounds = []
    steps = [(r, m) for r in range(cfg.rounds) for m in cfg.modes]  # A B C A B C ...
    bar = tqdm(steps, desc="bench ab", unit="mode", disable=not progress)
    for rnd, mode in bar:
        bar.set_postfix_str(f"round {rnd + 1}/{cfg.rounds} {mode.name}")
        if len(rounds) <= rnd:
            rounds.append({})
        try:
            if mode.url:
                rounds[rnd][mode.name] = _run_mode(cfg, mode, mode.url)
            else:
                args = list(cfg.serve_args) + ["--served-model-name", cfg.served_model_name]
                if mode.spec:
                    args += ["--speculative-config", json.dumps(mode.spec)]
                env = {**(cfg.env if cfg.env is not None else os.environ), **mode.env}
                with vllm_server(cfg.model, args, env=env) as url:
                    rounds[rnd][mode.name] = _run_mode(cfg, mode, url)
        except (ServerFailed, OSError, ValueError) as e:
            rounds[rnd][mode.name] = {"error": f"{type(e).__name__}: {e}"[:4000]}
    return {"config": _config_json(cfg), "rounds": rounds, "summary": summarize_rounds(cfg, rounds)}


def _config_json(cfg: ABConfig) -> dict:
    return {
        "model": cfg.model,
        "modes": [{"name": m.name, "speculative_config": m.spec, "url": m.url, "env": m.env} for m in cfg.modes],
        "serve_args": cfg.serve_args,
        "concurrency": cfg.concurrency,
        "rounds": cfg.rounds,
        "max_tokens": cfg.max_tokens,
        "prompts": cfg.prompts,
    }


def summarize_rounds(cfg: ABConfig, rounds: list[dict]) -> dict:
    """Per mode and concurrency: medians over rounds, and the ratio to the baseline
    computed within each round (so drift between rounds cancels), with its spread."""
    base = cfg.modes[0].name
    summary = {}
    for mode in cfg.modes:
        ok = [r[mode.name] for r in rounds if "error" not in r.get(mode.name, {"error": 1})]
        kv = [r.get("kv_cache_tokens") for r in ok if r.get("kv_cache_tokens")]
        entry = {
            "rounds_ok": len(ok),
            "errors": [r[mode.name]["error"] for r in rounds if "error" in r.get(mode.name, {})],
            "kv_cache_tokens": min(kv) if kv else None,  # the same at every start; min if not
        }
        for c in map(str, cfg.concurrency):
            tps = [r["by_concurrency"][c]["tok_per_s_per_request_median"] for r in ok]
            ratios = [
                r[mode.name]["by_concurrency"][c]["tok_per_s_per_request_median"]
                / r[base]["by_concurrency"][c]["tok_per_s_per_request_median"]
                for r in rounds
                if "error" not in r.get(mode.name, {"error": 1}) and "error" not in r.get(base, {"error": 1})
            ]
            both = [
                r
                for r in rounds
                if "error" not in r.get(mode.name, {"error": 1}) and "error" not in r.get(base, {"error": 1})
            ]
            pairs = [
                (
                    r[mode.name]["by_concurrency"][c].get("aggregate_tok_per_s"),
                    r[base]["by_concurrency"][c].get("aggregate_tok_per_s"),
                )
                for r in both
            ]
            agg = [a / b for a, b in pairs if a and b]
            entry[c] = {
                "tok_per_s_median": statistics.median(tps) if tps else None,
                "ratio_vs_baseline_median": statistics.median(ratios) if ratios else None,
                "ratio_vs_baseline_min": min(ratios) if ratios else None,
                "ratio_vs_baseline_max": max(ratios) if ratios else None,
                # throughput of the whole load (what a server with many users sees)
                "aggregate_ratio_vs_baseline_median": statistics.median(agg) if agg else None,
                "preemptions": sum(r["by_concurrency"][c].get("preemptions", 0.0) for r in ok),
            }
            for key in ("aggregate_tok_per_s", "ttft_s_p50", "ttft_s_p99", "tpot_s_p50", "tpot_s_p99"):
                xs = [r["by_concurrency"][c].get(key) for r in ok]
                xs = [x for x in xs if x is not None]
                entry[c][f"{key}_median"] = statistics.median(xs) if xs else None
            taus = [(r["by_concurrency"][c].get("acceptance") or {}).get("mean_acceptance_length") for r in ok]
            taus = [t for t in taus if t is not None]
            entry[c]["mean_acceptance_length_median"] = statistics.median(taus) if taus else None
        total = {"drafts": 0.0, "draft_tokens": 0.0, "accepted_tokens": 0.0}
        per_pos: list[float] = []
        for r in ok:
            sc = r["spec_counters"]
            for key in total:
                total[key] += sc[key]
            for i, v in enumerate(sc["accepted_per_position"]):
                per_pos += [0.0] * (i + 1 - len(per_pos))
                per_pos[i] += v
        entry["spec_counters"] = {**total, "accepted_per_position": per_pos}
        d = total["drafts"]
        entry["acceptance"] = {
            "acceptance_rate": total["accepted_tokens"] / total["draft_tokens"] if total["draft_tokens"] else None,
            "mean_acceptance_length": 1 + total["accepted_tokens"] / d if d else None,
            "per_position_acceptance": [v / d for v in per_pos] if d else [],
        }
        summary[mode.name] = entry
    base_texts = next((r[base]["texts"] for r in rounds if "error" not in r.get(base, {"error": 1})), None)
    summary["lossless"] = {  # None: nothing to compare (no baseline, or the mode never ran)
        m.name: (
            None
            if base_texts is None or not summary[m.name]["rounds_ok"]
            else [
                i
                for r in rounds
                if "error" not in r.get(m.name, {"error": 1})
                for i, (a, b) in enumerate(zip(r[m.name]["texts"], base_texts, strict=True))
                if a is not None and b is not None and a != b
            ]
        )
        for m in cfg.modes
    }
    return summary
