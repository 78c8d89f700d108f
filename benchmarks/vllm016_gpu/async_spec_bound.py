"""Bench-only, vLLM 0.16, dummy weights only: the speculative step without its start-of-step wait.

With async scheduling and EAGLE, 0.16's ``_update_states`` waits for the previous step's
count of valid sampled tokens (a copy recorded after its rejection sampler) before it can set
each request's computed tokens; the host's input preparation runs after that wait while the
GPU drains the previous drafter and then idles (profiled: ~2 ms idle per 4k step on the
24-layer slice). vLLM >= 0.18 assumes every draft accepted and corrects on the GPU instead
(vllm-project/vllm#32951). This module answers "what would that be worth on 0.16" before it
is built: the count is not waited for but taken as "all accepted". Positions then run ahead by
the rejected drafts (dummy weights accept none: 3 a step), so outputs are meaningless and the
KV lands beyond the request's blocks: only step costs of dummy-weight cases mean anything, and
only where the context plus 4 x the generated tokens stays inside max_model_len.
Loaded by ``gpu_engine_e2e.py`` for cases with ``"nosync_bound": True``.
"""

from vllm_k2_plugin.patching import REGISTRY

RUNNER = "vllm.v1.worker.gpu_model_runner"


def _all_accepted(original):
    def counts(self):
        prev = self.input_batch.prev_req_id_to_index
        if self.input_batch.prev_sampled_token_ids is None or not prev:
            return original(self)
        out = [1] * self.input_batch.prev_sampled_token_ids.shape[0]
        for req_id, index in prev.items():
            state = self.requests.get(req_id)
            if state is not None:
                out[index] = 1 + state.prev_num_draft_len
        return out

    return counts


def _no_wait(ctx):
    import importlib

    ctx.target()
    runner = importlib.import_module(RUNNER).GPUModelRunner
    ctx.wrap(runner, "_get_valid_sampled_token_count", _all_accepted)


REGISTRY.patch(
    name="bench-async-spec-nosync-bound",
    feature="benchmarks",
    target=f"{RUNNER}:GPUModelRunner._get_valid_sampled_token_count",
    applies_to=">=0.16,<0.17",
    upstream="n/a (benchmark bound; the real change is vllm-project/vllm#32951)",
    why="bound the speculative step's cost without 0.16's start-of-step wait (dummy weights only)",
    remove_when="never (benchmark only)",
)(_no_wait)
