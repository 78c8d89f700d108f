"""GPU benchmark of the EAGLE-3 training step at Kimi-K2.5 dimensions, on synthetic hidden states.

One optimizer step = ``ttt_loss`` forward (7 TTT steps, decay 0.8, fused flash attention and
fused LM-head/soft-CE on CUDA) -> backward -> clip_grad_norm_(1.0) + fused AdamW, with fp32
master weights and bf16 autocast (the frozen target embedding and the verifier head are bf16).

    # one GPU: matmul/copy ceilings, then the step
    python benchmarks/train_step.py --seq 2048 --batch 1 --out out.json
    # two GPUs, DDP: scaling, plus the data-parallel equality check
    torchrun --nproc_per_node 2 benchmarks/train_step.py --ddp --dp-check --out out_ddp.json
    # no GPU: the committed results file from the raw runs (derived fields recomputed)
    python benchmarks/train_step.py report benchmarks/results/train_step_h200_raw \
        --out benchmarks/results/train_step_h200.json

(``--json PATH`` is the earlier spelling of ``--out PATH``; still accepted.)

FLOPs are counted analytically (``vllm_k2_tools.train.plan.train_step_flops`` states the
formula; no recompute counted), and MFU is achieved FLOP/s over the bf16 matmul rate
measured in the same run (an 8192^3 product on random data, median of 20).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vllm_k2_plugin import fileio  # noqa: E402
from vllm_k2_tools.train import draft_model as dm  # noqa: E402
from vllm_k2_tools.train import ttt  # noqa: E402
from vllm_k2_tools.train.hardware import DraftDims  # noqa: E402
from vllm_k2_tools.train.plan import draft_step_flops  # noqa: E402

STEPS = 7  # TTT steps of the default recipe
DECAY = 0.8


def k25_config() -> dm.DraftConfig:
    return dm.DraftConfig.kimi_k25(draft_vocab_size=32_000)


def small_config() -> dm.DraftConfig:
    return dm.DraftConfig(
        hidden_size=512,
        target_hidden_size=512,
        num_attention_heads=8,
        num_key_value_heads=8,
        head_dim=64,
        intermediate_size=1024,
        draft_vocab_size=4000,
        vocab_size=16000,
        aux_layer_ids=[2, 30, 58],
    )


def step_flops(cfg: dm.DraftConfig, batch: int, seq: int, steps: int) -> dict:
    """Model FLOPs of one optimizer step on a [batch, seq] all-ones loss mask (the synthetic
    batches below): the planner's formula at this config's dims."""
    return draft_step_flops(seq, batch=batch, steps=steps, dims=DraftDims.from_config(cfg))


def build(cfg: dm.DraftConfig, device, seed: int = 0):
    """Draft model (fp32 trainable weights, bf16 frozen embedding) and a bf16 verifier head."""
    g = torch.Generator(device=device).manual_seed(seed)
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size, device=device, dtype=torch.bfloat16, generator=g)
    d2t = torch.zeros(cfg.draft_vocab_size, dtype=torch.long, device=device)
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool, device=device)
    t2d[: cfg.draft_vocab_size] = True
    torch.manual_seed(seed)
    with torch.device(device):
        model = dm.Eagle3Draft(cfg, embed, d2t, t2d)
    del embed
    vw = torch.randn(cfg.draft_vocab_size, cfg.target_hidden_size, device=device, dtype=torch.bfloat16, generator=g)
    vw *= cfg.target_hidden_size**-0.5
    return model, vw


def synthetic_batch(cfg, batch: int, seq: int, device, seed: int = 1) -> ttt.Batch:
    """Random (never zero) hidden states in bf16, random token ids, all-ones loss mask."""
    g = torch.Generator(device=device).manual_seed(seed)
    return ttt.Batch(
        torch.randint(0, cfg.vocab_size, (batch, seq), device=device, generator=g),
        torch.randn(batch, seq, cfg.num_aux * cfg.target_hidden_size, device=device, dtype=torch.bfloat16, generator=g),
        torch.randn(batch, seq, cfg.target_hidden_size, device=device, dtype=torch.bfloat16, generator=g),
        torch.ones(batch, seq, dtype=torch.long, device=device),
    )


class TTTStep(torch.nn.Module):
    """``ttt_loss`` as a module forward, so DDP sees a forward (its reducer only syncs
    gradients of backward passes that follow a DDP forward)."""

    def __init__(self, draft: dm.Eagle3Draft, steps: int = STEPS, decay: float = DECAY):
        super().__init__()
        self.draft, self.steps, self.decay = draft, steps, decay

    def forward(self, input_ids, aux, final, loss_mask, verifier_w):
        loss, metrics = ttt.ttt_loss(
            self.draft, ttt.Batch(input_ids, aux, final, loss_mask), verifier_w, self.steps, self.decay
        )
        return loss, metrics


def matmul_tflops(n: int = 8192, iters: int = 20) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        a @ b
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        a @ b
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return 2 * n**3 / statistics.median(times) / 1e12


def copy_gbps(nbytes: int = 4 << 30, iters: int = 10) -> float:
    """Device-to-device copy, bytes read + written."""
    x = torch.empty(nbytes // 2, device="cuda", dtype=torch.bfloat16).normal_()
    y = torch.empty_like(x)
    y.copy_(x)
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        y.copy_(x)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return 2 * nbytes / statistics.median(times) / 1e9


def _run_steps(step_mod, params, batch, vw, warmup: int, iters: int):
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0, fused=True)
    rec = []
    losses = []
    for i in range(warmup + iters):
        if i == warmup:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            wall0 = time.perf_counter()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        ev[0].record()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, _ = step_mod(batch.input_ids, batch.aux, batch.final, batch.loss_mask, vw)
        ev[1].record()
        loss.backward()
        ev[2].record()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        ev[3].record()
        torch.cuda.synchronize()
        losses.append(float(loss.detach()))
        if i >= warmup:
            rec.append([ev[j].elapsed_time(ev[j + 1]) / 1e3 for j in range(3)])
    wall = time.perf_counter() - wall0
    fwd, bwd, optim = (statistics.median(r[j] for r in rec) for j in range(3))
    totals = [sum(r) for r in rec]
    return {
        "forward_s": fwd,
        "backward_s": bwd,
        "optimizer_s": optim,
        "step_s": statistics.median(totals),
        "step_s_min": min(totals),
        "step_s_max": max(totals),
        "wall_step_s": wall / iters,
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
        "losses": losses,
    }


def bench_single(cfg, batch: int, seq: int, steps: int = STEPS, warmup: int = 2, iters: int = 8, peak=None) -> dict:
    model, vw = build(cfg, "cuda")
    data = synthetic_batch(cfg, batch, seq, "cuda")
    params = [p for p in model.parameters() if p.requires_grad]
    r = _run_steps(TTTStep(model, steps), params, data, vw, warmup, iters)
    fl = step_flops(cfg, batch, seq, steps)
    r.update(_derived(r, fl, batch * seq, peak))
    r.update(batch=batch, seq=seq, ttt_steps=steps, trainable_params=sum(p.numel() for p in params))
    del model, vw, data
    torch.cuda.empty_cache()
    return r


def _derived(r: dict, fl: dict, tokens: int, peak) -> dict:
    out = {
        "tokens_per_step": tokens,
        "tokens_per_s": tokens / r["step_s"],
        "model_flops_per_step": fl["total"],
        "model_flops_per_token": fl["total"] / tokens,
        "flops_breakdown": fl,
        "achieved_tflops": fl["total"] / r["step_s"] / 1e12,
    }
    if peak:
        out["mfu_vs_measured_matmul"] = out["achieved_tflops"] / peak
    return out


# ----------------------------------------------------------------------------- DDP


def _dist_setup():
    import torch.distributed as dist

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never NVLink multicast on shared hosts
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    return dist, dist.get_rank(), dist.get_world_size()


def allreduce_busbw(dist, world: int, nbytes: int = 1 << 30, iters: int = 10) -> float:
    x = torch.ones(nbytes // 4, device="cuda", dtype=torch.float32)
    for _ in range(3):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    t = (time.perf_counter() - t0) / iters
    return 2 * (world - 1) / world * nbytes / t / 1e9


def dp_check(dist, rank: int, world: int, cfg, seq: int, autocast: bool) -> dict:
    """Loss and gradients of DDP over ``world`` ranks (one sample each) against one process
    computing the whole global batch [world, seq] on one GPU, with the same weights."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    model, vw = build(cfg, "cuda", seed=7)
    data = synthetic_batch(cfg, world, seq, "cuda", seed=11)  # the global batch, same on every rank
    if not autocast:  # all fp32: inputs, frozen embedding and verifier rows too
        data, vw = data.to("cuda", torch.float32), vw.float()
        model.embed_tokens = model.embed_tokens.float()
    ctx = torch.autocast("cuda", dtype=torch.bfloat16) if autocast else torch.autocast("cuda", enabled=False)
    step = TTTStep(model)
    with ctx:
        loss_ref, _ = step(data.input_ids, data.aux, data.final, data.loss_mask, vw)
    loss_ref.backward()
    ref = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    ddp = DDP(step, broadcast_buffers=False, gradient_as_bucket_view=True)
    sl = slice(rank, rank + 1)
    with ctx:
        loss_r, _ = ddp(data.input_ids[sl], data.aux[sl], data.final[sl], data.loss_mask[sl], vw)
    loss_r.backward()
    loss_dp = loss_r.detach().clone()
    dist.all_reduce(loss_dp)
    loss_dp /= world
    errs = {n: float((p.grad - ref[n]).norm() / ref[n].norm().clamp_min(1e-30)) for n, p in model.named_parameters()}
    worst = max(errs, key=errs.get)
    res = {
        "config": "k25" if cfg.hidden_size == 7168 else "small",
        "precision": "bf16 autocast, fp32 weights" if autocast else "fp32 (TF32 off)",
        "seq": seq,
        "global_batch": world,
        "loss_1gpu": float(loss_ref.detach()),
        "loss_ddp": float(loss_dp),
        "loss_rel_diff": abs(float(loss_dp) - float(loss_ref)) / abs(float(loss_ref)),
        "grad_rel_l2_max": errs[worst],
        "grad_rel_l2_worst_param": worst,
        "grad_rel_l2_median": statistics.median(errs.values()),
    }
    del ddp, step, model, vw, data, ref
    torch.cuda.empty_cache()
    return res


