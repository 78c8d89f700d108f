"""Records, per model-runner step of a speculative engine, the step's k, its drafts, whether
it was a pure decode step (and one token per request: nothing to verify), how many times the
drafter's ``propose`` and the rejection sampler ran, and how many times the engine core
asked the runner for drafts since the previous step (``take_draft_token_ids``: the previous
step's drafts) (one JSON line per step) to the file named by DRAFTER_PASS_RECORD.
Loaded through VLLM_K2_EXTRA_PATCH_MODULES=tests.drafter_pass_recorder."""

import json
import os

from vllm_k2_plugin.patching import REGISTRY


def _record(ctx):
    from vllm.v1.sample import rejection_sampler
    from vllm.v1.spec_decode import llm_base_proposer
    from vllm.v1.worker import gpu_model_runner

    passes, rejections, takes = [0], [0], [0]

    def wrap_take(original):
        def take_draft_token_ids(self, *args, **kwargs):
            takes[0] += 1
            return original(self, *args, **kwargs)

        return take_draft_token_ids

    def wrap_rejection(original):
        def forward(self, *args, **kwargs):
            rejections[0] += 1
            return original(self, *args, **kwargs)

        return forward

    def wrap_propose(original):
        def propose(self, *args, **kwargs):
            passes[0] += 1
            return original(self, *args, **kwargs)

        return propose

    def wrap_sample_tokens(original):
        def sample_tokens(self, *args, **kwargs):
            state = self.execute_model_state
            passes[0] = rejections[0] = 0
            takes_before, takes[0] = takes[0], 0
            result = original(self, *args, **kwargs)
            if state is not None and self.speculative_config is not None:
                out = state[0]
                spec = out.scheduled_spec_decode_tokens
                pure = not out.scheduled_new_reqs and all(
                    n == 1 + len(spec.get(req, ())) for req, n in out.num_scheduled_tokens.items()
                )
                one_each = all(n == 1 for n in out.num_scheduled_tokens.values())  # nothing to verify
                line = {
                    "k": int(out.num_spec_tokens_to_schedule),
                    "pure_decode": pure,
                    "one_token_each": one_each,
                    "drafts": sum(len(v) for v in spec.values()),
                    "drafter_passes": passes[0],
                    "rejection_sampler_calls": rejections[0],
                    "draft_requests_for_previous_step": takes_before,
                }
                with open(os.environ["DRAFTER_PASS_RECORD"], "a") as f:
                    f.write(json.dumps(line) + "\n")
            return result

        return sample_tokens

    ctx.wrap(llm_base_proposer.SpecDecodeBaseProposer, "propose", wrap_propose)
    ctx.wrap(gpu_model_runner.GPUModelRunner, "sample_tokens", wrap_sample_tokens)
    ctx.wrap(rejection_sampler.RejectionSampler, "forward", wrap_rejection)
    ctx.wrap(gpu_model_runner.GPUModelRunner, "take_draft_token_ids", wrap_take)


REGISTRY.patch(
    name="test-drafter-pass-recorder",
    feature="tests",
    target="vllm.v1.worker.gpu_model_runner:GPUModelRunner.sample_tokens",
    applies_to=">=0.17",
    upstream="n/a (test fixture)",
    why="shows which steps ran the drafter",
    remove_when="never (test only)",
)(_record)
