"""The committed H200 results behind the PCIe all-reduce patch and the start-up hang
(both written by their scripts; see benchmarks/results/*/README.md). Read, not re-run:
they needed the GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
pytestmark = pytest.mark.vllm_independent


def _runs():
    summary = json.loads((RESULTS / "comm_shared_gpu_h200" / "summary.json").read_text())
    return {(r["world"], r["fault"]): r for r in summary["runs"]}


def test_oneshot_was_correct_at_every_rank_count_and_size_eager_and_in_graphs():
    runs = _runs()
    for world in (2, 4, 8):
        run = runs[(world, "")]
        oneshot = [m for m in run["selection"]["measurements"] if m["candidate"] == "oneshot"]
        assert oneshot and all(m["ok"] and m["us"] is not None for m in oneshot), (world, oneshot)
        assert run["gate_lifted"] is (world > 2)  # vLLM's own 2-rank path is left alone
        assert run["python_fully_connected"] is False and run["patch"] == "applied"


def test_a_wrong_or_slow_oneshot_was_refused_at_start_up():
    runs = _runs()
    for world in (4, 8):
        for fault in ("wrong", "slow"):
            run = runs[(world, fault)]
            assert set(run["selection"]["chosen"].values()) == {"nccl"}, (world, fault)
            assert all(v is None for v in run["custom_all_reduce"].values())  # vLLM's entry declines: NCCL's turn
        wrong = [m for m in runs[(world, "wrong")]["selection"]["measurements"] if m["candidate"] == "oneshot"]
        assert all(not m["ok"] and "off the float32 sum" in m["why"] for m in wrong)


def test_the_startup_hang_was_openmp_before_fork_not_a_patch():
    base = RESULTS / "engine_startup_h200"
    repro = json.loads((base / "repro" / "summary.json").read_text())
    assert all(v["hung"] and not v["reached_load_model"] for v in repro.values()), repro  # old fixture builder
    control = json.loads((base / "control_and_fix" / "hang_summary.json").read_text())
    assert control["omp-plugin-off"]["hung"]  # plugin off, OpenMP workers before LLM(): vLLM hangs too
    fixed = json.loads((base / "control_and_fix" / "up_summary.json").read_text())
    assert fixed["all-patches"]["up"] and fixed["omp-spawn"]["up"]
    assert fixed["all-patches"]["tokens"] == fixed["omp-spawn"]["tokens"]
