"""The messages a tensor-parallel engine all-reduces that a one-shot kernel may take.

Each decoder layer all-reduces tokens x hidden values (attention output, MoE output):
14 KiB per token for Kimi-K2.5 (7168 bf16). Decode steps carry the batch, an EAGLE-3
verify step 1 + k tokens per request. vLLM's custom all-reduce runs one-shot below
256 KiB at 8 ranks and 512 KiB at up to 4 (csrc/custom_all_reduce.cuh, both
releases); larger messages (prefill chunks) stay on NCCL and are not measured.
"""

from __future__ import annotations

#: K2.5's text hidden size: the sizes measured when the engine's config is not at hand.
DEFAULT_HIDDEN = 7168
DEFAULT_TOKENS = (1, 2, 4, 8)
#: At most this many sizes are measured at start-up (each costs a few graph replays).
MAX_SIZES = 8


def oneshot_limit(world_size: int) -> int:
    """Bytes below which vLLM's kernel runs its one-stage variant (fully connected dispatch)."""
    return 512 * 1024 if world_size <= 4 else 256 * 1024


def token_counts(max_num_seqs: int, num_speculative_tokens: int) -> list[int]:
    """Decode batches (powers of two up to max_num_seqs) and their verify batches."""
    counts, b = set(), 1
    while b <= max(1, max_num_seqs):
        counts.add(b)
        if num_speculative_tokens:
            counts.add(b * (1 + num_speculative_tokens))
        b *= 2
    return sorted(counts)


def message_sizes(world_size: int, hidden: int, element_size: int, tokens: list[int]) -> list[int]:
    """Ascending byte sizes under the one-shot limit (multiples of 16, as the kernel needs),
    thinned to MAX_SIZES keeping the smallest (single-stream decode) and largest."""
    limit = oneshot_limit(world_size)
    sizes = sorted({t * hidden * element_size for t in tokens if t * hidden * element_size < limit})
    sizes = [s for s in sizes if s % 16 == 0]
    if len(sizes) > MAX_SIZES:
        step = (len(sizes) - 1) / (MAX_SIZES - 1)
        sizes = sorted({sizes[round(i * step)] for i in range(MAX_SIZES)})
    return sizes


def engine_message_sizes(world_size: int, hidden: int | None = None) -> tuple[list[int], str]:
    """Sizes for the engine being built (vLLM's current config), or K2.5's token counts at
    ``hidden`` (K2.5's hidden size if not given); with a note saying which."""
    try:
        from vllm.config import get_current_vllm_config

        cfg = get_current_vllm_config()
        hidden = cfg.model_config.get_hidden_size()
        element = cfg.model_config.dtype.itemsize
        spec = cfg.speculative_config
        k = spec.num_speculative_tokens if spec is not None and spec.num_speculative_tokens else 0
        tokens = token_counts(cfg.scheduler_config.max_num_seqs, k)
        note = f"hidden {hidden}, {element}-byte values, max_num_seqs {cfg.scheduler_config.max_num_seqs}, k {k}"
    except Exception:  # noqa: BLE001 - no engine config here (doctor, tests): K2.5's sizes
        hidden, element, tokens = hidden or DEFAULT_HIDDEN, 2, list(DEFAULT_TOKENS)
        note = f"no engine config: hidden {hidden}, bf16, tokens {tokens}"
    return message_sizes(world_size, hidden, element, tokens), note
