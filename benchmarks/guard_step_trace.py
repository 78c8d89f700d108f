"""Bench-only patch: every step time the speculation guard is fed, written down.

Why: under Model Runner V2 (vLLM 0.26, H100) the guard once costed a step at k = 0 at 0.45 ms,
below what that engine's steps take (~2 ms), and flipped its k four times in two seconds. The
guard times a step as the gap between two outputs where steps overlap; whether outputs arrive in
bursts there is what this trace shows. ``GUARD_STEP_LOG``: a JSON-lines file, one line per
observed step: {"batch": requests, "k": k, "ms": step time}. Loaded into the engine's process
through VLLM_K2_EXTRA_PATCH_MODULES; ``summarize`` turns the file into per-bucket statistics
(the load case puts them into its result file).
"""

import json
import os
import statistics

from vllm_k2_plugin.patching import REGISTRY


def wrap_observe_step(original):
    def observe_step(self, batch, k, step_ms):
        with open(os.environ["GUARD_STEP_LOG"], "a") as f:
            f.write(json.dumps({"batch": batch, "k": k, "ms": round(step_ms, 4)}) + "\n")
        return original(self, batch, k, step_ms)

    return observe_step


def summarize(path: str) -> dict[str, dict[str, dict[str, float]]]:
    """{bucket: {k: n, min, p10, median, mean, p90 (ms)}} of a trace; buckets as the guard's
    (1, 2-3, 4-7, ...: named by their smallest batch)."""
    from vllm_k2_plugin.spec_guard.controller import bucket_of

    samples: dict[tuple[int, int], list[float]] = {}
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            samples.setdefault((bucket_of(row["batch"]), row["k"]), []).append(row["ms"])
    out: dict[str, dict[str, dict[str, float]]] = {}
    for (bucket, k), ms in sorted(samples.items()):
        ms.sort()
        out.setdefault(f"{1 << bucket}+", {})[str(k)] = {
            "n": len(ms),
            "min": ms[0],
            "p10": ms[len(ms) // 10],
            "median": round(statistics.median(ms), 4),
            "mean": round(statistics.fmean(ms), 4),
            "p90": ms[(9 * len(ms)) // 10],
        }
    return out


def _apply(ctx):
    guard = ctx.target()
    ctx.wrap(guard, "observe_step", wrap_observe_step)


REGISTRY.patch(
    name="bench-guard-step-trace",
    feature="benchmarks",
    target="vllm_k2_plugin.spec_guard.controller:SpecGuard",
    applies_to=">=0.16",
    upstream="n/a (benchmark fixture)",
    why="the step times the guard decides on, to check how it times overlapping steps",
    remove_when="never (benchmark only)",
)(_apply)
