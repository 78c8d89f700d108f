"""EAGLE-3 with the tiny Kimi-K2.5 wrapper target and drafters in every layout.

Latest engine: real speculative decoding (MHA path, see the known limit below);
greedy output with speculation is token-identical to output without it, and
vLLM's spec-decode metrics show drafts proposed and accepted.
vLLM 0.16 (no CPU spec decode): vLLM's config accepts target + drafter only with
the plugin, and vLLM's loader builds our speculator class from each layout.

Known limit on the latest CPU engine: an MLA target with a Llama drafter fails
with "No common block size" (CPU MLA needs block 16, the drafter's CPU attention
another), so the engine runs the target's MHA path (VLLM_MLA_DISABLE=1), whose
logits match transformers to 1e-6 with the cpu-rope-3d-query patch.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from vllm_k2_tools.fixtures import DRAFT_LAYOUTS, build_draft

from .conftest import REPO, SMALL_ENGINE, engine_env, run_engine_batch

pytestmark = pytest.mark.slow

PROMPTS = ["The quick brown fox", "def fibonacci(n):", "What is 12 times 7?", "Kimi K2.5 is"]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def drafts(k25_model, fixture_root):
    return {layout: build_draft(layout, str(fixture_root / f"draft-{layout}"), k25_model) for layout in DRAFT_LAYOUTS}


def _spec_job(k25_model, draft=None, **spec):
    job = {
        "model": k25_model,
        "prompts": PROMPTS,
        "max_tokens": MAX_TOKENS,
        "logprobs": None,
        "metrics": True,
        "llm_kwargs": dict(SMALL_ENGINE, disable_log_stats=False),
    }
    if draft:
        job["llm_kwargs"]["speculative_config"] = {
            "method": "eagle3",
            "model": draft,
            "num_speculative_tokens": 3,
            **spec,
        }
    return job


@pytest.fixture(scope="module")
def latest_runs(k25_model, drafts, tmp_path_factory):
    env = engine_env(VLLM_MLA_DISABLE="1", VLLM_K2_SPEC_GUARD="0")  # fixed k=3: the mechanics, not the guard
    jobs = {name: _spec_job(k25_model, draft) for name, draft in [("baseline", None)] + sorted(drafts.items())}
    runs = run_engine_batch(tmp_path_factory.mktemp("spec"), jobs, env)
    for name, r in runs.items():
        assert r["ok"], (name, r.get("traceback") or r["log"][-3000:])
    return runs


@pytest.mark.vllm_latest
@pytest.mark.parametrize("layout", DRAFT_LAYOUTS)
def test_greedy_speculation_is_lossless(latest_runs, layout):
    base = [o["token_ids"] for o in latest_runs["baseline"]["outputs"]]
    spec = [o["token_ids"] for o in latest_runs[layout]["outputs"]]
    assert all(len(t) == MAX_TOKENS for t in base)
    assert spec == base


@pytest.mark.vllm_latest
@pytest.mark.parametrize("layout", DRAFT_LAYOUTS)
def test_metrics_show_drafts_proposed_and_accepted(latest_runs, layout):
    m = latest_runs[layout]["metrics"]
    drafts, proposed = m["vllm:spec_decode_num_drafts"], m["vllm:spec_decode_num_draft_tokens"]
    accepted, per_pos = (
        m["vllm:spec_decode_num_accepted_tokens"],
        m["vllm:spec_decode_num_accepted_tokens_per_pos"],
    )
    print(
        f"{layout}: drafts={drafts} proposed={proposed} accepted={accepted} per_position={per_pos} "
        f"mean acceptance length={1 + accepted / drafts:.2f}"
    )
    assert drafts > 0 and proposed == 3 * drafts
    assert 0 < accepted <= proposed and sum(per_pos) == accepted
    assert "vllm:spec_decode_num_drafts" not in latest_runs["baseline"]["metrics"] or (
        latest_runs["baseline"]["metrics"]["vllm:spec_decode_num_drafts"] in (0, None)
    )


@pytest.mark.vllm_latest
def test_a_second_layer_that_passes_through_drafts_as_one_layer(latest_runs):
    """vLLM builds and loads the exported second layer (hidden-size qkv, no hidden_norm) and
    chains it after the first: an identity second layer leaves every draft unchanged."""
    keys = (
        "vllm:spec_decode_num_drafts",
        "vllm:spec_decode_num_draft_tokens",
        "vllm:spec_decode_num_accepted_tokens",
        "vllm:spec_decode_num_accepted_tokens_per_pos",
    )
    one, two = latest_runs["export"]["metrics"], latest_runs["two-layer"]["metrics"]
    assert [two[k] for k in keys] == [one[k] for k in keys]


def _config_jobs(k25_model, draft_dirs, tmp, env, load_draft, **engine):
    job = {
        "model": k25_model,
        "drafts": draft_dirs,
        "engine": {
            "dtype": "float32",
            "max_model_len": 512,
            "enforce_eager": True,
            "trust_remote_code": True,
            **engine,
        },
        "load_draft": load_draft,
    }
    (tmp / "job.json").write_text(json.dumps(job))
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "tests" / "engine_spec_config_job.py"),
            str(tmp / "job.json"),
            str(tmp / "r.json"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert (tmp / "r.json").exists(), (proc.stdout + proc.stderr)[-3000:]
    return json.loads((tmp / "r.json").read_text())


@pytest.mark.vllm016
def test_016_config_and_draft_class_load_with_plugin(k25_model, drafts, tmp_path):
    results = _config_jobs(k25_model, list(drafts.values()), tmp_path, engine_env(), load_draft=True)
    from safetensors import safe_open

    for layout, path in drafts.items():
        r = results[path]
        assert r["ok"], (layout, r.get("traceback"))
        assert r["method"] == "eagle3"
        assert r["aux_layer_ids"] == [2, 4, 8], "explicit ids honoured (nested eagle_config promoted)"
        d = r["draft"]
        assert d["class"] == "vllm_k2_plugin.models.k2p_eagle3_draft.Eagle3KimiK25ForCausalLM"
        with safe_open(f"{path}/model.safetensors", "pt") as f:
            assert d["d2t"] == f.get_tensor("d2t").tolist()
        assert d["fc_shape"] == [256, 768] and d["lm_head_shape"] == [768, 256]
        assert d["has_own_embed_tokens"] is False, "target embeddings are shared, not duplicated"


@pytest.mark.vllm016
def test_016_without_plugin_fails_like_stock(k25_model, drafts, tmp_path):
    env = engine_env(VLLM_K2_DISABLE="1")
    results = _config_jobs(k25_model, [drafts["legacy"]], tmp_path, env, load_draft=False)
    r = results[drafts["legacy"]]
    assert not r["ok"]
    assert "Eagle3 is only supported for" in r["error"] and "kimi_k2" in r["error"]
