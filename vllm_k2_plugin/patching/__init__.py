"""One patch mechanism for every change vllm-k2-plugin makes to vLLM."""

from .patch import (
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