def bench_ddp(dist, rank, world, cfg, batch, seq, steps, warmup, iters, peak) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model, vw = build(cfg, "cuda")
    data = synthetic_batch(cfg, batch, seq, "cuda", seed=100 + rank)
    params = [p for p in model.parameters() if p.requires_grad]
    ddp = DDP(TTTStep(model, steps), broadcast_buffers=False, gradient_as_bucket_view=True)
    r = _run_steps(ddp, params, data, vw, warmup, iters)
    t = torch.tensor([r["step_s"]], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    r["step_s_slowest_rank"] = float(t)
    fl = step_flops(cfg, batch, seq, steps)
    r.update(_derived(r, fl, batch * seq, peak))
    r["tokens_per_s_all_ranks"] = world * batch * seq / r["step_s_slowest_rank"]
    r.update(batch=batch, seq=seq, ttt_steps=steps, world=world)
    del ddp, model, vw, data
    torch.cuda.empty_cache()
    return r


def env_info() -> dict:
    p = torch.cuda.get_device_properties(0)
    return {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "gpu": p.name,
        "gpu_count": torch.cuda.device_count(),
        "sms": p.multi_processor_count,
        "gpu_mem_gib": p.total_memory / 2**30,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
    }


# ----------------------------------------------------------------------------- report (no GPU)

RECORDED = "predictions_recorded.json"  # the planner's predictions, written down before the runs they predict


def _measured_step(run: dict) -> float:
    return run["single"]["step_s"] if "single" in run else run["ddp"]["step_s_slowest_rank"]


def _config(run: dict) -> str:
    r = run.get("single") or run["ddp"]
    gpus = "1 GPU" if "single" in run else f"{r['world']} GPUs DDP"
    return (
        f"{gpus}, batch {r['batch']} x seq {r['seq']}"
        + (" per GPU" if "ddp" in run else "")
        + f", {r['ttt_steps']} TTT steps"
    )


def predict(cal, run: dict) -> dict:
    """The planner's step time for a run's configuration on the H200 preset, from the
    calibration: one GPU = seq_time + optimizer; DDP adds the all-reduce not hidden under
    the backward (at the preset's all-reduce bandwidth, as the planner plans)."""
    from vllm_k2_tools.train import plan as P
    from vllm_k2_tools.train.hardware import GPUS, H200_KEY

    h200 = GPUS[H200_KEY]
    r = run.get("single") or run["ddp"]
    t_seq = P.seq_time(cal, h200, r["seq"], r["batch"], r["ttt_steps"])["t"]
    if "single" in run:
        t = t_seq + P.optimizer_time(cal, h200)
        cmd = f"python -m vllm_k2_tools.train.plan --predict-step --hardware h200 --seq {r['seq']} --batch {r['batch']}"
        return {"command": cmd, "predicted_step_s": t, "predicted_tokens_per_s": r["batch"] * r["seq"] / t}
    world = r["world"]
    ost = P.optimizer_step_time(cal, h200, t_seq, 1, world, h200.allreduce_gbps)
    t = ost["t"]
    return {
        "command": f"plan.optimizer_step_time, H200 preset all-reduce {h200.allreduce_gbps:g} GB/s busbw: "
        f"{ost['grad_bytes'] / 1e9:.2f} GB fp32 grads -> {ost['t_allreduce'] * 1e3:.1f} ms, "
        f"{ost['t_exposed'] * 1e3:.1f} ms of it not hidden under the backward",
        "predicted_step_s": t,
        "predicted_tokens_per_s": world * r["batch"] * r["seq"] / t,
        "predicted_scaling_efficiency": (t_seq + P.optimizer_time(cal, h200)) / t,
    }


def derive(runs: dict, recorded: list[dict], calibration_run: str, ddp_run: str, cal_path: str) -> dict:
    """predictions / checks / ddp_scaling, recomputed from the raw runs (`cal_path`: a file
    holding them, which the planner's own loader reads)."""
    from vllm_k2_tools.train import plan as P

    cal = P.load_calibration(cal_path)
    rec = {p["run"]: p for p in recorded}
    unknown = sorted(set(rec) - set(runs))
    if unknown:
        raise ValueError(f"{RECORDED}: predictions for runs that have no raw file: {unknown}")
    predictions, checks = [], []
    for name, run in runs.items():
        p = predict(cal, run)
        if name == calibration_run:
            kind = "calibration run (identity by construction)"
        elif _config(run) == _config(runs[calibration_run]):
            kind = "calibration config, re-measured"
        elif name in rec and rec[name]["recorded_utc"] < run["date_utc"]:
            kind = "predicted before measuring"
        else:
            kind = "predicted after measuring"
        if name != calibration_run:
            entry = {"run": name, "config": _config(run), **p}
            if name in rec:
                r = rec[name]
                entry["recorded_before_measuring"] = {
                    "recorded_utc": r["recorded_utc"],
                    "predicted_step_s": r["predicted_step_s"],
                    # recorded to 4 decimals: does today's planner still predict what was written down?
                    "reproduced_by_this_planner": round(p["predicted_step_s"], 4) == r["predicted_step_s"],
                }
            predictions.append(entry)
        measured = _measured_step(run)
        checks.append(
            {
                "kind": kind,
                "run": name,
                "predicted_step_s": p["predicted_step_s"],
                "measured_step_s": measured,
                "error": (p["predicted_step_s"] - measured) / measured,
            }
        )
    single, ddp = runs[calibration_run]["single"], runs[ddp_run]["ddp"]
    one = single["batch"] * single["seq"] / single["step_s"]
    all_ranks = ddp["world"] * ddp["batch"] * ddp["seq"] / ddp["step_s_slowest_rank"]
    scaling = {
        "gpus": ddp["world"],
        f"tokens_per_s_{ddp['world']}gpu": all_ranks,
        "tokens_per_s_1gpu": one,
        "efficiency": all_ranks / (ddp["world"] * one),
    }
    return {"predictions": predictions, "checks": checks, "ddp_scaling": scaling}


ABOUT = (
    "benchmarks/train_step.py on the device tool's nvidia-h200-x2 (2x H200 SXM, torch 2.11, CUDA 13.0), read by "
    "vllm_k2_tools/train/plan.py. `runs`: the raw output of each measured run (its command and date inside; the "
    "raw files are in benchmarks/results/train_step_h200_raw/). predictions / checks / ddp_scaling: derived by "
    "`train_step.py report` from those runs and the planner (nothing here is typed in by hand)."
)


def report(raw_dir: str, out: str, calibration_run: str, ddp_run: str, argv: list[str]) -> dict:
    """Write the results file the planner reads: raw runs + the derived fields."""
    import tempfile

    raw = Path(raw_dir)
    runs = {}
    for p in sorted(raw.glob("*.json")):
        if p.name == RECORDED:
            continue
        run = json.loads(p.read_text())
        for key in ("command", "date_utc"):
            if key not in run:
                raise ValueError(f"{p}: raw run without '{key}' (write raw runs with train_step.py --out)")
        runs[p.stem] = run
    for name in (calibration_run, ddp_run):
        if name not in runs:
            raise ValueError(f"{raw}: no raw run '{name}.json' (have {sorted(runs)})")
    recorded = json.loads((raw / RECORDED).read_text()) if (raw / RECORDED).is_file() else []
    doc = {"about": ABOUT, "calibration_run": calibration_run, "ddp_run": ddp_run, "runs": runs}
    with tempfile.TemporaryDirectory() as tmp:  # the planner's own loader reads the calibration
        cal_path = os.path.join(tmp, "runs.json")
        fileio.write_json(cal_path, doc)
        doc.update(derive(runs, recorded, calibration_run, ddp_run, cal_path))
    doc["derived_by"] = {
        "command": " ".join(["python", "benchmarks/train_step.py", "report", *argv]),
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "note": "the derived fields were recomputed from the raw runs on this date, without a GPU; "
        "the runs themselves were measured on the dates they carry",
    }
    fileio.write_json(os.path.realpath(out), doc)  # realpath: benchmarks/results/ links to the package copy
    return doc


def report_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="train_step.py report", description="the results file from raw runs")
    ap.add_argument("raw", help="folder of raw run files (train_step.py --out) + predictions_recorded.json")
    ap.add_argument("--out", required=True, help="results file (the planner's calibration)")
    ap.add_argument("--calibration-run", default="single_s2048_b1")
    ap.add_argument("--ddp-run", default="ddp_s2048_b1")
    a = ap.parse_args(argv)
    doc = report(a.raw, a.out, a.calibration_run, a.ddp_run, argv)
    for c in doc["checks"]:
        print(
            f"{c['run']:24} {c['kind']:45} predicted {c['predicted_step_s'] * 1e3:6.1f} ms, measured "
            f"{c['measured_step_s'] * 1e3:6.1f} ms, error {c['error']:+.1%}"
        )
    print(f"DDP scaling efficiency {doc['ddp_scaling']['efficiency']:.1%} -> {a.out}")
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["report"]:
        return report_main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=1, help="sequences per GPU per step")
    ap.add_argument("--steps", type=int, default=STEPS, help="TTT steps")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--small", action="store_true", help="small dimensions (smoke test)")
    ap.add_argument("--ddp", action="store_true", help="run under torchrun: DDP over all ranks")
    ap.add_argument("--dp-check", action="store_true", help="with --ddp: DDP vs 1-GPU loss/gradients")
    ap.add_argument("--out", "--json", dest="out", help="write the results here (JSON, with command and date)")
    a = ap.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = False
    cfg = small_config() if a.small else k25_config()
    out = env_info()
    out["model"] = "small" if a.small else "Kimi-K2.5 EAGLE-3 draft (DraftConfig.kimi_k25, draft vocab 32000)"
    rank, world, dist = 0, 1, None
    if a.ddp:
        dist, rank, world = _dist_setup()
    out["matmul_bf16_tflops_measured"] = matmul_tflops()
    out["copy_gbps_measured"] = copy_gbps()
    peak = out["matmul_bf16_tflops_measured"]
    if a.ddp:
        out["allreduce_busbw_gbps"] = allreduce_busbw(dist, world)
        if a.dp_check:
            out["dp_check"] = [
                dp_check(dist, rank, world, small_config(), 256, autocast=False),
                dp_check(dist, rank, world, cfg, a.seq, autocast=True),
            ]
        out["ddp"] = bench_ddp(dist, rank, world, cfg, a.batch, a.seq, a.steps, a.warmup, a.iters, peak)
    else:
        out["single"] = bench_single(cfg, a.batch, a.seq, a.steps, a.warmup, a.iters, peak)
    if rank == 0:
        r = out.get("single") or out["ddp"]
        print(
            f"[{out['gpu']} x{world}] batch {a.batch} seq {a.seq} ttt {a.steps}: step {r['step_s'] * 1e3:.1f} ms "
            f"(fwd {r['forward_s'] * 1e3:.1f} / bwd {r['backward_s'] * 1e3:.1f} / opt {r['optimizer_s'] * 1e3:.1f}), "
            f"{r['tokens_per_s']:.0f} tok/s/GPU, {r['achieved_tflops']:.0f} TFLOP/s, "
            f"MFU {100 * r['mfu_vs_measured_matmul']:.1f}% of measured {peak:.0f}, peak {r['peak_mem_gib']:.1f} GiB"
        )
        for c in out.get("dp_check", []):
            print(
                f"dp_check {c['config']} {c['precision']}: loss rel {c['loss_rel_diff']:.2e}, "
                f"grad rel-L2 max {c['grad_rel_l2_max']:.2e} ({c['grad_rel_l2_worst_param']})"
            )
        if a.out:
            fileio.write_json(a.out, out)
    if dist is not None:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
