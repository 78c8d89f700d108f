"""The committed GPU-engine results (benchmarks/results/gpu_engine_h200) are what the
report makes of the raw case files: regenerated here, they must match, derived fields
and all. Plus the report's own arithmetic on small known inputs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "gpu_engine_h200"
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_engine_e2e as e2e  # noqa: E402


def test_committed_summary_is_the_reports_output(tmp_path):
    e2e.report([RESULTS / "raw"], tmp_path, RESULTS / "trained_pair_eval.json")
    assert json.loads((tmp_path / "summary.json").read_text()) == json.loads((RESULTS / "summary.json").read_text())
    committed = (RESULTS / "README.md").read_text()
    assert "Report command: `python benchmarks/gpu_engine_e2e.py report" in committed
    assert (tmp_path / "README.md").read_text().rstrip() == committed.split("Report command:")[0].rstrip()


def test_every_raw_result_names_its_command_and_date():
    for p in (RESULTS / "raw").glob("*.json"):
        r = json.loads(p.read_text())
        assert r["command"].startswith("gpu_engine_e2e.py case") and r["date"].startswith("20"), p.name
        assert p.stem == r["case"]["name"]


def test_greedy_comparison_and_tau():
    a = {"tokens": [[1, 2, 3], [4, 5, 6]], "margins": [[0.5, 0.5, 0.5], [0.5, 0.0625, 0.5]]}
    b = {"tokens": [[1, 2, 3], [4, 7, 6]], "margins": [[0.5, 0.5, 0.5], [0.5, 0.0, 0.5]]}
    c = e2e.compare_greedy(a, b)
    assert c["identical"] == 1 and c["divergences"] == [{"prompt": 1, "token": 1, "margins": [0.0625, 0.0]}]
    assert e2e.tau([0.8, 0.6, 0.5], 2) == 1 + 0.8 + 0.6


#: Features whose patches a "stock" engine keeps: K2.5 and its EAGLE-3 need them on every vLLM.
MODEL_SUPPORT_FEATURES = {"models", "cpu", "eagle3", "gguf", "speculators", "spec_guard"}


def test_stock_cases_turn_off_every_gpu_patch_and_only_those():
    """A "stock" engine that kept one of our GPU patches (draft-attention-tile once) is not stock:
    every registered patch is either off there or of a model-support feature, never both."""
    from vllm_k2_plugin.features import load_feature_patches
    from vllm_k2_plugin.patching import REGISTRY

    env = e2e.case_env({"backend": "stock", "task": "steps", "graphs": False}, "/nonexistent", 1)
    off = set(env["VLLM_K2_DISABLE_PATCHES"].split(","))
    assert {"triton-mla-k2-decode", "draft-attention-tile", "async-spec-zero-bubble"} <= off
    load_feature_patches()
    for p in REGISTRY:
        assert (p.name in off) != (p.feature in MODEL_SUPPORT_FEATURES), (p.name, p.feature)
    ours = e2e.case_env({"backend": "ours", "task": "steps", "graphs": False, "disable": ["x"]}, "/nonexistent", 1)
    assert ours["VLLM_K2_DISABLE_PATCHES"] == "x"


#: other results written by this report (raw/ beside README.md and summary.json)
REPORT_DIRS = sorted(
    p.parent
    for sub in ("mla_drafter_gpu", "spec_guard_gpu", "runners_gpu")
    for p in (REPO / "benchmarks" / "results" / sub).glob("*/raw")
)


def test_other_committed_reports_are_the_reports_output(tmp_path):
    assert REPORT_DIRS, "no committed report directories found"
    for d in REPORT_DIRS:
        e2e.report([d / "raw"], tmp_path / d.name)
        assert json.loads((tmp_path / d.name / "summary.json").read_text()) == json.loads(
            (d / "summary.json").read_text()
        ), d
        committed = (d / "README.md").read_text()
        assert (tmp_path / d.name / "README.md").read_text().rstrip() == committed.split("Report command:")[0].rstrip()
