"""The registry: every feature declares its patches here; register() applies them."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from ..log import get_logger
from ..settings import SettingError
from .patch import (
    RUNNER_ANY,
    Patch,
    PatchContext,
    PatchError,
    PatchState,
    StrictModeAbort,
    target_absent,
    undo,
)
from .runner import NAMES as RUNNER_NAMES
from .runner import RunnerChoice, model_runner_for_kimi
from .versions import in_range, upper_bound, vllm_release, vllm_version_string

#: States in which a patch of a whole-only feature takes the rest of its feature off: it could
#: not act here. A patch the user switched off by name (disabled) does not: measuring a feature
#: without one of its parts is what VLLM_K2_DISABLE_PATCHES is for.
_MISSING_PART = (PatchState.FAILED, PatchState.NOT_APPLICABLE)


def logger():
    return get_logger("patching")


def _stem(patch_file: str) -> str:
    """'0002-cpu-rope-3d-query.patch' -> 'cpu-rope-3d-query.patch': series number per version."""
    return re.sub(r"^\d{4}-", "", patch_file)


def applied_patch_files() -> list[str]:
    """Names of the patch files `vllm-k2 patches apply` put into the installed vLLM."""
    import importlib.util
    import json
    import os

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.origin:
        return []
    state = os.path.join(os.path.dirname(spec.origin), ".vllm-k2-patches", "state.json")
    try:
        with open(state) as f:
            return list(json.load(f).get("series", []))
    except (OSError, ValueError):
        return []


class PatchRegistry:
    def __init__(self) -> None:
        self._patches: dict[str, Patch] = {}

    # -- declaring -------------------------------------------------------
    def add(self, patch: Patch) -> Patch:
        existing = self._patches.get(patch.name)
        if existing is not None:
            if existing.apply is patch.apply:  # the same module imported twice
                return existing
            raise ValueError(f"two patches are named '{patch.name}'")
        self._patches[patch.name] = patch
        return patch

    def patch(self, **fields) -> Callable[[Callable[[PatchContext], None]], Patch]:
        """Decorator form: ``@REGISTRY.patch(name=..., target=..., ...)`` over apply()."""

        def wrap(apply: Callable[[PatchContext], None]) -> Patch:
            return self.add(Patch(apply=apply, **fields))

        return wrap

    def __iter__(self) -> Iterator[Patch]:
        return iter(self._patches.values())

    def __getitem__(self, name: str) -> Patch:
        return self._patches[name]

    def __contains__(self, name: str) -> bool:
        return name in self._patches

    def remove(self, name: str) -> None:
        patch = self._patches.pop(name)
        undo(patch)

    # -- applying --------------------------------------------------------
    def apply_all(self, disabled: frozenset[str] = frozenset(), strict: bool = False) -> None:
        """Apply every pending patch that fits the installed vLLM.

        Idempotent: patches already applied (or decided) in this process are left
        alone, so a second register() in the same process is a no-op.
        """
        unknown = sorted(disabled - set(self._patches))
        if unknown:
            logger().warning("vllm-k2: VLLM_K2_DISABLE_PATCHES names unknown patches: %s", unknown)
        runner: list[RunnerChoice | None] = []  # asked once, and only if a patch needs it
        for patch in self:
            if patch.state is not PatchState.PENDING:
                continue
            self._apply_one(patch, disabled, runner)
        self._whole_features()
        failures = [p for p in self if p.state is PatchState.FAILED]
        if failures and strict:
            raise StrictModeAbort("vllm-k2 (VLLM_K2_STRICT=1): " + "; ".join(f"{p.reason}" for p in failures))

    def _apply_one(self, patch: Patch, disabled: frozenset[str], runner: list | None = None) -> None:
        raw = vllm_version_string() or "not installed"
        release = vllm_release()
        if patch.name in disabled:
            patch.state, patch.reason = PatchState.DISABLED, "switched off by VLLM_K2_DISABLE_PATCHES"
            return
        if release is None:
            patch.state, patch.reason = PatchState.NOT_APPLICABLE, "vLLM is not installed"
            return
        choice = None
        if patch.model_runner != RUNNER_ANY:
            if runner is None:
                runner = []
            if not runner:
                runner.append(model_runner_for_kimi())
            choice = runner[0]
        # built for the runner this engine will not use: said so unless the range says more
        patch.other_runner = choice is not None and choice.runner != patch.model_runner
        if not in_range(patch.applies_to, release):
            patch.state = PatchState.NOT_APPLICABLE
            patch.reason = f"vLLM {raw} is outside {patch.applies_to}"
            end = upper_bound(patch.applies_to)
            if end is not None and release >= end and patch.why_range_ends:
                patch.reason += f": {patch.why_range_ends}"
            return
        if patch.other_runner:
            patch.state = PatchState.NOT_APPLICABLE
            patch.reason = (
                f"built for {RUNNER_NAMES[patch.model_runner]}; this engine will use {choice.name} ({choice.how})"
            )
            return
        ctx = PatchContext(patch, raw)
        try:
            skip = patch.only_if() if patch.only_if is not None else None
            if skip:
                patch.state, patch.reason = PatchState.NOT_APPLICABLE, skip
                return
            # A target gone from a release inside the range: the range should have ended
            # there (tests/test_patch_states.py checks the releases we run); never "failed".
            absent = target_absent(patch.target)
            if absent:
                patch.state = PatchState.NOT_APPLICABLE
                patch.reason = f"its target {patch.target} is not in vLLM {raw}: {absent}"
                logger().info("vllm-k2: patch '%s' not applicable: %s", patch.name, patch.reason)
                return
            if patch.already_upstream is not None and patch.already_upstream():
                patch.state = PatchState.RETIRED
                if patch.patch_file and _stem(patch.patch_file) in {_stem(n) for n in applied_patch_files()}:
                    patch.reason = f"patch file {patch.patch_file} is applied to this vLLM's sources"
                else:
                    patch.reason = f"vLLM {raw} already has this ({patch.upstream})"
                logger().info("vllm-k2: patch '%s' retired: %s", patch.name, patch.reason)
                return
            patch.apply(ctx)
        except Exception as e:  # noqa: BLE001 - every failure is reported, by name
            undo(patch)  # never leave a half-applied patch behind
            msg = str(e) if isinstance(e, PatchError) else str(ctx.fail(f"{type(e).__name__}: {e}"))
            patch.state, patch.reason = PatchState.FAILED, msg
            if isinstance(e, SettingError):  # the user's own setting: an error, not a shrug
                logger().error("vllm-k2: %s; fix the setting - vLLM runs without this patch until then", msg)
            else:
                logger().warning("vllm-k2: %s; vLLM runs without it", msg)
            return
        patch.state, patch.reason = PatchState.APPLIED, ""
        logger().debug("vllm-k2: patch '%s' applied", patch.name)

    def _whole_features(self) -> None:
        """A feature that needs all its patches is off as a whole when one of them could not
        act here: the others are undone and say which part was missing."""
        features: dict[str, list[Patch]] = {}
        for patch in self:
            features.setdefault(patch.feature, []).append(patch)
        for feature, patches in features.items():
            if not any(p.needs_whole_feature for p in patches):
                continue
            # the other runner's parts are not missing, but a feature none of whose runner-bound
            # parts is for this engine's runner is
            missing = next((p for p in patches if p.state in _MISSING_PART and not p.other_runner), None)
            bound = [p for p in patches if p.model_runner != RUNNER_ANY]
            if missing is None and bound and all(p.other_runner for p in bound):
                missing = bound[0]
            if missing is None:
                continue
            for patch in patches:
                if patch.state is PatchState.APPLIED:
                    undo(patch)
                    patch.state = PatchState.NOT_APPLICABLE
                    patch.reason = f"feature {feature} incomplete: {missing.name} {missing.state.value}"
                    logger().info("vllm-k2: patch '%s' undone: %s", patch.name, patch.reason)

    def revert_all(self) -> None:
        """Undo every applied patch and mark them pending again (tests use this)."""
        for patch in reversed(list(self)):
            undo(patch)
            patch.state, patch.reason, patch.other_runner = PatchState.PENDING, "", False


#: The process-wide registry that features add their patches to.
REGISTRY = PatchRegistry()
