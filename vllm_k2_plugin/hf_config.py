"""A model's Hugging Face config as every feature reads it (one place).

Kimi-K2.5 is a multimodal wrapper: its language model's config sits under ``text_config``;
DeepSeek-V3-style checkpoints have it at the top level.
"""

from __future__ import annotations

import json
import os


def text_config(cfg: dict) -> dict:
    """The language model's part of a config.json dict."""
    return cfg.get("text_config", cfg)


def read_text_config(model_dir: str) -> dict:
    path = os.path.join(model_dir, "config.json")
    try:
        with open(path) as f:
            return text_config(json.load(f))
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{path}: no config.json (is {model_dir!r} a model directory?)") from e
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from e


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """vLLM's EAGLE-3 default target layers (2, N//2, N-3), vLLM's convention (id i = the
    residual stream entering layer i); K2.5 (61 layers): (2, 30, 58)."""
    return [2, num_layers // 2, num_layers - 3]
