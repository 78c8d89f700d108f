"""vLLM-CPU verifies sampled requests' drafts against garbage target probabilities.

Before the rejection sampler verifies drafts, vLLM repeats each request's temperature (and top-k,
top-p) over its draft tokens (``expand_batch_to_tokens``). On the CPU platform that is a C++ op
behind a Python adapter (``vllm.utils.cpu_triton_utils._expand_kernel_impl``) which hands the
op int64 *copies* of the float output and input and never copies the result back: the expanded
temperatures are whatever the fresh tensor held (seen: -1.3e6, 4.6e-41, 2.0e34). Every batch
with a sampled request divides its target logits by those values, so sampled requests accept
almost nothing and greedy requests in the same batch lose their drafts too (measured on vLLM-CPU
0.32 with hand-made logits that agree with every draft: 3.0 of 3 drafts accepted when all
requests are greedy; 1.0 for sampled requests and 1.03 for a greedy request beside one: a one-off
script, not kept; tests/test_cpu_rejection_expand.py asserts the same pass/fail per case. Served:
benchmarks/results/load_cpu/README.md).

Fix, on the CPU platform only: the expansion in torch (repeat each value over its request's
tokens, then the replacement), which is what the GPU kernel computes.
"""

from __future__ import annotations

from ..patching import REGISTRY, PatchContext

MODULE = "vllm.v1.sample.rejection_sampler"


def _cpu_only() -> str | None:
    from vllm.platforms import current_platform

    return None if current_platform.is_cpu() else "only vLLM-CPU's expand adapter loses its output"


def expand_batch_to_tokens(x, cu_num_tokens, num_tokens: int, replace_from=0, replace_to=0):
    """[num_tokens]: x[i] over request i's tokens (cu_num_tokens: cumulative ends), with
    replace_from replaced by replace_to. Tokens past the last request's end are left unset, as
    the GPU kernel leaves them."""
    import torch

    ends = cu_num_tokens.to(torch.int64)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    out = x.new_empty(num_tokens)
    values = x.masked_fill(x == replace_from, replace_to)
    total = int(ends[-1]) if ends.numel() else 0
    out[:total] = torch.repeat_interleave(values, counts, output_size=total)
    return out


def _upstream_expands_on_cpu() -> bool:
    """vLLM-CPU's own expand adapter on two requests' float temperatures: upstream has this
    if it writes the values into the output it was given."""
    import torch
    from vllm.utils import cpu_triton_utils

    out = torch.full((4,), -7.0)
    try:
        cpu_triton_utils._expand_kernel_impl(out, torch.tensor([0.0, 0.5]), torch.tensor([1, 4]), 0, 1)
    except Exception:  # noqa: BLE001 - an adapter that cannot take float values is not a fix either
        return False
    return out.tolist() == [1.0, 0.5, 0.5, 0.5]


@REGISTRY.patch(
    name="cpu-rejection-expand",
    feature="cpu",
    target="vllm.utils.cpu_triton_utils:_expand_kernel_impl",
    applies_to=">=0.17,<0.34",  # 0.16's CPU engine cannot speculate: no adapter, nothing to fix
    why_range_ends="vLLM 0.34 removed its v1 model runner, whose drafts this sampler verifies",
    only_if=_cpu_only,
    already_upstream=_upstream_expands_on_cpu,
    upstream="to report (docs/upstream-reports/cpu-rejection-expand.md)",
    why="vLLM-CPU's rejection sampler divides sampled batches' target logits by uninitialised memory",
    remove_when="vLLM-CPU's _expand_kernel_impl writes its float output (the probe sees the values)",
)
def _apply(ctx: PatchContext) -> None:
    from vllm.v1.sample import rejection_sampler

    ctx.target()  # the broken adapter: a release without it is not-applicable
    ctx.replace(rejection_sampler, "expand_batch_to_tokens", expand_batch_to_tokens)
