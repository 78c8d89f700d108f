"""One patch mechanism for every change vllm-k2-plugin makes to vLLM."""

from .patch import (
    RUNNER_ANY,
    RUNNER_V1,
    RUNNER_V2,
    DoublePatchError,
    Patch,
    PatchContext,
    PatchError,
    PatchState,
    PatchTargetMissing,
    StrictModeAbort,
)
from .registry import REGISTRY, PatchRegistry

__all__ = [
    "RUNNER_ANY",
    "RUNNER_V1",
    "RUNNER_V2",
    "REGISTRY",
    "DoublePatchError",
    "Patch",
    "PatchContext",
    "PatchError",
    "PatchRegistry",
    "PatchState",
    "PatchTargetMissing",
    "StrictModeAbort",
]
