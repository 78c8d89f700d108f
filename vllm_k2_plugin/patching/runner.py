"""Which model runner vLLM will use for a DeepSeek-V3 / Kimi-K2.x engine with EAGLE-3.

vLLM has two: its v1 runner (``vllm/v1/worker/gpu_model_runner.py``) and Model Runner V2
(``vllm/v1/worker/gpu/``). V2 is the default for every model from 0.29 (vllm-project/vllm#53183)
and the only runner in 0.34; ``VLLM_USE_V2_MODEL_RUNNER`` picks one on the releases that have
both. Patches built for the v1 runner act on nothing under V2, so the registry asks here.

Where the release decides in ``VllmConfig.use_v2_model_runner``, that code itself is run on a
stand-in of such an engine (its own conditions: Triton present, the speculative method, the
environment variable), so a release that changes its rule answers for itself. Elsewhere the
answer comes from which runners the release ships, the variable, and its release default.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import types
from dataclasses import dataclass

from packaging.version import Version

from .versions import vllm_release, vllm_version_string

V1, V2 = "v1", "v2"
NAMES = {V1: "vLLM's v1 model runner", V2: "Model Runner V2"}
V1_RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
V2_RUNNER_MODULE = "vllm.v1.worker.gpu.model_runner"
ENV = "VLLM_USE_V2_MODEL_RUNNER"
#: From this release V2 is vLLM's default for every model (vllm-project/vllm#53183).
V2_DEFAULT_FROM = Version("0.29")


@dataclass(frozen=True)
class RunnerChoice:
    runner: str  # V1 or V2
    how: str  # why this one, in a sentence

    @property
    def name(self) -> str:
        return NAMES[self.runner]


def _ships(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package is missing
        return False


class _KimiEagle3Engine:
    """What ``VllmConfig.use_v2_model_runner`` reads, for a K2.x target served with EAGLE-3 on
    one node. Attributes it does not know raise AttributeError: the caller then falls back
    rather than guess; VllmConfig's own methods and properties run on this object."""

    def __init__(self) -> None:
        # no model yet: vLLM 0.29-0.31 read it first, for ROCm's per-architecture exceptions only
        self.model_config = None
        self.attention_config = types.SimpleNamespace(hisparse_config=None)
        self.watermark_config = None
        self.lora_config = None
        self.speculative_config = types.SimpleNamespace(
            method="eagle3", parallel_drafting=False, use_heterogeneous_vocab=False, draft_model_config=None
        )
        self.parallel_config = types.SimpleNamespace(
            distributed_executor_backend="mp",
            pipeline_parallel_size=1,
            use_ubatching=False,
            decode_context_parallel_size=1,
            prefill_context_parallel_size=1,
        )

    def __getattr__(self, name: str):
        from vllm.config import VllmConfig

        member = inspect.getattr_static(VllmConfig, name)  # AttributeError: not VllmConfig's either
        if isinstance(member, property):
            return member.fget(self)
        if inspect.isfunction(member):
            return types.MethodType(member, self)
        raise AttributeError(name)


def _asked_vllm() -> bool | None:
    """VllmConfig.use_v2_model_runner run on the stand-in; None where the release has no such
    property or it needs more of an engine than the stand-in has."""
    try:
        from vllm.config import VllmConfig

        prop = inspect.getattr_static(VllmConfig, "use_v2_model_runner", None)
        if not isinstance(prop, property):
            return None
        return bool(prop.fget(_KimiEagle3Engine()))
    except Exception:  # noqa: BLE001 - a changed rule we cannot stand in for: the fallback answers
        return None


def model_runner_for_kimi() -> RunnerChoice | None:
    """The runner a K2.x engine with EAGLE-3 gets on the installed vLLM (None: vLLM absent)."""
    release = vllm_release()
    if release is None:
        return None
    raw = vllm_version_string()
    if not _ships(V1_RUNNER_MODULE):
        return RunnerChoice(V2, f"vLLM {raw} has only Model Runner V2")
    if not _ships(V2_RUNNER_MODULE):
        return RunnerChoice(V1, f"vLLM {raw} has no Model Runner V2")
    asked = _asked_vllm()
    setting = os.environ.get(ENV)
    said = f" ({ENV}={setting})" if setting is not None else ""
    if asked is not None:
        return RunnerChoice(V2 if asked else V1, f"vLLM {raw}'s own choice for such an engine{said}")
    if setting is not None:
        on = setting.strip().lower() in ("1", "true", "yes")
        return RunnerChoice(V2 if on else V1, f"{ENV}={setting}")
    default = V2 if release >= V2_DEFAULT_FROM else V1
    return RunnerChoice(default, f"vLLM {raw}'s default (Model Runner V2 is the default from {V2_DEFAULT_FROM})")
