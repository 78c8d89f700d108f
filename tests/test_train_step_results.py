"""The committed H200 training-step results (benchmarks/results/train_step_h200.json, the
planner's calibration) are what `train_step.py report` makes of the raw runs beside them:
regenerated here with the command the file records, they must match, derived fields and
all (predictions, checks, DDP scaling are recomputed, never typed in)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "train_step_h200.json"
RAW = REPO / "benchmarks" / "results" / "train_step_h200_raw"
sys.path.insert(0, str(REPO / "benchmarks"))

pytest.importorskip("torch")  # train_step.py measures with torch; its report needs none of the GPU
import train_step  # noqa: E402

pytestmark = pytest.mark.vllm_independent


def _committed() -> dict:
    return json.loads(RESULTS.read_text())


def test_committed_results_are_the_reports_output(tmp_path, monkeypatch):
    committed = _committed()
    argv = shlex.split(committed["derived_by"]["command"])
    assert argv[:3] == ["python", "benchmarks/train_step.py", "report"], argv
    args = argv[3:]
    args[args.index("--out") + 1] = str(tmp_path / "regenerated.json")
    monkeypatch.chdir(REPO)  # the recorded command's paths are relative to the repository
    assert train_step.main(["report", *args]) == 0
    regenerated = json.loads((tmp_path / "regenerated.json").read_text())
    for doc in (committed, regenerated):  # stamped with the date and --out of the run that wrote it
        assert doc.pop("derived_by")["date_utc"].startswith("20")
    assert regenerated == committed


def test_the_package_copy_is_the_results_file():
    """The planner reads the package's copy (a wheel carries it): one file, linked."""
    from vllm_k2_tools.train.plan import DEFAULT_CALIBRATION

    assert RESULTS.resolve() == DEFAULT_CALIBRATION.resolve()


def test_every_raw_run_names_its_command_and_date_and_is_carried_verbatim():
    runs = _committed()["runs"]
    files = {p.stem: json.loads(p.read_text()) for p in RAW.glob("*.json") if p.name != train_step.RECORDED}
    assert files == runs
    for name, run in runs.items():
        assert "benchmarks/train_step.py" in run["command"] and run["date_utc"].startswith("2026-"), name


def test_planner_checks_recomputed_and_predictions_came_first():
    """The planner reproduces its calibration run and lies within 20 % of every other
    run; the runs it was checked on were predicted (and written down) before they ran, and
    today's planner still gives what was written down."""
    doc = _committed()
    by_run = {c["run"]: c for c in doc["checks"]}
    assert set(by_run) == set(doc["runs"])
    assert by_run[doc["calibration_run"]]["error"] == pytest.approx(0.0, abs=1e-12)
    for c in doc["checks"]:
        assert abs(c["error"]) <= 0.2, c
    before = [p for p in doc["predictions"] if "recorded_before_measuring" in p]
    assert len(before) == 3
    for p in before:
        rec = p["recorded_before_measuring"]
        assert rec["recorded_utc"] < doc["runs"][p["run"]]["date_utc"], p["run"]
        assert rec["reproduced_by_this_planner"], p


def test_report_refuses_a_raw_run_without_command(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    run = json.loads((RAW / "single_s2048_b1.json").read_text())
    del run["command"]
    (raw / "single_s2048_b1.json").write_text(json.dumps(run))
    with pytest.raises(ValueError, match=r"single_s2048_b1\.json: raw run without 'command'"):
        train_step.report(str(raw), str(tmp_path / "out.json"), "single_s2048_b1", "single_s2048_b1", [])
