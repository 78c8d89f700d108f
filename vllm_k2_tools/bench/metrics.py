"""Speculative-decoding counters from a vLLM server's Prometheus /metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

import requests
from prometheus_client.parser import text_string_to_metric_families

PREFIX = "vllm:spec_decode_"
PREEMPTIONS = "vllm:num_preemptions"
#: the engine's cache settings as labels, num_gpu_blocks among them once the KV cache is sized
CACHE_CONFIG = "vllm:cache_config_info"


@dataclass
class SpecCounters:
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_position: dict[int, float] = field(default_factory=dict)
    preemptions: float = 0.0  # vllm:num_preemptions (not a speculation counter; read alongside)

    def __sub__(self, other: SpecCounters) -> SpecCounters:
        keys = set(self.per_position) | set(other.per_position)
        return SpecCounters(
            self.drafts - other.drafts,
            self.draft_tokens - other.draft_tokens,
            self.accepted - other.accepted,
            {k: self.per_position.get(k, 0.0) - other.per_position.get(k, 0.0) for k in sorted(keys)},
            self.preemptions - other.preemptions,
        )

    def derived(self) -> dict:
        """Acceptance rate, mean acceptance length tau (1 + accepted / drafts: the target's
        token counts as one) and per-position acceptance, from the counters alone."""
        if self.drafts <= 0:
            return {"acceptance_rate": None, "mean_acceptance_length": None, "per_position_acceptance": []}
        return {
            "acceptance_rate": self.accepted / self.draft_tokens if self.draft_tokens else None,
            "mean_acceptance_length": 1.0 + self.accepted / self.drafts,
            "per_position_acceptance": [self.per_position[k] / self.drafts for k in sorted(self.per_position)],
        }


def _families(base_url: str, timeout: float):
    return text_string_to_metric_families(requests.get(f"{base_url}/metrics", timeout=timeout).text)


def kv_cache_tokens(base_url: str, timeout: float = 10.0) -> int | None:
    """Tokens the server's KV cache holds (blocks x block size, every layer's share included: a
    drafter's layers take part of the same space). None when the server does not say."""
    for family in _families(base_url, timeout):
        if family.name in (CACHE_CONFIG, CACHE_CONFIG.removesuffix("_info")):
            for sample in family.samples:
                blocks, size = sample.labels.get("num_gpu_blocks"), sample.labels.get("block_size")
                if blocks and size and blocks.isdigit() and size.isdigit():
                    return int(blocks) * int(size)
    return None


def scrape(base_url: str, timeout: float = 10.0) -> SpecCounters:
    c = SpecCounters()
    for family in _families(base_url, timeout):
        if family.name == PREEMPTIONS:
            c.preemptions += sum(x.value for x in family.samples if x.name.endswith("_total"))
        if not family.name.startswith(PREFIX):
            continue
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            name = sample.name[len(PREFIX) : -len("_total")]
            if name == "num_drafts":
                c.drafts += sample.value
            elif name == "num_draft_tokens":
                c.draft_tokens += sample.value
            elif name == "num_accepted_tokens":
                c.accepted += sample.value
            elif name == "num_accepted_tokens_per_pos":
                pos = int(sample.labels["position"])
                c.per_position[pos] = c.per_position.get(pos, 0.0) + sample.value
    return c
