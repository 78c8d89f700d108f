"""Kimi/DeepSeek MLA GGUFs on vLLM 0.16's in-tree GGUF loader (CPU engine).

GGUFs are written from the tiny fixture the way llama.cpp does (split attn_k_b /
attn_v_b, merged experts, several quant types, shards). With force-dequant `all`
(vLLM-CPU has no GGUF kernels), greedy output equals the safetensors model for a
lossless GGUF, and equals a model built from gguf-py's dequantized weights for a
quantized one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from vllm_k2_plugin.gguf.files import GGUFLoadError, discover_shards
from vllm_k2_plugin.gguf.loader import Options, iter_weights, make_plan
from vllm_k2_plugin.gguf.names import deepseek2_name_map
from vllm_k2_tools.fixtures.gguf_writer import write_gguf  # gguf-py imported lazily

from .conftest import SMALL_ENGINE, engine_env, run_engine_batch, run_engine_job

PROMPTS = ["The quick brown fox", "def fibonacci(n):", "Kimi K2.5 is", "What is 12 times 7?"]
MIXED = {
    "blk.*.attn_q_a.weight": "Q4_K",
    "blk.*.attn_kv_a_mqa.weight": "Q8_0",
    "blk.*.attn_q_b.weight": "Q4_0",
    "blk.*.attn_k_b.weight": "Q8_0",
    "blk.*.attn_v_b.weight": "Q5_0",
    "blk.*.attn_output.weight": "BF16",
    "blk.*.ffn_gate_exps.weight": "Q4_K",
    "blk.*.ffn_up_exps.weight": "Q6_K",
    "blk.*.ffn_down_exps.weight": "Q8_0",
    "blk.*.ffn_gate_shexp.weight": "TQ2_0",  # llama.cpp has kernels, vLLM 0.16 does not
    "blk.*.ffn_up_shexp.weight": "TQ2_0",
    "blk.*.ffn_down_shexp.weight": "Q8_0",
    "blk.0.ffn_*.weight": "F16",
    "output.weight": "Q8_0",
    "token_embd.weight": "F16",
}


class _Text:
    """The fixture's text config as the loader sees it."""

    def __init__(self, path):
        self.__dict__.update(json.load(open(os.path.join(path, "config.json"))))


