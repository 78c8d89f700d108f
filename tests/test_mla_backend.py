"""On the vLLM 0.16 engine: after vLLM loads general plugins, TRITON_MLA is ours.

Runs in a subprocess (plugins load once per process, as in vLLM's workers).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import engine_env

PROBE = r"""
import json
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.model_executor.layers.attention.mla_attention import QueryLenSupport
from vllm.v1.attention.backend import AttentionCGSupport
from vllm_k2_plugin.patching import REGISTRY
import torch
cls = AttentionBackendEnum.TRITON_MLA.get_class()
builder = cls.get_builder_cls()
# decode metadata of a uniform spec-verify batch: 3 requests x (1 + 3) tokens
b = object.__new__(builder)
b._max_model_len, b._max_graph_tokens = 4096, 16
def meta(n_tokens):
    return b._build_decode(torch.zeros(3, 8, dtype=torch.int32), torch.tensor([40, 50, 60]), 60,
                           torch.tensor([0, 4, 8, 12]), None, n_tokens, None)
graph_meta, eager_meta = meta(12), b._build_decode(torch.zeros(9, 8, dtype=torch.int32), torch.arange(9) + 5, 300,
                           torch.arange(0, 37, 4), None, 36, None)
print("RESULT" + json.dumps({
    "path": AttentionBackendEnum.TRITON_MLA.get_path(),
    "cls": f"{cls.__module__}.{cls.__qualname__}",
    "name": cls.get_name(),
    "impl": cls.get_impl_cls().__name__,
    "uniform": builder.query_len_support == QueryLenSupport.UNIFORM,
    "cg": builder.get_cudagraph_support(None, None).name,
    "fp8": "fp8" in cls.supported_kv_cache_dtypes,
    "is_mla": cls.is_mla(),
    "state": REGISTRY["triton-mla-k2-decode"].state.value,
    "graph_meta": [graph_meta.q_len, graph_meta.context_bound],
    "eager_meta": [eager_meta.q_len, eager_meta.context_bound],
    "custom_untouched": AttentionBackendEnum.CUSTOM not in __import__(
        "vllm.v1.attention.backends.registry", fromlist=["x"])._ATTN_OVERRIDES,
}))
"""


@pytest.mark.vllm016
def test_triton_mla_resolves_to_our_backend(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], env=engine_env(), capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    r = json.loads(lines[-1][len("RESULT") :])
    assert r["state"] == "applied"
    assert r["path"] == "vllm_k2_plugin.mla.backend.K2TritonMLABackend"
    assert r["cls"] == r["path"] and r["name"] == "TRITON_MLA" and r["is_mla"]
    assert r["impl"] == "K2TritonMLAImpl"
    assert r["uniform"], "uniform multi-token (spec-verify) decode must be declared"
    assert r["cg"] == "UNIFORM_BATCH"
    assert r["fp8"]
    assert r["custom_untouched"]
    # q_len from the uniform batch; the split-count context is max_model_len for batches
    # a CUDA graph may replay (constant per captured size), the batch's max otherwise
    assert r["graph_meta"] == [4, 4096]
    assert r["eager_meta"] == [4, 300]
