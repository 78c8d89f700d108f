"""Records every draft the model runner proposes (one JSON line per step: request id ->
drafted tokens) to the file named by DRAFT_RECORD. Loaded through VLLM_K2_EXTRA_PATCH_MODULES=tests.draft_recorder."""

import json
import os

from vllm_k2_plugin.patching import REGISTRY


def _record(ctx):
    from vllm.v1.worker import gpu_model_runner

    def make(original):
        def propose_draft_token_ids(self, *args, **kwargs):
            drafts = original(self, *args, **kwargs)
            rows = drafts.tolist() if hasattr(drafts, "tolist") else [list(r) for r in drafts]
            reqs = list(self.input_batch.req_ids)[: len(rows)]
            with open(os.environ["DRAFT_RECORD"], "a") as f:
                f.write(json.dumps(dict(zip(reqs, rows, strict=True))) + "\n")
            return drafts

        return propose_draft_token_ids

    ctx.wrap(gpu_model_runner.GPUModelRunner, "propose_draft_token_ids", make)


REGISTRY.patch(
    name="test-draft-recorder",
    feature="tests",
    target="vllm.v1.worker.gpu_model_runner:GPUModelRunner.propose_draft_token_ids",
    applies_to=">=0.1",
    upstream="n/a (test fixture)",
    why="compares the drafts of two engines step by step",
    remove_when="never (test only)",
)(_record)
