"""The committed GPU load results (benchmarks/results/load_gpu/*) are what benchmarks/engine_load.py's
report makes of their raw case files (regenerated here: every row, the guard's log lines, the
draft-graph captures), and each raw file names the command and date of the case that measured it."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RESULTS = sorted((REPO / "benchmarks" / "results" / "load_gpu").glob("*/raw"))
sys.path.insert(0, str(REPO / "benchmarks"))

import engine_load  # noqa: E402

pytestmark = pytest.mark.vllm_independent


@pytest.mark.parametrize("raw", RESULTS, ids=[p.parent.name for p in RESULTS])
def test_committed_report_is_the_reports_output(raw, tmp_path):
    engine_load.report([raw], tmp_path, "x")
    committed = raw.parent
    assert (
        json.loads((tmp_path / "load.json").read_text())["rows"]
        == json.loads((committed / "load.json").read_text())["rows"]
    )

    def body(text):  # the command and the report's own date differ; the rest may not
        return [ln for ln in text.splitlines() if not ln.startswith(("Command:", "Date:"))]

    assert body((tmp_path / "load.md").read_text()) == body((committed / "load.md").read_text())


@pytest.mark.parametrize("raw", RESULTS, ids=[p.parent.name for p in RESULTS])
def test_every_raw_result_names_its_command_and_date(raw):
    files = sorted(raw.glob("*.json.gz"))
    assert len(files) >= 2
    for p in files:
        r = json.loads(gzip.decompress(p.read_bytes()))
        assert r["command"].startswith("gpu_engine_e2e.py case") and r["date"].startswith("20"), p.name
        assert p.name == f"{r['case']['name']}.json.gz"
        assert all(row["requests"] == len(row["per_request"]) for row in r["load"])


def test_identity_counts_greedy_requests_only():
    plain = {"per_request": [{"i": 0, "greedy": True, "tokens": [1, 2]}, {"i": 1, "greedy": False, "tokens": None}]}
    spec = {"per_request": [{"i": 0, "greedy": True, "tokens": [1, 3]}, {"i": 1, "greedy": False, "tokens": None}]}
    assert engine_load._identity(plain, plain) == "1/1"
    assert engine_load._identity(plain, spec) == "0/1"


def test_the_report_prints_the_step_times_the_guard_was_fed(tmp_path):
    """A case run with ``guard_trace`` carries ``guard_steps`` (benchmarks/guard_step_trace.py);
    the report prints one row per bucket and k."""
    raw = REPO / "benchmarks" / "results" / "load_gpu" / "vllm026_v2_h100_guard" / "raw"
    cases = tmp_path / "cases"
    cases.mkdir()
    for p in sorted(raw.glob("*.json.gz")):
        r = json.loads(gzip.decompress(p.read_bytes()))
        if r["case"]["name"].endswith("-never-guard"):
            r["guard_steps"] = {"2+": {"0": {"n": 9, "min": 0.4, "p10": 0.4, "median": 2.1, "mean": 1.9, "p90": 2.5}}}
        (cases / f"{r['case']['name']}.json").write_text(json.dumps(r))
    engine_load.report([cases], tmp_path / "out", "x")
    md = (tmp_path / "out" / "load.md").read_text()
    assert "| v26-v2-load-eagle3-k3-never-guard | 2+ | 0 | 9 | 0.4 | 0.4 | 2.1 | 1.9 | 2.5 |" in md
