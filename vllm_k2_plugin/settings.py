"""Every knob of vllm-k2-plugin, in one place.

All settings are environment variables so that they reach every process vLLM
spawns (API server, engine core, workers, the model-inspection subprocess):
vLLM hands the environment down, while Python state does not survive `spawn`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

#: Turn the whole plugin off: register() returns before touching vLLM.
ENV_DISABLE = "VLLM_K2_DISABLE"
#: Comma-separated patch names to skip (see `vllm-k2 patches list`).
ENV_DISABLE_PATCHES = "VLLM_K2_DISABLE_PATCHES"
#: Make any patch failure abort start-up instead of logging it.
ENV_STRICT = "VLLM_K2_STRICT"
#: Comma-separated importable modules that define extra (site-local) patches.
ENV_EXTRA_PATCH_MODULES = "VLLM_K2_EXTRA_PATCH_MODULES"
#: Directory where every process that runs register() drops a JSON record of
#: what it applied (who loaded the plugin, which patches, their states).
ENV_TRACE_DIR = "VLLM_K2_TRACE_DIR"

#: 0 = no speculation guard: vLLM speculates with the configured k at every step.
ENV_SPEC_GUARD = "VLLM_K2_SPEC_GUARD"

#: EAGLE draft step as one CUDA graph per decode shape: 1 = on (without a GPU: the same
#: static-buffer path, uncaptured), 0 = off, unset = on where CUDA graphs can be captured.
ENV_DRAFT_GRAPH = "VLLM_K2_DRAFT_GRAPH"

#: GGUF force-dequant globs (or "all"); --model-loader-extra-config takes precedence.
ENV_GGUF_FORCE_DEQUANT = "VLLM_K2_GGUF_FORCE_DEQUANT"
#: 0 = tensor-parallel all-reduce stays on NCCL for > 2 PCIe GPUs (patch tp-pcie-oneshot-allreduce)
ENV_PCIE_ALLREDUCE = "VLLM_K2_PCIE_ALLREDUCE"
#: where the plugin keeps what it measured (e.g. the last all-reduce selection)
ENV_CACHE = "VLLM_K2_CACHE"

_TRUE = {"1", "true", "yes", "on"}


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def _csv(name: str) -> frozenset[str]:
    raw = os.environ.get(name, "")
    return frozenset(p.strip() for p in raw.split(",") if p.strip())


def cache_dir() -> str:
    return os.environ.get(ENV_CACHE) or os.path.expanduser("~/.cache/vllm-k2-plugin")


def pcie_allreduce_enabled() -> bool:
    raw = os.environ.get(ENV_PCIE_ALLREDUCE, "1").strip().lower()
    if raw in {"1", "true", "yes", "on", "auto", ""}:
        return True
    if raw in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"{ENV_PCIE_ALLREDUCE}={raw!r}: expected 1 or 0 (or unset)")


def spec_guard_enabled() -> bool:
    """The guard is on unless VLLM_K2_SPEC_GUARD is set to a false value."""
    return os.environ.get(ENV_SPEC_GUARD, "1").strip().lower() not in {"0", "false", "no", "off"}


def draft_graph_setting() -> str:
    """'on', 'off' or 'auto' from VLLM_K2_DRAFT_GRAPH (unset: auto)."""
    raw = os.environ.get(ENV_DRAFT_GRAPH, "").strip().lower()
    if not raw:
        return "auto"
    if raw in _TRUE:
        return "on"
    if raw in {"0", "false", "no", "off"}:
        return "off"
    raise ValueError(f"{ENV_DRAFT_GRAPH}={raw!r}: expected 1 or 0 (or unset)")


@dataclass(frozen=True)
class Settings:
    disabled: bool = False
    strict: bool = False
    disabled_patches: frozenset[str] = field(default_factory=frozenset)
    extra_patch_modules: tuple[str, ...] = ()
    trace_dir: str | None = None

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            disabled=_flag(ENV_DISABLE),
            strict=_flag(ENV_STRICT),
            disabled_patches=_csv(ENV_DISABLE_PATCHES),
            extra_patch_modules=tuple(sorted(_csv(ENV_EXTRA_PATCH_MODULES))),
            trace_dir=os.environ.get(ENV_TRACE_DIR) or None,
        )


#: (name, meaning) for the README and `vllm-k2 doctor`.
DOCUMENTED = (
    (ENV_DISABLE, "1 = the plugin does nothing; vLLM runs stock"),
    (ENV_DISABLE_PATCHES, "comma list of patch names to leave unapplied"),
    (ENV_STRICT, "1 = a failing patch aborts vLLM start-up (default: log and run unpatched)"),
    (ENV_EXTRA_PATCH_MODULES, "comma list of modules whose import registers extra patches"),
    (ENV_TRACE_DIR, "directory for one JSON record per process that loaded the plugin"),
    (ENV_GGUF_FORCE_DEQUANT, "GGUF tensors to dequantize at load: globs or 'all'"),
    (ENV_DRAFT_GRAPH, "0 = drafter passes on vLLM's piecewise graphs (default: one graph per decode step)"),
    (ENV_PCIE_ALLREDUCE, "0 = TP all-reduce on > 2 PCIe GPUs stays on NCCL (default: one-shot where measured faster)"),
    (ENV_CACHE, "folder for what the plugin measured (default ~/.cache/vllm-k2-plugin)"),
    (ENV_SPEC_GUARD, "0 = speculate with the configured k at every step (default: the guard picks k, 0 = off)"),
)
