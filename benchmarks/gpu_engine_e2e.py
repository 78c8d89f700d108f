"""Our MLA backend and EAGLE-3 inside a real GPU vLLM engine (vLLM 0.20 on the H200).

Every case is one engine in its own process (``case``). ``run`` starts a suite's cases,
``--parallel`` at a time: engines build side by side (compile, capture) but measure one
at a time under a file lock, after every engine of the group is ready, so no timing
shares the GPU or the host with another engine's start-up.

  python benchmarks/gpu_engine_e2e.py prepare DIR                 # here: prompts, drafters' configs
  python benchmarks/gpu_engine_e2e.py run SUITE --models DIR --out OUT [--parallel N]
  python benchmarks/gpu_engine_e2e.py report OUT/*.json --out benchmarks/results/gpu_engine_h200

Suites are data: ``gpu_suites.toml`` (each suite's defaults and cases; a new suite is a table
there, not code here), e.g. ``tiny`` (the trained tiny target: stock vs ours, eager vs graphs,
EAGLE-3 with the trained drafter, n-gram, the self-check fallback), ``slice`` (a K2.5-sized
per-GPU slice with dummy weights: decode step times at 4k/32k/128k) and ``load`` (a serving load,
``engine_load.py``). Time per step = (t(129 tokens) - t(1 token)) / (steps between them), steps from vLLM's
own spec-decode counters (one per token without speculation).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import fcntl
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CONTEXTS = (4096, 32768, 131072)
BENCH_DRAFTER = REPO / "benchmarks" / "results" / "bench_ab_tiny_bench_drafter_cpu" / "drafter"
DEEP_LAYERS = 24  # slice24: 23 MoE layers x 4.2 GB of bf16 experts fit one H200 with its KV cache
GEN = 129  # tokens generated for a timing; the first comes from the prefill
STEP_ROUNDS = 5  # interleaved (1-token, GEN-token) request pairs per context
CUDAGRAPH_LOG = (
    "CUDAGraphMode",
    "cudagraph_mode",
    "Capturing CUDA graphs",
    "self-check",
    "draft step",
    "EAGLE drafter attention",
    "grouped GGUF MoE",
    "speculation guard",
)

# --------------------------------------------------------------------------- models

#: The official Kimi-K2.5 checkpoint's expert format as its config states it: compressed-tensors
#: INT4 weights, symmetric, group 32, bf16 activations (W4A16, vLLM runs it through Marlin MoE);
#: attention, shared experts, dense MLPs and the head stay bf16.
W4A16_EXPERTS = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "quantization_status": "compressed",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {
                "num_bits": 4,
                "type": "int",
                "symmetric": True,
                "group_size": 32,
                "strategy": "group",
                "dynamic": False,
                "actorder": None,
                "observer": "minmax",
            },
            "input_activations": None,
            "output_activations": None,
        }
    },
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
    "kv_cache_scheme": None,
}


def slice_config() -> dict:
    """K2.5's per-GPU share at TP 8 (64 heads / 8, experts' 2048 / 8, vocab 163,840 / 8)."""
    from vllm_k2_tools.fixtures.build import K25_ROPE_SCALING

    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": 7168,
        "num_hidden_layers": 12,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "intermediate_size": 18432 // 8,
        "moe_intermediate_size": 2048 // 8,
        "n_routed_experts": 384,
        "num_experts_per_tok": 8,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.827,
        "vocab_size": 163840 // 8,
        "max_position_embeddings": 262144,
        "rope_theta": 50000.0,
        "rope_scaling": dict(K25_ROPE_SCALING),  # MLA drafters take the target's RoPE
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": False,
        "num_nextn_predict_layers": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
    }


def prepare(dest: Path, trained_draft: Path | None) -> None:
    """Written here (CPU), carried to the device: the slice and its dummy drafter's
    configs, the trained drafter, held-out code prompts of the trained tiny target."""
    import shutil
    import tempfile

    from transformers import AutoTokenizer

    from vllm_k2_plugin import fileio
    from vllm_k2_tools.fixtures import build_fixture
    from vllm_k2_tools.fixtures import trained_target as tt
    from vllm_k2_tools.train.draft_model import DraftConfig
    from vllm_k2_tools.train.export import export_config, mla_layer_config

    dest.mkdir(parents=True, exist_ok=True)
    cfg = slice_config()
    fileio.write_json(str(dest / "slice" / "config.json"), cfg)
    n = cfg["num_hidden_layers"]
    draft = DraftConfig(
        hidden_size=7168,
        target_hidden_size=7168,
        num_attention_heads=8,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=18432 // 8,
        draft_vocab_size=16384,  # <= the slice's vocab: dummy weights leave d2t at zero
        vocab_size=cfg["vocab_size"],
        aux_layer_ids=[2, n // 2, n - 3],
        max_position_embeddings=cfg["max_position_embeddings"],
    )
    fileio.write_json(
        str(dest / "slice-draft" / "config.json"),
        export_config("legacy", draft, str(dest / "slice"), "bfloat16", k=3),
    )
    # the per-GPU share at TP 8 of a drafter with 64 query and 8 KV heads: 1 KV head, an
    # eighth of slice-draft's KV bytes per token (4 KiB -> 512 B)
    fileio.write_json(
        str(dest / "slice-draft-kv1" / "config.json"),
        export_config(
            "legacy", dataclasses.replace(draft, num_key_value_heads=1), str(dest / "slice"), "bfloat16", k=3
        ),
    )
    # K2.5's drafter at TP 8 as one GPU holds it: 8 KV heads / 8 and a draft vocab of
    # 32,000 / 8 (the lm_head is vocab-parallel), like the slice's own vocab
    fileio.write_json(
        str(dest / "slice-draft-tp8" / "config.json"),
        export_config(
            "legacy",
            dataclasses.replace(draft, num_key_value_heads=1, draft_vocab_size=32_000 // 8),
            str(dest / "slice"),
            "bfloat16",
            k=3,
        ),
    )
    mla_draft = dataclasses.replace(
        draft,
        attention="mla",
        **{k: cfg[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")},
        rope_theta=cfg["rope_theta"],
        rope_scaling=cfg["rope_scaling"],  # K2.5's YaRN, as the MLA drafters take the target's RoPE
        max_position_embeddings=cfg["max_position_embeddings"],
    )
    # the MLA drafter (lightseekorg's layout, vLLM's own K2.5 recipe) at the same TP-8 share as
    # slice-draft-tp8: the slice's 8 MLA heads (K2.5's 64 / 8), a draft vocab of 32,000 / 8
    fileio.write_json(
        str(dest / "slice-draft-mla-tp8" / "config.json"),
        mla_layer_config(dataclasses.replace(mla_draft, draft_vocab_size=32_000 // 8), "bfloat16"),
    )
    # the same slice with W4A16 routed experts (the official checkpoint's format); same drafters
    fileio.write_json(str(dest / "slice-w4a16" / "config.json"), {**cfg, "quantization_config": W4A16_EXPERTS})
    # half the layers: with the 12-layer slice, step time = fixed + per-layer x layers can be
    # fit and carried to K2.5's 61 (suite dgdepth)
    half = {**cfg, "num_hidden_layers": n // 2}
    fileio.write_json(str(dest / "slice6" / "config.json"), half)
    m = half["num_hidden_layers"]
    fileio.write_json(
        str(dest / "slice6-draft" / "config.json"),
        export_config(
            "legacy",
            dataclasses.replace(draft, aux_layer_ids=[1, m // 2, m - 2]),
            str(dest / "slice6"),
            "bfloat16",
            k=3,
        ),
    )
    # the deepest slice one H200 holds (24 layers of bf16 experts: ~100 GB) with K2.5's drafter at
    # its TP-8 share: the step ratio at twice the 12-layer slice's depth (dgdeep)
    deep = {**cfg, "num_hidden_layers": DEEP_LAYERS}
    fileio.write_json(str(dest / "slice24" / "config.json"), deep)
    fileio.write_json(
        str(dest / "slice24-draft-tp8" / "config.json"),
        export_config(
            "legacy",
            dataclasses.replace(
                draft,
                num_key_value_heads=1,
                draft_vocab_size=32_000 // 8,
                aux_layer_ids=[2, DEEP_LAYERS // 2, DEEP_LAYERS - 3],
            ),
            str(dest / "slice24"),
            "bfloat16",
            k=3,
        ),
    )
    fileio.write_json(
        str(dest / "slice24-draft-mla-tp8" / "config.json"),
        mla_layer_config(
            dataclasses.replace(
                mla_draft, draft_vocab_size=32_000 // 8, aux_layer_ids=[2, DEEP_LAYERS // 2, DEEP_LAYERS - 3]
            ),
            "bfloat16",
        ),
    )
    with tempfile.TemporaryDirectory() as tmp:
        tok = AutoTokenizer.from_pretrained(build_fixture("trained-text", tmp))
    held = [f for f in tt.stdlib_files() if tt.is_heldout(f)]
    chats = tt.code_chats(held)
    random.Random(0).shuffle(chats)
    prompts = [tok.apply_chat_template(chat[:1], add_generation_prompt=True, tokenize=False) for chat in chats[:12]]
    fileio.write_json(str(dest / "prompts.json"), prompts)
    # the load suites' requests: 64 other held-out chats, every other one sampled with its own seed
    load = [
        {"prompt": tok.apply_chat_template(chat[:1], add_generation_prompt=True, tokenize=False)}
        | ({"temperature": 0.8, "seed": 1000 + i} if i % 2 else {})
        for i, chat in enumerate(chats[12:76])
    ]
    fileio.write_json(str(dest / "load_prompts.json"), load)
    if trained_draft is not None:  # the training pipeline's export (its weights and config)
        shutil.copytree(trained_draft, dest / "draft", dirs_exist_ok=True)


# --------------------------------------------------------------------------- worker-side probes
# Sent to the engine's worker by collective_rpc (cloudpickle): each gets the worker first.


def _patch_states(worker) -> dict[str, str]:
    """Each of our patches' state in the worker (applied, disabled, failed, ...)."""
    from vllm_k2_plugin.patching import REGISTRY

    return {p.name: p.state.value for p in REGISTRY}


def _patch_reasons(worker) -> dict[str, str]:
    """Why each patch that did not apply is in its state (the README's release table reads them)."""
    from vllm_k2_plugin.patching import REGISTRY

    return {p.name: p.reason for p in REGISTRY if p.reason}


def _kv_cache_tokens(worker) -> int:
    """Tokens the engine's KV cache holds: blocks x block size (a drafter's layers share the
    blocks: a speculative engine holds fewer tokens in the same kv_cache_memory_bytes)."""
    cfg = worker.model_runner.kv_cache_config
    return cfg.num_blocks * min(g.kv_cache_spec.block_size for g in cfg.kv_cache_groups)


