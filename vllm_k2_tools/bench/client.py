"""Streaming chat requests: TTFT, TPOT and output tokens per request."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import requests


@dataclass
class RequestResult:
    prompt_index: int
    text: str
    output_tokens: int
    ttft_s: float
    latency_s: float
    greedy: bool = True

    @property
    def tpot_s(self) -> float | None:
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1) if self.output_tokens > 1 else None

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.latency_s if self.latency_s > 0 else 0.0


def request_body(model: str, prompt: str, max_tokens: int, temperature: float = 0.0, seed: int | None = None) -> dict:
    """A streaming chat request; greedy unless the prompt says otherwise (greedy outputs must be
    identical across modes: the lossless check)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if seed is not None:
        body["seed"] = seed
    return body


def chat(
    url: str,
    model: str,
    index: int,
    prompt: str,
    max_tokens: int,
    timeout: float = 600,
    temperature: float = 0.0,
    seed: int | None = None,
) -> RequestResult:
    body = request_body(model, prompt, max_tokens, temperature, seed)
    t0 = time.perf_counter()
    ttft, parts, tokens = None, [], 0
    with requests.post(f"{url}/v1/chat/completions", json=body, stream=True, timeout=timeout) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line or not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            event = json.loads(line[6:])
            for choice in event.get("choices", []):
                delta = choice.get("delta", {}).get("content")
                if delta:
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    parts.append(delta)
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    latency = time.perf_counter() - t0
    return RequestResult(
        index, "".join(parts), tokens, ttft if ttft is not None else latency, latency, greedy=temperature == 0.0
    )


def run_load(url: str, model: str, prompts: list[dict], concurrency: int, max_tokens: int) -> list[RequestResult]:
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        futures = [
            pool.submit(
                chat, url, model, i, p["prompt"], max_tokens, temperature=p.get("temperature", 0.0), seed=p.get("seed")
            )
            for i, p in enumerate(prompts)
        ]
        return [f.result() for f in futures]
