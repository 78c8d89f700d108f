"""The committed draft-step results (benchmarks/results/draft_step_h200) are what
draft_step_report.py makes of the raw case files: regenerated here, they must match."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "draft_step_h200"
sys.path.insert(0, str(REPO / "benchmarks"))

import draft_step_report  # noqa: E402


def test_committed_results_are_the_reports_output(tmp_path):
    draft_step_report.report(RESULTS / "raw", tmp_path, "python benchmarks/draft_step_report.py")
    assert json.loads((tmp_path / "summary.json").read_text()) == json.loads((RESULTS / "summary.json").read_text())
    committed = (RESULTS / "README.md").read_text()
    assert "Report command: `python benchmarks/draft_step_report.py" in committed
    assert (tmp_path / "README.md").read_text().split("Report command:")[0] == committed.split("Report command:")[0]


def test_raw_cases_name_their_command_and_date():
    for p in (RESULTS / "raw").glob("*.json"):
        r = json.loads(p.read_text())
        assert r["command"].startswith("gpu_engine_e2e.py case") and r["date"].startswith("20"), p.name
        assert p.stem == r["case"]["name"]