def _install_counters(worker) -> str:
    """Count, per attention-metadata build, prefill batches and decode batches by query
    length, and Python-level calls of the MLA prefill path (forward_mha)."""
    import collections

    from vllm.model_executor.layers.attention import mla_attention as m

    stats = m.__dict__.setdefault("_k2_e2e_stats", collections.Counter())
    if not getattr(m.MLACommonMetadataBuilder.build, "_k2_counted", False):
        build = m.MLACommonMetadataBuilder.build

        def counted_build(self, *a, **kw):
            md = build(self, *a, **kw)
            if getattr(md, "num_prefills", 0):
                stats["prefill_batches"] += 1
            if getattr(md, "decode", None) is not None and md.num_decodes:
                stats[f"decode_batches_q{md.num_decode_tokens // md.num_decodes}"] += 1
            return md

        counted_build._k2_counted = True
        m.MLACommonMetadataBuilder.build = counted_build
        mha = m.MLACommonImpl.forward_mha

        def counted_mha(self, *a, **kw):
            stats["forward_mha_calls"] += 1
            return mha(self, *a, **kw)

        m.MLACommonImpl.forward_mha = counted_mha
    impls = sorted({type(mod.impl).__name__ for mod in worker.model_runner.model.modules() if hasattr(mod, "impl")})
    return ",".join(impls)


def _draft_graph_stats(worker) -> dict | None:
    """The draft-step-graph patch's per-proposer state: shapes captured, failed, replays."""
    drafter = getattr(worker.model_runner, "drafter", None)
    graphs = drafter.__dict__.get("_vllm_k2_draft_graphs") if drafter is not None else None
    if graphs is None:
        return None
    return {"captured": sorted(k[0] for k in graphs.graphs), "failed": len(graphs.failed), "replays": graphs.replays}


def _async_spec_stats(worker) -> dict | None:
    """Patch async-spec-zero-bubble's per-runner state: steps prepared without the wait, steps
    that waited, requests whose books were corrected, drafts found rejected; why it is off."""
    from vllm_k2_plugin.async_spec.patch import STATE

    st = worker.model_runner.__dict__.get(STATE)
    return None if st is None else {**st.stats, "off": st.off}


def _drafter_attention(worker) -> list[str]:
    """Metadata builder classes of the drafter's attention layers (its attention backend)."""
    from vllm_k2_plugin.draft_graph.vllm_adapter import drafter_metadata_builders

    drafter = getattr(worker.model_runner, "drafter", None)
    return sorted({type(b).__name__ for b in drafter_metadata_builders(drafter)}) if drafter is not None else []


def _read_counters(worker, reset: bool) -> dict:
    from vllm.model_executor.layers.attention import mla_attention as m

    stats = m.__dict__.get("_k2_e2e_stats", {})
    out = dict(stats)
    if reset:
        stats.clear()
    return out


def _routers(model):
    return [mod for name, mod in model.named_modules() if name.endswith("mlp.gate") and hasattr(mod, "weight")]


def _experts_per_verify(worker, k: int, spread: bool, seed: int = 0) -> dict:
    """Distinct routed experts that k+1 consecutive tokens pick in the first MoE layer,
    ESTIMATED from the tokens' embeddings through that layer's norm and router (attention's
    contribution ignored); ``spread`` first redraws every router's weight at a scale that
    makes its logits ~N(0, 1), so routing spreads over all experts."""
    import torch

    model = worker.model_runner.model
    gates = _routers(model)
    layer = next(mod for name, mod in model.named_modules() if name.endswith("layers.1"))
    embed = model.model.embed_tokens.weight
    g = torch.Generator(device=embed.device).manual_seed(seed)
    ids = torch.randint(0, embed.shape[0], (256,), generator=g, device=embed.device)
    x = embed[ids].float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * layer.post_attention_layernorm.weight.float()
    if spread:
        for gate in gates:
            if gate.weight.numel() == 0:
                continue
            w = torch.randn(gate.weight.shape, generator=g, device=gate.weight.device, dtype=torch.float32)
            scale = 1.0 / float((x @ w.T).std())
            gate.weight.data.copy_((w * scale).to(gate.weight.dtype))
    gate = gates[0]
    if gate.weight.numel() == 0:  # vLLM-CPU repacks the router: nothing to read
        return {"tokens": k + 1, "error": "router weight not materialised on this platform"}
    top_k = min(8, gate.weight.shape[0])
    bias = getattr(gate, "e_score_correction_bias", None)
    scores = torch.sigmoid(x @ gate.weight.float().T)
    scores = scores + (bias.float() if bias is not None else 0)
    top = scores.topk(top_k, dim=-1).indices  # [256, top_k]
    groups = top[: (256 // (k + 1)) * (k + 1)].reshape(-1, (k + 1) * top_k)
    distinct = [len(set(row.tolist())) for row in groups]
    return {"tokens": k + 1, "mean_distinct_experts": sum(distinct) / len(distinct), "routers": len(gates)}


# --------------------------------------------------------------------------- one engine


def _spec_counts(llm) -> dict:
    out = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": []}
    for m in llm.get_metrics():
        if m.name == "vllm:spec_decode_num_drafts":
            out["drafts"] = m.value
        elif m.name == "vllm:spec_decode_num_draft_tokens":
            out["draft_tokens"] = m.value
        elif m.name == "vllm:spec_decode_num_accepted_tokens":
            out["accepted"] = m.value
        elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            out["per_pos"] = list(m.values)
    return out


def _delta(a: dict, b: dict) -> dict:
    per_pos = [y - x for x, y in zip(a["per_pos"] or [0] * len(b["per_pos"]), b["per_pos"], strict=False)]
    return {k: b[k] - a[k] for k in ("drafts", "draft_tokens", "accepted")} | {"per_pos": per_pos}


class GpuTurn:
    """Wait until every engine of the group is ready (or gone), then hold the GPU lock."""

    def __init__(self, name: str):
        self.name, self.dir = name, os.environ.get("E2E_GROUP_DIR")

    def __enter__(self):
        if not self.dir:
            return self
        Path(self.dir, f"{self.name}.ready").touch()
        size = int(os.environ["E2E_GROUP_SIZE"])
        while (
            len({p.stem for p in Path(self.dir).glob("*.ready")} | {p.stem for p in Path(self.dir).glob("*.exit")})
            < size
        ):
            time.sleep(0.5)
        self.lock = open(Path(self.dir, "gpu.lock"), "w")
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        if self.dir:
            fcntl.flock(self.lock, fcntl.LOCK_UN)
            self.lock.close()


def run_case(case: dict) -> dict:
    from vllm import LLM, SamplingParams

    spec = case.get("spec")
    speculative_config = None
    if spec and spec["method"] == "eagle3":
        speculative_config = {"method": "eagle3", "model": spec["model"], "num_speculative_tokens": spec["k"]}
    elif spec and spec["method"] == "ngram":
        speculative_config = {
            "method": "ngram",
            "num_speculative_tokens": spec["k"],
            "prompt_lookup_max": 4,
            "prompt_lookup_min": 2,
        }
    dummy = case.get("dummy", False)
    t0 = time.time()
    llm = LLM(
        model=case["model"],
        dtype="bfloat16",
        max_model_len=case["max_model_len"],
        enforce_eager=not case["graphs"],
        compilation_config={"backend": "eager"} if case["graphs"] else None,
        max_num_seqs=case.get("max_num_seqs", 4),
        gpu_memory_utilization=case["gpu_memory_utilization"],
        kv_cache_memory_bytes=case["kv_cache_bytes"],
        speculative_config=speculative_config,
        load_format="dummy" if dummy else "auto",
        skip_tokenizer_init=dummy,
        enable_prefix_caching=True,
        seed=0,
        disable_log_stats=False,
        **case.get("llm_kwargs", {}),
    )
    # engines of one group start together and are measured one at a time (GpuTurn)
    import vllm

    result = {"case": case, "init_s": round(time.time() - t0, 1), "engines_at_once": int(os.environ["E2E_GROUP_SIZE"])}
    result["vllm"] = vllm.__version__
    result["engine_route"] = os.environ.get("E2E_ENGINE_ROUTE", "vLLM's own wheel")
    result["impls"] = llm.collective_rpc(_install_counters)[0]
    result["patches"] = llm.collective_rpc(_patch_states)[0]
    result["patch_reasons"] = llm.collective_rpc(_patch_reasons)[0]
    result["kv_cache_tokens"] = llm.collective_rpc(_kv_cache_tokens)[0]
    if dummy:
        k = spec["k"] if spec else 3
        result["experts_dummy_router"] = llm.collective_rpc(_experts_per_verify, args=(k, False))[0]
        if case.get("routing") == "spread":
            result["experts_spread_router"] = llm.collective_rpc(_experts_per_verify, args=(k, True))[0]
    sp = lambda n: SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, detokenize=not dummy)  # noqa: E731

    def timed(prompt, n):
        before = _spec_counts(llm)
        t = time.perf_counter()
        out = llm.generate([prompt], sp(n), use_tqdm=False)[0].outputs[0]
        dt = time.perf_counter() - t
        d = _delta(before, _spec_counts(llm))
        return dt, d, list(out.token_ids)

    with GpuTurn(case["name"]):
        if case["task"] == "greedy":
            prompts = json.loads(Path(case["prompts"]).read_text())
            llm.collective_rpc(_read_counters, args=(True,))
            outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=64, ignore_eos=True, logprobs=2))
            result["tokens"] = [list(o.outputs[0].token_ids) for o in outs]
            # top-2 logprob margin per generated token: explains a divergence between backends
            result["margins"] = [
                [
                    round(lp[t].logprob - max((v.logprob for i, v in lp.items() if i != t), default=-1e9), 4)
                    for t, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs, strict=True)
                ]
                for o in outs
            ]
            result["text0"] = outs[0].outputs[0].text[:160]
            result["counters_greedy"] = llm.collective_rpc(_read_counters, args=(True,))[0]
            # single stream: 1 warm-up, then best of 3, 256 tokens of the first prompt
            timed(prompts[0], 256)
            runs = [timed(prompts[0], 256) for _ in range(3)]
            best = min(runs, key=lambda r: r[0])
            result["single_stream"] = {
                "tokens": len(best[2]),
                "s": round(best[0], 4),
                "tok_s": round(len(best[2]) / best[0], 1),
            }
            result["spec"] = best[1]
            result["counters_single_stream"] = llm.collective_rpc(_read_counters, args=(True,))[0]
        elif case["task"] == "load":  # a serving load, concurrency by concurrency (engine_load.py)
            from benchmarks.engine_load import run_load

            prompts = json.loads(Path(case["load_prompts"]).read_text())
            # warm-up: every batch size once (the draft-step graphs are captured at a size's first
            # use, and each capture stalls the engine: the first GPU load run measured them inside)
            for n in range(1, case["max_num_seqs"] + 1):
                llm.generate([p["prompt"] for p in prompts[:n]], sp(8), use_tqdm=False)
            result["load"] = [
                run_load(llm, prompts[: case["requests"][str(c)]], c, case["max_tokens"]) for c in case["concurrency"]
            ]
            if case.get("guard_trace") and os.path.exists(os.environ["GUARD_STEP_LOG"]):
                from benchmarks.guard_step_trace import summarize

                result["guard_steps"] = summarize(os.environ["GUARD_STEP_LOG"])
        elif case["task"] == "steps":
            rng = random.Random(0)
            vocab = case["vocab"]
            result["contexts"] = {}
            for ctx in case["contexts"]:
                ids = [rng.randrange(100, vocab - 100) for _ in range(ctx - GEN - 8)]
                prompt = {"prompt_token_ids": ids}
                timed(prompt, 1)  # prefill into the prefix cache
                llm.collective_rpc(_read_counters, args=(True,))
                # a step = (GEN-token request - 1-token request) / its steps, from the medians of
                # interleaved rounds: a slow 1-token outlier must not shrink the step (a min over
                # per-round differences once gave a spec step faster than a plain one)
                t1s, tns = [], []
                for _ in range(STEP_ROUNDS):
                    t1, d1, _ = timed(prompt, 1)
                    tn, dn, toks = timed(prompt, GEN)
                    t1s.append(t1)
                    tns.append(tn)
                steps = decode_steps({"accepted": dn["accepted"] - d1["accepted"]}, toks)
                step_ms = 1000 * (statistics.median(tns) - statistics.median(t1s)) / max(steps, 1)
                result["contexts"][str(ctx)] = {
                    "step_ms": round(step_ms, 3),
                    "steps": steps,
                    "tokens": len(toks) - 1,
                    "tokens_per_step": round((len(toks) - 1) / max(steps, 1), 3),
                    "spec": dn,
                    "request_s": {"1": [round(t, 5) for t in t1s], str(GEN): [round(t, 5) for t in tns]},
                    "counters": llm.collective_rpc(_read_counters, args=(True,))[0],
                }
        elif case["task"] in ("profile", "hostprof"):  # in-process engine (case_env): profilers see it all
            if "contexts" in case:
                rng = random.Random(0)
                ids = [rng.randrange(100, case["vocab"] - 100) for _ in range(case["contexts"][0] - GEN - 8)]
                prompt = {"prompt_token_ids": ids}
            else:
                prompt = json.loads(Path(case["prompts"]).read_text())[0]
            timed(prompt, 1)
            timed(prompt, GEN)  # warm
            # eager (no CUDA graphs): every kernel has the Python stack that launched it
            result["profile"] = profile_steps(lambda: timed(prompt, GEN), stacks=not case["graphs"])
            if case["task"] == "hostprof":
                wall, d, toks = timed(prompt, GEN)
                result["wall_ms_per_step"] = round(1000 * wall / decode_steps(d, toks), 3)
                result["host"] = host_profile(lambda: timed(prompt, GEN))
    if spec:
        result["draft_graphs"] = llm.collective_rpc(_draft_graph_stats)[0]
    if spec and spec["method"] == "eagle3":
        result["drafter_attention"] = llm.collective_rpc(_drafter_attention)[0]
        result["async_spec"] = llm.collective_rpc(_async_spec_stats)[0]
    return result


