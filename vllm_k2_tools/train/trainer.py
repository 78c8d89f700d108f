"""Stage 4, ``train``: EAGLE-3 with training-time test on extracted hidden states.

One process, or ``torchrun --nproc_per_node N`` (DDP; gloo on CPU, NCCL on GPU). The
data order is a pure function of (seed, epoch): optimizer step s consumes global samples
[s*G, (s+1)*G), G = world * grad_accum * batch_size, so a resumed run continues with
exactly the samples an uninterrupted run would have seen (no step lost or repeated).

Why not speculators' trainer: 0.3.0's reads its own .pt dumps, packs with flex attention
(CUDA only), saves per epoch only (no step-level resume), and initialises from the
verifier through its own model classes; this loop trains the draft vLLM runs
(``draft_model``) on our checksummed shards, on CPU and GPU alike.

Why DDP and not FSDP: the K2.5 draft is ~1.2 B trainable parameters (+ a frozen 2.35 GB
embedding): its training step peaked at 30.3 GiB on an H200 at batch 1 x 2,048 tokens
(benchmarks/results/train_step_h200.md), which fits every GPU we target; sharding
would only add communication.

Checkpoints (atomic directories): out/checkpoints/step-NNNNNNN/{draft.safetensors,
optimizer.pt, state.json}, out/checkpoints/latest.json names the newest. Metrics:
out/metrics.jsonl, one line per optimizer step (truncated back to the checkpoint on resume).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from dataclasses import asdict

import torch

from vllm_k2_plugin import fileio

from .config import TrainConfig
from .draft_model import DraftConfig, Eagle3Draft
from .order import SampleOrder
from .shards import ShardReader
from .stream import StreamFeed
from .target_weights import EMBED, LM_HEAD, load_tensor
from .ttt import Batch
from .vocab import load_vocab


def draft_config_for(target: str, draft_vocab_size: int, aux_layer_ids: list[int], **overrides) -> DraftConfig:
    """The draft geometry for a target: SpecForge's K2.5 draft for hidden 7168, else one
    Llama layer shaped like the target's attention (heads, hidden, dense MLP width). With the
    override ``attention = "mla"``: the same layer with the target's MLA attention dims and
    RoPE base (lightseekorg's Kimi MLA drafters)."""
    from vllm_k2_plugin.hf_config import read_text_config

    text = read_text_config(target)
    hidden, vocab = int(text["hidden_size"]), int(text["vocab_size"])
    if hidden == 7168:
        cfg = asdict(DraftConfig.kimi_k25(draft_vocab_size, aux_layer_ids))
    else:
        heads = int(text["num_attention_heads"])
        cfg = dict(
            hidden_size=hidden,
            target_hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=heads,
            head_dim=hidden // heads,
            intermediate_size=int(text.get("intermediate_size", 4 * hidden)),
            draft_vocab_size=draft_vocab_size,
            vocab_size=vocab,
            aux_layer_ids=list(aux_layer_ids),
            max_position_embeddings=int(text.get("max_position_embeddings", 4096)),
        )
    if overrides.get("attention") == "mla":  # the target's MLA geometry, as the published MLA drafters have it
        for key in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if key not in text:
                raise ValueError(
                    f"{target}/config.json: '{key}' is missing (an MLA drafter takes the target's MLA dims)"
                )
            cfg[key] = text[key]
        cfg["rope_theta"] = float(text.get("rope_theta", cfg.get("rope_theta", 1_000_000.0)))
        cfg["rope_scaling"] = text.get("rope_scaling")
        cfg["max_position_embeddings"] = int(text.get("max_position_embeddings", cfg["max_position_embeddings"]))
    cfg.update(vocab_size=vocab, target_hidden_size=hidden, **overrides)
    return DraftConfig(**cfg)


def build_draft(target: str, cfg: DraftConfig, d2t, t2d, seed: int = 0) -> tuple[Eagle3Draft, torch.Tensor]:
    """A fresh draft (lm_head = the target's LM-head rows of the draft vocab, as
    speculators initialises it) and the frozen verifier rows for the distillation targets."""
    torch.manual_seed(seed)
    embed = load_tensor(target, EMBED).float()
    lm_head = load_tensor(target, LM_HEAD).float()
    model = Eagle3Draft(cfg, embed, d2t, t2d)
    verifier_w = lm_head[t2d].contiguous()
    with torch.no_grad():
        model.lm_head.weight.copy_(verifier_w)
    return model, verifier_w


def collate(rows: list[dict], max_len: int) -> Batch:
    t = min(max(len(r["input_ids"]) for r in rows), max_len)
    b = len(rows)
    a_dim, h_dim = rows[0]["aux"].shape[-1], rows[0]["final"].shape[-1]
    ids = torch.zeros(b, t, dtype=torch.int64)
    mask = torch.zeros(b, t, dtype=torch.float32)
    aux = torch.zeros(b, t, a_dim)
    final = torch.zeros(b, t, h_dim)
    for i, r in enumerate(rows):
        n = min(len(r["input_ids"]), t)
        ids[i, :n] = r["input_ids"][:n]
        mask[i, :n] = r["loss_mask"][:n].float()
        aux[i, :n] = r["aux"][:n].float()
        final[i, :n] = r["final"][:n].float()
    return Batch(ids, aux, final, mask)


def lr_factor(step: int, total: int, cfg: TrainConfig) -> float:
    warm = max(1, int(total * cfg.warmup_ratio))
    if step < warm:
        return (step + 1) / warm
    p = (step - warm) / max(1, total - warm)
    shape = 0.5 * (1 + math.cos(math.pi * p)) if cfg.schedule == "cosine" else 1 - p
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * shape


def _dist():
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank() if world > 1 else 0
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local}" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return rank, world, device


