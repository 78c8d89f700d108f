"""Our TRITON_MLA backend inside real vLLM processes (both engines), and its self-check.

Runs in subprocesses: plugins load once per process, as in vLLM's workers. TRITON_INTERPRET
lets the self-check run our kernel on the CPU; faults come from tests/mla_faults.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import IS_016, engine_env

PROBE = r"""
import json
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.model_executor.layers.attention.mla_attention import QueryLenSupport
from vllm.v1.attention.backend import AttentionCGSupport
from vllm_k2_plugin.patching import REGISTRY
from vllm_k2_plugin.mla import backend, selfcheck
import torch
patch = REGISTRY["triton-mla-k2-decode"]
resolved = AttentionBackendEnum.TRITON_MLA.get_class()
cls = backend.K2TritonMLABackend  # also where the patch retired (latest): our classes still resolve
with torch.device("meta"):  # vLLM's workers set a default device: the self-check must not rely on it
    impl, builder = cls.get_impl_cls(), cls.get_builder_cls()
result = {
    "state": patch.state.value, "reason": patch.reason,
    "path": AttentionBackendEnum.TRITON_MLA.get_path(),
    "resolved": f"{resolved.__module__}.{resolved.__qualname__}",
    "name": cls.get_name(), "is_mla": cls.is_mla(), "fp8": "fp8" in cls.supported_kv_cache_dtypes,
    "impl": f"{impl.__module__}.{impl.__qualname__}", "builder": f"{builder.__module__}.{builder.__qualname__}",
    "selfcheck": selfcheck.failure(),
    "uniform": builder.query_len_support == QueryLenSupport.UNIFORM,
    "cg": builder.get_cudagraph_support(None, None).name,
    "custom_untouched": AttentionBackendEnum.CUSTOM not in __import__(
        "vllm.v1.attention.backends.registry", fromlist=["x"])._ATTN_OVERRIDES,
}
if builder is backend.K2TritonMLAMetadataBuilder:
    # decode metadata of a uniform spec-verify batch: 3 requests x (1 + 3) tokens, built
    # with the keywords this vLLM's MLACommonMetadataBuilder.build passes
    import inspect
    from vllm.model_executor.layers.attention.mla_attention import MLACommonMetadataBuilder as Base
    takes = set(inspect.signature(Base._build_decode).parameters)
    b = object.__new__(builder)
    b._max_model_len, b._max_graph_tokens = 4096, 16
    def meta(bt, seqs, max_seq, qsl, n_tokens):
        kw = dict(block_table_tensor=bt, seq_lens_device=seqs, max_seq_len=max_seq, query_start_loc_cpu=qsl,
                  query_start_loc_device=None, num_decode_tokens=n_tokens, dcp_tot_seq_lens_device=None,
                  max_query_len=4)
        m = b._build_decode(**{k: v for k, v in kw.items() if k in takes})
        return [m.q_len, m.context_bound]
    result["graph_meta"] = meta(torch.zeros(3, 8, dtype=torch.int32), torch.tensor([40, 50, 60]), 60,
                                torch.tensor([0, 4, 8, 12]), 12)
    result["eager_meta"] = meta(torch.zeros(9, 8, dtype=torch.int32), torch.arange(9) + 5, 300,
                                torch.arange(0, 37, 4), 36)
print("RESULT" + json.dumps(result))
"""


def run_probe(tmp_path, **env) -> tuple[dict, str]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE],
        # no engine here for the model gate to ask about: any model, unless a test says otherwise
        env=engine_env(**{"TRITON_INTERPRET": "1", "VLLM_K2_ANY_MODEL": "1", **env}),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(lines[-1][len("RESULT") :]), proc.stdout + proc.stderr


OURS = "vllm_k2_plugin.mla.backend.K2TritonMLABackend"


def test_triton_mla_resolves_to_our_backend(tmp_path):
    r, log = run_probe(tmp_path)
    if IS_016:
        assert r["state"] == "applied", r["reason"]
        assert r["path"] == OURS and r["resolved"] == OURS
    else:  # 0.32's own TritonMLA has uniform decode, UNIFORM_BATCH graphs and fp8 KV
        assert r["state"] == "retired-upstream", r["reason"]
        assert r["path"].endswith("triton_mla.TritonMLABackend") and r["resolved"] != OURS
    assert r["name"] == "TRITON_MLA" and r["is_mla"] and r["fp8"]
    assert r["selfcheck"] is None, r["selfcheck"]
    assert "self-check failed" not in log
    assert r["impl"] == "vllm_k2_plugin.mla.backend.K2TritonMLAImpl"
    assert r["builder"] == "vllm_k2_plugin.mla.backend.K2TritonMLAMetadataBuilder"
    assert r["uniform"], "uniform multi-token (spec-verify) decode must be declared"
    assert r["cg"] == "UNIFORM_BATCH"
    assert r["custom_untouched"]
    # q_len from the uniform batch; the split-count context is max_model_len for batches
    # a CUDA graph may replay (constant per captured size), the batch's max otherwise
    assert r["graph_meta"] == [4, 4096]
    assert r["eager_meta"] == [4, 300]


@pytest.mark.parametrize("fault", ["mismatch", "raise"])
def test_self_check_failure_falls_back_to_stock(tmp_path, fault):
    r, log = run_probe(tmp_path, VLLM_K2_EXTRA_PATCH_MODULES="tests.mla_faults", MLA_FAULT=fault)
    assert r["selfcheck"], "the injected fault must fail the self-check"
    assert (
        ("relative error" in r["selfcheck"]) if fault == "mismatch" else ("injected launcher fault" in r["selfcheck"])
    )
    lines = [ln for ln in log.splitlines() if "self-check failed" in ln]
    assert len(lines) == 1 and "uses vLLM's stock TRITON_MLA" in lines[0], log[-3000:]
    assert r["impl"].endswith("triton_mla.TritonMLAImpl")
    assert "K2" not in r["builder"]
    assert r["cg"] != "UNIFORM_BATCH" or not IS_016  # stock 0.16 has no full graphs


def test_no_model_of_the_family_gets_vllms_own_triton_mla(tmp_path):
    """Outside the DeepSeek-V3 / Kimi-K2.x family (here: no engine config at all) the backend
    hands out vLLM's own classes, self-check or not."""
    r, _ = run_probe(tmp_path, VLLM_K2_ANY_MODEL="0")
    assert r["impl"].endswith("triton_mla.TritonMLAImpl")
    assert "K2" not in r["builder"]


def test_self_check_needs_a_device(tmp_path):
    """Without CUDA and without the interpreter Triton cannot run: stock, said once."""
    r, log = run_probe(tmp_path, TRITON_INTERPRET="0")
    assert "Triton cannot run here" in r["selfcheck"]
    assert r["impl"].endswith("triton_mla.TritonMLAImpl")


@pytest.mark.gpu
def test_gpu_self_check_passes_and_a_real_compile_failure_falls_back(tmp_path):
    r, _ = run_probe(tmp_path, TRITON_INTERPRET="0")
    assert r["selfcheck"] is None, r["selfcheck"]
    assert r["impl"].endswith("K2TritonMLAImpl")
    # a variant that needs far more shared memory than any GPU has: Triton refuses it
    r, log = run_probe(tmp_path, TRITON_INTERPRET="0", VLLM_K2_EXTRA_PATCH_MODULES="tests.mla_faults", MLA_FAULT="smem")
    assert r["selfcheck"] and "sm_" in r["selfcheck"], r["selfcheck"]
    assert r["impl"].endswith("triton_mla.TritonMLAImpl")
    assert sum("self-check failed" in ln for ln in log.splitlines()) == 1
