"""Committed results that scripts render from raw files: the draft-attention tile results
(benchmarks/draft_attention_tile_probe.py --report) and the users' rig model
(benchmarks/pcie_allreduce_model.py, whose spec/plain ratios are read from committed results).
Each committed file must be what its script makes of the committed inputs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TILE = REPO / "benchmarks" / "results" / "draft_attention_tile_h200"


def _body(text: str) -> str:
    """Without the lines that name the output folder or the date of writing."""
    return "\n".join(line for line in text.splitlines() if "Written by" not in line)


def test_tile_results_readme_is_the_reports_output(tmp_path):
    folder = tmp_path / "tile"
    shutil.copytree(TILE, folder)
    (folder / "README.md").unlink()
    out = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "draft_attention_tile_probe.py"), "--report", str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert _body((folder / "README.md").read_text()) == _body((TILE / "README.md").read_text())
    # every call has its own plain step (ratios are taken within a call), and every engine case
    # names its vLLM and the tile patch's state and keeps the log the tile decision is read from
    for call in (TILE / "raw").iterdir():
        assert any(p.stem.endswith("-plain") for p in call.glob("*.json")), call
        for p in call.glob("*.json"):
            r = json.loads(p.read_text())
            assert r["vllm"] and "draft-attention-tile" in r["patches"], p
            assert p.with_suffix(".log").exists(), p


def test_rig_model_is_the_scripts_output_and_reads_the_committed_ratios():
    out = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "pcie_allreduce_model.py")],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    committed = (REPO / "benchmarks" / "results" / "pcie_allreduce_model.md").read_text()
    assert _body(out.stdout).rstrip() == _body(committed).rstrip()
    assert "spec_over_plain, vLLM 0.16 (route C) | 1.491 x" in committed
    assert "spec_over_plain, vLLM 0.16 (route B) | 1.285 x" in committed
