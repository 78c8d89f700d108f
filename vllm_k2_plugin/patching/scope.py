"""Which engines the GPU/performance patches act in: those serving the DeepSeek-V3 / Kimi-K2.x
family (MLA attention + MoE targets), and their EAGLE-3 drafters.

Those are the models every patch was written and measured for. A patch is installed when
vLLM starts (before the model is known), so each patched code path asks :func:`acts` with
the engine config it already holds (a scheduler's, runner's, builder's ``vllm_config``, or
vLLM's current config while a model is built) and runs vLLM's own code when the answer is
no. ``VLLM_K2_ANY_MODEL=1`` lets them act for any model.

Each process records what was decided per patch (once per patch and answer) in its trace
record (``VLLM_K2_TRACE_DIR``), so a test can see which patches acted for which model.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..log import get_logger

#: HF ``model_type`` of the family (a multimodal wrapper's ``text_config`` counts too).
FAMILY_MODEL_TYPES = frozenset({"deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2", "kimi_k25"})
#: vLLM architecture names of the family's targets.
FAMILY_ARCHITECTURES = frozenset(
    {
        "DeepseekV2ForCausalLM",
        "DeepseekV3ForCausalLM",
        "DeepseekV32ForCausalLM",
        "KimiK25ForConditionalGeneration",
    }
)


@dataclass(frozen=True)
class Verdict:
    acts: bool
    model: str  # "model_type (Architecture)", for the trace and the log


#: id(model config) -> (the config, its verdict); the config is held so that its id stays its own
_VERDICTS: dict[int, tuple[object, Verdict]] = {}
#: (patch, acted) -> model, one entry per patch and answer in this process
_DECISIONS: dict[tuple[str, bool], str] = {}
_TOLD = False  # the out-of-scope line is logged once per process


def target_model_config(config):
    """The model config that decides: a speculating engine's target (its drafter is in scope
    when its target is), the engine's model, or ``config`` itself when it is a model config."""
    spec = getattr(config, "speculative_config", None) or config
    target = getattr(spec, "target_model_config", None)
    if target is not None:
        return target
    return getattr(config, "model_config", config)


def describe(model_config) -> tuple[set[str], set[str]]:
    """(model types, architectures) of a vLLM ModelConfig (or anything with ``hf_config``)."""
    hf = getattr(model_config, "hf_config", None)
    text = getattr(hf, "text_config", None)
    types = {t for t in (getattr(hf, "model_type", None), getattr(text, "model_type", None)) if t}
    archs = set(getattr(model_config, "architectures", None) or getattr(hf, "architectures", None) or ())
    return types, archs


def in_family(model_config) -> bool:
    types, archs = describe(model_config)
    return bool(types & FAMILY_MODEL_TYPES or archs & FAMILY_ARCHITECTURES)


def verdict(config) -> Verdict:
    """Whether the patches act for the engine ``config`` belongs to (cached per model config)."""
    from ..settings import any_model

    model = target_model_config(config)
    if model is None:  # no engine config at hand: vLLM's own code, unless any model is wanted
        return Verdict(any_model(), "no engine config")
    cached = _VERDICTS.get(id(model))
    if cached is not None and cached[0] is model:
        return cached[1]
    types, archs = describe(model)
    label = f"{'/'.join(sorted(types)) or '?'} ({', '.join(sorted(archs)) or '?'})"
    result = Verdict(in_family(model) or any_model(), label)
    _VERDICTS[id(model)] = (model, result)
    return result


def acts(patch: str, config) -> bool:
    """The gate every GPU/performance patch consults: True where ``patch`` may change what
    vLLM does for the engine of ``config`` (a VllmConfig, SpeculativeConfig or ModelConfig;
    None: vLLM's current config; without one, vLLM's own code runs unless VLLM_K2_ANY_MODEL=1)."""
    if config is None:
        from vllm.config import get_current_vllm_config_or_none

        config = get_current_vllm_config_or_none()
    result = verdict(config)
    key = (patch, result.acts)
    if key not in _DECISIONS:
        _DECISIONS[key] = result.model
        _said(patch, result)
    return result.acts


def decisions() -> dict[str, dict]:
    """What the gate answered in this process, per patch: {patch: {"acted": bool, "model": str}}
    (a patch asked for two engines' models keeps the answer that let it act)."""
    out: dict[str, dict] = {}
    for (patch, acted), model in sorted(_DECISIONS.items(), key=lambda kv: kv[0][1]):
        out[patch] = {"acted": acted, "model": model}
    return out


def _said(patch: str, result: Verdict) -> None:
    """Log the first out-of-scope answer in this process; refresh this process's trace record."""
    from ..settings import ENV_ANY_MODEL, Settings

    global _TOLD
    if not result.acts and not _TOLD:
        _TOLD = True
        get_logger("patching").info(
            "vllm-k2: %s is not of the DeepSeek-V3 / Kimi-K2.x family: the plugin's GPU patches run vLLM's own "
            "code for it (%s=1 lets them act)",
            result.model,
            ENV_ANY_MODEL,
        )
    trace_dir = Settings.from_env().trace_dir
    if trace_dir:
        from .. import trace

        trace.write_trace(trace_dir)
