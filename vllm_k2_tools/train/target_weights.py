"""Read single tensors (embedding, LM head) from a target checkpoint without loading it
whole: Kimi-K2.5's checkpoint is ~600 GB, its embedding 2.35 GB."""

from __future__ import annotations

import glob
import json
import os

import torch

# Text-model names, bare (DeepseekV3ForCausalLM) or inside the K2.5 wrapper.
EMBED = ("model.embed_tokens.weight", "language_model.model.embed_tokens.weight")
LM_HEAD = ("lm_head.weight", "language_model.lm_head.weight")


def _weight_map(model_dir: str) -> dict[str, str]:
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            return {k: os.path.join(model_dir, v) for k, v in json.load(f)["weight_map"].items()}
    from safetensors import safe_open

    out = {}
    for path in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        with safe_open(path, "pt") as f:
            out.update({k: path for k in f.keys()})
    return out


def load_tensor(model_dir: str, names: tuple[str, ...]) -> torch.Tensor:
    from safetensors import safe_open

    wmap = _weight_map(model_dir)
    for name in names:
        if name in wmap:
            with safe_open(wmap[name], "pt") as f:
                return f.get_tensor(name)
    raise KeyError(f"{model_dir}: none of {list(names)} in its safetensors files")