def profile_steps(run, stacks: bool = False) -> dict:
    """Wall time vs GPU-busy time per engine step (torch.profiler; the union of kernel
    intervals, so overlapping kernels count once), kernels per step, the top kernels, the
    GPU's idle gaps by the kernels around them, and the host's waits on the GPU.
    ``stacks``: also the Python stacks of the dtype casts and copies with the most device
    time (only meaningful without CUDA graphs, where every kernel has a launching op)."""
    import collections

    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=stacks) as prof:
        wall, spec, toks = run()
    steps = decode_steps(spec, toks)  # a guard's k = 0 steps draft nothing: not a count of drafts
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    spans = sorted((e.time_range.start, e.time_range.end) for e in kernels)
    busy, end = 0.0, float("-inf")
    for a, b in spans:
        if b > end:
            busy += b - max(a, end)
            end = b
    per_name, count = collections.Counter(), collections.Counter()
    for e in kernels:
        per_name[e.name[:80]] += e.time_range.end - e.time_range.start
        count[e.name[:80]] += 1
    # full kernel names (the 80-character prefix above can merge several kernels), and the ops
    # that launched kernels outside any CUDA graph with their input shapes (inside a replay a
    # kernel has no op of its own)
    averages = prof.key_averages(group_by_input_shape=True)
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    by_kernel = sorted((o for o in averages if o.device_type == cuda), key=lambda o: -o.self_device_time_total)
    by_op = sorted(
        (o for o in averages if o.device_type == cpu and o.device_time_total > 0), key=lambda o: -o.device_time_total
    )
    extra = {"copy_stacks": _copy_stacks(prof, steps)} if stacks else {}
    # vLLM's expert sort (moe_align_block_size): whether this version's MoE sorts a step's tokens
    # by expert at all, the question behind patch moe-group-tokens-by-expert
    sort = [e for e in kernels if "moe_align_block_size" in e.name]
    return {
        **extra,
        "moe_sort_per_step": {
            "calls": round(len(sort) / steps, 2),
            "ms": round(sum(e.time_range.end - e.time_range.start for e in sort) / 1000 / steps, 4),
        },
        "gpu_idle": _idle_gaps(kernels, steps),
        "host_waits": _host_waits(prof, steps),
        "steps": steps,
        "steps_from": "decode_steps",  # earlier files counted drafting steps (wrong at k = 0)
        "wall_ms_per_step": round(1000 * wall / steps, 3),
        "gpu_busy_ms_per_step": round(busy / 1000 / steps, 3),
        "kernels_per_step": round(len(kernels) / steps, 1),
        "top_kernels_ms_per_step": {k: round(v / 1000 / steps, 3) for k, v in per_name.most_common(12)},
        "top_kernels_per_step": {k: round(count[k] / steps, 2) for k, _ in per_name.most_common(12)},
        "kernels_full_names": [
            {
                "kernel": o.key,
                "calls": round(o.count / steps, 2),
                "ms": round(o.self_device_time_total / 1000 / steps, 4),
            }
            for o in by_kernel[:20]
        ],
        "eager_ops_ms_per_step": [  # device time of the kernels each op launched, its children's included
            {
                "op": o.key,
                "shapes": str(o.input_shapes)[:200],
                "calls": round(o.count / steps, 2),
                "ms": round(o.device_time_total / 1000 / steps, 4),
            }
            for o in by_op[:25]
        ],
    }


def _idle_gaps(kernels, steps: int, min_us: float = 20.0, top: int = 12) -> dict:
    """Where the GPU waits: gaps of at least ``min_us`` between kernels (union of intervals),
    grouped by the kernel that ended before the gap and the one that started after it."""
    import collections

    ms, calls = collections.Counter(), collections.Counter()
    end, last = None, None
    for e in sorted(kernels, key=lambda e: e.time_range.start):
        a, b = e.time_range.start, e.time_range.end
        if end is not None and a - end >= min_us:
            key = (last.name[:60], e.name[:60])
            ms[key] += a - end
            calls[key] += 1
        if end is None or b > end:
            end, last = b, e
    return {
        "min_gap_us": min_us,
        "ms_per_step": round(sum(ms.values()) / 1000 / steps, 3),
        "gaps_per_step": round(sum(calls.values()) / steps, 2),
        "by_neighbours": [
            {"before": k[0], "after": k[1], "calls": round(calls[k] / steps, 2), "ms": round(v / 1000 / steps, 4)}
            for k, v in ms.most_common(top)
        ],
    }


#: CUDA runtime calls in which the host blocks until the GPU gets somewhere.
HOST_WAITS = ("cudaEventSynchronize", "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpy")


def _host_waits(prof, steps: int) -> dict:
    """Host time blocked in CUDA synchronisation per step, by runtime call."""
    import collections

    ms, calls = collections.Counter(), collections.Counter()
    for e in prof.events():
        if e.name in HOST_WAITS:
            ms[e.name] += e.time_range.end - e.time_range.start
            calls[e.name] += 1
    return {
        "ms_per_step": round(sum(ms.values()) / 1000 / steps, 3),
        "by_call": [
            {"call": k, "calls": round(calls[k] / steps, 2), "ms": round(v / 1000 / steps, 4)}
            for k, v in ms.most_common()
        ],
    }


def _copy_stacks(prof, steps: int, top: int = 12) -> list[dict]:
    """Casts and copies (aten::_to_copy / copy_) grouped by input shapes and the innermost
    Python frames that called them, by device time per step."""
    import collections

    ms, calls = collections.Counter(), collections.Counter()
    for e in prof.events():
        if e.name not in ("aten::_to_copy", "aten::copy_") or not e.device_time_total:
            continue
        frames = tuple(f for f in (e.stack or []) if "torch/" not in f)[:6]
        key = (e.name, str(e.input_shapes)[:160], frames)
        ms[key] += e.device_time_total
        calls[key] += 1
    return [
        {
            "op": op,
            "shapes": shapes,
            "stack": list(frames),
            "calls": round(calls[k] / steps, 2),
            "ms": round(ms[k] / 1000 / steps, 4),
        }
        for k, _ in ms.most_common(top)
        for op, shapes, frames in [k]
    ]


def decode_steps(spec: dict, toks: list) -> int:
    """Engine steps of one generation: each gives one token plus its accepted drafts (a guard's
    k = 0 steps draft nothing, so counting drafting steps would miss them)."""
    return max(1, len(toks) - 1 - spec.get("accepted", 0))


def host_profile(run, top: int = 45) -> dict:
    """cProfile of the engine's own thread over one generation: per step, the functions
    with the most inclusive and the most own time (profiler overhead inflates both)."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    wall, spec, toks = run()
    prof.disable()
    steps = decode_steps(spec, toks)
    rows = []
    for (file, line, fn), (_cc, ncalls, own, incl, _callers) in pstats.Stats(prof).stats.items():
        where = file.split("site-packages/")[-1].split("/work/")[-1] if file != "~" else ""
        rows.append((f"{where}:{line}:{fn}", ncalls / steps, 1000 * own / steps, 1000 * incl / steps))
    fmt = lambda r: {"fn": r[0], "calls": round(r[1], 2), "own_ms": round(r[2], 4), "incl_ms": round(r[3], 4)}  # noqa: E731
    return {
        "steps": steps,
        "wall_ms_per_step_profiled": round(1000 * wall / steps, 3),
        "by_inclusive": [fmt(r) for r in sorted(rows, key=lambda r: -r[3])[:top]],
        "by_own": [fmt(r) for r in sorted(rows, key=lambda r: -r[2])[:top]],
    }


# --------------------------------------------------------------------------- report
#: The users' rig, as they measured it: 8x RTX PRO 6000 over PCIe, single stream.
RIG_TOK_S = 82.5
RIG_ALLREDUCE_SHARE = 0.515  # of the decode step, latency-bound: ~constant per step


def tau(per_pos: list[float], k: int) -> float:
    """Tokens per step with k drafts: 1 + sum over j <= k of P(first j accepted)."""
    return 1.0 + sum(per_pos[:k])


def _first_divergence(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)


def compare_greedy(a: dict, b: dict) -> dict:
    """Prompts whose greedy tokens agree; for the others, where they part and the top-1 vs
    top-2 logprob margin there in each run (a near-zero margin: a bf16 tie, not a bug)."""
    parts = []
    for i, (x, y) in enumerate(zip(a["tokens"], b["tokens"], strict=True)):
        d = _first_divergence(x, y)
        if d is not None:
            parts.append({"prompt": i, "token": d, "margins": [a["margins"][i][d], b["margins"][i][d]]})
    return {"identical": len(a["tokens"]) - len(parts), "prompts": len(a["tokens"]), "divergences": parts}


def graph_modes(r: dict) -> str:
    """What vLLM's log says about CUDA graphs: the modes it captured, and any downgrade."""
    import re

    caps = sorted({m for ln in r.get("log_lines", []) for m in re.findall(r"Capturing CUDA graphs \(([^)]*)\)", ln)})
    down = sorted({m for ln in r.get("log_lines", []) for m in re.findall(r"setting cudagraph_mode=(\w+)", ln)})
    out = ", ".join(caps) if caps else "none (eager)"
    return out + (f"; downgraded to {down[0]}" if down else "")


