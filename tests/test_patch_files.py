"""The versioned patch files apply cleanly, in series order, to this engine's vLLM
sources (dry run on a copy: site-packages is never touched by tests)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from .conftest import REPO

SERIES = REPO / "patches" / "vllm-0.16.0" / "series"
ALL_SERIES = sorted((REPO / "patches").glob("vllm-*/series"))


def _names(series=SERIES):
    return [n.strip() for n in series.read_text().splitlines() if n.strip()]


@pytest.mark.parametrize("series", ALL_SERIES, ids=lambda p: p.parent.name)
def test_series_lists_every_patch_file(series):
    on_disk = sorted(p.name for p in series.parent.glob("*.patch"))
    assert sorted(_names(series)) == on_disk


@pytest.mark.parametrize("series", ALL_SERIES, ids=lambda p: p.parent.name)
def test_every_patch_declares_its_contract(series):
    for name in _names(series):
        head = (series.parent / name).read_text().split("\n---\n", 1)[0]
        for key in ("Title:", "Why:", "Changes:", "Upstream:", "Remove when:"):
            assert key in head, (name, key)


@pytest.mark.vllm016
def test_series_applies_to_installed_vllm_016(tmp_path):
    import vllm

    src = os.path.dirname(vllm.__file__)
    work = tmp_path / "vllm"
    shutil.copytree(src, work, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    for name in _names():
        out = subprocess.run(
            ["patch", "-p1", "--forward", "-i", str(SERIES.parent / name)],
            cwd=work,
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, (name, out.stdout + out.stderr)
    subprocess.run(["python3", "-m", "py_compile", *map(str, work.rglob("deepseek_v2.py"))], check=True)


def test_readme_table_lists_every_patch():
    table = (REPO / "patches" / "README.md").read_text()
    for series in ALL_SERIES:
        assert f"## {series.parent.name}" in table
        for name in _names(series):
            assert name.removesuffix(".patch") in table, name
