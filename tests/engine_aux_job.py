"""Engine job: capture EAGLE-3 aux hidden states from a real vLLM target.

    python tests/engine_aux_job.py JOB.json OUT.pt

Runs where vLLM has no CPU spec decode (0.16): the test installs a recorder on
the target inside the worker (apply_model), asks the patched model for aux layers,
runs prefills (each prompt alone, then all together) and saves what it captured.
"""

import json
import sys


def main(job_path, out_path):
    import functools

    import torch
    from vllm import LLM, SamplingParams

    # Functions sent to workers must be importable there (not __main__ objects).
    from tests.aux_recorder import install_recorder, take_captured

    job = json.load(open(job_path))
    llm = LLM(model=job["model"], **job["llm_kwargs"])
    llm.apply_model(functools.partial(install_recorder, layers=job["layers"]))
    params = SamplingParams(temperature=0.0, max_tokens=1)
    result = {"single": [], "batched": None, "prompt_ids": []}
    for prompt in job["prompts"]:
        out = llm.generate([prompt], params, use_tqdm=False)[0]
        result["prompt_ids"].append(list(out.prompt_token_ids))
        result["single"].append(llm.apply_model(take_captured)[0])
    llm.generate(job["prompts"], params, use_tqdm=False)
    result["batched"] = llm.apply_model(take_captured)[0]
    torch.save(result, out_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
