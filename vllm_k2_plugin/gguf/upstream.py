"""Render this package as one vLLM module for the upstream-ready patch file.

patches/vllm-0.16.0/0006-gguf-deepseek2-mla.patch adds
``vllm/model_executor/model_loader/gguf_deepseek2.py`` with exactly this text (a
test checks they have not drifted) plus three small hooks in vLLM's own files.
"""

from __future__ import annotations

import os
import re

#: in dependency order
PARTS = ("mla_layout.py", "files.py", "names.py", "loader.py")

HEADER = '''# SPDX-License-Identifier: Apache-2.0
"""GGUF loading for deepseek2-architecture models (DeepSeek-V2/V3, Kimi-K2, Kimi-K2.5):
force-dequant, llama.cpp's attn_k_b/attn_v_b MLA split, kimi model types,
multi-shard files, streaming dequantization and a strict audit.

Contributed from vllm-k2-plugin (vllm_k2_plugin/gguf/)."""

from __future__ import annotations

'''


def _strip(text: str) -> str:
    text = re.sub(r'^""".*?"""\n', "", text, count=1, flags=re.S)  # module docstring
    lines = []
    for line in text.splitlines():
        if line.startswith("from __future__") or line.startswith("from ."):
            continue
        lines.append(line)
    return "\n".join(lines).strip("\n") + "\n"


def render() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    body = []
    for name in PARTS:
        with open(os.path.join(here, name)) as f:
            body.append(f"# ---- from vllm_k2_plugin/gguf/{name}\n" + _strip(f.read()))
    return HEADER + "\n\n".join(body)
