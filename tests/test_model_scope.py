"""The GPU/performance patches act only for the DeepSeek-V3 / Kimi-K2.x family.

A Llama-architecture engine (tiny, random weights) served with every patch switched on runs
vLLM's own code: no patch's gate lets it act (the patch trace), and its greedy output equals
the plugin switched off. On the latest engine it speculates with an EAGLE-3 drafter, so the
speculation guard and the draft-step graph are reached and asked.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from vllm_k2_plugin.patching import scope

from .conftest import IS_LATEST, SMALL_ENGINE, engine_env, run_engine_job

PROMPTS = ["def fibonacci(n):", "import os\n\ndef walk(root):"]
#: Geometry of the tiny Llama, shared with its EAGLE-3 drafter: 9 layers, so the drafter's
#: aux-layer ids (2, 4, 8) are all layers of the target.
GEOMETRY = dict(hidden_size=128, num_attention_heads=4, intermediate_size=128, vocab_size=1024, num_hidden_layers=9)
#: Every switch of a GPU/performance patch on.
ALL_ON = dict(VLLM_K2_DRAFT_GRAPH="1", VLLM_K2_SPEC_GUARD="1", VLLM_K2_PCIE_ALLREDUCE="1")


def _model(**kw):
    hf = SimpleNamespace(**kw)
    return SimpleNamespace(hf_config=hf, architectures=kw.get("architectures"))


def test_the_gate_knows_the_family_and_the_opt_in(monkeypatch):
    monkeypatch.delenv("VLLM_K2_ANY_MODEL", raising=False)
    k25 = _model(
        model_type="kimi_k25",
        architectures=["KimiK25ForConditionalGeneration"],
        text_config=SimpleNamespace(model_type="kimi_k2"),
    )
    v3 = _model(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"])
    llama = _model(model_type="llama", architectures=["LlamaForCausalLM"])
    drafter = _model(model_type="llama", architectures=["Eagle3LlamaForCausalLM"])
    engine = SimpleNamespace(model_config=llama, speculative_config=None)
    spec_engine = SimpleNamespace(model_config=v3, speculative_config=SimpleNamespace(target_model_config=v3))
    assert scope.verdict(k25).acts and scope.verdict(v3).acts
    assert not scope.verdict(llama).acts and not scope.verdict(engine).acts
    assert scope.verdict(spec_engine).acts  # the drafter of a family target: its target decides
    assert not scope.verdict(SimpleNamespace(model_config=drafter)).acts
    assert scope.verdict(llama).model == "llama (LlamaForCausalLM)"
    assert not scope.verdict(None).acts  # no engine config at hand: vLLM's own code
    monkeypatch.setenv("VLLM_K2_ANY_MODEL", "1")
    assert scope.verdict(_model(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"])).acts
    assert scope.verdict(None).acts
    monkeypatch.setenv("VLLM_K2_ANY_MODEL", "sometimes")
    with pytest.raises(ValueError, match="VLLM_K2_ANY_MODEL='sometimes'"):
        scope.verdict(_model(model_type="qwen2", architectures=["Qwen2ForCausalLM"]))


def test_every_scoped_feature_asks_the_gate():
    """Each module that declares a patch of a model-scoped feature consults ``scope.acts``
    (a new GPU patch without the gate fails here)."""
    import importlib
    import inspect

    from vllm_k2_plugin.features import MODEL_SCOPED_FEATURES, load_feature_patches
    from vllm_k2_plugin.patching import REGISTRY

    load_feature_patches()
    scoped = [p for p in REGISTRY if p.feature in MODEL_SCOPED_FEATURES]
    assert len(scoped) >= 14
    #: a patch whose apply() only registers a class: the gate is in that class's module
    gated_in = {"triton-mla-k2-decode": "vllm_k2_plugin.mla.backend"}
    for patch in scoped:
        module = importlib.import_module(gated_in.get(patch.name, patch.apply.__module__))
        assert "scope.acts(" in inspect.getsource(module), f"{patch.name} ({module.__name__}) never asks scope.acts"


def _tiny_llama(root) -> str:
    """A Llama-architecture model with random weights (a few MB) and the fixtures' tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from vllm_k2_tools.fixtures.tokenizer import build_tokenizer

    out = root / "tiny-llama"
    out.mkdir()
    ids = build_tokenizer(str(out), GEOMETRY["vocab_size"])
    cfg = LlamaConfig(
        **GEOMETRY,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        bos_token_id=ids["[BOS]"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["[PAD]"],
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).to(torch.float32).save_pretrained(out, safe_serialization=True)
    return str(out)


def _drafter(root, target) -> str:
    """A random-weight EAGLE-3 drafter for the tiny Llama (the fixtures' legacy layout; its
    aux-layer ids also at the top level, where vLLM reads them)."""
    from vllm_k2_tools.fixtures import build_draft
    from vllm_k2_tools.fixtures.build import FixtureSpec

    out = build_draft("legacy", str(root / "llama-eagle3"), target, spec=FixtureSpec(**GEOMETRY))
    path = f"{out}/config.json"
    with open(path) as f:
        cfg = json.load(f)
    cfg["eagle_aux_hidden_state_layer_ids"] = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    with open(path, "w") as f:
        json.dump(cfg, f, indent=1)
    return out


@pytest.fixture(scope="module")
def llama_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama-scope")
    target = _tiny_llama(root)
    kwargs = dict(SMALL_ENGINE)
    kwargs.pop("attention_backend", None)  # CPU_MLA is for the MLA fixtures; Llama takes vLLM's pick
    if IS_LATEST:  # the 0.16 CPU engine has no speculative decoding
        kwargs["speculative_config"] = {
            "method": "eagle3",
            "model": _drafter(root, target),
            "num_speculative_tokens": 3,
        }
    job = {"model": target, "prompts": PROMPTS, "max_tokens": 24, "logprobs": None, "llm_kwargs": kwargs}
    runs = {}
    for name, extra in (("stock", {"VLLM_K2_DISABLE": "1"}), ("plugin", {})):
        tmp = root / name
        env = engine_env(VLLM_K2_TRACE_DIR=str(tmp / "trace"), **ALL_ON, **extra)
        r = run_engine_job(tmp, job, env, timeout=900, in_process=True)
        assert r["ok"], (name, r.get("traceback") or r["log"][-4000:])
        trace_dir = tmp / "trace"
        r["traces"] = (
            [json.loads(p.read_text()) for p in sorted(trace_dir.glob("*.json"))] if trace_dir.exists() else []
        )
        runs[name] = r
    return runs


@pytest.mark.slow
def test_a_llama_engine_runs_stock_code_with_every_patch_on(llama_runs):
    stock, ours = llama_runs["stock"], llama_runs["plugin"]
    assert [o["token_ids"] for o in ours["outputs"]] == [o["token_ids"] for o in stock["outputs"]]
    assert not stock["traces"]  # switched off: register() did nothing, wrote nothing
    assert ours["traces"], "the plugin wrote no trace"
    asked = {}
    for t in ours["traces"]:
        asked.update(t["scope"])
    acted = sorted(name for name, d in asked.items() if d["acted"])
    assert not acted, f"patches acted for a Llama engine: {acted}"
    assert all(d["model"] == "llama (LlamaForCausalLM)" for d in asked.values()), asked
    if IS_LATEST:  # the speculating engine reached the guard and the draft step, and both said no
        applied = {n for t in ours["traces"] for n, p in t["patches"].items() if p["state"] == "applied"}
        assert {"spec-guard", "draft-step-graph"} <= applied, applied
        assert {"spec-guard", "draft-step-graph"} <= set(asked), asked
        assert "speculation guard on" not in ours["log"]
        assert "not of the DeepSeek-V3 / Kimi-K2.x family" in ours["log"]
