"""Does a vLLM engine with our patches come up? Start engines side by side, each in a
session of its own with a deadline; one that is not serving by then has every one of
its Python processes' stacks written (SIGUSR1, stack_dump_site/sitecustomize.py) and is
killed. Written for issue 37 item 1 (an engine of the trained tiny target that never
started on the H200 with every patch on).

    python3 benchmarks/engine_startup/run.py --out DIR --deadline 200 \
        all= no-rope=VLLM_K2_DISABLE_PATCHES=rope-float32-cache spawn=VLLM_WORKER_MULTIPROC_METHOD=spawn

Each variant is NAME=[VAR=VAL[;VAR=VAL...]]; ENGINE_STARTUP_OMP_BEFORE=1 has the
process run a parallel torch op (GNU OpenMP workers) before it starts the engine. Per variant DIR/NAME.log (engine log),
DIR/NAME.json (up, seconds to first token, greedy tokens) and DIR/NAME/stack-*.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def child(result: Path, model_dir: Path) -> None:
    """The engine as a user starts it (issue 37's repro): the fixture, then LLM(...)."""
    t0 = time.time()
    from vllm_k2_tools.fixtures import build_fixture

    target = build_fixture("trained-text", str(model_dir))
    if os.environ.get("ENGINE_STARTUP_OMP_BEFORE") == "1":  # a user's own torch CPU work before LLM(...)
        import torch

        torch.randn(1 << 22).sum()
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=target,
        dtype="bfloat16",
        max_model_len=2048,
        max_num_seqs=4,
        gpu_memory_utilization=0.10,
        seed=0,
        disable_log_stats=False,
        enable_prefix_caching=False,
    )
    t_up = time.time() - t0
    out = llm.generate(["def fibonacci(n):"], SamplingParams(temperature=0.0, max_tokens=16))
    result.write_text(json.dumps({"up": True, "up_s": round(t_up, 1), "tokens": list(out[0].outputs[0].token_ids)}))
    print("ENGINE UP", flush=True)
    os.killpg(0, signal.SIGKILL)  # the engine core goes with us; the runner needs no teardown


def driver_state() -> dict:
    """Has this process initialised the CUDA driver (cuInit), and does it hold a context?
    Asked through the driver itself: cuDevicePrimaryCtxGetState answers
    CUDA_ERROR_NOT_INITIALIZED (3) before cuInit, and initialises nothing."""
    import ctypes
    import threading

    import torch

    lib = ctypes.CDLL("libcuda.so.1")
    flags, active = ctypes.c_uint(), ctypes.c_int()
    rc = lib.cuDevicePrimaryCtxGetState(0, ctypes.byref(flags), ctypes.byref(active))
    return {
        "cuInit_done": rc != 3,
        "primary_ctx_active": bool(active.value) if rc == 0 else None,
        "torch_cuda_initialized": torch.cuda.is_initialized(),
        "threads": sorted(t.name for t in threading.enumerate()),
    }


def probe(result: Path) -> None:
    """What each of our patches does to the LLM process before vLLM starts its engine core:
    the driver's state after each patch is applied, in the registry's order."""
    states = {"after_import_torch": driver_state()}
    import vllm  # noqa: F401

    states["after_import_vllm"] = driver_state()
    from vllm_k2_plugin.features import load_feature_patches
    from vllm_k2_plugin.patching import REGISTRY
    from vllm_k2_plugin.settings import Settings

    settings = Settings.from_env()
    load_feature_patches(settings.extra_patch_modules)
    states["after_loading_features"] = driver_state()
    for patch in REGISTRY:
        REGISTRY._apply_one(patch, settings.disabled_patches)
        states[f"after {patch.name} ({patch.state.value})"] = driver_state()
    result.write_text(json.dumps(states, indent=1))


def start(name: str, env_spec: str, out: Path, model_dir: Path) -> tuple[subprocess.Popen, Path]:
    dump = out / name
    dump.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, STACK_DUMP_DIR=str(dump), PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE / "stack_dump_site"), str(REPO), env.get("PYTHONPATH")]))
    for pair in filter(None, env_spec.split(";")):
        key, _, value = pair.partition("=")
        env[key] = value
    log = open(out / f"{name}.log", "w")  # noqa: SIM115 - closed when the runner exits
    cmd = [sys.executable, __file__, "child", str(out / f"{name}.json"), str(model_dir)]
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True), dump


def dump_and_kill(proc: subprocess.Popen) -> None:
    """SIGUSR1 to every process of the variant's session, then SIGKILL to the session."""
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    members = []
    for pid in pids:
        try:
            if os.getsid(pid) == proc.pid:
                members.append(pid)
        except OSError:
            continue
    for pid in members:
        try:
            os.kill(pid, signal.SIGUSR1)
        except OSError:
            pass
    time.sleep(3)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.wait()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        child(Path(sys.argv[2]), Path(sys.argv[3]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "probe":
        probe(Path(sys.argv[2]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--deadline", type=float, default=200, help="seconds for an engine to serve its first request")
    ap.add_argument(
        "--sequential",
        action="store_true",
        help="one engine at a time (each sizes its KV cache "
        "from the GPU's free memory: engines side by side can starve each other)",
    )
    ap.add_argument(
        "--fresh-fixture",
        action="store_true",
        help="each engine's process builds its own fixture "
        "first, as a user's script does (else one is built beforehand and reused)",
    )
    ap.add_argument("variants", nargs="+", help="NAME=[VAR=VAL[;VAR=VAL...]]")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    model_dir = a.out / "target"
    if not a.fresh_fixture:
        from vllm_k2_tools.fixtures import build_fixture

        build_fixture("trained-text", str(model_dir))  # once, before the engines race for it
    variants = [spec.partition("=")[::2] for spec in a.variants]
    batches = [[v] for v in variants] if a.sequential else [variants]
    procs, hung = {}, set()
    for batch in batches:
        for name, env_spec in batch:
            target = a.out / f"target-{name}" if a.fresh_fixture else model_dir
            procs[name] = start(name, env_spec, a.out, target)
        t0 = time.time()
        pending = {name: procs[name] for name, _ in batch}
        while pending and time.time() - t0 < a.deadline:
            for name, (proc, _) in list(pending.items()):
                if proc.poll() is not None:
                    del pending[name]
            time.sleep(1)
        for name, (proc, _) in pending.items():
            hung.add(name)
            dump_and_kill(proc)
    summary = {}
    for name in procs:
        res_path = a.out / f"{name}.json"
        res = json.loads(res_path.read_text()) if res_path.exists() else {"up": False}
        res["hung"] = name in hung
        res["reached_load_model"] = "Starting to load model" in (a.out / f"{name}.log").read_text(errors="replace")
        summary[name] = res
        print(f"VARIANT {name}: {json.dumps(res)}", flush=True)
    (a.out / "summary.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
