"""``vllm-k2 gguf check``: will this DeepSeek-MLA GGUF load, before any engine starts?

Runs the loader's own planning on the files (every shard found, every GGUF tensor mapped to
the model and every model tensor present: the audit; which tensors are dequantized at load
and which vLLM's GGUF kernels must run) and checks the MLA attention tensors' shapes against
the config: llama.cpp's ``attn_k_b`` is ``[heads, kv_lora, nope]`` (k_b transposed per head)
and ``attn_v_b`` ``[heads, v, kv_lora]``, or one ``attn_kv_b`` ``[heads * (nope + v), kv_lora]``.
Only headers are read (gguf-py maps the files; no tensor data is dequantized).
"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

from ..hf_config import read_text_config
from .files import UNQUANTIZED, GGUFLoadError, discover_shards
from .loader import Options, _kv_b_parts, make_plan
from .names import DEEPSEEK2_TYPES, deepseek2_name_map


def _mla_shapes(text: dict, where: str) -> dict[str, tuple[int, ...]]:
    try:
        heads, kv_lora = int(text["num_attention_heads"]), int(text["kv_lora_rank"])
        nope, v = int(text["qk_nope_head_dim"]), int(text["v_head_dim"])
    except KeyError as e:
        raise GGUFLoadError(f"{where}: field '{e.args[0]}' is missing (an MLA config needs it)") from e
    return {
        "attn_k_b": (heads, kv_lora, nope),
        "attn_v_b": (heads, v, kv_lora),
        "attn_kv_b": (heads * (nope + v), kv_lora),
    }


def check_gguf(path: str, config_dir: str, force_dequant: list[str] | None = None, on_cpu: bool = False) -> dict:
    """A summary of what loading `path` with `config_dir`'s config would do; raises
    GGUFLoadError naming the file and tensor (or config field) that would fail."""
    where = f"{config_dir}/config.json"
    text = read_text_config(config_dir)
    if text.get("model_type") not in DEEPSEEK2_TYPES:
        raise GGUFLoadError(
            f"{where}: model_type {text.get('model_type')!r} is not a deepseek2 architecture "
            f"({', '.join(DEEPSEEK2_TYPES)}): this check covers DeepSeek-MLA GGUFs only"
        )
    shards = discover_shards(path)
    names = deepseek2_name_map(SimpleNamespace(**text))
    plan = make_plan(
        shards, names, Options(force=["*"] if force_dequant == ["all"] else list(force_dequant or [])), on_cpu=on_cpu
    )
    want = _mla_shapes(text, where)
    layouts = set()
    for i in names.kv_b:
        for gg in _kv_b_parts(i):
            t = plan.tensors.get(gg)
            if t is None:
                continue
            kind = gg.split(".")[2]
            layouts.add("attn_kv_b" if kind == "attn_kv_b" else "attn_k_b + attn_v_b")
            if tuple(t.shape) != want[kind]:
                raise GGUFLoadError(
                    f"{t.file}: tensor '{gg}' has shape {list(t.shape)}, the config ({where}) needs "
                    f"{list(want[kind])} ({kind}: llama.cpp's layout, see vllm_k2_plugin/gguf/mla_layout.py)"
                )
    kept = [g for g, t in plan.tensors.items() if g not in plan.dequant and t.qtype not in UNQUANTIZED]
    return {
        "shards": shards,
        "model_type": text["model_type"],
        "layers": len(names.kv_b),
        "tensors": len(plan.tensors),
        "types": dict(sorted(Counter(t.qtype for t in plan.tensors.values()).items())),
        "mla_layout": " and ".join(sorted(layouts)),
        "dequantized_at_load": len(plan.dequant),
        "kept_quantized": len(kept),
        "tie_word_embeddings": plan.tie_embeddings,
        "for": "vLLM-CPU (no GGUF kernels)" if on_cpu else "GPU (vLLM's GGUF kernels)",
    }
