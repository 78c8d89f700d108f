"""Job: speculators 0.3.0's own generator API on a real vLLM 0.16 engine.

python tests/speculators_job.py JOB.json OUT.pt
"""

import json
import sys
import traceback


def main(job_path, out_path):
    import torch

    job = json.load(open(job_path))
    result = {"ok": False}
    try:
        if job.get("shim", True):
            from vllm_k2_plugin.speculators_compat import enable

            enable()  # applies the shim
        from speculators.data_generation.vllm_hidden_states_generator import VllmHiddenStatesGenerator

        kwargs = dict(max_model_len=job.get("max_model_len", 256))
        if job.get("dtype"):
            kwargs["dtype"] = job["dtype"]
        if job.get("max_num_batched_tokens"):
            kwargs["max_num_batched_tokens"] = job["max_num_batched_tokens"]
        gen = VllmHiddenStatesGenerator(job["model"], **kwargs)
        result["metadata"] = getattr(gen, "capture_metadata", None)
        prompts = job["prompts"]
        result["batched"] = gen.generate(prompts)
        result["single"] = [gen.generate([p])[0] for p in prompts]
        result["batched_again"] = gen.generate(prompts)  # repeated calls (speculators #279)
        if job.get("dataset"):
            from vllm_k2_tools.train.speculators_dataset import generate_dataset

            d = job["dataset"]
            samples = [[(7 * i + j) % 900 + 20 for j in range(5 + i % 23)] for i in range(d["n"])]
            generate_dataset(gen, samples, d["dir"], batch_size=d["batch"], stop_after_shards=d["stop"])
            result["dataset_first"] = json.load(open(d["dir"] + "/manifest.json"))
            generate_dataset(gen, samples, d["dir"], batch_size=d["batch"])
            result["samples"] = samples
        gen.executor.shutdown()
        result["ok"] = True
    except BaseException as e:  # noqa: BLE001 - the test reads the failure
        result.update(error_type=type(e).__name__, error=str(e), traceback=traceback.format_exc())
    torch.save(result, out_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
