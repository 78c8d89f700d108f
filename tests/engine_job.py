"""Run real vLLM engine jobs in a fresh process and write their results as JSON.

    python tests/engine_job.py JOB.json RESULT.json

JOB: {"model": path, "prompts": [...], "max_tokens": n, "llm_kwargs": {...}}; optional
"sampling": one SamplingParams keyword dict per prompt (default: greedy, max_tokens, logprobs).
A separate process per engine keeps pytest's own process free of vLLM state and
matches how users start vLLM (spawned engine core and workers; hence the guard).

"in_process": true runs the engine core and worker in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0, the uni executor): two process starts fewer (each
imports torch and vLLM) for tests about an engine's outputs,
not about how vLLM spawns its processes (tests/test_plugin_engine.py covers that).
JOB {"batch": {name: job, ...}}: in-process engines one after another, each torn down
before the next; RESULT {name: result}.
"""

import gc
import json
import os
import sys
import time
import traceback


def main(job_path: str, result_path: str) -> None:
    with open(job_path) as f:
        job = json.load(f)
    if "batch" in job:
        result = {name: run({**one, "in_process": True}, teardown=True) for name, one in job["batch"].items()}
    else:
        result = run(job)
    with open(result_path, "w") as f:
        json.dump(result, f)


def run(job: dict, teardown: bool = False) -> dict:
    result: dict = {"ok": False}
    llm = None
    try:
        kwargs = dict(job.get("llm_kwargs", {}))
        if job.get("in_process"):
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # read when the engine starts
            kwargs["distributed_executor_backend"] = "uni"
        from vllm import LLM, SamplingParams

        t0 = time.time()
        llm = LLM(model=job["model"], **kwargs)
        result["start_s"] = time.time() - t0
        params = SamplingParams(temperature=0.0, max_tokens=job.get("max_tokens", 8), logprobs=job.get("logprobs", 5))
        if "sampling" in job:
            params = [SamplingParams(**one) for one in job["sampling"]]
        outs = llm.generate(job["prompts"], params)
        result["outputs"] = [
            {
                "text": o.outputs[0].text,
                "token_ids": list(o.outputs[0].token_ids),
                "prompt_token_ids": list(o.prompt_token_ids),
                "logprobs": [{str(t): lp.logprob for t, lp in step.items()} for step in (o.outputs[0].logprobs or [])],
            }
            for o in outs
        ]
        import vllm_k2_plugin
        from vllm_k2_plugin.patching import REGISTRY

        if job.get("metrics"):
            result["metrics"] = {
                m.name: getattr(m, "value", None) if getattr(m, "values", None) is None else list(m.values)
                for m in llm.get_metrics()
                if "spec_decode" in m.name
            }
        result["api_process_loads"] = vllm_k2_plugin._LOADS
        result["patches"] = {p.name: p.state.value for p in REGISTRY}
        result["ok"] = True
    except BaseException as e:  # noqa: BLE001 - the test reads the failure
        result["error_type"] = type(e).__name__
        result["error"] = str(e)
        result["traceback"] = traceback.format_exc()
    if teardown:  # the next engine in this process starts from a clean slate
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
    return result


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
