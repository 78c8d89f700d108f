"""Faults injected into the one-shot all-reduce candidate, to prove the start-up check
refuses it. Loaded through VLLM_K2_EXTRA_PATCH_MODULES=tests.comm_faults (the same patch
mechanism as everything else); COMM_FAULT picks it:
  wrong  rank 0's result is off by one (wrong numbers, no error), eager and in graphs
  slow   every call runs the all-reduce four times (right numbers, 4x the work)
"""

import os

from vllm_k2_plugin.patching import REGISTRY

FAULT = os.environ.get("COMM_FAULT", "wrong")


def _inject(ctx):
    from vllm_k2_plugin.comm import measure

    def make(original):
        def faulty(self, inp):
            if FAULT == "slow":
                for _ in range(3):
                    original(self, inp)
                return original(self, inp)
            out = original(self, inp)
            if self.ca.rank == 0:
                out.add_(1.0)
            return out

        return faulty

    ctx.wrap(measure.OneShot, "run", make)
    ctx.wrap(measure.OneShot, "graph_run", make)


REGISTRY.patch(
    name="test-comm-fault",
    feature="tests",
    target="vllm_k2_plugin.comm.measure:OneShot.run",
    applies_to=">=0.1",
    upstream="n/a (test fixture)",
    why="proves the all-reduce start-up check refuses a wrong or slow candidate",
    remove_when="never (test only)",
)(_inject)
