"""Prefill throughput of the K2.5 slice in a real vLLM engine (issue 39 item 5): the number the
hero-run planner's extraction time rests on, instead of its assumed 30 % of bf16 peak.

On the device (vLLM 0.20 bundle, .gpub/e2e/slice24 carried; dummy weights, router weights
redrawn so tokens spread over all experts as trained routers do):

    python benchmarks/prefill_throughput.py --model .gpub/e2e/slice24 --seq 2048 --batch 8 \\
        --out $OUT/prefill_h200.json

Each round sends ``batch`` prompts of ``seq`` random token ids with ``max_tokens=1`` (prefix
caching off, so every token is computed); tokens/s = batch x seq / best round, and the time per
token per layer = 1 / (tokens/s x layers): at TP 8 each of 8 GPUs runs its share of every
layer, so K2.5's prefill takes 61 x that per token. ``achieved_tflops`` is what this GPU
executed (``slice_flops_per_token``: its TP-8 share of the matmuls, the replicated low-rank
projections counted in full, + causal attention at seq / 2), for reference. The planner reads
the file from ``vllm_k2_tools/train/calibration/prefill_h200.json`` (copy it there; it keeps
the command and date): ``train.plan.load_prefill_calibration``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def slice_flops_per_token(cfg: dict, seq: int) -> dict:
    """FLOPs (2 per multiply-add) per prefill token that one GPU executes for a DeepSeek-V3-style
    config written as its TP share (heads, expert widths): the low-rank q_a / kv_a projections
    are replicated in vLLM, so counted in full; plus causal MLA attention at mean context
    seq / 2 (prefill runs MLA in its MHA form: qk 192, v 128); no lm_head (one token)."""
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    qk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    v, kv_lora, q_lora = cfg["v_head_dim"], cfg["kv_lora_rank"], cfg["q_lora_rank"]
    attn_proj = h * q_lora + q_lora * heads * qk + h * (kv_lora + cfg["qk_rope_head_dim"])
    attn_proj += kv_lora * heads * (cfg["qk_nope_head_dim"] + v) + heads * v * h
    attn_scores = heads * (qk + v) * seq / 2
    moe = (cfg["num_experts_per_tok"] + cfg["n_shared_experts"]) * 3 * h * cfg["moe_intermediate_size"]
    moe += h * cfg["n_routed_experts"]  # router
    dense = 3 * h * cfg["intermediate_size"]
    layers, first_dense = cfg["num_hidden_layers"], cfg["first_k_dense_replace"]
    macs = layers * (attn_proj + attn_scores) + first_dense * dense + (layers - first_dense) * moe
    return {"flops_per_token": 2 * macs, "layers": layers, "moe_layers": layers - first_dense}


def measure(model: str, seq: int, batch: int, rounds: int) -> dict:
    sys.path.insert(0, str(HERE))
    from gpu_engine_e2e import _experts_per_verify
    from vllm import LLM, SamplingParams

    cfg = json.loads((Path(model) / "config.json").read_text())
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # the router probe goes by collective_rpc
    llm = LLM(
        model=model,
        dtype="bfloat16",
        load_format="dummy",
        skip_tokenizer_init=True,
        max_model_len=seq + 16,
        max_num_seqs=batch,
        max_num_batched_tokens=seq * batch,
        enable_prefix_caching=False,
        gpu_memory_utilization=0.88,
        seed=0,
        # batches of seq x batch tokens run outside CUDA graphs and Inductor's fusions are
        # elementwise: eager saves the device call ~1-2 min of compiling and capturing
        enforce_eager=True,
    )
    spread = llm.collective_rpc(_experts_per_verify, args=(3, True))[0]
    rng = random.Random(0)
    vocab = cfg["vocab_size"]
    sp = SamplingParams(max_tokens=1, temperature=0, detokenize=False)

    def one_round() -> float:
        prompts = [{"prompt_token_ids": [rng.randrange(100, vocab - 100) for _ in range(seq)]} for _ in range(batch)]
        t = time.perf_counter()
        llm.generate(prompts, sp, use_tqdm=False)
        return time.perf_counter() - t

    one_round()  # warm-up: compilation, first-touch allocations
    times = [one_round() for _ in range(rounds)]
    f = slice_flops_per_token(cfg, seq)
    tok_s = batch * seq / min(times)
    return {
        "config": {
            k: cfg[k]
            for k in (
                "num_hidden_layers",
                "hidden_size",
                "num_attention_heads",
                "moe_intermediate_size",
                "n_routed_experts",
                "num_experts_per_tok",
            )
        },
        "seq": seq,
        "batch": batch,
        "round_s": [round(t, 4) for t in times],
        "tokens_per_s": round(tok_s, 1),
        "ms_per_token_per_layer": round(1000 / tok_s / f["layers"], 6),
        **f,
        "achieved_tflops": round(tok_s * f["flops_per_token"] / 1e12, 2),
        "routing": spread,
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="the slice's folder (config.json; weights are dummy)")
    ap.add_argument("--seq", type=int, default=2048, help="the recipe's sequence length")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    import torch
    import vllm

    from vllm_k2_plugin import fileio
    from vllm_k2_tools.train.hardware import GPUS, H200_KEY

    r = measure(a.model, a.seq, a.batch, a.rounds)
    peak = GPUS[H200_KEY].bf16_dense_tflops
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (a smoke run: no efficiency to use)"
    r.update(
        gpu=device,
        vllm=vllm.__version__,
        engine_route=os.environ.get("E2E_ENGINE_ROUTE", "vLLM's own wheel"),
        peak_bf16_dense_tflops=peak,
        peak_source=GPUS[H200_KEY].source,
        efficiency=round(r["achieved_tflops"] / peak, 4),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        command=" ".join(["python", "benchmarks/prefill_throughput.py", *(argv or sys.argv[1:])]),
    )
    fileio.write_json(str(a.out), r)
    print(json.dumps(r, indent=1))


if __name__ == "__main__":
    main()
