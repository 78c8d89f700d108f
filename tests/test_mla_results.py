"""The committed H200 MLA results are what `vllm-k2 bench mla` writes from its own raw
measurements: derived fields and the Markdown are recomputed here and must match, and the
launcher's committed variant preference is the one that run's sweep chose."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from vllm_k2_plugin.mla import configs
from vllm_k2_tools.mla_bench import bench

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
DERIVED = ("kernel_gbps", "pct_copy", "of_roofline", "split_vs_roofline", "speedup", "kernel_speedup")


def _load() -> dict:
    return json.loads((RESULTS / "mla_h200.json").read_text())


def test_derived_fields_recomputed_from_raw_times():
    result = _load()
    for row in result["rows"]:
        raw = {k: v for k, v in row.items() if k not in DERIVED}
        again = bench.derive(copy.deepcopy(raw), result["copy_gbps"])
        for k in DERIVED:
            assert (k in row) == (k in again), (k, row)
            if k in row:
                assert abs(row[k] - again[k]) <= 1e-9 * abs(again[k]), (k, row)


def test_json_and_markdown_are_the_writers_output(tmp_path):
    result = _load()
    raw = {k: v for k, v in result.items() if k not in ("command", "users_model")}
    bench.write(raw, str(tmp_path / "mla_h200.json"), result["command"])
    assert json.loads((tmp_path / "mla_h200.json").read_text()) == result
    assert (tmp_path / "mla_h200.md").read_text() == (RESULTS / "mla_h200.md").read_text()


def test_committed_preference_is_the_sweeps_choice():
    result = _load()
    assert result["variant_sweep"], "the committed run must include the variant sweep"
    for kv, fp8 in (("bf16", False), ("fp8", True)):
        assert tuple(result["preference"][kv][0]) == configs.PREFERENCE[fp8][0]


def test_launcher_split_choice_is_near_the_sweeps_best():
    """The committed launcher, on the measured device's limits, picks a split count within
    5 % of the fastest one the committed sweep measured, for every probe."""
    from vllm_k2_plugin.mla import launcher

    result = _load()
    assert result["split_sweep"], "the committed run must include the split sweep"
    device = configs.Device(**result["device_limits"])
    for rec in result["split_sweep"]:
        pick = launcher.plan(
            rec["batch"], rec["heads"], rec["q_len"], rec["context"], result["page_size"], rec["kv"] == "fp8", device
        ).num_splits
        times = rec["kernel_us"]
        assert str(pick) in times, (rec, pick)
        assert times[str(pick)] <= 1.05 * min(times.values()), (rec["batch"], rec["context"], rec["kv"], pick)
