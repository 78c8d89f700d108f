"""Bench-only patch: the speculation guard's k follows a fixed schedule, and every step's
acceptance counts are written down (``benchmarks/drafter_off_holes.py``).

``FORCED_K_SCHEDULE`` = "3:16,0:64,3:1000": k 3 for the first 16 scheduler steps, 0 for the
next 64, 3 after. ``FORCED_K_LOG``: a JSON-lines file, one line per step that drafted:
{"step": n, "drafted": [...], "accepted": [...]} per draft position, as vLLM counted them.
Loaded into the engine's process through VLLM_K2_EXTRA_PATCH_MODULES.
"""

import json
import os

from vllm_k2_plugin.patching import REGISTRY

_STEP = [0]


def schedule() -> list[tuple[int, int]]:
    out = []
    for part in os.environ["FORCED_K_SCHEDULE"].split(","):
        k, steps = part.split(":")
        out.append((int(k), int(steps)))
    return out


def forced_k(step: int) -> int:
    for k, steps in schedule():
        if step < steps:
            return k
        step -= steps
    return schedule()[-1][0]


def _apply(ctx):
    state_cls = ctx.target()
    from vllm_k2_plugin.spec_guard.controller import SpecGuard

    def k_for(self, batch):  # once per schedule() where vLLM has no per-step k (0.16 ... 0.24)
        _STEP[0] += 1
        return forced_k(_STEP[0])

    def fill(self, lookup):  # once per schedule() where it has (dynamic_sd_lookup)
        _STEP[0] += 1
        for batch in range(1, len(lookup)):
            lookup[batch] = forced_k(_STEP[0])

    def wrap_observe(original):
        def observe_drafts(self, drafted, accepted):
            if any(drafted):
                with open(os.environ["FORCED_K_LOG"], "a") as f:
                    f.write(json.dumps({"step": _STEP[0], "drafted": list(drafted), "accepted": list(accepted)}) + "\n")
            return original(self, drafted, accepted)

        return observe_drafts

    ctx.replace(state_cls, "k_for", k_for)
    ctx.replace(state_cls, "fill", fill)
    ctx.wrap(SpecGuard, "observe_drafts", wrap_observe)


REGISTRY.patch(
    name="bench-guard-forced-k",
    feature="benchmarks",
    target="vllm_k2_plugin.spec_guard.patch:_State",
    applies_to=">=0.16",
    upstream="n/a (benchmark fixture)",
    why="a fixed k schedule to measure what a stretch at k = 0 does to later drafts",
    remove_when="never (benchmark only)",
)(_apply)
