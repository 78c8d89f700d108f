"""Every knob of vllm-k2-plugin, in one place.

Yes/no settings take 1/true/yes/on or 0/false/no/off (``env_flag``); any other value is
an error naming the variable. All settings are environment variables so that they reach every process vLLM
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

#: 1 = the GPU/performance patches act for any model, not only the DeepSeek-V3 / Kimi-K2.x family.
ENV_ANY_MODEL = "VLLM_K2_ANY_MODEL"

#: EAGLE draft step as one CUDA graph per decode shape: 1 = on (without a GPU: the same
#: static-buffer path, uncaptured), 0 = off, unset = on where CUDA graphs can be captured.
ENV_DRAFT_GRAPH = "VLLM_K2_DRAFT_GRAPH"

#: GGUF force-dequant globs (or "all"); --model-loader-extra-config takes precedence.
ENV_GGUF_FORCE_DEQUANT = "VLLM_K2_GGUF_FORCE_DEQUANT"
#: 1 = tensor-parallel all-reduce over > 2 PCIe GPUs may leave NCCL where measured faster
#: (patch tp-pcie-oneshot-allreduce; off by default: not yet run on PCIe GPUs)
ENV_PCIE_ALLREDUCE = "VLLM_K2_PCIE_ALLREDUCE"
#: the grouped GGUF MoE path (patch gguf-moe-grouped-small-batches): "auto" (unset) = where its
#: start-up check passed and it was measured faster; "always" = wherever the check passed
ENV_GGUF_MOE = "VLLM_K2_GGUF_MOE"
#: where the plugin keeps what it measured (e.g. the last all-reduce selection)
ENV_CACHE = "VLLM_K2_CACHE"

#: The words a yes/no setting takes (any case, surrounding spaces ignored); unset or empty = its default.
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


class SettingError(ValueError):
    """A VLLM_K2_* variable holds a value the plugin does not understand; the message names it."""


def env_flag(name: str, default: bool | None = False) -> bool | None:
    """The yes/no setting ``name``: True for TRUE_WORDS, False for FALSE_WORDS, ``default`` when
    unset or empty; any other value raises SettingError naming the variable."""
    raw = os.environ.get(name, "")
    word = raw.strip().lower()
    if not word:
        return default
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise SettingError(
        f"{name}={raw!r}: expected one of {', '.join(TRUE_WORDS)} (on) or {', '.join(FALSE_WORDS)} (off), or unset"
    )


def _csv(name: str) -> frozenset[str]:
    raw = os.environ.get(name, "")
    return frozenset(p.strip() for p in raw.split(",") if p.strip())


def cache_dir() -> str:
    return os.environ.get(ENV_CACHE) or os.path.expanduser("~/.cache/vllm-k2-plugin")


def pcie_allreduce_enabled() -> bool:
    """Opt-in: the PCIe all-reduce has not run on PCIe GPUs yet (its start-up check cannot see
    every hazard there, e.g. a missing end barrier under speculative decoding)."""
    return bool(env_flag(ENV_PCIE_ALLREDUCE, default=False))


def spec_guard_enabled() -> bool:
    """The guard is on unless VLLM_K2_SPEC_GUARD is set to a false word."""
    return bool(env_flag(ENV_SPEC_GUARD, default=True))


def any_model() -> bool:
    """VLLM_K2_ANY_MODEL=1: the GPU/performance patches act for models outside the K2 family too."""
    return bool(env_flag(ENV_ANY_MODEL, default=False))


def draft_graph_setting() -> str:
    """'on', 'off' or 'auto' from VLLM_K2_DRAFT_GRAPH (unset: auto)."""
    value = env_flag(ENV_DRAFT_GRAPH, default=None)
    return "auto" if value is None else "on" if value else "off"


def gguf_moe_mode() -> str:
    """'auto' or 'always' from VLLM_K2_GGUF_MOE (unset or empty: auto)."""
    raw = os.environ.get(ENV_GGUF_MOE, "")
    word = raw.strip().lower() or "auto"
    if word not in ("auto", "always"):
        raise SettingError(f"{ENV_GGUF_MOE}={raw!r}: expected auto or always, or unset")
    return word


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
            disabled=bool(env_flag(ENV_DISABLE)),
            strict=bool(env_flag(ENV_STRICT)),
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
    (ENV_PCIE_ALLREDUCE, "1 = TP all-reduce on > 2 PCIe GPUs: one-shot where measured faster (default 0: NCCL)"),
    (ENV_ANY_MODEL, "1 = GPU/performance patches act for any model (default: DeepSeek-V3 / Kimi-K2.x family only)"),
    (ENV_CACHE, "folder for what the plugin measured (default ~/.cache/vllm-k2-plugin)"),
    (ENV_SPEC_GUARD, "0 = speculate with the configured k at every step (default: the guard picks k, 0 = off)"),
)
