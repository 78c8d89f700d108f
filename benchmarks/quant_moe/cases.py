"""The quantized-MoE cases, as data: one row per expert weight format.

Shapes are Kimi-K2.5's routed experts as one GPU of a TP-8 deployment holds them:
384 experts, hidden 7168, expert intermediate 2048 / 8 = 256, top 8 (sigmoid router with a
correction bias, routed scaling 2.827). `gguf` rows give the ggml type of the fused gate+up
tensor (`ffn_gate_exps` / `ffn_up_exps`) and of `ffn_down_exps`; `w4a16` is the official
checkpoint's compressed-tensors INT4 group-32 format that vLLM runs through Marlin MoE;
`bf16` is what the force-dequant loader leaves and what every earlier slice measured.
"""

from __future__ import annotations

EXPERTS, TOP_K, HIDDEN, INTERMEDIATE_TP8 = 384, 8, 7168, 256
ROUTED_SCALING = 2.827
TOKENS = (1, 2, 3, 4, 5, 6, 8, 12, 16)

#: The Q2_K_XL-style mix of the routed experts. No Kimi UD-Q2_K_XL type list is public; these are
#: DeepSeek UD-Q2_K_XL's (sources: benchmarks/quant_moe/q2_k_xl_types.md).
Q2_K_XL_EXPERTS = {"gate_up": "Q2_K", "down": "Q3_K"}

CASES = [
    {"name": "bf16", "kind": "bf16"},
    {"name": "w4a16-g32", "kind": "w4a16", "group": 32},
    {"name": "gguf-q4_k", "kind": "gguf", "gate_up": "Q4_K", "down": "Q4_K"},
    {"name": "gguf-q2_k_xl", "kind": "gguf", **Q2_K_XL_EXPERTS},
    # every other type vLLM's GGUF MoE accepts, both tensors of one type
    *(
        {"name": f"gguf-{t.lower()}", "kind": "gguf", "gate_up": t, "down": t}
        for t in (
            "Q2_K",
            "Q3_K",
            "Q5_K",
            "Q6_K",
            "Q8_0",
            "Q4_0",
            "IQ1_S",
            "IQ1_M",
            "IQ2_XXS",
            "IQ2_XS",
            "IQ2_S",
            "IQ3_XXS",
            "IQ3_S",
            "IQ4_XS",
            "IQ4_NL",
        )
    ),
]


def case(name: str) -> dict:
    for c in CASES:
        if c["name"] == name:
            return c
    raise KeyError(f"no quantized-MoE case named {name!r}; cases: {', '.join(c['name'] for c in CASES)}")