def _step_ms(r: dict) -> float:
    """Single stream: seconds per engine step (per token without speculation)."""
    steps = r["spec"]["drafts"] or r["single_stream"]["tokens"]
    return round(1000 * r["single_stream"]["s"] / steps, 2)


def _fmt_div(c: dict) -> str:
    s = f"{c['identical']}/{c['prompts']}"
    if c["divergences"]:
        s += (
            " (prompt:token margins "
            + ", ".join(f"{d['prompt']}:{d['token']} {d['margins'][0]}/{d['margins'][1]}" for d in c["divergences"])
            + ")"
        )
    return s


GREEDY_PAIRS = [
    ("tiny-stock-eager", "tiny-ours-eager"),
    ("tiny-stock-graphs", "tiny-ours-graphs"),
    ("tiny-ours-eager", "tiny-ours-graphs"),
    ("tiny-stock-eager", "tiny-stock-graphs"),
    ("tiny-ours-graphs", "tiny-ours-eagle3-k3"),
    ("tiny-stock-graphs", "tiny-stock-eagle3-k3"),
    ("tiny-ours-graphs", "tiny-ours-ngram-k3"),
    ("tiny-stock-graphs", "tiny-ours-fault-smem"),
    ("gguf-dequantized-reference", "gguf-q4k-experts-kept"),
    ("gguf-q4k-kept-stockmoe", "gguf-q4k-experts-kept"),
    ("gguf-q4k-experts-kept", "gguf-q4k-kept-eagle3-k3"),
    ("gguf-q4k-kept-stockmoe", "gguf-q4k-kept-stockmoe-eagle3-k3"),
    ("v16-mla-plain", "v16-mla-eagle3-k3-passthrough"),
    ("v16-mla-plain", "v16-mla-eagle3-k3-attention"),
    ("mla-plain", "mla-eagle3-k3-passthrough"),
    ("mla-plain", "mla-eagle3-k3-attention"),
    ("v26-v1-ours-plain", "v26-v1-ours-eagle3-k3"),
    ("v26-v2-ours-plain", "v26-v2-ours-eagle3-k3"),
    ("v26-v1-ours-plain", "v26-v2-ours-plain"),
    ("v26-v1-stock-plain", "v26-v1-ours-plain"),
    ("v26-v2-stock-plain", "v26-v2-ours-plain"),
    ("v26-v1-ours-eagle3-k3", "v26-v2-ours-eagle3-k3"),
]


def _device(runs: dict) -> str:
    """The GPU the cases ran on (H100 / H200), as our MLA self-check logged it; results from before
    the lender handed out H100s too carry no such line: the H200."""
    import re

    names = {
        m.group(1)
        for r in runs.values()
        for ln in r.get("log_lines", [])
        if (m := re.search(r"self-check passed on \D*(H\d00)", ln))
    }
    return " / ".join(sorted(names)) or "H200"


def _quant_section(runs: dict, summary: dict) -> list[str]:
    """Suite ``quant``: per expert format, the 12-layer slice's step, plain vs EAGLE-3 k = 3."""
    q = {n: r for n, r in runs.items() if n.startswith("q12-") and "contexts" in r}
    if not q:
        return []
    ctxs = sorted({int(c) for r in q.values() for c in r["contexts"]})
    head = " | ".join(f"{c // 1024}k" for c in ctxs)
    step = {n: {int(c): _ms_per_step(v) for c, v in r["contexts"].items()} for n, r in q.items()}
    L = [
        "## Quantized experts: the 12-layer K2.5 slice, plain vs EAGLE-3 k = 3 (suite `quant`)",
        "",
        "Dummy weights; the routers redrawn so tokens spread over the experts as a trained router's do "
        "(distinct experts of 4 tokens in the table's last column, estimated from layer 1's router); "
        "the TP-8 share of K2.5's drafter with its own head, no draft accepted (tokens/step 1.0). "
        "Step in ms = (t(129 tokens) - t(1 token)) / steps, median of 5 interleaved rounds; steps = "
        "tokens - accepted drafts (each step gives one token and its accepted drafts).",
        "",
        f"| case | {head} | distinct experts, 4 tokens |",
        "|---|" + "---:|" * len(ctxs) + "---:|",
    ]
    for n in sorted(q):
        ex = q[n].get("experts_spread_router") or {}
        L.append(
            f"| {n} | "
            + " | ".join(str(step[n].get(c, "-")) for c in ctxs)
            + f" | {ex.get('mean_distinct_experts', '-')} |"
        )
    L += ["", f"| t_spec(3) / t_plain | {head} |", "|---|" + "---:|" * len(ctxs)]
    summary["quant_spec_over_plain"] = {}
    for fmt in sorted({n.split("-")[1] for n in q}):
        num, den = step.get(f"q12-{fmt}-eagle3-k3"), step.get(f"q12-{fmt}-plain")
        if num and den:
            vals = {c: round(num[c] / den[c], 3) for c in ctxs if c in num and c in den}
            summary["quant_spec_over_plain"][fmt] = vals
            L.append(f"| {fmt} experts | " + " | ".join(str(vals.get(c, "-")) for c in ctxs) + " |")
    # per output token: comparable whatever k each step had (the guard's steps mostly draft nothing)
    per_token = {n: {int(c): _ms_per_output_token(v) for c, v in r["contexts"].items()} for n, r in q.items()}
    L += [
        "",
        "Per output token (ms) = (t(129 tokens) - t(1 token)) / 128, the same medians; ratio against the "
        "plain engine of the same expert format.",
        "",
        f"| case | {head} | {' | '.join(f'/ plain, {c // 1024}k' for c in ctxs)} |",
        "|---|" + "---:|" * (2 * len(ctxs)),
    ]
    summary["quant_per_token_over_plain"] = {}
    for n in sorted(q):
        plain = per_token.get(f"q12-{n.split('-')[1]}-plain", {})
        ratio = {c: round(per_token[n][c] / plain[c], 3) for c in ctxs if c in per_token[n] and plain.get(c)}
        summary["quant_per_token_over_plain"][n] = ratio
        L.append(
            f"| {n} | "
            + " | ".join(str(per_token[n].get(c, "-")) for c in ctxs)
            + " | "
            + " | ".join(str(ratio.get(c, "-")) for c in ctxs)
            + " |"
        )
    return L + [""]


def _failed_section(raw_paths: list[Path], summary: dict) -> list[str]:
    """Cases whose engine did not start: their logs, as the suite runner wrote them, in a ``failed/``
    directory beside ``raw/``; the root error named (the first exception other than vLLM's
    "Engine core initialization failed" that reports it)."""
    import re

    logs = sorted(f for p in raw_paths if p.is_dir() for f in (p.parent / "failed").glob("*.log"))
    if not logs:
        return []
    L = ["## Cases whose engine did not start", "", "| case | root error (from its log) |", "|---|---|"]
    summary["failed"] = {}
    for f in logs:
        errors = [
            m.group(0) for ln in f.read_text(errors="replace").splitlines() if (m := re.search(r"\w+Error: .*", ln))
        ]
        root = next((e for e in errors if "Engine core initialization failed" not in e), errors[0] if errors else "-")
        summary["failed"][f.stem] = root
        L.append(f"| {f.stem} | `{root[:200]}` (log: `failed/{f.name}`) |")
    return L + [""]


def _mla_section(runs: dict, summary: dict) -> list[str]:
    """Suites mla / v16mla (the tiny pair with MLA drafters: greedy identity, acceptance) and
    deepmla / v16deepmla (the 24-layer slice: the MLA drafter's step against the Llama-style one's)."""
    L = []
    tiny = {n: r for n, r in runs.items() if n.removeprefix("v16-").startswith("mla-") and "spec" in r}
    if tiny:
        L += [
            "## MLA drafters on the tiny random target (suite `mla` / `v16mla`)",
            "",
            "lightseekorg's MLA layout written for the tiny target (`write_mla_drafter`): `passthrough` drafts the "
            "target's last prediction again (output projections zero), `attention` has a random attention output "
            "projection, so its drafts also go through the MLA attention. Greedy, 12 prompts x 64 tokens batched; "
            "acceptance from the single-stream run (256 tokens).",
            "",
            "| case | drafter attention | greedy tokens vs plain (divergences: prompt:token, top-1 margins) | "
            "tok/s | acceptance per position | tau |",
            "|---|---|---|---:|---|---:|",
        ]
        for n in sorted(tiny):
            r = tiny[n]
            sp = r["spec"]
            plain = "v16-mla-plain" if n.startswith("v16-") else "mla-plain"
            g = summary["greedy"].get(f"{plain} vs {n}")
            acc = [round(x / sp["drafts"], 3) for x in sp["per_pos"]] if sp["drafts"] else []
            tau_ = round(1 + sp["accepted"] / sp["drafts"], 3) if sp["drafts"] else "-"
            L.append(
                f"| {n} | {', '.join(r.get('drafter_attention') or []) or '-'} | "
                f"{_fmt_div(g) if g else '-'} | {r['single_stream']['tok_s']} | {acc or '-'} | {tau_} |"
            )
        L.append("")
    deep = {n: r for n, r in runs.items() if "deepmla-" in n and "contexts" in r}
    if deep:
        ctxs = sorted({int(c) for r in deep.values() for c in r["contexts"]})
        head = " | ".join(f"{c // 1024}k" for c in ctxs)
        step = {n: {int(c): _ms_per_step(v) for c, v in r["contexts"].items()} for n, r in deep.items()}
        L += [
            "## MLA drafter vs Llama-style drafter: the 24-layer slice (suite `deepmla` / `v16deepmla`)",
            "",
            "Dummy weights, routers spread over the experts, one engine at a time; both drafters at K2.5's TP-8 "
            "share with their own head (draft vocabulary 32,000 / 8): the Llama-style layer with 8 query and 1 KV "
            "heads, the MLA layer with 8 MLA heads and K2.5's MLA dims. No draft accepted. Step in ms = "
            "(t(129 tokens) - t(1 token)) / steps, median of 5 rounds.",
            "",
            f"| case | {head} | {' | '.join(f'/ plain, {c // 1024}k' for c in ctxs)} | draft-step CUDA graph | "
            "drafter attention |",
            "|---|" + "---:|" * (2 * len(ctxs)) + "---|---|",
        ]
        summary["deepmla_spec_over_plain"] = {}
        for n in sorted(deep):
            plain = next((m for m in deep if m.endswith("-plain") and m.startswith(n.split("deepmla-")[0])), None)
            ratio = {
                c: round(step[n][c] / step[plain][c], 3) for c in ctxs if plain and c in step[n] and c in step[plain]
            }
            summary["deepmla_spec_over_plain"][n] = ratio
            dg = deep[n].get("draft_graphs") or {}
            L.append(
                f"| {n} | "
                + " | ".join(str(step[n].get(c, "-")) for c in ctxs)
                + " | "
                + " | ".join(str(ratio.get(c, "-")) for c in ctxs)
                + f" | {'sizes ' + str(dg['captured']) if dg.get('captured') else ('none' if dg else '-')} | "
                f"{', '.join(deep[n].get('drafter_attention') or []) or '-'} |"
            )
        L.append("")
    return L


