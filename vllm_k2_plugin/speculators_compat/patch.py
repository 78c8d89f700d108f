"""Register the speculators-0.3.0 shim with the patch registry."""

from __future__ import annotations

import importlib.util

from vllm_k2_plugin.patching import REGISTRY, PatchContext

TARGET = "speculators.data_generation.vllm_hidden_states_generator:VllmHiddenStatesGenerator"


def _no_speculators() -> str | None:
    if importlib.util.find_spec("speculators") is None:
        return "speculators is not installed"
    return None


def _speculators_targets_this_vllm() -> bool:
    from packaging.version import Version

    from vllm_k2_plugin.patching.versions import package_version

    # speculators >= 0.4 dropped the in-process generator and targets vLLM >= 0.16 itself
    return Version(package_version("speculators") or "0") >= Version("0.4")


@REGISTRY.patch(
    name="speculators-0.3-generator",
    feature="speculators",
    target=TARGET,
    applies_to=">=0.16,<0.17",
    why_range_ends="speculators 0.3.0's in-process generator was written for vLLM 0.16 (0.4 targets later vLLM itself)",
    only_if=_no_speculators,
    already_upstream=_speculators_targets_this_vllm,
    upstream="vllm-project/speculators #279, PR #313; later releases rewrote data generation",
    why="speculators 0.3.0's VllmHiddenStatesGenerator breaks on vLLM 0.16 and captures one layer late",
    remove_when="users move to speculators >= 0.4 (no vLLM 0.16 in-process generator)",
)
def _apply(ctx: PatchContext) -> None:
    # speculators imports half of vLLM's engine internals (~2 s). vLLM's own processes
    # never use the generator, so patch it when (if) the module is imported.
    def patch_module(module) -> None:
        from . import generator

        cls = getattr(module, "VllmHiddenStatesGenerator", None)
        if cls is None:
            raise ctx.fail(f"{MODULE} has no VllmHiddenStatesGenerator")
        for name in ("__init__", "_create_vllm_config", "generate"):
            ctx.replace(cls, name, getattr(generator, name))

    after_import(MODULE, patch_module)


MODULE = TARGET.split(":")[0]


def after_import(module_name: str, callback) -> None:
    """Run callback(module) once module_name is imported (now, if it already is)."""
    import sys

    if module_name in sys.modules:
        callback(sys.modules[module_name])
        return
    if any(isinstance(f, _PostImportFinder) and f.name == module_name for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _PostImportFinder(module_name, callback))


class _PostImportFinder:
    def __init__(self, name, callback):
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        import importlib.util
        import sys

        sys.meta_path.remove(self)  # find the real spec without us
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader, callback = spec.loader, self.callback

        class _Loader:
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                callback(module)

        spec.loader = _Loader()
        sys.meta_path.remove(self)
        return spec
