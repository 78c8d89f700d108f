"""Bench-only patch + report: where a served engine's step goes, per process.

Loaded into `vllm serve`'s processes through VLLM_K2_EXTRA_PATCH_MODULES=served_step_timers
(with ``benchmarks`` on PYTHONPATH) and STEP_TIMERS=<file>: the worker appends one line per
step with the time spent in the model runner's methods, the engine core one line per step with
its ``step`` (schedule, wait for the worker, update) and the draft requests to the worker
since the previous line (``take_draft_token_ids``: the previous step's). Report of a
finished run (one server per process id, in start order):

    python benchmarks/served_step_timers.py report STEP_TIMERS_FILE --out results.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from vllm_k2_plugin.patching import REGISTRY

RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
# methods no other patch of ours wraps (the patch mechanism refuses a second wrapper)
TIMED = (
    "execute_model",
    "_update_states",
    "_prepare_inputs",
    "_preprocess",
    "_model_forward",
    "_calc_spec_decode_metadata",
    "_bookkeeping_sync",
)
_acc: dict[str, float] = {}


def _timed(original):
    name = original.__name__

    def timed(self, *args, **kwargs):
        t = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            _acc[name] = _acc.get(name, 0.0) + time.perf_counter() - t

    return timed


def _flush(role: str, **extra) -> None:
    line = {"role": role, "pid": os.getpid(), "t": time.perf_counter(), **extra}
    line.update({k: round(1e3 * v, 4) for k, v in _acc.items()})
    _acc.clear()
    with open(os.environ["STEP_TIMERS"], "a") as f:
        f.write(json.dumps(line) + "\n")


def _install(ctx) -> None:
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    for name in TIMED:
        if hasattr(GPUModelRunner, name):
            ctx.wrap(GPUModelRunner, name, _timed)

    def sample_tokens(original):  # the step's last runner call: one worker line per step
        def wrapper(self, *args, **kwargs):
            t = time.perf_counter()
            result = original(self, *args, **kwargs)
            _acc["sample_tokens"] = time.perf_counter() - t
            _flush("worker")
            return result

        return wrapper

    def step(original):  # one engine-core line per step that ran the model
        def wrapper(self, *args, **kwargs):
            t = time.perf_counter()
            outputs, executed = original(self, *args, **kwargs)
            if executed:
                _acc["step"] = time.perf_counter() - t
                _flush("engine_core")
            return outputs, executed

        return wrapper

    ctx.wrap(GPUModelRunner, "sample_tokens", sample_tokens)
    ctx.wrap(EngineCore, "step", step)
    ctx.wrap(MultiprocExecutor, "take_draft_token_ids", _timed)


REGISTRY.patch(
    name="bench-served-step-timers",
    feature="benchmarks",
    target=f"{RUNNER}.sample_tokens",
    applies_to=">=0.17",
    upstream="n/a (benchmark instrumentation)",
    why="splits a served step into the worker's runner methods, the scheduler's, and the rest",
    remove_when="never (benchmark only)",
)(_install)


def report(path: str) -> str:
    servers: dict[tuple[str, int], list[dict]] = {}
    for line in open(path):
        row = json.loads(line)
        servers.setdefault((row["role"], row["pid"]), []).append(row)
    out = [
        f"Per-step medians (ms) from `{os.path.basename(path)}`, one server per process id in start order; "
        "'step to step' = median interval between consecutive lines (steps under 200 ms); each "
        "method: median over the steps that called it (n).",
        "",
    ]
    for (role, pid), rows in servers.items():
        ts = [r["t"] for r in rows]
        gaps = [1e3 * (b - a) for a, b in zip(ts, ts[1:], strict=False) if b - a < 0.2]
        keys = sorted({k for r in rows for k in r} - {"role", "pid", "t"})
        cells = ", ".join(
            f"{k} {statistics.median([r[k] for r in rows if k in r]):.3f} (n {sum(k in r for r in rows)})" for k in keys
        )
        out.append(f"- {role} pid {pid}: {len(rows)} steps, step to step {statistics.median(gaps):.3f}; {cells}")
    return "\n".join(out) + "\n"


def main() -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("report")
    r.add_argument("path")
    r.add_argument("--out", required=True)
    args = p.parse_args()
    from vllm_k2_plugin import fileio

    fileio.write_text(args.out, report(args.path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