def _latest(out_dir: str) -> dict | None:
    path = os.path.join(out_dir, "checkpoints", "latest.json")
    return fileio.read_json(path) if os.path.exists(path) else None


def _save(out_dir: str, step: int, model: Eagle3Draft, opt, sched, cfg: TrainConfig, dcfg: DraftConfig) -> None:
    from safetensors.torch import save_file

    ck_root = os.path.join(out_dir, "checkpoints")
    name = f"step-{step:07d}"
    with fileio.directory(os.path.join(ck_root, name)) as tmp:
        save_file({k: v.contiguous() for k, v in model.exported_state_dict().items()}, f"{tmp}/draft.safetensors")
        torch.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict()}, f"{tmp}/optimizer.pt")
        with open(f"{tmp}/state.json", "w") as f:
            json.dump({"step": step, "train": asdict(cfg), "draft": dcfg.to_dict()}, f, indent=1)
    fileio.write_json(os.path.join(ck_root, "latest.json"), {"step": step, "dir": name})
    old = sorted(d for d in os.listdir(ck_root) if d.startswith("step-") and d != name)
    for d in old[: max(0, len(old) - (cfg.keep_checkpoints - 1))]:
        shutil.rmtree(os.path.join(ck_root, d), ignore_errors=True)


def _truncate_metrics(path: str, step: int) -> None:
    if not os.path.exists(path):
        return
    with open(path) as f:
        keep = [line for line in f if line.strip() and json.loads(line)["step"] <= step]
    fileio.write_file(path, lambda tmp: open(tmp, "w").writelines(keep))


