"""Which device this process serves on, as vLLM decides it.

``vllm.platforms.current_platform`` is what vLLM itself asks (NVML-based on NVIDIA: no CUDA
context is created in the API-server process, as ``torch.cuda.is_available()`` may do), so a
patch's "is this a CUDA engine?" gets the same answer as vLLM's own code paths.
"""

from __future__ import annotations


def on_cuda() -> bool:
    """True where vLLM runs on its CUDA platform (False without vLLM)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False
    return bool(current_platform.is_cuda())


def no_cuda(what: str) -> str | None:
    """For a patch's ``only_if``: None on vLLM's CUDA platform, else why the patch stays off
    ("no CUDA device (<what>)")."""
    return None if on_cuda() else f"no CUDA device ({what})"
