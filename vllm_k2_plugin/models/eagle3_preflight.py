"""Check an EAGLE-3 drafter against its target while vLLM builds its config.

Runs in the API server / LLM process inside ``EngineArgs.create_speculative_config``,
before any engine or worker starts, on every vLLM version:

* broken drafters fail there with DraftCheckError naming file and field/tensor; a drafter
  given as a hub id is resolved through the local Hugging Face cache first (offline and
  not cached: an error naming the id, before vLLM's own);
* the draft config is completed the way the speculator class needs it:
  ``target_hidden_size`` from the target's ``text_config`` when the drafter omits it,
  and a nested ``eagle_config.eagle_aux_hidden_state_layer_ids`` promoted to the top
  level (vLLM 0.16 reads only the top level and silently used the target default).
  The changed config travels to the workers inside VllmConfig.
"""

from __future__ import annotations

import os

from vllm_k2_plugin.patching import REGISTRY, PatchContext
from vllm_k2_plugin.threads import caller_thread_only

from .eagle3_checks import MLA_ARCHS, DraftCheckError, TargetShape, architecture, check_draft, read_draft_config


def _draft_dir(spec) -> str | None:
    path = getattr(spec, "model", None) or getattr(getattr(spec, "draft_model_config", None), "model", None)
    return resolve_draft(path, getattr(spec, "revision", None)) if path else None


def resolve_draft(path: str, revision: str | None = None) -> str:
    """The drafter's local directory: as given, or a hub id resolved through the local
    Hugging Face cache (fetched first when online, as vLLM itself would right after)."""
    if os.path.isdir(path):
        return path
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() not in ("", "0", "false", "no")
    try:
        return snapshot_download(path, revision=revision, allow_patterns=DRAFT_FILES, local_files_only=offline)
    except LocalEntryNotFoundError as e:
        raise DraftCheckError(
            f"EAGLE-3 drafter {path!r}: not a directory and not in the local Hugging Face cache "
            "(HF_HUB_OFFLINE is set): download it first, e.g. `huggingface-cli download " + path + "`"
        ) from e


#: What the drafter check reads (and vLLM loads): configs and weights.
DRAFT_FILES = ["*.json", "*.safetensors"]


def preflight(spec, target_model_config, load_format: str | None = None) -> None:
    if spec is None or getattr(spec, "method", None) != "eagle3":
        return
    draft_dir = _draft_dir(spec)
    if draft_dir is None:
        return
    target = TargetShape.from_hf_text_config(target_model_config.hf_text_config)
    summary = check_draft(draft_dir, target, weights=str(load_format or "auto") != "dummy")
    hf = spec.draft_model_config.hf_config
    if getattr(hf, "target_hidden_size", None) is None and summary.target_hidden_size != summary.hidden_size:
        hf.target_hidden_size = summary.target_hidden_size
    if summary.aux_layer_ids is not None and not getattr(hf, "eagle_aux_hidden_state_layer_ids", None):
        hf.eagle_aux_hidden_state_layer_ids = list(summary.aux_layer_ids)


def vllm_builds(arch: str) -> bool:
    from vllm.model_executor.models.registry import ModelRegistry

    return arch in ModelRegistry.get_supported_archs()


def drafter_class(arch: str) -> str:
    """module:Class that vLLM's registry builds for this drafter architecture."""
    from vllm.model_executor.models.registry import ModelRegistry

    entry = ModelRegistry.models[arch]
    return f"{entry.module_name}:{entry.class_name}"


def check_drafter_class(draft_dir: str) -> None:
    """An MLA drafter on a vLLM without a class for it: say so, naming the field, instead of
    vLLM's list of every architecture it supports."""
    cfg, where = read_draft_config(draft_dir)
    arch = architecture(cfg)
    if arch in MLA_ARCHS and not vllm_builds(arch):
        from vllm import __version__

        raise DraftCheckError(
            f"{where}: field 'architectures' is ['{arch}'], an EAGLE-3 drafter with MLA attention; "
            f"vLLM {__version__} has no class for it (vLLM builds it from 0.18 on, the plugin on 0.16 and "
            "0.17 unless its patch kimi-eagle3-mla-draft-class is disabled). On this vLLM, "
            "serve a Llama-style EAGLE-3 drafter (e.g. lightseekorg/kimi-k2.5-eagle3, "
            "AQ-MedAI/Kimi-K25-eagle3) or one trained with `vllm-k2 train`."
        )


def _wrap(original):
    def create_speculative_config(self, target_model_config, target_parallel_config, *args, **kwargs):
        asked = self.speculative_config if isinstance(self.speculative_config, dict) else {}
        # this runs in the process vLLM forks its engine from: no torch worker threads there
        # (the d2t check's ops over a K2.5 drafter's vocabulary are big enough to start them)
        with caller_thread_only():
            if asked.get("method") == "eagle3" and isinstance(asked.get("model"), str):
                # before vLLM's own, less clear, errors
                check_drafter_class(resolve_draft(asked["model"], asked.get("revision")))
            spec = original(self, target_model_config, target_parallel_config, *args, **kwargs)
            preflight(spec, target_model_config, getattr(self, "load_format", None))
        return spec

    return create_speculative_config


@REGISTRY.patch(
    name="eagle3-draft-preflight",
    feature="eagle3",
    target="vllm.engine.arg_utils:EngineArgs.create_speculative_config",
    applies_to=">=0.16,<0.35",
    upstream="none: plugin feature (clear drafter errors before serving)",
    why="broken drafters otherwise fail late (worker) or serve garbage (bad d2t, wrong aux ids)",
    remove_when="vLLM validates drafters against the target itself",
)
def _apply(ctx: PatchContext) -> None:
    from vllm.engine.arg_utils import EngineArgs

    ctx.target()  # names this patch if the method moved
    ctx.wrap(EngineArgs, "create_speculative_config", _wrap)
