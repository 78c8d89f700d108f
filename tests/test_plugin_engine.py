"""The plugin inside real vLLM engines (0.16 and latest), not imported by the test.

One engine run (module-scoped) serves most assertions: vLLM's own plugin loader
calls register() in the API process, the engine core and a separate worker
process; a deliberately broken extra patch only warns; the K2.5 wrapper fixture
generates.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from vllm_k2_plugin.patching.versions import vllm_version_string
from vllm_k2_plugin.trace import read_traces

from .conftest import IS_016, SMALL_ENGINE, engine_env, run_engine_job

pytestmark = pytest.mark.slow

PROMPTS = ["Hello, how are", "def fibonacci(n):"]
CONFIG_PATCH = "kimi-k2-config-registry"


@pytest.fixture(scope="module")
def engine_run(k25_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("engine")
    trace_dir = tmp / "trace"
    env = engine_env(
        VLLM_K2_TRACE_DIR=str(trace_dir),
        VLLM_K2_EXTRA_PATCH_MODULES="tests.broken_patch",
    )
    # "mp" gives the worker its own process, as on GPUs with tensor parallelism.
    job = {
        "model": k25_model,
        "prompts": PROMPTS,
        "max_tokens": 6,
        "llm_kwargs": dict(SMALL_ENGINE, distributed_executor_backend="mp"),
    }
    result = run_engine_job(tmp, job, env)
    assert result["ok"], result.get("traceback") or result["log"][-3000:]
    result["traces"] = read_traces(str(trace_dir))
    return result


def _by_site(traces, fragment):
    return [t for t in traces if fragment in t["call_site"]]


def test_vllm_loads_plugin_in_api_engine_core_and_worker(engine_run):
    traces = engine_run["traces"]
    api = _by_site(traces, "engine/arg_utils.py")
    core = _by_site(traces, "v1/engine/core.py")
    worker = _by_site(traces, "worker/worker_base.py")
    assert api and core and worker, [t["call_site"] for t in traces]
    pids = {api[0]["pid"], core[0]["pid"], worker[0]["pid"]}
    assert len(pids) == 3, "API server, engine core and worker are separate processes"
    assert worker[0]["ppid"] == core[0]["pid"]
    for t in traces:
        assert t["vllm"] == vllm_version_string()


def test_patch_states_in_every_process(engine_run):
    expected = "applied" if IS_016 else "retired-upstream"
    for t in engine_run["traces"]:
        assert t["patches"][CONFIG_PATCH]["state"] == expected, t
        broken = t["patches"]["test-broken-target"]
        assert broken["state"] == "failed"
        assert "test-broken-target" in broken["reason"] and vllm_version_string() in broken["reason"]


def test_broken_patch_warns_and_vllm_still_serves(engine_run):
    assert "vllm-k2: patch 'test-broken-target'" in engine_run["log"]
    assert "vLLM runs without it" in engine_run["log"]
    outs = engine_run["outputs"]
    assert len(outs) == 2 and all(len(o["token_ids"]) == 6 for o in outs)


def test_each_process_applies_once(engine_run):
    for t in engine_run["traces"]:
        assert t["loads"] == 1, t  # vLLM's per-process guard plus ours: no re-application


def test_strict_mode_aborts_startup_naming_the_patch(k25_model, tmp_path):
    env = engine_env(VLLM_K2_STRICT="1", VLLM_K2_EXTRA_PATCH_MODULES="tests.broken_patch")
    job = {"model": k25_model, "prompts": ["x"], "llm_kwargs": SMALL_ENGINE}
    result = run_engine_job(tmp_path, job, env, timeout=300)
    assert not result["ok"]
    assert result["error_type"] == "StrictModeAbort", result.get("traceback")
    assert "test-broken-target" in result["error"]
    assert f"vLLM {vllm_version_string()}" in result["error"]


PROBE = r"""
import json, os, sys
import vllm_k2_plugin
from vllm.plugins import load_general_plugins
from vllm.transformers_utils.config import _CONFIG_REGISTRY
from vllm_k2_plugin.patching import REGISTRY
before = "kimi_k2" in _CONFIG_REGISTRY
load_general_plugins()
vllm_k2_plugin.register()  # a second, direct call: must be harmless
vllm_k2_plugin.register()
print(json.dumps({
    "loads": vllm_k2_plugin._LOADS,
    "kimi_k2_before": before,
    "kimi_k2_after": "kimi_k2" in _CONFIG_REGISTRY,
    "states": {p.name: p.state.value for p in REGISTRY},
    "replacements": {p.name: len(p.replaced) for p in REGISTRY},
}))
"""


def _probe(env):
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_double_loading_is_harmless():
    r = _probe(engine_env())
    assert r["loads"] == 3
    if IS_016:
        assert (r["kimi_k2_before"], r["kimi_k2_after"]) == (False, True)
        assert r["states"][CONFIG_PATCH] == "applied" and r["replacements"][CONFIG_PATCH] == 1
    else:
        assert r["states"][CONFIG_PATCH] == "retired-upstream" and r["replacements"][CONFIG_PATCH] == 0


def test_disable_env_leaves_vllm_untouched(tmp_path):
    r = _probe(engine_env(VLLM_K2_DISABLE="1", VLLM_K2_TRACE_DIR=str(tmp_path / "t")))
    assert r["loads"] == 0 and r["kimi_k2_after"] == r["kimi_k2_before"]
    assert set(r["states"].values()) <= {"pending"}
    assert not (tmp_path / "t").exists()


def test_disable_one_patch_by_name():
    r = _probe(engine_env(VLLM_K2_DISABLE_PATCHES=CONFIG_PATCH))
    assert r["states"][CONFIG_PATCH] == "disabled"
    assert r["kimi_k2_after"] == r["kimi_k2_before"]


def test_doctor_reports_vllm_loaded_the_plugin():
    out = subprocess.run(
        [sys.executable, "-m", "vllm_k2_plugin.cli", "doctor", "--json"],
        env=engine_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert report["loaded_by_vllm"] is True
    assert report["versions"]["vllm"] == vllm_version_string()
    assert report["entry_points"] == ["vllm_k2_plugin = vllm_k2_plugin:register"]
    states = {p["name"]: p["state"] for p in report["patches"]}
    assert states[CONFIG_PATCH] == ("applied" if IS_016 else "retired-upstream")

    text = subprocess.run(
        [sys.executable, "-m", "vllm_k2_plugin.cli", "doctor"],
        env=engine_env(VLLM_K2_DISABLE="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "loaded by vLLM   NO: VLLM_K2_DISABLE is set" in text.stdout


def test_patches_list_prints_the_registry():
    out = subprocess.run(
        [sys.executable, "-m", "vllm_k2_plugin.cli", "patches", "list"],
        env=engine_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    for field in (CONFIG_PATCH, "target", "applies to", "upstream", "why", "remove when"):
        assert field in out.stdout
