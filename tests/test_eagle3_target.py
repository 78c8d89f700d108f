"""EAGLE-3 target side on a real engine: the K2.5 wrapper fixture returns aux hidden
states equal to transformers' DeepSeek-V3 hidden states at the requested layers
(vLLM convention: input of layer i), for single and batched prompts.

On 0.16 this is our backport; on the latest engine the same assertions hold for
upstream's implementation, and our patches report themselves retired.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from .conftest import IS_016, REPO, SMALL_ENGINE, engine_env

pytestmark = pytest.mark.slow

PROMPTS = ["The quick brown fox", "def fibonacci(n):\n    a, b = 0, 1\n    for", "Hi"]
LAYERS = [2, 4, 5]  # distinct; 8-layer fixture
TOL = 1e-4  # float32; measured max abs error ~1e-6 (see test output)


@pytest.fixture(scope="module")
def captured(k25_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("aux")
    job = {
        "model": k25_model,
        "layers": LAYERS,
        "prompts": PROMPTS,
        "llm_kwargs": dict(SMALL_ENGINE, enable_prefix_caching=False),
    }
    (tmp / "job.json").write_text(json.dumps(job))
    out = tmp / "aux.pt"
    env = engine_env(VLLM_ALLOW_INSECURE_SERIALIZATION="1", VLLM_K2_TRACE_DIR=str(tmp / "trace"))
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "engine_aux_job.py"), str(tmp / "job.json"), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    from vllm_k2_plugin.trace import read_traces

    return torch.load(out), read_traces(str(tmp / "trace"))


@pytest.fixture(scope="module")
def reference(text_model, captured):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(text_model, dtype=torch.float32).eval()
    refs = []
    for ids in captured[0]["prompt_ids"]:
        with torch.no_grad():
            hs = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
        refs.append([hs[i][0] for i in LAYERS])  # hs[i] = input of layer i (i < N)
    return refs


def _concat(captures):
    """Captures of several forward steps -> one [tokens, hidden] per aux layer."""
    return [torch.cat([step[j] for step in captures]) for j in range(len(LAYERS))]


def test_single_prompts_match_transformers(captured, reference):
    worst = 0.0
    for caps, ref in zip(captured[0]["single"], reference, strict=True):
        got = _concat(caps)
        for g, r in zip(got, ref, strict=True):
            assert g.shape == r.shape
            worst = max(worst, (g - r).abs().max().item() / r.abs().max().item())
    print(f"max relative error of aux hidden states: {worst:.2e}")
    assert worst < TOL


def test_batched_prompts_match_transformers(captured, reference):
    got = _concat(captured[0]["batched"])
    want = [torch.cat([ref[j] for ref in reference]) for j in range(len(LAYERS))]
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape, "batched rows = all prompts' tokens, in submission order"
        assert (g - w).abs().max().item() < TOL * w.abs().max().item()


def test_aux_layers_are_distinct_states(captured):
    first = _concat(captured[0]["single"][0])
    assert not torch.allclose(first[0], first[1]) and not torch.allclose(first[1], first[2])


def test_backport_applies_on_016_and_retires_on_latest(captured):
    expected = "applied" if IS_016 else "retired-upstream"
    for trace in captured[1]:
        for name in ("deepseek-eagle3-aux-hidden-states", "kimi-k25-eagle3-passthrough"):
            assert trace["patches"][name]["state"] == expected, (name, trace["patches"][name])
        # its range ends at 0.32, where K2.5's config class (its target) is transformers' own
        image = trace["patches"]["kimi-k25-image-token-index"]["state"]
        assert image == ("applied" if IS_016 else "not-applicable"), trace["patches"]["kimi-k25-image-token-index"]


def test_final_layer_aux_patch_only_where_upstream_skips_that_id(captured):
    """0.16: our backport's forward already has aux id == num_hidden_layers; latest: upstream
    emits it (the probe runs upstream's forward). 0.20 skips it: applied there (H200 results)."""
    expected = "not-applicable" if IS_016 else "retired-upstream"
    for trace in captured[1]:
        assert trace["patches"]["deepseek-eagle3-final-layer-aux"]["state"] == expected, trace["patches"]
