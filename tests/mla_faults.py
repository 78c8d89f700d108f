"""Faults injected into our MLA kernel, to prove the start-up self-check's fallback.

Loaded into a process through VLLM_K2_EXTRA_PATCH_MODULES=tests.mla_faults, so the fault
goes through the same patch mechanism as everything else; MLA_FAULT picks it:
  mismatch  the kernel's output is off by one (wrong numbers, no error)
  raise     the launcher raises
  smem      the launcher asks for a variant that needs ~800 KB of shared memory (the table
            is told it fits): a real compile/launch failure on any GPU
"""

import os

from vllm_k2_plugin.patching import REGISTRY

FAULT = os.environ.get("MLA_FAULT", "mismatch")


def _inject(ctx):
    from vllm_k2_plugin.mla import configs, launcher

    if FAULT == "smem":
        huge = (8, 128, 6)
        for fp8 in (False, True):
            ctx.replace_item(configs.VARIANT_SMEM[fp8], huge, 1_000)
            ctx.replace_item(configs.VARIANT_REGS[fp8], huge, 128)
            ctx.replace_item(configs.PREFERENCE, fp8, [huge])
        return

    def make(original):
        def faulty(*args, **kwargs):
            if FAULT == "raise":
                raise RuntimeError("injected launcher fault")
            out, lse = original(*args, **kwargs)
            out.add_(1.0)
            return out, lse

        return faulty

    ctx.wrap(launcher, "mla_decode", make)


REGISTRY.patch(
    name="test-mla-fault",
    feature="tests",
    target="vllm_k2_plugin.mla.launcher:mla_decode",
    applies_to=">=0.1",
    upstream="n/a (test fixture)",
    why="proves the MLA self-check falls back to stock TRITON_MLA",
    remove_when="never (test only)",
)(_inject)