def _runners_section(runs: dict, summary: dict) -> list[str]:
    """Suites v26tiny / v26slice (vLLM 0.26, ENGINE=vllm026): the v1 model runner against Model
    Runner V2, ours and stock. Tiny pair: greedy identity and acceptance; slice: step times."""
    L = []
    tiny = {n: r for n, r in runs.items() if n.startswith("v26-") and "single_stream" in r}
    if tiny:
        L += [
            "## vLLM 0.26: the v1 model runner and Model Runner V2, the trained tiny pair (suite `v26tiny`)",
            "",
            "`v1` = vLLM's older runner, `v2` = Model Runner V2 (`VLLM_USE_V2_MODEL_RUNNER=1`); `stock` = every "
            "GPU patch of ours off. EAGLE-3 with the committed demo drafter, k = 3, the guard off. Greedy, 12 "
            "prompts x 64 tokens batched, compared with the plain engine of the same runner; acceptance and "
            "tok/s from one request of 256 tokens.",
            "",
            "| case | greedy tokens vs plain, same runner | tok/s | acceptance per position | tau | attention |",
            "|---|---|---:|---|---:|---|",
        ]
        summary["runners_tiny"] = {}
        for n in sorted(tiny):
            r = tiny[n]
            sp = r.get("spec") or {}
            plain = n.replace("-eagle3-k3", "-plain")
            g = summary["greedy"].get(f"{plain} vs {n}") if plain != n else None
            acc = [round(x / sp["drafts"], 3) for x in sp["per_pos"]] if sp.get("drafts") else []
            tau_ = round(1 + sp["accepted"] / sp["drafts"], 3) if sp.get("drafts") else None
            summary["runners_tiny"][n] = {"tok_s": r["single_stream"]["tok_s"], "per_pos": acc, "tau": tau_}
            L.append(
                f"| {n} | {_fmt_div(g) if g else '-'} | {r['single_stream']['tok_s']} | {acc or '-'} | "
                f"{tau_ if tau_ is not None else '-'} | {r.get('impls', '-')} |"
            )
        pairs = [k for k in summary["greedy"] if k.startswith("v26-")]
        if pairs:
            L += ["", "Greedy pairs: " + "; ".join(f"{k}: {_fmt_div(summary['greedy'][k])}" for k in pairs)]
        L.append("")
    sl = {n: r for n, r in runs.items() if n.startswith(("v26slice-", "v26slice24-")) and "contexts" in r}
    if sl:
        ctxs = sorted({int(c) for r in sl.values() for c in r["contexts"]})
        step = {n: {int(c): _ms_per_step(v) for c, v in r["contexts"].items()} for n, r in sl.items()}
        L += [
            "## vLLM 0.26: a K2.5 slice on both model runners (suites `v26slice12`, `v26slice`)",
            "",
            "`v26slice-*`: the 12-layer slice with a Llama-style drafter of 8 query and 8 KV heads and a 16,384-token "
            "draft vocabulary; `v26slice24-*`: the 24-layer slice with K2.5's drafter at its TP-8 share (8 query and "
            "1 KV head, its own head over 32,000 / 8 draft tokens). Aux layers inside the slice, so stock vLLM "
            "serves either. Dummy weights, routers spread over the experts, one engine at a time, EAGLE-3 k = 3, "
            "no draft accepted. Step in ms = (t(129 tokens) - "
            "t(1 token)) / steps, median of 5 rounds. '/ plain': against the plain engine of the same runner "
            "and patches where it ran, else the same runner's other plain engine (named).",
            "",
            "| case | " + " | ".join(f"{c // 1024}k" for c in ctxs) + " | / plain | plain used |",
            "|---|" + "---:|" * len(ctxs) + "---|---|",
        ]
        summary["runners_slice_ms"] = step
        for n in sorted(sl):
            plain = n.replace("-eagle3-k3", "-plain")
            if plain not in step:  # the same runner's plain engine of the other backend
                runner = n.split("-")[1]
                plain = next((m for m in sorted(step) if m.split("-")[1] == runner and m.endswith("-plain")), None)
            ratio = (
                " / ".join(
                    str(round(step[n][c] / step[plain][c], 3)) for c in ctxs if c in step[n] and c in step[plain]
                )
                if plain and plain != n
                else "-"
            )
            L.append(
                f"| {n} | " + " | ".join(str(step[n].get(c, "-")) for c in ctxs) + f" | {ratio} | "
                f"{plain if plain and plain != n else '-'} |"
            )
        L.append("")
    return L


