"""The one contract every change to vLLM goes through.

A Patch says what it changes (target), for which vLLM releases (applies_to, whose
upper bound is where its target ends: why_range_ends says why), for which model runner, how
to tell that upstream already has the change (already_upstream, then the patch
retires itself), where upstream tracks it, why it exists and when it can go.
Only its ``apply`` function touches vLLM, and it does so through PatchContext so
that every replacement is recorded, refused when another patch owns the same
attribute, and reversible.
"""

from __future__ import annotations

import enum
import functools
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class PatchState(str, enum.Enum):
    PENDING = "pending"
    APPLIED = "applied"
    RETIRED = "retired-upstream"
    NOT_APPLICABLE = "not-applicable"
    DISABLED = "disabled"
    FAILED = "failed"


class PatchError(RuntimeError):
    """A patch could not be applied. The message names the patch and vLLM version."""


class PatchTargetMissing(PatchError):
    """The object a patch changes does not exist in the installed vLLM."""


class DoublePatchError(PatchError):
    """Two different patches tried to replace the same attribute."""


class StrictModeAbort(BaseException):
    """Raised from register() under VLLM_K2_STRICT=1.

    A BaseException on purpose: vLLM's plugin loader swallows ``Exception`` from
    plugins (it logs and carries on), which is exactly what strict mode forbids.
    """


#: Patch.model_runner: the values are patching/runner.py's V1 and V2.
RUNNER_ANY, RUNNER_V1, RUNNER_V2 = "any", "v1", "v2"

#: Attribute set on every object we modify: {attribute name: patch name}.
MARKER = "__vllm_k2_patched__"


@dataclass
class Patch:
    name: str
    target: str  # "package.module:Qual.name" - what apply() changes
    applies_to: str  # packaging specifier over vLLM releases, e.g. ">=0.16,<0.18"
    why: str
    upstream: str  # PR or issue that carries (or should carry) the change
    remove_when: str
    apply: Callable[[PatchContext], None]
    already_upstream: Callable[[], bool] | None = None
    # Optional: returns a reason when the patch is irrelevant here (e.g. not a CPU
    # build); the patch is then reported not-applicable with that reason.
    only_if: Callable[[], str | None] | None = None
    feature: str = "core"
    patch_file: str | None = None  # name of the twin diff under patches/vllm-<ver>/
    # Why applies_to's upper bound is where it is (the release its target leaves, or the
    # plugin's supported range); part of the not-applicable reason beyond it.
    why_range_ends: str = ""
    # The feature works only with all its patches: one that fails or does not apply here
    # takes the others of its feature off with it (registry.apply_all).
    needs_whole_feature: bool = False
    # RUNNER_V1: changes vLLM's v1 model runner (or what only it calls), so it is not-applicable
    # where the engine will run Model Runner V2 (patching/runner.py); RUNNER_V2 the reverse.
    model_runner: str = RUNNER_ANY
    # runtime state
    state: PatchState = PatchState.PENDING
    reason: str = ""
    # not-applicable only because the engine runs the other model runner: a feature with parts
    # for each runner is whole without the other runner's parts
    other_runner: bool = False
    replaced: list[tuple] = field(default_factory=list, repr=False)

    def describe(self) -> dict[str, str]:
        return {
            "name": self.name,
            "feature": self.feature,
            "target": self.target,
            "applies_to": self.applies_to,
            "why_range_ends": self.why_range_ends,
            "model_runner": self.model_runner,
            "state": self.state.value,
            "reason": self.reason,
            "upstream": self.upstream,
            "why": self.why,
            "remove_when": self.remove_when,
            "patch_file": self.patch_file or "",
        }


def resolve(target: str) -> Any:
    """Import 'pkg.mod:A.b' and return the object, or raise LookupError saying what is missing."""
    module_name, _, qualname = target.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as e:
        raise LookupError(f"module {module_name!r} cannot be imported ({e})") from e
    for part in filter(None, qualname.split(".")):
        if not hasattr(obj, part):
            raise LookupError(f"{module_name}:{qualname} has no attribute {part!r}")
        obj = getattr(obj, part)
    return obj


def target_absent(target: str) -> str | None:
    """Why ``target`` is not in the installed packages (its module or an attribute on the way is
    missing), or None when it is there or cannot be told here: a module that exists but does
    not import on this machine (vllm.platforms.cuda without a CUDA driver) is not absent."""
    module_name, _, qualname = target.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        # only the module itself or one of its packages missing counts, not a dependency of it
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            return f"module {module_name} is not in it"
        return None
    except Exception:  # noqa: BLE001 - importable elsewhere; apply() reports what happens here
        return None
    for part in filter(None, qualname.split(".")):
        if not hasattr(obj, part):
            return f"{module_name}:{qualname} has no {part!r}"
        obj = getattr(obj, part)
    return None


