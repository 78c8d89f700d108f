"""Build a fixture in this process, then fork as vLLM forks its engine core on a CUDA
machine, and have the child allocate what the GPU model runner allocates first: vLLM's
own ``CpuGpuBuffer`` for ``inputs_embeds`` (max_num_tokens x hidden, bf16), the line an
engine of the trained tiny target hung on (issue 37 item 1, H200 stacks in
benchmarks/results/engine_startup_h200/).

    python tests/fork_after_fixture_job.py OUT_DIR RESULT.json

RESULT: {"method": vLLM's start method here, "child": "ok" | "hung" | "exit N"}.
"""

import json
import os
import sys


def fill_like_the_model_runner(hidden: int) -> None:
    import torch
    from vllm.v1.utils import CpuGpuBuffer

    # 8192: vLLM's default max_num_batched_tokens, the runner's max_num_tokens
    CpuGpuBuffer(8192, hidden, dtype=torch.bfloat16, device=torch.device("cpu"), pin_memory=False, with_numpy=False)


def main(out_dir: str, result_path: str) -> None:
    from vllm_k2_tools.fixtures import build_fixture

    target = build_fixture("trained-text", os.path.join(out_dir, "target"))
    with open(os.path.join(target, "config.json")) as f:
        hidden = json.load(f)["hidden_size"]
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
        json.dump({"method": ctx.get_start_method(), "child": fate}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