def _k0_host_section(runs: dict, summary: dict) -> list[str]:
    """Suite v16k0prof: a plain engine's step against a speculative engine's step at k = 0 (the
    guard, drafts never accepted), with the host functions that account for the difference."""
    hp = {n: r for n, r in runs.items() if "k0prof-" in n and "host" in r}
    pairs = [(n, n.replace("-eagle3-k3-never-guard", "-plain")) for n in sorted(hp) if "-never-guard" in n]
    pairs = [(g, p) for g, p in pairs if p in hp]
    if not pairs:
        return []
    L = [
        "## Host time of a speculative engine's steps without drafts (suites `v16k0prof`, `v16k0slice`)",
        "",
        "One request, 128 tokens; in-process engine with CUDA graphs. The guard case has a drafter whose drafts "
        "are never accepted, so after its warm-up nearly every step drafts nothing (k = 0; in `v16k0slice` the "
        "guard's k is forced to 0 from the first step). Wall ms/step is measured without the profiler (128 "
        "tokens / steps); GPU busy ms/step is torch.profiler's union of kernel time per step; the host functions "
        "are cProfile's per engine step (profiled, so slower), listed by how much more time the guard engine's "
        "step spends in them than the plain engine's step of the same scheduling mode.",
        "",
        "| model | guard case | plain case | guard ms/step | plain ms/step | difference "
        "| guard GPU busy ms/step | plain GPU busy ms/step |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    summary["k0_host"] = {}
    for g, p in pairs:
        a, b = hp[g]["wall_ms_per_step"], hp[p]["wall_ms_per_step"]
        ga, gb = (_gpu_busy_per_decode_step(hp[n]) for n in (g, p))
        summary["k0_host"][g] = {
            "ms_per_step": a,
            "plain_ms_per_step": b,
            "extra_ms": round(a - b, 3),
            "gpu_busy_ms_per_step": ga,
            "plain_gpu_busy_ms_per_step": gb,
        }
        model = Path(hp[g]["case"]["model"]).name
        L.append(f"| {model} | {g} | {p} | {a} | {b} | {a - b:+.3f} | {ga} | {gb} |")
    for g, p in pairs:
        for key, field, what in (("by_own", "own_ms", "own time"), ("by_inclusive", "incl_ms", "inclusive time")):
            mine = {r["fn"]: r for r in hp[g]["host"][key]}
            theirs = {r["fn"]: r for r in hp[p]["host"][key]}
            extra = sorted(
                ((mine.get(f, {}).get(field, 0) - theirs.get(f, {}).get(field, 0), f) for f in set(mine) | set(theirs)),
                reverse=True,
            )[:10]
            L += ["", f"{g} vs {p}, {what} (ms per step; calls per step plain -> guard):", ""]
            L += [
                f"- +{d:.3f} `{f.split('site-packages/')[-1][-90:]}` "
                f"({theirs.get(f, {}).get('calls', 0)} -> {mine.get(f, {}).get('calls', 0)})"
                for d, f in extra
            ]
    return L + [""]


def _k0_steps_section(runs: dict, summary: dict) -> list[str]:
    """Suites v16k0slice / v26k0slice: a speculative engine whose guard holds k at 0 from its
    first step against a plain engine, step times by context (what speculation costs while off)."""
    st = {n: r for n, r in runs.items() if "k0slice" in n and "contexts" in r}
    if not st:
        return []
    ctxs = sorted({int(c) for r in st.values() for c in r["contexts"]})
    step = {n: {int(c): _ms_per_step(v) for c, v in r["contexts"].items()} for n, r in st.items()}
    L = [
        "## A speculative engine with its guard at k = 0 against a plain engine (suites `v16k0slice`, `v26k0slice`)",
        "",
        "The 6-layer K2.5 slice, dummy weights, routers spread; EAGLE-3 k = 3 with the guard's k forced to 0 "
        "from the first step (no drafts, no verify width). One engine measured at a time. Step in ms = "
        "(t(129 tokens) - t(1 token)) / steps, median of 5 rounds; '/ plain': against the plain engine of the "
        "same runner. Runner: `v2` = Model Runner V2 (`VLLM_USE_V2_MODEL_RUNNER=1`), else the v1 runner.",
        "",
        "| case | runner | " + " | ".join(f"{c // 1024}k" for c in ctxs) + " | / plain | draft tokens | "
        "patches switched off |",
        "|---|---|" + "---:|" * len(ctxs) + "---:|---:|---|",
    ]
    summary["k0_steps_ms"] = step
    for n in sorted(st):
        r = st[n]
        runner = "v2" if r["case"].get("env", {}).get("VLLM_USE_V2_MODEL_RUNNER") == "1" else "v1"
        plain = re.sub(r"-eagle3-k3-forced-k0.*$", "-plain", n)
        ratio = (
            " / ".join(str(round(step[n][c] / step[plain][c], 3)) for c in ctxs if c in step[n] and c in step[plain])
            if plain != n and plain in step
            else "-"
        )
        drafted = sum(v["spec"].get("draft_tokens", 0) for v in r["contexts"].values())
        off = ", ".join(r["case"].get("disable", [])) or "-"
        L.append(
            f"| {n} | {runner} | " + " | ".join(str(step[n].get(c, "-")) for c in ctxs) + f" | {ratio} | "
            f"{drafted} | {off} |"
        )
    return L + [""]


def _gpu_busy_per_decode_step(run: dict):
    """The profile's GPU busy ms per engine step, where its steps were counted as decode steps
    (files written before that counted drafting steps, which a guard at k = 0 barely has)."""
    prof = run.get("profile", {})
    return prof.get("gpu_busy_ms_per_step", "-") if prof.get("steps_from") == "decode_steps" else "-"


def _ms_per_step(context: dict) -> float:
    """(median t(GEN tokens) - median t(1 token)) / engine steps, from a steps case's raw rounds."""
    steps = max(1, context["tokens"] - context["spec"].get("accepted", 0))
    return round(_ms_per_output_token(context) * context["tokens"] / steps, 3)


def _ms_per_output_token(context: dict) -> float:
    """(median t(GEN tokens) - median t(1 token)) / decode tokens, from a steps case's raw rounds."""
    rounds = context["request_s"]
    longer = next(k for k in rounds if k != "1")
    span = statistics.median(rounds[longer]) - statistics.median(rounds["1"])
    return round(1000 * span / context["tokens"], 3)


def report(raw_paths: list[Path], out: Path, acceptance: Path | None = None, command: str = "") -> dict:
    """Tables from the cases' raw JSON (written by ``case``) into out/README.md + summary.json."""
    runs = {}
    files = [f for p in raw_paths for f in (sorted(p.glob("*.json")) if p.is_dir() else [p])]
    for p in files:
        if p.name.endswith(".case.json"):  # a case's input, not its result
            continue
        r = json.loads(p.read_text())
        runs[r["case"]["name"]] = r
    dates = sorted(r["date"] for r in runs.values())
    release = ".".join(sorted({r.get("vllm", "0.20") for r in runs.values()})[-1].split(".")[:2])
    routes = " / ".join(sorted({r.get("engine_route") or "vLLM 0.20.0 from the bundle" for r in runs.values()}))
    L = [
        f"# vLLM {release} GPU engine on the {_device(runs)}: our MLA backend and EAGLE-3",
        "",
        f"Written by `python benchmarks/gpu_engine_e2e.py report` from `raw/` (one file per case, written by "
        f"the case that measured it, command and date inside; cases ran {dates[0]} .. {dates[-1]}). "
        f"Every case is its own engine: {routes}, "
        "bf16, `max_num_seqs=4`, CUDA graphs with "
        "`compilation_config={'backend': 'eager'}` (Dynamo + vLLM's piecewise/full graphs, no Inductor, to keep "
        "engine starts short), engines of a group built side by side and measured one at a time. "
        "'stock' = `VLLM_K2_DISABLE_PATCHES=triton-mla-k2-decode`.",
        "",
    ]
    summary: dict = {"cases": sorted(runs), "greedy": {}}
    for a, b in GREEDY_PAIRS:
        if a in runs and b in runs:
            summary["greedy"][f"{a} vs {b}"] = compare_greedy(runs[a], runs[b])
    tiny = {n: r for n, r in runs.items() if n.startswith("tiny-")}
    if tiny:
        L += [
            "## Trained tiny target (8 layers, hidden 256, 4 MLA heads, vocab 1024)",
            "",
            "Single stream, 256 tokens of held-out prompt 0 (best of 3); counters over those 4 x 256 tokens: "
            "attention-metadata builds (decode batches by query length; prefill batches) and Python calls of "
            "the MLA prefill path (`forward_mha`, per layer).",
            "",
            "| case | impl | CUDA graphs (vLLM's log) | tok/s | ms/step | decode batches | prefill batches | forward_mha |",  # noqa: E501
            "|---|---|---|---:|---:|---|---:|---:|",
        ]
        for n, r in sorted(tiny.items()):
            c = r.get("counters_single_stream", {})
            dec = ", ".join(f"q{k.rsplit('_q', 1)[1]}: {v}" for k, v in sorted(c.items()) if k.startswith("decode"))
            L.append(
                f"| {n} | {r['impls']} | {graph_modes(r)} | {r['single_stream']['tok_s']} | {_step_ms(r)} | "
                f"{dec or '-'} | {c.get('prefill_batches', 0)} | {c.get('forward_mha_calls', 0)} |"
            )
        L += [
            "",
            "### Greedy tokens, 12 held-out prompts x 64 tokens (batched)",
            "",
            "| runs compared | prompts identical (divergences: prompt:token, top-1 margin in each run) |",
            "|---|---|",
        ]
        L += [f"| {k} | {_fmt_div(v)} |" for k, v in summary["greedy"].items() if k.startswith("tiny")]
        L.append("")
        fault = tiny.get("tiny-ours-fault-smem")
        if fault:
            line = next((ln for ln in fault.get("log_lines", []) if "check failed" in ln), "")
            L += [
                "Self-check fallback on the GPU (`tests/mla_faults.py`, `MLA_FAULT=smem`: a variant needing "
                f"more shared memory than the H200 has): impl {fault['impls']}, log: "
                f"`...{line.strip()}`",
                "",
            ]
        plain = tiny.get("tiny-ours-graphs")
        spec_rows = []
        for n in ("tiny-stock-eagle3-k3", "tiny-ours-eagle3-k3", "tiny-ours-ngram-k3"):
            r = tiny.get(n)
            if not r or not plain:
                continue
            sp = r["spec"]
            v = {
                "tok_s": r["single_stream"]["tok_s"],
                "ms_per_step": _step_ms(r),
                "vs_plain_ours_graphs": round(r["single_stream"]["tok_s"] / plain["single_stream"]["tok_s"], 3),
                "acceptance_per_position": [round(x / sp["drafts"], 3) for x in sp["per_pos"]] if sp["drafts"] else [],
                "tau": round(1 + sp["accepted"] / max(sp["drafts"], 1), 3),
            }
            summary[n] = v
            spec_rows.append(
                f"| {n} | {v['tok_s']} | {v['ms_per_step']} | {v['vs_plain_ours_graphs']} | {v['tau']} | "
                f"{v['acceptance_per_position']} |"
            )
        if spec_rows:
            L += (
                [
                    "### Speculation with the tiny pair (single stream, CUDA graphs)",
                    "",
                    "The pair is tiny: a plain step is ~1.5 ms with full graphs, so these ratios measure vLLM 0.20's "
                    "per-step cost of speculation on this host, not K2.5's.",
                    "",
                    "| case | tok/s | ms/step | x plain (ours, graphs: "
                    f"{plain['single_stream']['tok_s']} tok/s) | tau | acceptance per position |",
                    "|---|---:|---:|---:|---:|---|",
                ]
                + spec_rows
                + [""]
            )
    sl = {n: r for n, r in runs.items() if n.startswith("slice-")}
    ratios: dict = {}
    ctxs: list[int] = []
    if sl:
        ctxs = sorted({int(c) for r in sl.values() for c in r.get("contexts", {})})
        head = " | ".join(f"{c // 1024}k" for c in ctxs)
        L += [
            "## K2.5-sized per-GPU slice (dummy weights, 12 layers, single stream, CUDA graphs)",
            "",
            "hidden 7168, 8 MLA heads, q_lora 1536, kv_lora 512, rope 64, nope/v 128, 384 experts x 256 (8 active, "
            "1 shared), layer 0 dense, vocab 20,480; EAGLE-3 drafter: K2.5's draft layer sharded 8 ways, draft vocab "
            "16,384, dummy weights (no draft is accepted: tokens/step 1.0). Step = (t(129 tokens) - t(1 token)) / "
            "steps, best of 2; prompts are random token ids served from the prefix cache.",
            "",
            f"| case | impl | CUDA graphs | {head} |",
            "|---|---|---|" + "---:|" * len(ctxs),
        ]
        step = {n: {int(c): v["step_ms"] for c, v in r["contexts"].items()} for n, r in sl.items()}
        for n, r in sorted(sl.items()):
            L.append(
                f"| {n} | {r['impls']} | {graph_modes(r)} | "
                + " | ".join(str(step[n].get(c, "-")) for c in ctxs)
                + " |"
            )
        L += ["", "Ratios (same runs):", "", f"| ratio | {head} |", "|---|" + "---:|" * len(ctxs)]

        def ratio_row(label, num, den):
            if num in step and den in step:
                vals = {c: round(step[num][c] / step[den][c], 3) for c in ctxs if c in step[num] and c in step[den]}
                ratios[label] = vals
                L.append(f"| {label} | " + " | ".join(str(vals.get(c, "-")) for c in ctxs) + " |")

        ratio_row("plain: stock / ours (speed-up of ours)", "slice-stock-plain", "slice-ours-plain")
        ratio_row("EAGLE-3 k=3 step: stock / ours", "slice-stock-eagle3-k3", "slice-ours-eagle3-k3")
        ratio_row("t_spec(3) / t_plain, stock", "slice-stock-eagle3-k3", "slice-stock-plain")
        for k in (1, 2, 3, 4):
            ratio_row(f"t_spec({k}) / t_plain, ours", f"slice-ours-eagle3-k{k}", "slice-ours-plain")
        ratio_row("t_spec(3) / t_plain, ours, spread routing", "slice-ours-eagle3-k3-spread", "slice-ours-plain-spread")
        summary["slice_step_ms"], summary["slice_ratios"] = step, ratios
        L += [
            "",
            "Attention path during the timed generations (per context, 2 x (1 + 129 tokens); the 4 prefill "
            "batches are the prompts' uncached tails):",
            "",
            "| case | decode batches (by query length) | prefill batches | forward_mha calls |",
            "|---|---|---:|---:|",
        ]  # noqa: E501
        for n, r in sorted(sl.items()):
            c = next(iter(r["contexts"].values())).get("counters", {})
            same = all(v.get("counters") == c for v in r["contexts"].values())
            dec = ", ".join(f"q{k.rsplit('_q', 1)[1]}: {v}" for k, v in sorted(c.items()) if k.startswith("decode"))
            L.append(
                f"| {n} | {dec or '-'} | {c.get('prefill_batches', 0)} | {c.get('forward_mha_calls', 0)} |"
                + ("" if same else " (differs by context)")
            )
        ex = {}
        for _n, r in sorted(sl.items()):
            for key in ("experts_dummy_router", "experts_spread_router"):
                e = r.get(key)
                if e and "mean_distinct_experts" in e:
                    ex[(key, e["tokens"])] = round(e["mean_distinct_experts"], 1)
        if ex:
            summary["experts_per_verify_estimate"] = {f"{k[0]} {k[1]} tokens": v for k, v in ex.items()}
            L += [
                "",
                "Distinct routed experts a verify step touches (k+1 tokens x top-8), ESTIMATED: 256 random "
                "tokens' embeddings through layer 1's norm and router, attention ignored: "
                + "; ".join(
                    f"{'dummy' if 'dummy' in k[0] else 'spread'} router, {k[1]} tokens: {v}"
                    for k, v in sorted(ex.items())
                ),
                "",
            ]
    L += _failed_section(raw_paths, summary)
    L += _quant_section(runs, summary)
    L += _mla_section(runs, summary)
    L += _k0_steps_section(runs, summary)
    L += _k0_host_section(runs, summary)
    L += _runners_section(runs, summary)
    prof = {n: r["profile"] for n, r in runs.items() if "profile" in r and "k0prof-" not in n}
    if prof:
        summary["profile"] = prof
        L += [
            "## Where a step's time goes (slice, 4k, ours, in-process engine under torch.profiler)",
            "",
            "GPU busy = the union of kernel intervals (CUPTI sees kernels inside CUDA graphs too); the profiler "
            "itself slows the host side, so wall times here are above the unprofiled ones above.",
            "",
            "| case | wall ms/step | GPU busy ms/step | kernels/step | top kernels (ms/step) |",
            "|---|---:|---:|---:|---|",
        ]  # noqa: E501
        for n, v in sorted(prof.items()):
            top = ", ".join(f"{k.split('(')[0][:40]} {t}" for k, t in list(v["top_kernels_ms_per_step"].items())[:6])
            L.append(
                f"| {n} | {v['wall_ms_per_step']} | {v['gpu_busy_ms_per_step']} | {v['kernels_per_step']} | {top} |"
            )
        L.append("")
    gg = summary["greedy"].get("gguf-dequantized-reference vs gguf-q4k-experts-kept")
    if gg:
        a, b = runs["gguf-dequantized-reference"], runs["gguf-q4k-experts-kept"]
        L += [
            "## GGUF on the GPU engine (trained tiny target)",
            "",
            "`q4k.gguf`: experts' gate/up Q4_K and down Q8_0 **kept quantized** (vLLM's GGUF kernels), attention "
            'Q8_0 force-dequantized (`force_dequant: ["blk.*.attn_*"]`), shared experts Q8_0; the reference is a '
            "safetensors checkpoint of gguf-py's dequantization of the same file.",
            "",
            f"- greedy tokens: {_fmt_div(gg)}",
            f"- single stream: GGUF {b['single_stream']['tok_s']} tok/s, reference {a['single_stream']['tok_s']} tok/s "  # noqa: E501
            f"(impl {b['impls']}, CUDA graphs {graph_modes(b)})",
            "",
        ]
    if acceptance is not None and acceptance.exists() and ratios:
        per_pos = json.loads(acceptance.read_text())["per_position_acceptance"]
        L += [
            "## Modelled EAGLE-3 speed-ups (MODELLED from the measurements above, not measured)",
            "",
            f"tau(k) = 1 + sum of the trained tiny pair's per-position acceptance {[round(x, 3) for x in per_pos]} "
            "(offline eval over every position, `trained_pair_eval.json`); single GPU = tau(k) x t_plain / t_spec(k), "  # noqa: E501
            f"both from the slice (ours); users' rig = tau(k) / ({RIG_ALLREDUCE_SHARE} + {1 - RIG_ALLREDUCE_SHARE:.3f} x "  # noqa: E501
            f"t_spec(k)/t_plain): their {RIG_TOK_S} tok/s step has {RIG_ALLREDUCE_SHARE:.1%} AllReduce, latency-bound, "  # noqa: E501
            "taken as constant per step; the rest scales like the slice's step.",
            "",
            "| k | tau(k) | "
            + " | ".join(f"single GPU {c // 1024}k" for c in ctxs)
            + " | "
            + " | ".join(f"rig {c // 1024}k" for c in ctxs)
            + " |",
            "|---:|---:|" + "---:|" * (2 * len(ctxs)),
        ]  # noqa: E501
        model = {}
        for k in (1, 2, 3, 4):
            r = ratios.get(f"t_spec({k}) / t_plain, ours")
            if not r:
                continue
            t = tau(per_pos, k)
            gpu = {c: round(t / r[c], 3) for c in r}
            rig = {c: round(t / (RIG_ALLREDUCE_SHARE + (1 - RIG_ALLREDUCE_SHARE) * r[c]), 3) for c in r}
            model[k] = {"tau": round(t, 3), "single_gpu": gpu, "rig": rig}
            L.append(
                f"| {k} | {t:.3f} | "
                + " | ".join(str(gpu.get(c, "-")) for c in ctxs)
                + " | "
                + " | ".join(str(rig.get(c, "-")) for c in ctxs)
                + " |"
            )
        best = {
            w: {c: max(model, key=lambda k, w=w, c=c: model[k][w].get(c, 0)) for c in ctxs}
            for w in ("single_gpu", "rig")
        }
        summary["modelled"], summary["best_k"] = model, best
        L += [
            "",
            "Best k (modelled): "
            + "; ".join(f"{w}: " + ", ".join(f"{c // 1024}k -> k={k}" for c, k in b.items()) for w, b in best.items()),
            "",
        ]
    if command:
        L += [f"Report command: `{command}`"]
    out.mkdir(parents=True, exist_ok=True)
    from vllm_k2_plugin import fileio

    fileio.write_text(str(out / "README.md"), "\n".join(L) + "\n")
    fileio.write_json(str(out / "summary.json"), summary)
    return summary


# --------------------------------------------------------------------------- suites


def _toml(text: str) -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    return tomllib.loads(text)


#: The suites as data: each suite's default keys and its cases (one engine each), in order.
SUITES = HERE / "gpu_suites.toml"


def suite(name: str, models: Path) -> list[dict]:
    """The cases of suite ``name`` from gpu_suites.toml: its defaults with each case's keys on top,
    '{models}' and '{repo}' in strings made paths."""
    suites = _toml(SUITES.read_text())
    if name not in suites:
        raise SystemExit(f"unknown suite {name!r}: {', '.join(suites)} ({SUITES})")

    def fill(v):
        if isinstance(v, str):
            return v.replace("{models}", str(models)).replace("{repo}", str(REPO))
        if isinstance(v, list):
            return [fill(x) for x in v]
        if isinstance(v, dict):
            return {k: fill(x) for k, x in v.items()}
        return v

    defaults = suites[name].get("defaults", {})
    return [fill({**defaults, **case}) for case in suites[name]["cases"]]


#: the load suites' drafter whose drafts are never accepted (written next to the models at run time)
NEVER_ACCEPTED = "draft-never-accepted"


def write_never_accepted_drafter(dest: Path) -> None:
    """The committed trained drafter with its lm_head zeroed: every draft is draft-vocabulary
    entry 0, which d2t maps to target token 0 ([BOS]), a token the target never writes."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(BENCH_DRAFTER, dest, dirs_exist_ok=True)
    path = dest / "model.safetensors"
    tensors = load_file(str(path))
    tensors["lm_head.weight"].zero_()
    if int(tensors["d2t"][0]) != 0:
        raise ValueError(f"{BENCH_DRAFTER}/model.safetensors: d2t[0] must be 0 (draft entry 0 = target [BOS])")
    save_file(tensors, str(path) + ".tmp", metadata={"format": "pt"})
    os.replace(str(path) + ".tmp", path)


#: tiny random targets written at run time: ``text`` without RoPE scaling, ``text-yarn`` with
#: K2.5's YaRN (vLLM 0.18+'s own MLA drafter class builds YaRN whenever the config names a
#: scaling, and transformers 5 names one for every config: it cannot load ``text``'s drafters)
TINY_TARGETS = ("text", "text-yarn")
#: MLA-layout drafters for the tiny random targets: name -> (target, attention output std)
MLA_DRAFTERS = {
    "draft-mla": ("text", 0.0),
    "draft-mla-attn": ("text", 0.02),
    "draft-mla-yarn": ("text-yarn", 0.0),
    "draft-mla-attn-yarn": ("text-yarn", 0.02),
}


def tiny_spec(target: str):
    from vllm_k2_tools.fixtures.build import K25_ROPE_SCALING, FixtureSpec

    if target not in TINY_TARGETS:
        raise ValueError(f"unknown tiny target {target!r}; expected one of {TINY_TARGETS}")
    return FixtureSpec(rope_scaling=K25_ROPE_SCALING if target == "text-yarn" else None)


def write_mla_drafter(target: Path, dest: Path, attention_out_std: float) -> None:
    """lightseekorg's MLA drafter layout (vllm_k2_tools.fixtures, ``mla``) for ``target``, its
    final norm and head the target's own rows: the layer passes the fc state through (output
    projections zero), so it drafts "the target's last prediction, again". With
    ``attention_out_std`` > 0 the attention's output projection is random (seeded) instead, so
    the drafts also depend on the MLA attention's numbers."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from vllm_k2_tools.fixtures import build_draft

    build_draft("mla", str(dest), str(target), tiny_spec(target.name))
    path = dest / "model.safetensors"
    tensors = load_file(str(path))
    with safe_open(str(target / "model.safetensors"), "pt") as f:
        keep = (tensors["d2t"] + torch.arange(len(tensors["d2t"]))).long()
        tensors["norm.weight"] = f.get_tensor("model.norm.weight").to(tensors["norm.weight"].dtype)
        tensors["lm_head.weight"] = f.get_tensor("lm_head.weight")[keep].to(tensors["lm_head.weight"].dtype)
    if attention_out_std:
        g = torch.Generator().manual_seed(0)
        o = tensors["midlayer.self_attn.o_proj.weight"]
        tensors["midlayer.self_attn.o_proj.weight"] = (torch.randn(o.shape, generator=g) * attention_out_std).to(
            o.dtype
        )
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path) + ".tmp", metadata={"format": "pt"})
    os.replace(str(path) + ".tmp", path)