class PatchContext:
    """What a patch's apply() gets: the resolved target and a recorded setattr."""

    def __init__(self, patch: Patch, vllm_version: str):
        self.patch = patch
        self.vllm_version = vllm_version

    def fail(self, message: str) -> PatchError:
        return PatchError(f"patch '{self.patch.name}' (vLLM {self.vllm_version}): {message}")

    def target(self) -> Any:
        try:
            return resolve(self.patch.target)
        except LookupError as e:
            raise PatchTargetMissing(
                f"patch '{self.patch.name}' (vLLM {self.vllm_version}): target {self.patch.target} is missing: {e}"
            ) from e

    def replace(self, owner: Any, attr: str, value: Any) -> None:
        """setattr(owner, attr, value), recorded; refuses if another patch owns it,
        and is a no-op if this patch already owns it (never a double wrap)."""
        if self.owns(owner, attr):
            return
        self._claim(_marks_of(owner), attr, f"{_name(owner)}.{attr}")
        # Restore strategy for undo(): re-set what was there, or delete our class
        # attribute to reveal the inherited one again.
        own = attr in getattr(owner, "__dict__", {})
        had = own or (not isinstance(owner, type) and hasattr(owner, attr))
        # a class's own attribute as stored (a classmethod stays a classmethod on undo)
        original = vars(owner)[attr] if own and isinstance(owner, type) else getattr(owner, attr, None)
        setattr(owner, attr, value)
        self.patch.replaced.append(("attr", owner, attr, original, had))

    def wrap(self, owner: Any, attr: str, make: Callable[[Any], Any], check: Callable[[Any], None] | None = None):
        """Replace owner.attr by make(original): the wrapper gets functools.wraps(original)
        (``__wrapped__``, name, doc), ``check(wrapper)`` may refuse it before it is installed;
        recorded like replace(). A class's classmethod or staticmethod stays one: ``make``
        gets its function (a classmethod's takes ``cls`` first) and the wrapper is installed
        under the same decorator. Returns what owner.attr is afterwards."""
        if not self.owns(owner, attr):
            stored = inspect.getattr_static(owner, attr) if isinstance(owner, type) else None
            kind = type(stored) if isinstance(stored, (classmethod, staticmethod)) else None
            original = stored.__func__ if kind else getattr(owner, attr)
            wrapper = functools.wraps(original)(make(original))
            if check is not None:
                check(wrapper)
            self.replace(owner, attr, kind(wrapper) if kind else wrapper)
        return getattr(owner, attr)

    def replace_item(self, mapping: Any, key: Any, value: Any) -> None:
        """mapping[key] = value, recorded; for registries such as _CONFIG_REGISTRY."""
        marks = _MAPPING_MARKS.setdefault(id(mapping), {})
        if marks.get(key) == self.patch.name:
            return
        self._claim(marks, key, f"{type(mapping).__name__}[{key!r}]")
        had = key in mapping
        original = mapping[key] if had else None
        mapping[key] = value
        self.patch.replaced.append(("item", mapping, key, original, had))

    def owns(self, owner: Any, attr: str) -> bool:
        """True when this process already carries this patch on owner.attr (fork,
        a second register()): applying again must be a no-op, never a double wrap."""
        return _marks_of(owner, create=False).get(attr) == self.patch.name

    def _claim(self, marks: dict, key: Any, label: str) -> None:
        holder = marks.get(key)
        if holder is not None and holder != self.patch.name:
            raise DoublePatchError(
                f"patch '{self.patch.name}' (vLLM {self.vllm_version}): {label} is already patched by '{holder}'"
            )
        marks[key] = self.patch.name


def undo(patch: Patch) -> None:
    """Restore everything a patch replaced, newest first."""
    while patch.replaced:
        kind, owner, key, original, had = patch.replaced.pop()
        if kind == "attr":
            if had:
                setattr(owner, key, original)
            else:
                delattr(owner, key)
            _marks_of(owner, create=False).pop(key, None)
        else:
            if had:
                owner[key] = original
            else:
                owner.pop(key, None)
            _MAPPING_MARKS.get(id(owner), {}).pop(key, None)


# Mappings cannot carry an attribute marker; their claims live here (per process,
# which is also the lifetime of the mapping objects they describe).
_MAPPING_MARKS: dict[int, dict] = {}


def _marks_of(owner: Any, create: bool = True) -> dict:
    marks = getattr(owner, "__dict__", {}).get(MARKER)
    if marks is None:
        marks = {}
        if create:
            setattr(owner, MARKER, marks)
    return marks


def _name(owner: Any) -> str:
    return getattr(owner, "__qualname__", None) or getattr(owner, "__name__", None) or repr(owner)
