"""Where the time of one decoding step goes, with and without EAGLE-3, in a real vLLM engine.

Runs the engine in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0) under cProfile and reads
vLLM's own functions from the profile: the engine-core step, the scheduler, the target
model's forward, the drafter's proposal, the rejection sampler. Times are per engine step
(cumulative time / calls of the step function), single stream, greedy. cProfile slows
Python-heavy parts (scheduler, proposer bookkeeping) more than the model's kernels: use
the split, not the absolute tok/s (`vllm-k2 bench ab` measures those without a profiler).

    python benchmarks/eagle3_step_profile.py --target TARGET --draft DRAFT [--k 3] [--prompts FILE]
        [--max-tokens 96] [--with-k0] [--out OUT.json]

``--with-k0`` adds a third engine: the same drafter with vLLM's dynamic speculative decoding
told to schedule k = 0 at every batch size (what the speculation guard picks when drafts
lose), vLLM >= 0.32 only. ``--guard-k0`` runs the baseline and that k = 0 engine with the
speculation guard's patches on (the guard cannot raise k above the schedule's 0), so k = 0
skips the drafter's pass (patch ``spec-guard-drafter-off``); the guard is process-wide,
hence a separate run.

(`--model` and `--json OUT.json` are the earlier spellings of `--target` and `--out`; still accepted.)

Any vLLM version with the V1 engine; on CPU set VLLM_MLA_DISABLE=1 for an MLA target with a
Llama drafter on 0.32 ("No common block size").
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import time

from vllm_k2_plugin import fileio

# (label, file suffix, function name): vLLM's own functions, read from the profile.
PROBES = [
    ("engine step (total)", "v1/engine/core.py", "step"),
    ("scheduler", "v1/core/sched/scheduler.py", "schedule"),
    ("scheduler update", "v1/core/sched/scheduler.py", "update_from_output"),
    ("runner execute_model", "gpu_model_runner.py", "execute_model"),
    ("target forward", "gpu_model_runner.py", "_model_forward"),
    ("runner sample_tokens", "gpu_model_runner.py", "sample_tokens"),
    ("draft: propose_draft_token_ids", "gpu_model_runner.py", "propose_draft_token_ids"),
    ("draft: proposer.propose", ("v1/spec_decode/eagle.py", "v1/spec_decode/llm_base_proposer.py"), "propose"),
    ("draft: drafter model forward", "model_executor/models/llama_eagle3.py", "forward"),
    ("rejection sampler", "v1/sample/rejection_sampler.py", "forward"),
    # vLLM's CPU ops for the speculative step's bookkeeping (Triton kernels on GPU)
    (
        "cpu op: eagle_prepare_inputs_padded",
        "~",
        "<built-in method torch._ops._C.eagle_prepare_inputs_padded_kernel_impl>",
    ),
    (
        "cpu op: eagle_prepare_next_token_padded",
        "~",
        "<built-in method torch._ops._C.eagle_prepare_next_token_padded_kernel_impl>",
    ),
    ("cpu op: rejection_greedy_sample", "~", "<built-in method torch._ops._C.rejection_greedy_sample_kernel_impl>"),
]


def _probe(stats: pstats.Stats) -> dict:
    out = {}
    for label, suffix, name in PROBES:
        best = None
        for (path, _line, func), (_cc, nc, _tt, ct, _callers) in stats.stats.items():
            if func == name and path.endswith(suffix) and (best is None or ct > best[1]):  # suffix: str | tuple
                best = (nc, ct)
        if best:
            out[label] = {"calls": best[0], "seconds": best[1]}
    return out


def run(
    model: str, draft: str | None, k: int, prompts: list[str], max_tokens: int, engine_kwargs: dict, k0: bool = False
) -> dict:
    from vllm import LLM, SamplingParams

    kwargs = dict(engine_kwargs)
    if draft:
        kwargs["speculative_config"] = {"method": "eagle3", "model": draft, "num_speculative_tokens": k}
        if k0:  # vLLM's dynamic speculative decoding: k = 0 at every batch size
            kwargs["speculative_config"]["num_speculative_tokens_per_batch_size"] = [(1, kwargs["max_num_seqs"], 0)]
    llm = LLM(model=model, disable_log_stats=False, **kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    llm.generate(prompts[:1], params)  # warm-up
    prof = cProfile.Profile()
    tokens, t0 = 0, time.perf_counter()
    prof.enable()
    for p in prompts:  # single stream
        tokens += len(llm.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids)
    prof.disable()
    wall = time.perf_counter() - t0
    probes = _probe(pstats.Stats(prof))
    steps = probes.get("engine step (total)", {}).get("calls") or 1
    result = {
        "draft": draft,
        "k": 0 if k0 or not draft else k,
        "tokens": tokens,
        "wall_s": wall,
        "tok_per_s": tokens / wall,
        "engine_steps": steps,
        "tokens_per_step": tokens / steps,
        "per_step_ms": {lab: 1000 * v["seconds"] / steps for lab, v in probes.items()},
        "calls": {lab: v["calls"] for lab, v in probes.items()},
    }
    if draft:
        m = {x.name: getattr(x, "value", None) for x in llm.get_metrics() if "spec_decode" in x.name}
        drafts = m.get("vllm:spec_decode_num_drafts") or 0
        acc = m.get("vllm:spec_decode_num_accepted_tokens") or 0
        result["tau"] = 1 + acc / drafts if drafts else None
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", "--model", dest="target", required=True, help="target model directory")
    ap.add_argument("--draft", required=True)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--prompts", help="JSONL with 'prompt' (chat user message) per line")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--out", "--json", dest="out", help="write the rows here (JSON)")
    ap.add_argument("--with-k0", action="store_true", help="also the drafter scheduled at k = 0 (vLLM >= 0.32)")
    ap.add_argument(
        "--guard-k0",
        action="store_true",
        help="baseline and k = 0 only, with the speculation guard's patches on (vLLM >= 0.32)",
    )
    ap.add_argument(
        "--guard",
        action="store_true",
        help="baseline and the drafter at --k with the speculation guard choosing k per step",
    )
    a = ap.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process: profiled
    # fixed k per engine (the guard would change it mid-run), unless k = 0 under the guard is asked for
    os.environ["VLLM_K2_SPEC_GUARD"] = "1" if a.guard_k0 or a.guard else "0"
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a.target)
    users = [json.loads(x)["prompt"] for x in open(a.prompts)][: a.limit] if a.prompts else ["def fibonacci(n):"]
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": u}], tokenize=False, add_generation_prompt=True)
        for u in users
    ]
    engine = dict(dtype="float32", max_model_len=512, max_num_seqs=4, enforce_eager=True, trust_remote_code=True)
    rows = [run(a.target, None, 0, prompts, a.max_tokens, engine)]
    if not a.guard_k0:
        rows.append(run(a.target, a.draft, a.k, prompts, a.max_tokens, engine))
        rows[-1]["guard"] = "free" if a.guard else None
    if a.with_k0 or a.guard_k0:
        rows.append(run(a.target, a.draft, a.k, prompts, a.max_tokens, engine, k0=True))
        rows[-1]["guard"] = a.guard_k0
    table = _table(rows)
    print(table)
    if a.out:
        # the plugin's switches are part of how it ran (e.g. VLLM_K2_DISABLE_PATCHES)
        env = " ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("VLLM_K2_"))
        command = (env + " " if env else "") + "python benchmarks/eagle3_step_profile.py " + " ".join(sys.argv[1:])
        date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        fileio.write_text(a.out, json.dumps({"command": command, "date": date, "rows": rows}, indent=1))
        md = os.path.splitext(a.out)[0] + ".md"
        fileio.write_text(
            md, f"Written by `{command}` on {date} (cProfile: use the split, not the tok/s).\n\n{table}\n"
        )


def _table(rows: list[dict]) -> str:
    """Markdown: per engine step, each probe's cumulative ms, one column per engine."""
    names = [
        "baseline"
        if not r["draft"]
        else f"eagle3 k={r['k']}"
        + {"free": " (guard picks k)", None: "", False: ""}.get(r.get("guard"), " (guard: drafter off)")
        for r in rows
    ]
    lines = ["| per engine step (ms) | " + " | ".join(names) + " |", "|---" * (len(rows) + 1) + "|"]
    for lab, _suffix, _name in PROBES:
        lines.append(f"| {lab} | " + " | ".join(f"{r['per_step_ms'].get(lab, float('nan')):.2f}" for r in rows) + " |")
    for key in ("tokens_per_step", "tok_per_s"):
        lines.append(f"| {key} | " + " | ".join(f"{r[key]:.2f}" for r in rows) + " |")
    lines.append(
        "| tau (vLLM counters) | " + " | ".join(f"{r['tau']:.2f}" if r.get("tau") else "-" for r in rows) + " |"
    )
    lines.append(
        "| tok/s vs baseline | " + " | ".join(f"{r['tok_per_s'] / rows[0]['tok_per_s']:.2f}" for r in rows) + " |"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