#: GGUF types for the trained tiny target (hidden 256, experts 64 wide): K-quants need rows
#: of 256, so only the experts' gate/up are Q4_K; everything else quantized is Q8_0.
GGUF_TYPES = {  # first match wins
    "*norm*": "F32",
    "blk.*.ffn_gate_exps.weight": "Q4_K",
    "blk.*.ffn_up_exps.weight": "Q4_K",
    "blk.*.ffn_down_exps.weight": "Q8_0",
    "blk.*.ffn_*_shexp.weight": "Q8_0",
    "blk.*.attn_*.weight": "Q8_0",
    "blk.0.ffn_*.weight": "F16",
    "output.weight": "Q8_0",
    "token_embd.weight": "F16",
}


def write_gguf_pair(target: Path, dest: Path) -> None:
    """The target as a llama.cpp-style GGUF, and a safetensors checkpoint of gguf-py's
    dequantization of that same GGUF (the oracle for greedy tokens)."""
    import shutil
    from collections import Counter

    import torch
    from safetensors.torch import save_file

    from vllm_k2_plugin.gguf.loader import Options, iter_weights, make_plan
    from vllm_k2_plugin.gguf.names import deepseek2_name_map
    from vllm_k2_tools.fixtures.gguf_writer import write_gguf

    dest.mkdir(parents=True, exist_ok=True)
    gguf = write_gguf(str(target), str(dest / "q4k.gguf"), types=GGUF_TYPES)
    text = type("TextConfig", (), json.loads((target / "config.json").read_text()))
    plan = make_plan(gguf, deepseek2_name_map(text), Options(force=["*"]), on_cpu=True)
    ref = dest / "reference"
    shutil.copytree(target, ref, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.safetensors*"))
    tensors = {k: v.clone() for k, v in iter_weights(plan, torch.float32, Counter())}
    save_file(tensors, str(ref / "model.safetensors"))


#: Bench-only patch module: a dummy drafter runs its own draft-vocabulary lm_head (case key
#: "draft_head": "own"); without it vLLM shares the target's full-vocabulary head with it.
DUMMY_DRAFT_HEAD = "benchmarks.dummy_draft_head"
#: Route C only (vLLM 0.16's Python on 0.20's kernels): 0.20's rotary op casts 0.16's bf16 cos/sin
#: cache to float32 on every call, 0.16's own op does not; this module hands it a float32 copy
#: made once (case key "route_c_rope"), for stock and ours alike.
ROUTE_C_ROPE = "benchmarks.vllm016_gpu.route_c_rope"
#: vLLM 0.16, dummy weights only: the accepted count taken as "all accepted" instead of waited for
#: at the start of each step (case key "nosync_bound"): the bound of a zero-bubble backport.
NOSYNC_BOUND = "benchmarks.vllm016_gpu.async_spec_bound"


#: Features whose patches change what the GPU runs: a "stock" case turns every one of their patches
#: off (the model-support patches stay on: K2.5 needs them).
GPU_FEATURES = ("mla", "draft_graph", "draft_attention", "moe_verify", "gguf_moe", "rope_cache", "async_spec", "comm")


def gpu_patches() -> list[str]:
    """The registered patches of GPU_FEATURES, in application order (a new one is off in stock cases
    without a list to update)."""
    from vllm_k2_plugin.features import load_feature_patches
    from vllm_k2_plugin.patching import REGISTRY

    load_feature_patches()
    return [p.name for p in REGISTRY if p.feature in GPU_FEATURES]


def case_env(case: dict, group_dir: str, size: int) -> dict:
    env = dict(os.environ, E2E_GROUP_DIR=group_dir, E2E_GROUP_SIZE=str(size), VLLM_ALLOW_INSECURE_SERIALIZATION="1")
    env["PYTHONFAULTHANDLER"] = "1"  # a case stopped as stuck prints every process's stacks (run_suite)
    if case.get("graphs") and not case.get("aot_compile"):
        # Cases compile with backend "eager" (no Inductor wait). With that backend vLLM 0.20 skips AOT
        # compilation but, AOT being on by default, re-hashes the whole config on every call of a
        # compiled model (hostprof, cProfile: 8.5 of 18.9 ms per EAGLE-3 step, in the drafter's passes).
        # Inductor builds (the default) set the AOT function once and never pay this.
        env["VLLM_USE_AOT_COMPILE"] = "0"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    if case["task"] == "steps" and case.get("spec"):
        # a step's cost at the case's k: the guard would turn k down (a dummy drafter's drafts are
        # never accepted); a case may still set it
        env["VLLM_K2_SPEC_GUARD"] = "0"
    env.update(case.get("env", {}))
    off = list(case.get("disable", []))
    if case["backend"] == "stock":
        off += gpu_patches()
    if off:
        env["VLLM_K2_DISABLE_PATCHES"] = ",".join(off)
    if "draft_graph" in case:
        env["VLLM_K2_DRAFT_GRAPH"] = "1" if case["draft_graph"] else "0"
    if case["task"] in ("profile", "hostprof"):
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    extra = []
    if case.get("fault"):
        extra.append("tests.mla_faults")
        env["MLA_FAULT"] = case["fault"]
    if case.get("dummy") and case.get("spec", {}).get("method") == "eagle3" and case.get("draft_head") == "own":
        extra.append(DUMMY_DRAFT_HEAD)
    if case.get("route_c_rope") and os.environ.get("E2E_ENGINE_ROUTE", "").startswith("route C"):
        extra.append(ROUTE_C_ROPE)  # route B runs 0.16's own rotary op: nothing to take out
    if case.get("nosync_bound"):
        extra.append(NOSYNC_BOUND)
    if case.get("segment_waves") == 1:
        extra.append("benchmarks.draft_segment_waves")
    if case.get("forced_k"):  # the guard's k on a fixed schedule (guard_forced_k.py), e.g. "0:1": always 0
        extra.append("benchmarks.guard_forced_k")
        env["VLLM_K2_SPEC_GUARD"] = "1"
        env["FORCED_K_SCHEDULE"] = case["forced_k"]
        env["FORCED_K_LOG"] = os.path.join(group_dir, f"{case['name']}.forced_k.jsonl")
    if case.get("guard_trace"):  # every step time the guard is fed (guard_step_trace.py)
        extra.append("benchmarks.guard_step_trace")
        env["GUARD_STEP_LOG"] = os.path.join(group_dir, f"{case['name']}.guard_steps.jsonl")
    if extra:
        env["VLLM_K2_EXTRA_PATCH_MODULES"] = ",".join(extra)
    return env


def run_suite(name: str, models: Path, out: Path, parallel: int, only: list[str], budget_s: float) -> int:
    """Run a suite's cases; returns how many produced a result. A first group in which no engine
    came up ends the suite (the others would fail the same way and spend the device call)."""
    from vllm_k2_tools.procs import dump_group_stacks, start_group

    out.mkdir(parents=True, exist_ok=True)
    cases = suite(name, models)
    if name == "gguf" or any(c.get("model") == str(models / "target") for c in cases):  # gguf: written from it
        from vllm_k2_tools.fixtures import build_fixture

        build_fixture("trained-text", str(models / "target"))
    if any(c.get("spec", {}).get("model") == str(models / NEVER_ACCEPTED) for c in cases):
        write_never_accepted_drafter(models / NEVER_ACCEPTED)
    drafters = {
        drafter: spec
        for drafter, spec in MLA_DRAFTERS.items()
        if any(c.get("spec", {}).get("model") == str(models / drafter) for c in cases)
    }
    for target in TINY_TARGETS:
        if any(c.get("model") == str(models / target) for c in cases) or target in (t for t, _ in drafters.values()):
            from vllm_k2_tools.fixtures import build_fixture

            build_fixture("text", str(models / target), tiny_spec(target))
    for drafter, (target, std) in drafters.items():
        write_mla_drafter(models / target, models / drafter, std)
    if name == "gguf":
        write_gguf_pair(models / "target", models / "gguf")
    cases = [c for c in cases if not only or c["name"] in only]
    t_start = time.time()
    for g in range(0, len(cases), parallel):
        group = cases[g : g + parallel]
        left = budget_s - (time.time() - t_start)
        if left < 60:
            print(f"SKIP (budget) {[c['name'] for c in group]}", flush=True)
            continue
        gdir = out / f".group{g}"
        gdir.mkdir(exist_ok=True)
        procs = []
        for case in group:
            (out / f"{case['name']}.case.json").write_text(json.dumps(case))
            log = open(out / f"{case['name']}.log", "w")
            cmd = [
                sys.executable,
                __file__,
                "case",
                str(out / f"{case['name']}.case.json"),
                str(out / f"{case['name']}.json"),
            ]
            env = case_env(case, str(gdir), len(group))
            # own session: the engine core child is killed with it (cases exit without teardown)
            proc = start_group(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
            procs.append((case, proc, log))
        deadline = time.time() + left
        pending = list(procs)
        ok_before = _results(out)
        while pending:  # poll all: a peer that died must release the others' barrier at once
            stalled = _all_silent([out / f"{c['name']}.log" for c, _, _ in pending], STALL_S)
            if stalled or time.time() > deadline:
                why = f"its log silent for {STALL_S} s" if stalled else "out of the call's budget"
                print(f"STOP {[c['name'] for c, _, _ in pending]}: {why}; stacks in their logs", flush=True)
                for _, proc, _ in pending:
                    dump_group_stacks(proc)
            for item in list(pending):
                if item[1].poll() is not None or stalled or time.time() > deadline:
                    _finish(*item, gdir, out)
                    pending.remove(item)
            time.sleep(0.5)
        time.sleep(3)  # let the driver hand the killed engines' memory back
        ok_now = _results(out)
        if g == 0 and ok_now == ok_before:
            print(f"SKIP (no engine of the first group came up) {[c['name'] for c in cases[parallel:]]}", flush=True)
            return 0
    return _results(out)


#: A group whose every running case has written nothing to its log for this long is stuck (an
#: H100 call on 2026-12-07 spent its whole budget on two vLLM 0.16 engines that stopped logging
#: before loading their model): its stacks are dumped and the call goes on with the next step.
#: The longest gap between two timestamped lines in the 68 engine logs committed under
#: benchmarks/results (read 2026-12-07) is 160 s, and untimestamped output (progress bars)
#: falls inside it, so no committed engine was silent that long.
STALL_S = 240


def _all_silent(logs: list[Path], quiet_s: float) -> bool:
    """True when none of ``logs`` (those that exist; none existing: False) has been written to
    for ``quiet_s`` seconds."""
    now = time.time()
    present = [log for log in logs if log.exists()]
    return bool(present) and all(now - log.stat().st_mtime > quiet_s for log in present)


def _results(out: Path) -> int:
    """Cases of a suite folder that wrote a result (``NAME.json``; ``NAME.case.json`` is an input)."""
    return sum(1 for p in out.glob("*.json") if not p.name.endswith(".case.json"))


def _finish(case: dict, p: subprocess.Popen, log, gdir: Path, out: Path) -> None:
    from vllm_k2_tools.procs import stop_group

    stop_group(p, grace_s=0)  # at once, the engine core child too (the next group needs the GPU)
    Path(gdir, f"{case['name']}.exit").touch()
    log.close()
    text = (out / f"{case['name']}.log").read_text(errors="replace")
    lines = sorted({ln.strip()[-220:] for ln in text.splitlines() if any(s in ln for s in CUDAGRAPH_LOG)})
    res_path = out / f"{case['name']}.json"
    if res_path.exists():
        res = json.loads(res_path.read_text())
        res["log_lines"] = lines
        res_path.write_text(json.dumps(res, indent=1))
        print(f"CASE {case['name']} ok init {res['init_s']} s", flush=True)
    else:
        tail = [ln for ln in text.splitlines() if "Error" in ln or "error" in ln][-6:]
        print(f"CASE {case['name']} FAILED rc={p.returncode}: " + " | ".join(tail)[-1500:], flush=True)
    for ln in lines:
        print("   ", ln, flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("dest", type=Path)
    p.add_argument("--trained-draft", type=Path, help="the training pipeline's export directory")
    p = sub.add_parser("run")
    p.add_argument("suite")
    p.add_argument("--models", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--parallel", type=int, default=1)
    p.add_argument("--only", nargs="*", default=[])
    p.add_argument("--budget", type=float, default=540, help="seconds for the whole suite")
    p = sub.add_parser("case")
    p.add_argument("case", type=Path)
    p.add_argument("result", type=Path)
    p = sub.add_parser("report")
    p.add_argument("raw", type=Path, nargs="+", help="case result files or folders of them")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--acceptance", type=Path, help="eval.json of the trained pair (per-position acceptance)")
    a = ap.parse_args(argv)
    if a.cmd == "prepare":
        prepare(a.dest, a.trained_draft)
    elif a.cmd == "run":
        if run_suite(a.suite, a.models, a.out, a.parallel, a.only, a.budget) == 0:
            sys.exit(3)  # no case produced a result
    elif a.cmd == "case":
        case = json.loads(a.case.read_text())
        res = run_case(case)
        res["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        res["command"] = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
        a.result.write_text(json.dumps(res, indent=1))
        if os.getpgrp() == os.getpid():  # started by `run` in a group of its own: end it, engine and all,
            os.killpg(0, 9)  # at once (the next group needs the GPU); `run` kills the group again
        sys.exit(0)  # started by hand: vLLM's own shutdown runs (no orphaned engine processes)
    elif a.cmd == "report":
        report(a.raw, a.out, a.acceptance, " ".join(["python", *sys.argv]))


if __name__ == "__main__":
    main()
