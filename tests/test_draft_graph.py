"""The draft step from static buffers (the CUDA-graph path of patch draft-step-graph,
uncaptured on CPU) proposes exactly what stock vLLM proposes, step by step."""

import json
import re
import subprocess
import sys

import pytest

from .conftest import IS_016, SMALL_ENGINE, engine_env, run_engine_job

PROMPTS = ["def fibonacci(n):", "class Stack:\n    def push(self, item):", "import os\n\ndef walk(root):"]


def per_request(steps: list[dict[str, list[int]]]) -> dict[str, list[list[int]]]:
    """Each request's drafts in order (which requests share a step varies between runs:
    the engine admits them as they arrive)."""
    out: dict[str, list[list[int]]] = {}
    for step in steps:
        for req, row in step.items():
            out.setdefault(req.split("-")[0], []).append(row)
    return out


@pytest.fixture(scope="module")
def draft_runs(trained_pair_random_drafter, tmp_path_factory):
    target, draft = trained_pair_random_drafter
    runs = {}
    for name, flag in (("stock", "0"), ("static", "1")):
        tmp = tmp_path_factory.mktemp(f"draft-graph-{name}")
        job = {
            "model": target,
            "prompts": PROMPTS,
            "max_tokens": 40,
            "logprobs": None,
            "llm_kwargs": dict(
                SMALL_ENGINE,
                speculative_config={"method": "eagle3", "model": draft, "num_speculative_tokens": 3},
            ),
        }
        env = engine_env(
            VLLM_MLA_DISABLE="1",
            VLLM_K2_SPEC_GUARD="0",  # a fixed k: both engines draft at the same steps
            VLLM_K2_DRAFT_GRAPH=flag,
            VLLM_K2_EXTRA_PATCH_MODULES="tests.draft_recorder",
            DRAFT_RECORD=str(tmp / "drafts.jsonl"),
        )
        r = run_engine_job(tmp, job, env, timeout=900, in_process=True)
        assert r["ok"], (name, r.get("traceback") or r["log"][-4000:])
        r["drafts"] = per_request([json.loads(line) for line in (tmp / "drafts.jsonl").read_text().splitlines()])
        runs[name] = r
    return runs


@pytest.mark.slow
@pytest.mark.vllm_latest
def test_static_buffer_draft_step_proposes_what_stock_proposes(draft_runs):
    stock, static = draft_runs["stock"], draft_runs["static"]
    assert static["patches"]["draft-step-graph"] == "applied"
    assert stock["patches"]["draft-step-graph"] == "not-applicable"
    # the static path ran for decode batches (1 + k tokens a request), and only for those
    shapes = re.findall(r"draft step for (\d+) requests x (\d+) tokens runs from static buffers", static["log"])
    assert shapes and {q for _, q in shapes} == {"4"}, shapes
    assert "stays stock" not in static["log"]  # the build-time check (same drafts as stock) passed
    assert sorted(static["drafts"]) == sorted(stock["drafts"]) == ["0", "1", "2"]
    assert sum(len(v) for v in static["drafts"].values()) > 30
    assert static["drafts"] == stock["drafts"]
    assert [o["token_ids"] for o in static["outputs"]] == [o["token_ids"] for o in stock["outputs"]]


def test_setting_parses_strictly_and_names_the_variable(monkeypatch):
    from vllm_k2_plugin.settings import ENV_DRAFT_GRAPH, draft_graph_setting

    for raw, want in (("", "auto"), ("1", "on"), ("on", "on"), ("0", "off"), ("false", "off")):
        monkeypatch.setenv(ENV_DRAFT_GRAPH, raw)
        assert draft_graph_setting() == want, raw
    monkeypatch.setenv(ENV_DRAFT_GRAPH, "sometimes")
    with pytest.raises(ValueError, match=f"{ENV_DRAFT_GRAPH}='sometimes'"):
        draft_graph_setting()


ADAPTER_PROBE = r"""
import json, os
os.environ["VLLM_K2_DRAFT_GRAPH"] = "1"  # the static-buffer path: the patch applies without a GPU
import vllm_k2_plugin
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.config import CUDAGraphMode, VllmConfig
from vllm_k2_plugin.draft_graph import graphs, patch
from vllm_k2_plugin.draft_graph.vllm_adapter import propose_owner, proposer_class
from vllm_k2_plugin.patching import REGISTRY
owner = propose_owner()
mode, batch = graphs._no_graph_dispatcher(VllmConfig()).dispatch(8)
print(json.dumps({
    "states": {n: REGISTRY[n].state.value for n in ("draft-step-graph", "draft-attention-triton")},
    "owner": f"{owner.__module__}.{owner.__qualname__}",
    "eagle_is_owner_or_subclass": issubclass(proposer_class(), owner),
    "wrapped": getattr(proposer_class().propose, "__wrapped__", None) is not None,
    "upstream": patch._upstream_graphs_drafts(),
    "dispatch": [mode.name, batch.num_tokens],
}))
"""


