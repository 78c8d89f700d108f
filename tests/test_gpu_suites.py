"""The GPU benchmark suites (benchmarks/gpu_suites.toml) are data the runner can start: every case
has the keys run_case and case_env read, unique names, contexts its engine can hold, the slice's
vocabulary, and model paths that `prepare` writes or the runner builds."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_engine_e2e as e2e  # noqa: E402

pytestmark = pytest.mark.vllm_independent
NAMES = list(e2e._toml(e2e.SUITES.read_text()))
REQUIRED = {"name", "model", "task", "backend", "graphs", "max_model_len", "gpu_memory_utilization", "kv_cache_bytes"}
#: what `prepare` writes into the models folder, and what `run` builds there before a suite
MODELS = {
    "target",
    "draft",
    "prompts.json",
    "load_prompts.json",
    "gguf",
    e2e.NEVER_ACCEPTED,
    *e2e.TINY_TARGETS,
    *e2e.MLA_DRAFTERS,
} | {
    "slice",
    "slice-draft",
    "slice-draft-kv1",
    "slice-draft-tp8",
    "slice-draft-mla-tp8",
    "slice-w4a16",
    "slice6",
    "slice6-draft",
    "slice24",
    "slice24-draft-tp8",
    "slice24-draft-mla-tp8",
}


def _paths(v):
    if isinstance(v, str):
        yield v
    elif isinstance(v, list):
        for x in v:
            yield from _paths(x)
    elif isinstance(v, dict):
        for x in v.values():
            yield from _paths(x)


@pytest.mark.parametrize("name", NAMES)
def test_every_case_can_start(name, tmp_path):
    cases = e2e.suite(name, tmp_path)
    assert cases, name
    assert len({c["name"] for c in cases}) == len(cases), "case names must be unique (results are keyed by them)"
    vocab = e2e.slice_config()["vocab_size"]
    for c in cases:
        assert REQUIRED <= c.keys(), (c["name"], REQUIRED - c.keys())
        assert c["task"] in ("greedy", "steps", "profile", "hostprof", "load"), c["name"]
        assert c["backend"] in ("stock", "ours"), c["name"]
        if "contexts" in c:
            assert max(c["contexts"]) + e2e.GEN <= c["max_model_len"], c["name"]
        if c.get("dummy"):
            assert c["vocab"] == vocab, c["name"]
        for p in _paths(c):
            if p.startswith(str(tmp_path)):
                assert Path(p).relative_to(tmp_path).parts[0] in MODELS, (c["name"], p)
            elif p.startswith(str(REPO)):
                assert Path(p).exists(), (c["name"], p)


def test_names_are_unique_across_suites(tmp_path):
    seen: dict[str, str] = {}
    for name in NAMES:
        for c in e2e.suite(name, tmp_path):
            assert c["name"] not in seen, f"{c['name']} in {name} and {seen.get(c['name'])}"
            seen[c["name"]] = name


def test_an_unknown_suite_names_the_known_ones(tmp_path):
    with pytest.raises(SystemExit, match="unknown suite 'nope': tiny, slice"):
        e2e.suite("nope", tmp_path)


def test_a_stuck_case_leaves_its_stacks_in_its_log(tmp_path):
    """A case whose log stops growing is declared stuck once every running case has been silent
    that long, and stopping it makes each Python process of its group print where it hung (the
    case's environment carries PYTHONFAULTHANDLER)."""
    import os
    import subprocess
    import time

    from vllm_k2_tools.procs import dump_group_stacks, start_group, stop_group

    log_path = tmp_path / "case.log"
    hang = "import time\ndef waiting_for_the_engine():\n    print('up', flush=True)\n    time.sleep(600)\n"
    hang += "waiting_for_the_engine()\n"
    env = e2e.case_env({"task": "steps", "backend": "ours"}, str(tmp_path), 1)
    with log_path.open("w") as log:
        proc = start_group([sys.executable, "-c", hang], env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            while "up" not in log_path.read_text():
                time.sleep(0.1)
            assert not e2e._all_silent([log_path], 5)
            old = time.time() - 10
            os.utime(log_path, (old, old))
            assert e2e._all_silent([log_path], 5)
            dump_group_stacks(proc)
        finally:
            stop_group(proc, grace_s=0)
    assert "waiting_for_the_engine" in log_path.read_text()


def test_no_log_yet_is_not_a_stall(tmp_path):
    """Before any case has opened its log nothing can be called silent (a stall then would stop
    every group at its start)."""
    assert not e2e._all_silent([tmp_path / "not-yet.log"], 0)


def test_a_traced_guard_case_writes_every_step_time_it_is_fed(tmp_path, monkeypatch):
    """Cases with ``guard_trace`` load benchmarks/guard_step_trace.py into the engine: each step
    time the guard observes lands in the group's trace file, and the case's result file gets its
    statistics by batch-size bucket and k (the load report prints them)."""
    sys.path.insert(0, str(REPO))
    from vllm_k2_plugin.patching import REGISTRY
    from vllm_k2_plugin.spec_guard.controller import SpecGuard

    try:
        from benchmarks import guard_step_trace as trace
    finally:  # importing it registers its bench patch: not one of this process's patches
        if "bench-guard-step-trace" in REGISTRY:
            REGISTRY.remove("bench-guard-step-trace")

    case = {"name": "traced", "task": "load", "backend": "ours", "guard_trace": True}
    env = e2e.case_env(case, str(tmp_path), 1)
    assert "benchmarks.guard_step_trace" in env["VLLM_K2_EXTRA_PATCH_MODULES"].split(",")
    log = tmp_path / "traced.guard_steps.jsonl"
    assert env["GUARD_STEP_LOG"] == str(log)
    monkeypatch.setenv("GUARD_STEP_LOG", str(log))
    monkeypatch.setattr(SpecGuard, "observe_step", trace.wrap_observe_step(SpecGuard.observe_step))
    guard = SpecGuard(max_k=3)
    for ms in (2.0, 0.4, 2.2, 0.5, 2.1):  # one request at k = 3: outputs in bursts
        guard.observe_step(1, 3, ms)
    guard.observe_step(3, 0, 1.5)
    stats = trace.summarize(str(log))
    assert stats["1+"]["3"] == {"n": 5, "min": 0.4, "p10": 0.4, "median": 2.0, "mean": 1.44, "p90": 2.2}
    assert stats["2+"]["0"]["n"] == 1
    assert len(guard.step_ms(1)) == 1  # the guard itself still got every step
