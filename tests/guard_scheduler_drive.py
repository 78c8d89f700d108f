"""vLLM's own scheduler, with the plugin registered, driven as its engine core drives it: the
model step is a sleep whose length grows with the step's verify width, the drafts are accepted
always or never, and the drafts a step leaves are handed back as the synchronous engine core
does (or, after a step that skipped the drafter, the zeros 0.16's runner leaves in their place).

    python tests/guard_scheduler_drive.py TARGET DRAFT never:sync [always:async ...]

Prints one JSON line, per case: per step the guard's k, the drafts each request verified, whether the
step skipped the drafter; the guard's decisions; each request's output length.
Used by tests/test_spec_guard_016.py (vLLM 0.16 cannot speculate on the CPU: no engine can).
"""

from __future__ import annotations

import json
import sys
import time

K, REQUESTS, MAX_TOKENS, PROMPT = 3, 4, 160, 40
TOKEN = 11


def step_ms(verify_width: int) -> float:
    """The pretend model step: 3 ms, plus 1 ms per draft verified (a MoE verify costs more)."""
    return 3.0 + 1.0 * verify_width


def main(target: str, draft: str, cases: list[str]) -> dict:
    import torch

    import vllm_k2_plugin

    vllm_k2_plugin.register()
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    from vllm_k2_plugin.patching import REGISTRY

    args = EngineArgs(
        model=target,
        dtype="float32",
        max_model_len=512,
        max_num_seqs=REQUESTS,
        enforce_eager=True,
        enable_prefix_caching=False,
        speculative_config={"method": "eagle3", "model": draft, "num_speculative_tokens": K},
    )
    config = args.create_engine_config()
    config.cache_config.num_gpu_blocks = 512  # the engine core sets it from the profiled memory
    spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64, dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=512, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    states = {n: REGISTRY[n].state.value for n in ("spec-guard", "spec-guard-drafter-off")}
    results = {}
    for case in cases:
        accept, mode = case.split(":")
        results[case] = {"states": states, **drive(config, kv, accept, mode)}
    return results


def drive(config, kv, accept: str, mode: str) -> dict:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    from vllm_k2_plugin.spec_guard.patch import ATTR, drafter_skipped

    cls = AsyncScheduler if mode == "async" else Scheduler
    sched = cls(
        vllm_config=config,
        kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(config),
        block_size=16,
        log_stats=True,
    )
    for i in range(REQUESTS):
        params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.0)
        sched.add_request(Request(f"r{i}", list(range(1, PROMPT + 1 + i)), params, None, eos_token_id=None))
    steps, outputs = [], {f"r{i}": 0 for i in range(REQUESTS)}
    while sched.has_unfinished_requests() and len(steps) < 2000:
        out = sched.schedule()
        drafts = {r: len(d) for r, d in out.scheduled_spec_decode_tokens.items()}
        time.sleep(1e-3 * step_ms(max(drafts.values(), default=0)))
        req_ids = list(out.num_scheduled_tokens)
        sampled = []
        for r in req_ids:
            request = sched.requests[r]
            if request.num_computed_tokens < request.num_tokens:  # a prefill chunk: nothing sampled
                sampled.append([])
            else:
                sampled.append([TOKEN] * (1 + (drafts.get(r, 0) if accept == "always" else 0)))
        skipped = drafter_skipped(out)
        steps.append(
            {
                "k": getattr(out, "num_spec_tokens_to_schedule", None),
                "drafts": drafts,
                "skipped": skipped,
                "batch": len(req_ids),
            }
        )
        result = ModelRunnerOutput(
            req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)}, sampled_token_ids=sampled
        )
        for engine_outputs in sched.update_from_output(out, result).values():
            for o in engine_outputs.outputs:
                outputs[o.request_id] += len(o.new_token_ids)
        if mode == "sync":  # the engine core asks the runner for the step's drafts
            live = [r for r in req_ids if r in sched.requests]
            left = [[0] * K if skipped else [TOKEN] * K for _ in live]
            sched.update_draft_token_ids(DraftTokenIds(live, left))
    state = getattr(sched, ATTR, None)
    return {
        "guard": state is not None,
        "decisions": [(d.bucket, d.old_k, d.new_k) for d in state.guard.decisions] if state else [],
        "steps": steps,
        "outputs": outputs,
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], sys.argv[3:])))