def train(
    target: str,
    extract_dir: str,
    vocab_dir: str,
    out_dir: str,
    cfg: TrainConfig | None = None,
    draft_overrides: dict | None = None,
    stream: bool = False,
    poll_s: float = 1.0,
) -> dict:
    from safetensors.torch import load_file
    from tqdm import tqdm

    cfg = cfg or TrainConfig()
    rank, world, device = _dist()
    data = ShardReader(extract_dir, streaming=stream)
    if stream:  # extraction may not have started yet: wait for its manifest
        while not data.metadata:
            time.sleep(poll_s)
            data.refresh()
    else:
        data.verify_all()  # a corrupted shard stops the run before any step (streaming: at first use)
    order = SampleOrder(data.manifest, cfg.seed, cfg.shuffle_window, streaming=stream)
    d2t, t2d = load_vocab(vocab_dir)
    dcfg = draft_config_for(target, len(d2t), data.metadata["layer_ids"], **(draft_overrides or {}))
    model, verifier_w = build_draft(target, dcfg, d2t, t2d, cfg.seed)
    model.to(device)
    verifier_w = verifier_w.to(device)
    g = world * cfg.grad_accum * cfg.batch_size
    total = cfg.steps or max(1, int(cfg.epochs * order.per_pass // g))
    if stream and total * g > order.passes * order.per_pass:
        raise ValueError(
            f"{extract_dir}: {total} steps x {g} samples need {total * g / order.per_pass:g} passes of extraction, "
            f"the spool's extraction makes {order.passes} (train extract --passes)"
        )
    decay, no_decay = [], []
    for p in model.parameters():
        (no_decay if p.ndim < 2 else decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, total, cfg))
    metrics_path = os.path.join(out_dir, "metrics.jsonl")
    start = 0
    latest = _latest(out_dir)
    if latest:
        ck = os.path.join(out_dir, "checkpoints", latest["dir"])
        state = fileio.read_json(os.path.join(ck, "state.json"))
        if state["draft"] != dcfg.to_dict():
            raise ValueError(f"{ck}: checkpoint draft config differs from this run's; use another --out")
        model.load_exported(load_file(os.path.join(ck, "draft.safetensors")), os.path.join(ck, "draft.safetensors"))
        model.to(device)
        opt_state = torch.load(os.path.join(ck, "optimizer.pt"), map_location=device, weights_only=False)
        opt.load_state_dict(opt_state["optimizer"])
        sched.load_state_dict(opt_state["scheduler"])
        start = state["step"]
        if rank == 0:
            _truncate_metrics(metrics_path, start)
    net = model
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            broadcast_buffers=False,  # the frozen 2.35 GB embedding is identical on every rank
            gradient_as_bucket_view=True,
        )
    feed = StreamFeed(data, order, poll_s, rank, world, log=tqdm.write) if stream else None

    def checkpoint(step: int) -> None:
        if rank == 0:
            _save(out_dir, step, model, opt, sched, cfg, dcfg)
        if world > 1:
            torch.distributed.barrier()

    if feed:
        feed.release_consumed(start * g)  # finish a release a kill interrupted
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda" and cfg.bf16)
    os.makedirs(out_dir, exist_ok=True)
    bar = tqdm(range(start, total), desc="train eagle3", unit="step", initial=start, total=total, disable=rank != 0)
    log = open(metrics_path, "a") if rank == 0 else None
    try:
        for step in bar:
            t0 = time.time()
            sums: dict[str, float] = {}
            tokens = 0
            if feed:
                feed.wait_for(step * g, (step + 1) * g, step * g, lambda s=step: checkpoint(s))
            for m in range(cfg.grad_accum):
                first = step * g + (m * world + rank) * cfg.batch_size
                rows = [data.row(*order.locate(first + j)) for j in range(cfg.batch_size)]
                batch = collate(rows, cfg.max_len).to(device)
                tokens += int(batch.loss_mask.sum())
                sync = m == cfg.grad_accum - 1 or world == 1
                ctx = net.no_sync() if (world > 1 and not sync) else _null()
                with ctx, autocast:
                    # Through the (DDP) wrapper: its forward is the TTT loss, so gradient hooks fire.
                    # Each micro-batch's loss is a mean over its own masked tokens; DDP and accumulation
                    # average those means, which equals the global per-token mean only when micro-batches
                    # hold equal masked-token counts (a small bias otherwise, as in speculators/SpecForge).
                    loss, met = net(batch, verifier_w, cfg.ttt_steps, cfg.step_decay)
                (loss / cfg.grad_accum).backward()
                for k, v in met.items():
                    sums[k] = sums.get(k, 0.0) + float(v) / cfg.grad_accum
                sums["loss"] = sums.get("loss", 0.0) + float(loss.detach()) / cfg.grad_accum
            if world > 1:  # log the global batch's means, not rank 0's share
                keys = sorted(sums)
                vals = torch.tensor([sums[k] for k in keys] + [float(tokens)], dtype=torch.float64, device=device)
                torch.distributed.all_reduce(vals)
                sums = {k: float(v) / world for k, v in zip(keys, vals[:-1].tolist(), strict=True)}
                tokens = int(vals[-1])
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            if rank == 0:
                rec = {
                    "step": step + 1,
                    "lr": sched.get_last_lr()[0],
                    "grad_norm": float(gnorm),
                    "tokens": tokens,
                    "seconds": round(time.time() - t0, 4),
                    **sums,
                }
                log.write(json.dumps(rec) + "\n")
                log.flush()
                bar.set_postfix(loss=f"{sums['loss']:.3f}", acc0=f"{sums.get('acc_0', 0):.2f}")
            if (step + 1) % cfg.save_every == 0 or step + 1 == total:
                checkpoint(step + 1)
                if feed:
                    feed.release_consumed((step + 1) * g)
    finally:
        if log:
            log.close()
    if feed:
        feed.drain()
    summary = {
        "steps": total,
        "world_size": world,
        "global_batch": g,
        "samples": order.per_pass,
        "shuffle_window": cfg.shuffle_window,
        "streaming": stream,
        "draft": dcfg.to_dict(),
    }
    if rank == 0:
        fileio.write_json(os.path.join(out_dir, "train.json"), summary)
    return summary


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def latest_weights(out_dir: str) -> tuple[str, dict]:
    """(draft.safetensors path, state) of the newest checkpoint of a training run."""
    latest = _latest(out_dir)
    if not latest:
        raise FileNotFoundError(f"{out_dir}: no checkpoints/latest.json; run `vllm-k2 train train` first")
    ck = os.path.join(out_dir, "checkpoints", latest["dir"])
    return os.path.join(ck, "draft.safetensors"), fileio.read_json(os.path.join(ck, "state.json"))