def _run_probe(code: str, env: dict[str, str], *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_draft_graph_patch_applies_to_this_vllms_eagle_proposer():
    """0.16 defines ``propose`` on its own base class in eagle.py, later releases in
    llm_base_proposer.py: the adapter finds it, the patch wraps it, the upstream probe and
    the no-graph dispatcher work against this release's classes."""
    r = _run_probe(ADAPTER_PROBE, engine_env())
    assert r["states"] == {"draft-step-graph": "applied", "draft-attention-triton": "not-applicable"}
    module = "vllm.v1.spec_decode.eagle" if IS_016 else "vllm.v1.spec_decode.llm_base_proposer"
    assert r["owner"] == f"{module}.SpecDecodeBaseProposer"
    assert r["eagle_is_owner_or_subclass"] and r["wrapped"]
    assert r["upstream"] is False  # stock vLLM keeps its drafter on piecewise graphs
    assert r["dispatch"] == ["NONE", 8]


BACKEND_PROBE = r"""
import json, os, sys
import torch
from vllm.engine.arg_utils import EngineArgs
from vllm.v1.attention.selector import AttentionSelectorConfig
from vllm_k2_plugin.draft_graph.drafter_backend import drafter_of_mla_target
target, draft = sys.argv[1:3]
layer = AttentionSelectorConfig(head_size=64, dtype=torch.float32, kv_cache_dtype="auto", block_size=16)
specs = {
    "eagle3": {"method": "eagle3", "model": draft, "num_speculative_tokens": 3},
    "ngram": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3},
    "none": None,
}
out = {}
for mla in ("0", "1"):
    os.environ["VLLM_MLA_DISABLE"] = mla
    for name, spec in specs.items():
        args = EngineArgs(model=target, dtype="float32", max_model_len=512, speculative_config=spec)
        cfg = args.create_engine_config()
        out[f"mla_disable={mla} {name}"] = [
            drafter_of_mla_target(cfg, layer),
            drafter_of_mla_target(cfg, layer._replace(use_mla=True)),
            drafter_of_mla_target(cfg, layer._replace(attn_type="encoder_only")),
        ]
print(json.dumps(out))
"""

# The wrapper's decisions under a real engine config (MLA target + EAGLE-3 drafter). vLLM's CUDA
# chooser needs a GPU, so a stand-in answers for it: FLASH_ATTN by priority, TRITON_ATTN when
# asked, or a ValueError when asked (a layer TRITON_ATTN does not fit).
WRAPPER_PROBE = r"""
import json, logging, os, sys
import torch
os.environ["VLLM_MLA_DISABLE"] = "0"
from vllm.config import CUDAGraphMode, set_current_vllm_config
from vllm.engine.arg_utils import EngineArgs
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.attention.selector import AttentionSelectorConfig
from vllm_k2_plugin.draft_graph.drafter_backend import _wrap_get_attn_backend_cls
target, draft = sys.argv[1:3]
layer = AttentionSelectorConfig(head_size=64, dtype=torch.float32, kv_cache_dtype="auto", block_size=16)
spec = {"method": "eagle3", "model": draft, "num_speculative_tokens": 3}
cfg = EngineArgs(model=target, dtype="float32", max_model_len=512, speculative_config=spec).create_engine_config()
said = []
class Said(logging.Handler):
    def emit(self, record):
        said.append(record.levelname + " " + record.getMessage())
logging.getLogger("vllm.k2_plugin.draft_graph").addHandler(Said())
def chooser(refuse):
    def pick(cls, selected, config, *a, **k):
        if selected is None:
            return "FLASH_ATTN"
        if selected == AttentionBackendEnum.TRITON_ATTN and refuse:
            raise ValueError("head size not supported")
        return selected.name
    return pick
out = {}
for mode in ("FULL_AND_PIECEWISE", "NONE"):
    cfg.compilation_config.cudagraph_mode = CUDAGraphMode[mode]
    with set_current_vllm_config(cfg):
        for refuse in (False, True):
            wrapped = _wrap_get_attn_backend_cls(chooser(refuse))
            said.clear()
            out[f"{mode} refuse={refuse}"] = {
                "drafter": wrapped(None, None, layer),
                "user_choice": wrapped(None, AttentionBackendEnum.FLEX_ATTENTION, layer),
                "mla_layer": wrapped(None, None, layer._replace(use_mla=True)),
                "log": [m.split(" (")[0] for m in said],
            }
print(json.dumps(out))
"""


@pytest.mark.slow
def test_only_an_eagle_drafters_layers_of_an_mla_target_get_triton_attn(trained_pair_random_drafter):
    """Engine configs of this vLLM: the backend patch touches the non-MLA decoder layers of
    an engine whose target is MLA and whose speculation is EAGLE, nothing else."""
    target, draft = trained_pair_random_drafter
    r = _run_probe(BACKEND_PROBE, engine_env(), target, draft)
    assert r.pop("mla_disable=0 eagle3") == [True, False, False]
    assert all(v == [False, False, False] for v in r.values()), r


@pytest.mark.slow
def test_drafter_backend_choice_and_its_fallback_when_triton_attn_does_not_fit(trained_pair_random_drafter):
    """With graphs on, the drafter's layers get TRITON_ATTN instead of vLLM's pick (logged);
    where TRITON_ATTN refuses the layer, vLLM's pick stays (warned); a user's backend, MLA
    layers and eager engines are left to vLLM."""
    target, draft = trained_pair_random_drafter
    r = _run_probe(WRAPPER_PROBE, engine_env(), target, draft)
    assert r["FULL_AND_PIECEWISE refuse=False"] == {
        "drafter": "TRITON_ATTN",
        "user_choice": "FLEX_ATTENTION",
        "mla_layer": "FLASH_ATTN",
        "log": ["INFO vllm-k2: EAGLE drafter attention: TRITON_ATTN instead of vLLM's pick FLASH_ATTN"],
    }
    assert r["FULL_AND_PIECEWISE refuse=True"] == {
        "drafter": "FLASH_ATTN",
        "user_choice": "FLEX_ATTENTION",
        "mla_layer": "FLASH_ATTN",
        "log": ["WARNING vllm-k2: EAGLE drafter attention keeps FLASH_ATTN"],
    }
    for refuse in (False, True):
        assert r[f"NONE refuse={refuse}"] == {
            "drafter": "FLASH_ATTN",
            "user_choice": "FLEX_ATTENTION",
            "mla_layer": "FLASH_ATTN",
            "log": [],
        }
