"""HF <-> GGUF tensor names for the deepseek2 architecture (DeepSeek-V2/V3, Kimi-K2,
Kimi-K2.5's language model), from gguf-py's tensor map plus what it leaves out."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

#: text model types that llama.cpp converts as `deepseek2`.
DEEPSEEK2_TYPES = ("deepseek_v2", "deepseek_v3", "kimi_k2", "kimi_k25")
#: GGUF tensors that carry nothing a vLLM DeepSeek model loads (llama.cpp extras).
IGNORED = re.compile(r"^(rope_freqs\.weight|blk\.\d+\.attn_kv_b_scale.*)$")


@dataclass
class NameMap:
    """gguf name -> hf name, plus the gguf tensors that need special handling."""

    direct: dict[str, str] = field(default_factory=dict)
    experts: dict[str, tuple[str, int]] = field(default_factory=dict)  # gguf -> (hf template, n_expert)
    kv_b: dict[int, str] = field(default_factory=dict)  # layer -> hf kv_b_proj name
    prefix: str = ""

    def hf_names(self) -> set[str]:
        names = set(self.direct.values()) | set(self.kv_b.values())
        for template, n in self.experts.values():
            names |= {template.format(e=e) for e in range(n)}
        return names


def deepseek2_name_map(text_config, prefix: str = "") -> NameMap:
    import gguf

    n_layers = int(text_config.num_hidden_layers)
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.DEEPSEEK2, n_layers)
    first_dense = int(getattr(text_config, "first_k_dense_replace", 0) or 0)
    n_expert = int(getattr(text_config, "n_routed_experts", 0) or 0)
    q_lora = getattr(text_config, "q_lora_rank", None)
    m = NameMap(prefix=prefix)

    def add(hf: str) -> None:
        base, suffix = hf.rsplit(".", 1)
        gg = tmap.get_name(base)
        if gg is None:
            raise KeyError(f"gguf-py has no deepseek2 name for {hf}")
        m.direct[f"{gg}.{suffix}"] = prefix + hf

    for hf in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
        add(hf)
    for i in range(n_layers):
        p = f"model.layers.{i}."
        for hf in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            add(p + hf)
        a = p + "self_attn."
        attn = ["kv_a_proj_with_mqa", "kv_a_layernorm", "o_proj"]
        attn += ["q_a_proj", "q_a_layernorm", "q_b_proj"] if q_lora else ["q_proj"]
        for hf in attn:
            add(f"{a}{hf}.weight")
        m.kv_b[i] = prefix + a + "kv_b_proj.weight"
        if i < first_dense or n_expert == 0:
            for hf in ("gate_proj", "up_proj", "down_proj"):
                add(f"{p}mlp.{hf}.weight")
            continue
        add(p + "mlp.gate.weight")
        m.direct[f"blk.{i}.exp_probs_b.bias"] = prefix + p + "mlp.gate.e_score_correction_bias"
        for hf in ("gate_proj", "up_proj", "down_proj"):
            add(f"{p}mlp.shared_experts.{hf}.weight")
            short = hf.split("_")[0]
            m.experts[f"blk.{i}.ffn_{short}_exps.weight"] = (
                prefix + p + "mlp.experts.{e}." + hf + ".weight",
                n_expert,
            )
    return m