@pytest.fixture(scope="module")
def ggufs(text_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("gguf")
    from .gguf_llamacpp_writer import convert

    return {
        "oracle": [convert(text_model, str(out / "llamacpp-oracle.gguf"))],
        "f32": write_gguf(text_model, str(out / "f32.gguf")),
        "f32_unsplit": write_gguf(text_model, str(out / "f32-kvb.gguf"), split_kv_b=False),
        "mixed": write_gguf(text_model, str(out / "mixed.gguf"), types=MIXED, shards=2),
    }


@pytest.fixture(scope="module")
def mixed_reference(text_model, ggufs, tmp_path_factory):
    """A plain HF checkpoint holding gguf-py's dequantization of the mixed GGUF."""
    import torch
    from safetensors.torch import save_file

    out = tmp_path_factory.mktemp("mixed-ref") / "model"
    shutil.copytree(text_model, out)
    names = deepseek2_name_map(_Text(text_model))
    plan = make_plan(ggufs["mixed"], names, Options(force=["*"]), on_cpu=True)
    tensors = {k: v.clone() for k, v in iter_weights(plan, torch.float32, Counter())}
    save_file(tensors, str(out / "model.safetensors"))
    return str(out)


def _gguf_job(paths, text_model, extra=None):
    kwargs = dict(SMALL_ENGINE, tokenizer=text_model, hf_config_path=text_model)
    kwargs["model_loader_extra_config"] = extra if extra is not None else {"force_dequant": "all"}
    return {"model": paths[0], "prompts": PROMPTS, "max_tokens": 8, "llm_kwargs": kwargs}


@pytest.fixture(scope="module")
def kimi_k2_config(text_model, tmp_path_factory):
    """The same model described as Kimi-K2 (model_type kimi_k2), as K2/K2.5 ship it."""
    out = tmp_path_factory.mktemp("kimi-cfg") / "cfg"
    shutil.copytree(text_model, out, ignore=shutil.ignore_patterns("*.safetensors"))
    cfg = json.load(open(out / "config.json"))
    cfg["model_type"] = "kimi_k2"
    json.dump(cfg, open(out / "config.json", "w"))
    return str(out)


@pytest.fixture(scope="module")
def runs(text_model, kimi_k2_config, ggufs, mixed_reference, tmp_path_factory):
    env = engine_env()
    jobs = {
        "safetensors": {"model": text_model, "prompts": PROMPTS, "max_tokens": 8, "llm_kwargs": SMALL_ENGINE},
        "mixed_reference": {
            "model": mixed_reference,
            "prompts": PROMPTS,
            "max_tokens": 8,
            "llm_kwargs": SMALL_ENGINE,
        },
        "oracle": _gguf_job(ggufs["oracle"], text_model),
        "f32": _gguf_job(ggufs["f32"], kimi_k2_config),  # kimi_k2 maps to deepseek2 names
        "f32_unsplit": _gguf_job(ggufs["f32_unsplit"], text_model),
        "mixed": _gguf_job(ggufs["mixed"], text_model),
    }
    out = run_engine_batch(tmp_path_factory.mktemp("runs"), jobs, env)
    for name, r in out.items():
        if name != "oracle":  # the oracle's own test reports its failure (a wrong layout fails to load)
            assert r["ok"], (name, r.get("traceback") or r["log"][-3000:])
    return out


def _max_dlogprob(a, b):
    worst = 0.0
    for x, y in zip(a["outputs"], b["outputs"], strict=True):
        for sx, sy in zip(x["logprobs"], y["logprobs"], strict=True):
            worst = max(worst, max(abs(sx[t] - sy[t]) for t in sx.keys() & sy.keys()))
    return worst


def _tokens(run):
    return [o["token_ids"] for o in run["outputs"]]


@pytest.mark.vllm016
@pytest.mark.slow
def test_lossless_gguf_equals_safetensors(runs):
    assert _tokens(runs["f32"]) == _tokens(runs["safetensors"])
    assert _max_dlogprob(runs["f32"], runs["safetensors"]) < 1e-5


@pytest.mark.vllm016
@pytest.mark.slow
def test_gguf_from_an_independent_llamacpp_style_writer_equals_safetensors(runs):
    """The oracle GGUF is written without the plugin (tests/gguf_llamacpp_writer.py): a
    k_b/v_b orientation error shared by our loader and our fixture writer fails here."""
    assert runs["oracle"]["ok"], runs["oracle"].get("traceback") or runs["oracle"]["log"][-3000:]
    assert _tokens(runs["oracle"]) == _tokens(runs["safetensors"])
    assert _max_dlogprob(runs["oracle"], runs["safetensors"]) < 1e-5


@pytest.mark.vllm016
@pytest.mark.slow
def test_split_k_b_v_b_equals_unsplit_kv_b(runs):
    assert _tokens(runs["f32"]) == _tokens(runs["f32_unsplit"])
    assert _max_dlogprob(runs["f32"], runs["f32_unsplit"]) < 1e-6


@pytest.mark.vllm016
@pytest.mark.slow
def test_quantized_sharded_gguf_equals_its_dequantized_weights(runs):
    assert _tokens(runs["mixed"]) == _tokens(runs["mixed_reference"])
    assert _max_dlogprob(runs["mixed"], runs["mixed_reference"]) < 1e-5
    assert _tokens(runs["mixed"]) != _tokens(runs["safetensors"]), "the quantized model is a different model"


# -- errors: no engine needed for the loader's checks ---------------------------------


def _plan(paths, text_model, force=("*",), on_cpu=True):
    return make_plan(paths, deepseek2_name_map(_Text(text_model)), Options(force=list(force)), on_cpu=on_cpu)


@pytest.mark.vllm016  # gguf-py ships with the in-tree-GGUF vLLM
def test_audit_missing_tensor(text_model, tmp_path):
    paths = write_gguf(text_model, str(tmp_path / "m.gguf"), drop=("blk.3.attn_q_b.weight",))
    with pytest.raises(GGUFLoadError, match=r"missing from the GGUF \(audit\): \['blk.3.attn_q_b.weight'\]"):
        _plan(paths, text_model)


@pytest.mark.vllm016  # gguf-py ships with the in-tree-GGUF vLLM
def test_audit_unused_tensor(text_model, tmp_path):
    paths = write_gguf(
        text_model, str(tmp_path / "u.gguf"), extra={"blk.0.mystery.weight": np.zeros((4, 4), np.float32)}
    )
    with pytest.raises(GGUFLoadError, match=r"not used by the model \(audit\): \['blk.0.mystery.weight'\]"):
        _plan(paths, text_model)


@pytest.mark.vllm016  # gguf-py ships with the in-tree-GGUF vLLM
def test_unsupported_type_names_tensor_type_and_option(ggufs, text_model):
    with pytest.raises(GGUFLoadError) as e:
        _plan(ggufs["mixed"], text_model, force=(), on_cpu=False)
    msg = str(e.value)
    assert "_shexp.weight' has type TQ2_0" in msg
    assert "force_dequant" in msg and "--model-loader-extra-config" in msg


@pytest.mark.vllm016  # gguf-py ships with the in-tree-GGUF vLLM
def test_cpu_requires_force_dequant(ggufs, text_model):
    with pytest.raises(GGUFLoadError, match="vLLM's CPU build has no GGUF kernels"):
        _plan(ggufs["mixed"], text_model, force=(), on_cpu=True)


@pytest.mark.vllm016  # gguf-py ships with the in-tree-GGUF vLLM
def test_partial_force_dequant_keeps_fused_modules_consistent(ggufs, text_model):
    plan = _plan(ggufs["mixed"], text_model, force=("blk.2.attn_q_a.weight", "*_shexp*"), on_cpu=False)
    assert {"blk.2.attn_q_a.weight", "blk.2.attn_kv_a_mqa.weight"} <= plan.dequant  # fused_qkv_a_proj
    assert "blk.3.attn_q_a.weight" not in plan.dequant
    assert {f"blk.{i}.attn_k_b.weight" for i in range(8)} <= plan.dequant  # MLA: always dense
    assert "model.layers.2.self_attn.q_a_proj" in plan.unquantized_modules()


@pytest.mark.vllm016  # gguf-py ships with the in-tree-GGUF vLLM
def test_truncated_file_names_file_and_offset(ggufs, tmp_path):
    src = ggufs["f32"][0]
    cut = tmp_path / "cut.gguf"
    data = open(src, "rb").read()
    cut.write_bytes(data[: len(data) - 1000])
    with pytest.raises(GGUFLoadError) as e:
        from vllm_k2_plugin.gguf.files import open_shards

        open_shards([str(cut)])
    assert str(cut) in str(e.value) and ("offset" in str(e.value) or "truncated" in str(e.value))


@pytest.mark.vllm016  # gguf-py ships with the in-tree-GGUF vLLM
def test_missing_shard(ggufs, tmp_path):
    first, second = ggufs["mixed"]
    copy = tmp_path / os.path.basename(first)
    shutil.copy(first, copy)
    with pytest.raises(GGUFLoadError, match="missing shard"):
        discover_shards(str(copy))
    assert discover_shards(first) == [first, second]


@pytest.mark.vllm016
@pytest.mark.slow
def test_engine_reports_loader_errors(ggufs, text_model, tmp_path):
    r = run_engine_job(tmp_path, _gguf_job(ggufs["mixed"], text_model, extra={}), engine_env())
    assert not r["ok"]
    assert "vLLM's CPU build has no GGUF kernels" in r["log"]


@pytest.mark.vllm_latest
def test_not_applicable_where_gguf_left_vllm():
    out = subprocess.run(
        [sys.executable, "-m", "vllm_k2_plugin.cli", "patches", "list", "--register", "--json"],
        env=engine_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    states = {p["name"]: p for p in json.loads(out.stdout)}
    for name in ("gguf-deepseek-force-dequant", "gguf-skip-speculators-probe"):
        assert states[name]["state"] == "not-applicable", states[name]
        assert "GGUF left vLLM's tree in 0.24" in states[name]["reason"], states[name]


@pytest.mark.vllm016
def test_a_drafter_checkpoint_beside_a_gguf_target_loads_as_safetensors(tmp_path):
    """vLLM builds an EAGLE-3 drafter with its GGUF target's load config: the drafter's folder
    (no GGUF file) must go to vLLM's default loader without the GGUF options (on the GPU a
    force_dequant target with a drafter failed its start: "force_dequant is implemented for
    deepseek2-architecture GGUFs only")."""
    from types import SimpleNamespace

    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    from vllm_k2_plugin.gguf.k2p_gguf_loader import K2GGUFModelLoader

    ours = K2GGUFModelLoader(LoadConfig(load_format="gguf", model_loader_extra_config={"force_dequant": ["*"]}))
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "model.safetensors").write_bytes(b"")
    plain = ours.loader_for(SimpleNamespace(model=str(drafter)))
    assert type(plain) is DefaultModelLoader
    assert plain.load_config.load_format == "auto" and not plain.load_config.model_loader_extra_config
    assert ours.loader_for(SimpleNamespace(model=str(tmp_path / "target.gguf"))) is ours
    (tmp_path / "sharded").mkdir()
    (tmp_path / "sharded" / "m-00001-of-00002.gguf").write_bytes(b"")
    assert ours.loader_for(SimpleNamespace(model=str(tmp_path / "sharded"))) is ours
