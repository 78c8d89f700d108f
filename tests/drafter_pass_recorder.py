"""Records, per model-runner step of a speculative engine, the step's k, its drafts, whether
it was a pure decode step (and one token per request: nothing to verify), how many times the
drafter's ``propose`` and the rejection sampler ran, and how many times the engine core
asked the runner for drafts since the previous step (``take_draft_token_ids``: the previous
step's drafts), whether the step's attention metadata covered the drafter's layers, and how
many times the drafts' copy stream waited for the step's device work (a copy of drafts from
the device; zeroing the CPU buffer does not wait) (one JSON line per step) to the file named by
DRAFTER_PASS_RECORD.
Loaded through VLLM_K2_EXTRA_PATCH_MODULES=tests.drafter_pass_recorder."""

import json
import os

from vllm_k2_plugin.patching import REGISTRY


def _record(ctx):
    from vllm.v1.sample import rejection_sampler
    from vllm.v1.spec_decode import llm_base_proposer
    from vllm.v1.worker import gpu_model_runner

    from vllm_k2_plugin.spec_guard.drafter_off import drafter_layer_names

    passes, rejections, takes, copy_waits = [0], [0], [0], [0]
    drafter_builds = [0]

    class CountingStream:
        def __init__(self, stream):
            self.stream = stream

        def wait_stream(self, other):
            copy_waits[0] += 1
            return self.stream.wait_stream(other)

        def __getattr__(self, name):
            return getattr(self.stream, name)

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

    def wrap_builders(original):
        """Counts the runner's metadata builds for attention groups of the drafter's layers only
        (on instances: the runner's own methods are the plugin's to wrap)."""

        def initialize_metadata_builders(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            names = drafter_layer_names(self.drafter) if self.speculative_config is not None else set()
            for groups in self.attn_groups:
                for group in groups:
                    if names and set(group.layer_names) <= names:
                        for builder in group.metadata_builders:
                            builder.build = counting(builder.build)
            return result

        return initialize_metadata_builders

    def counting(build):
        def counted(*args, **kwargs):
            drafter_builds[0] += 1
            return build(*args, **kwargs)

        return counted

    def wrap_sample_tokens(original):
        def sample_tokens(self, *args, **kwargs):
            state = self.execute_model_state
            stream = self.draft_token_ids_copy_stream
            if stream is not None and not isinstance(stream, CountingStream):
                self.draft_token_ids_copy_stream = CountingStream(stream)
            built_for_drafter = drafter_builds[0] > 0  # by this step's execute_model
            passes[0] = rejections[0] = copy_waits[0] = 0
            takes_before, takes[0] = takes[0], 0
            result = original(self, *args, **kwargs)
            drafter_builds[0] = 0
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
                    "drafter_metadata": built_for_drafter,
                    "draft_copy_waits": copy_waits[0],
                }
                with open(os.environ["DRAFTER_PASS_RECORD"], "a") as f:
                    f.write(json.dumps(line) + "\n")
            return result

        return sample_tokens

    ctx.wrap(llm_base_proposer.SpecDecodeBaseProposer, "propose", wrap_propose)
    ctx.wrap(gpu_model_runner.GPUModelRunner, "sample_tokens", wrap_sample_tokens)
    ctx.wrap(rejection_sampler.RejectionSampler, "forward", wrap_rejection)
    ctx.wrap(gpu_model_runner.GPUModelRunner, "take_draft_token_ids", wrap_take)
    ctx.wrap(gpu_model_runner.GPUModelRunner, "initialize_metadata_builders", wrap_builders)


REGISTRY.patch(
    name="test-drafter-pass-recorder",
    feature="tests",
    target="vllm.v1.worker.gpu_model_runner:GPUModelRunner.sample_tokens",
    applies_to=">=0.17",
    upstream="n/a (test fixture)",
    why="shows which steps ran the drafter",
    remove_when="never (test only)",
)(_record)
