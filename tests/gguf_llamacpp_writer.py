"""Test-only GGUF writer that follows llama.cpp's DeepSeek-2 conversion on its own.

It imports nothing from the plugin: the GGUF oracle test serves its output through the
plugin's loader, so an orientation error shared by the loader and the plugin's fixture
writer (both use gguf/mla_layout.py) cannot hide. What llama.cpp's convert_hf_to_gguf.py
does for DeepseekV2 (Kimi-K2 converts as deepseek2), restated from its behaviour:

* ``kv_b_proj.weight`` [H * (nope + v), kv_lora] is viewed per head [H, nope + v, kv_lora],
  split along dim 1; ``attn_k_b`` is the k part transposed to [H, kv_lora, nope],
  ``attn_v_b`` the v part as is, [H, v, kv_lora];
* routed experts are stacked per layer: ``ffn_{gate,up,down}_exps`` [n_expert, out, in];
* ``e_score_correction_bias`` becomes ``exp_probs_b.bias``; every other tensor is renamed
  through gguf-py's DeepSeek-2 name map. All tensors F32 (lossless).
"""

from __future__ import annotations

import json
import os

import gguf
import numpy as np
import torch
from safetensors.torch import load_file

#: (GGUFWriter method, config key) for the metadata llama.cpp writes for deepseek2
METADATA = [
    ("add_block_count", "num_hidden_layers"),
    ("add_context_length", "max_position_embeddings"),
    ("add_embedding_length", "hidden_size"),
    ("add_feed_forward_length", "intermediate_size"),
    ("add_head_count", "num_attention_heads"),
    ("add_layer_norm_rms_eps", "rms_norm_eps"),
    ("add_rope_freq_base", "rope_theta"),
    ("add_rope_dimension_count", "qk_rope_head_dim"),
    ("add_q_lora_rank", "q_lora_rank"),
    ("add_kv_lora_rank", "kv_lora_rank"),
    ("add_leading_dense_block_count", "first_k_dense_replace"),
    ("add_expert_count", "n_routed_experts"),
    ("add_expert_used_count", "num_experts_per_tok"),
    ("add_expert_shared_count", "n_shared_experts"),
    ("add_expert_feed_forward_length", "moe_intermediate_size"),
    ("add_expert_weights_scale", "routed_scaling_factor"),
    ("add_vocab_size", "vocab_size"),
]


def convert(hf_dir: str, out_path: str) -> str:
    cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    cfg = cfg.get("text_config", cfg)
    sd = {k.removeprefix("language_model."): v for k, v in load_file(os.path.join(hf_dir, "model.safetensors")).items()}
    n_layers, n_kv = cfg["num_hidden_layers"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    nope, v = cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.DEEPSEEK2, n_layers)
    out: dict[str, np.ndarray] = {}
    experts: dict[tuple[int, str], dict[int, torch.Tensor]] = {}
    for name, t in sd.items():
        if name.startswith(("vision", "mm_")):
            continue
        parts = name.split(".")
        if ".mlp.experts." in name:  # model.layers.L.mlp.experts.E.gate_proj.weight
            experts.setdefault((int(parts[2]), parts[6].removesuffix("_proj")), {})[int(parts[5])] = t
        elif name.endswith("kv_b_proj.weight"):
            per_head = t.view(n_kv, nope + v, t.shape[-1])
            out[f"blk.{parts[2]}.attn_k_b.weight"] = per_head[:, :nope, :].transpose(1, 2).float().numpy()
            out[f"blk.{parts[2]}.attn_v_b.weight"] = per_head[:, nope:, :].float().numpy()
        elif name.endswith("e_score_correction_bias"):
            out[f"blk.{parts[2]}.exp_probs_b.bias"] = t.float().numpy()
        else:
            base, suffix = name.rsplit(".", 1)
            out[f"{names.get_name(base)}.{suffix}"] = t.float().numpy()
    for (layer, kind), per_expert in experts.items():
        stacked = torch.stack([per_expert[e] for e in sorted(per_expert)])
        out[f"blk.{layer}.ffn_{kind}_exps.weight"] = stacked.float().numpy()
    w = gguf.GGUFWriter(out_path, "deepseek2")
    for method, key in METADATA:
        getattr(w, method)(cfg[key])
    w.add_head_count_kv(1)  # llama.cpp's MLA: one latent "KV head"
    w.add_key_length(cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"])
    w.add_value_length(cfg["kv_lora_rank"])
    w.add_expert_weights_norm(bool(cfg["norm_topk_prob"]))
    for name in sorted(out):
        w.add_tensor(name, out[name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out_path
