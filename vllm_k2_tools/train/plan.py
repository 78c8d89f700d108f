"""``vllm-k2 train plan``: hours or days for an EAGLE-3 hero run, from measured numbers.

For a dataset (samples x mean tokens) and a machine (a preset of ``hardware.GPUS`` or
custom specs), it prints each figure with its formula inputs:

* extraction: prefill FLOPs of Kimi-K2.5 (``2 x 32e9`` active parameters + causal MLA
  attention) over ``gpus x bf16 dense x prefill efficiency``, plus the tensor-parallel
  all-reduce traffic of that prefill over the interconnect; the efficiency comes from the
  MEASURED prefill of the K2.5 slice on an H200 (``calibration/prefill_h200.json``, written by
  benchmarks/prefill_throughput.py) where that file exists, else it is the 30 % ASSUMPTION,
  flagged as such in the output;
* storage of offline mode: ``tokens x 57,344 B`` (3 aux + final K2.5 states in bf16);
* memory: whether the target and the trainer fit together (online) or must alternate
  (offline);
* training: the MEASURED H200 step (``benchmarks/results/train_step_h200.json``, with its date)
  scaled to the GPU: the matmul part by the bf16 dense TFLOP/s ratio, the rest of the step by
  the memory-bandwidth ratio, plus the data-parallel gradient all-reduce not hidden under the
  backward;
* I/O, as the pipeline does it (not overlapped with compute): extraction writes every shard
  and reads it back for its sha256; training checks each shard's sha256 once and reads each
  sample's bytes once per epoch. Disk bandwidths are ASSUMPTIONS (flags);
* a verdict per mode the pipeline implements: hours (< 24 h end to end) or days, and the disk:
  offline (extract everything, then train; multi-epoch keeps the shards) and streaming
  (extraction and training together through a bounded spool; multi-epoch re-extracts), on
  one host (only where the target and the trainer fit the GPUs together) or on two hosts
  sharing a directory. Online training (the trainer fed by the serving engine without a
  spool) is not implemented, so it gets no verdict.

``register_cli(subparsers)`` adds the ``plan`` sub-command; ``python -m
vllm_k2_tools.train.plan`` runs it stand-alone.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, replace
from importlib import resources
from pathlib import Path

from .hardware import GPUS, H200_KEY, K25, K25_DRAFT, GPUSpec

#: Package data (benchmarks/results/train_step_h200.json links here), so a wheel carries it.
DEFAULT_CALIBRATION = Path(str(resources.files("vllm_k2_tools.train") / "calibration" / "train_step_h200.json"))
#: Written by benchmarks/prefill_throughput.py on an H200 (K2.5 slice, dummy weights); absent until measured.
DEFAULT_PREFILL = Path(str(resources.files("vllm_k2_tools.train") / "calibration" / "prefill_h200.json"))
#: Fraction of bf16 dense peak the target's prefill is ASSUMED to reach when nothing is measured.
ASSUMED_PREFILL_EFFICIENCY = 0.30
HOURS_VS_DAYS_H = 24.0  # the verdict's threshold: end-to-end wall time below this is "hours"


class PlanError(ValueError):
    """A bad planner input; the message names the flag."""


# ----------------------------------------------------------------------------- FLOPs


def train_step_flops(
    *,
    hidden: int,
    target_hidden: int,
    num_aux: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    intermediate: int,
    draft_vocab: int,
    batch: int,
    seq: int,
    steps: int,
    masked_per_step: list[float],
) -> dict:
    """Model FLOPs of one EAGLE-3 TTT training step (forward + backward; recomputation not
    counted; elementwise work, norms, RoPE and softmax not counted). B=batch, T=seq,
    H=hidden, Ht=target_hidden, A=num_aux, V=draft_vocab, n_k = loss positions of step k:

        fc        = 4 B T (A Ht) H                         fwd 2 + weight-grad 2 (aux is data)
        layer_k   = 6 B T P,  P = 2H (heads + 2 kv_heads) hd + heads hd H + 3 H I
        attn_k    = 3 x 4 B heads hd (T(T+1)/2 + k T)      causal step-0 block + k diagonal keys;
                                                            fwd QK^T and PV, bwd = 2 x fwd
        lm_head_k = 6 n_k H V                               draft LM head, fwd + bwd
        verify_k  = 2 n_k Ht V                              target distribution (frozen verifier rows)
        total     = fc + sum_k (layer_k + attn_k + lm_head_k + verify_k)
    """
    bt = batch * seq
    p_layer = 2 * hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden + 3 * hidden * intermediate
    fc = 4 * bt * num_aux * target_hidden * hidden
    layer = attn = lm = verify = 0.0
    for k in range(steps):
        n_k = masked_per_step[k]
        layer += 6 * bt * p_layer
        attn += 3 * 4 * batch * heads * head_dim * (seq * (seq + 1) / 2 + k * seq)
        lm += 6 * n_k * hidden * draft_vocab
        verify += 2 * n_k * target_hidden * draft_vocab
    total = fc + layer + attn + lm + verify
    return {
        "fc": fc,
        "layer": layer,
        "attention": attn,
        "lm_head": lm,
        "verifier": verify,
        "total": total,
        "matmul_params_per_layer": p_layer,
    }


def draft_step_flops(seq: int, batch: int = 1, steps: int = 7, loss_fraction: float = 1.0, dims=None) -> dict:
    """``train_step_flops`` for the K2.5 draft: step k trains on loss_fraction x B x (T-2-k) positions
    (the loss mask shifted by 2+k, as ``ttt.unroll`` does)."""
    d = dims or K25_DRAFT
    masked = [loss_fraction * batch * max(seq - 2 - k, 0) for k in range(steps)]
    return train_step_flops(
        hidden=d.hidden,
        target_hidden=d.target_hidden,
        num_aux=d.num_aux,
        heads=d.heads,
        kv_heads=d.kv_heads,
        head_dim=d.head_dim,
        intermediate=d.intermediate,
        draft_vocab=d.draft_vocab,
        batch=batch,
        seq=seq,
        steps=steps,
        masked_per_step=masked,
    )


def prefill_flops_per_token(mean_tokens: float) -> float:
    """K2.5 prefill: 2 x active params + causal MLA attention at mean context T/2:
    2 x layers x heads x (qk_dim + v_dim) x T/2."""
    return 2 * K25.active_params + 2 * K25.layers * K25.heads * (K25.qk_head_dim + K25.v_head_dim) * mean_tokens / 2


# ----------------------------------------------------------------------------- calibration


@dataclass(frozen=True)
class Calibration:
    """The measured H200 training step the planner scales from."""

    path: str
    date: str
    gpu: str
    seq: int
    batch: int
    ttt_steps: int
    step_s: float
    backward_s: float
    optimizer_s: float
    flops_per_step: float
    matmul_tflops: float
    copy_gbps: float
    peak_mem_gib: float
    ddp_world: int | None = None
    ddp_step_s: float | None = None
    ddp_busbw_gbps: float | None = None

    @property
    def tokens(self) -> int:
        return self.seq * self.batch

    @property
    def matmul_s(self) -> float:
        """The step's model FLOPs at the measured matmul rate."""
        return self.flops_per_step / (self.matmul_tflops * 1e12)

    @property
    def rest_s_per_token(self) -> float:
        """What the measured forward + backward took beyond its FLOPs at the matmul rate:
        elementwise work, attention and GEMMs below the matmul rate, launch gaps."""
        return max(self.step_s - self.optimizer_s - self.matmul_s, 0.0) / self.tokens

    @property
    def mfu(self) -> float:
        return self.matmul_s / self.step_s


def load_calibration(path: str | Path | None = None) -> Calibration:
    p = Path(path) if path else DEFAULT_CALIBRATION
    if not p.is_file():
        raise PlanError(f"--calibration: no measured results at {p} (run benchmarks/train_step.py; see its docstring)")
    try:
        doc = json.loads(p.read_text())
        run = doc["runs"][doc["calibration_run"]]
        single = run["single"]
        ddp = doc["runs"].get(doc.get("ddp_run", ""), {})
        d = ddp.get("ddp", {})
        return Calibration(
            path=str(p),
            date=run["date_utc"],
            gpu=run["gpu"],
            seq=single["seq"],
            batch=single["batch"],
            ttt_steps=single["ttt_steps"],
            step_s=single["step_s"],
            backward_s=single["backward_s"],
            optimizer_s=single["optimizer_s"],
            flops_per_step=single["model_flops_per_step"],
            matmul_tflops=run["matmul_bf16_tflops_measured"],
            copy_gbps=run["copy_gbps_measured"],
            peak_mem_gib=single["peak_mem_gib"],
            ddp_world=d.get("world"),
            ddp_step_s=d.get("step_s_slowest_rank"),
            ddp_busbw_gbps=ddp.get("allreduce_busbw_gbps"),
        )
    except (KeyError, TypeError, json.JSONDecodeError) as e:
        raise PlanError(f"--calibration: {p} is not a train_step results file ({type(e).__name__}: {e})") from e


def load_prefill_calibration(path: str | Path | None = None) -> tuple[float, str]:
    """(efficiency, label) for extraction: from a prefill measurement if one exists, else the
    labelled assumption. The measured time per token per layer of the K2.5 slice at TP 8 on
    an H200 becomes the fraction of the H200's bf16 dense peak that reproduces it in the
    planner's formula (61 layers x that time = K2.5 FLOPs at the measured seq / (8 x peak x
    efficiency)); other GPUs get the same fraction of their peak, as the training step's
    matmul part scales."""
    p = Path(path) if path else DEFAULT_PREFILL
    if not p.is_file():
        if path:
            raise PlanError(f"--prefill-calibration: no file at {p}")
        return ASSUMED_PREFILL_EFFICIENCY, f"ASSUMED (no prefill measurement at {p})"
    try:
        doc = json.loads(p.read_text())
        seq, t_layer = int(doc["seq"]), float(doc["ms_per_token_per_layer"]) / 1e3
        gpu, date = str(doc["gpu"]), str(doc["date"])
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as e:
        raise PlanError(f"--prefill-calibration: {p} is not a prefill_throughput results file ({e!r})") from e
    if t_layer <= 0:
        raise PlanError(f"--prefill-calibration: {p}: ms_per_token_per_layer must be > 0")
    peak = GPUS[H200_KEY].bf16_dense_tflops * 1e12
    eff = prefill_flops_per_token(seq) / (8 * peak * K25.layers * t_layer)
    return eff, f"MEASURED ({gpu}, {date}: {doc['ms_per_token_per_layer']} ms/token/layer at seq {seq}; {p})"


# ----------------------------------------------------------------------------- the model


def optimizer_time(cal: Calibration, gpu: GPUSpec) -> float:
    """clip_grad_norm_ + fused AdamW over the fp32 states: memory-bound, so the measured time
    x bw(H200)/bw(gpu); once per optimizer step."""
    return cal.optimizer_s * GPUS[H200_KEY].mem_bw_tbs / gpu.mem_bw_tbs


def seq_time(cal: Calibration, gpu: GPUSpec, seq: int, batch: int = 1, steps: int = 7, loss_fraction=1.0) -> dict:
    """One micro-batch [batch, seq] forward + backward on one GPU:
    t = F / (R_meas x bf16(gpu)/bf16(H200)) + rest_per_token x tokens x bw(H200)/bw(gpu)."""
    h200 = GPUS[H200_KEY]
    flops = draft_step_flops(seq, batch, steps, loss_fraction)["total"]
    rate = cal.matmul_tflops * 1e12 * gpu.bf16_dense_tflops / h200.bf16_dense_tflops
    t_mm = flops / rate
    t_rest = cal.rest_s_per_token * batch * seq * h200.mem_bw_tbs / gpu.mem_bw_tbs
    return {"flops": flops, "rate": rate, "t_matmul": t_mm, "t_rest": t_rest, "t": t_mm + t_rest}


def allreduce_s(nbytes: float, gpus: int, busbw_gbps: float) -> float:
    """Ring all-reduce: 2 (n-1)/n x bytes / link bandwidth (busbw already includes that factor's
    normalisation: time = bytes x 2(n-1)/n / busbw)."""
    return 0.0 if gpus <= 1 else 2 * (gpus - 1) / gpus * nbytes / (busbw_gbps * 1e9)


def optimizer_step_time(cal: Calibration, gpu: GPUSpec, t_seq: float, micro: int, gpus: int, busbw_gbps: float):
    """micro-batches x t_seq + optimizer + the fp32 gradient all-reduce not hidden under the
    last micro-batch's backward (DDP overlaps its buckets with the backward)."""
    grad_bytes = 4 * K25_DRAFT.trainable_params
    t_ar = allreduce_s(grad_bytes, gpus, busbw_gbps)
    bwd = cal.backward_s / (cal.step_s - cal.optimizer_s) * t_seq
    exposed = max(0.0, t_ar - bwd)
    t_opt = optimizer_time(cal, gpu)
    return {
        "grad_bytes": grad_bytes,
        "t_allreduce": t_ar,
        "t_exposed": exposed,
        "t_optimizer": t_opt,
        "t": micro * t_seq + t_opt + exposed,
    }


def trainer_memory_gb(cal: Calibration, seq: int, batch: int, gpus: int) -> dict:
    """static = 18 B/param (fp32 weights 4 + grads 4 + AdamW 8 + bf16 autocast copies 2) + the
    frozen bf16 embedding and verifier rows; activations per token from the measured peak."""
    d = K25_DRAFT
    states = 18 * d.trainable_params
    frozen = 2 * d.target_vocab * d.hidden + 2 * d.draft_vocab * d.target_hidden
    act_per_token = max(cal.peak_mem_gib * 2**30 - states - frozen, 0.0) / cal.tokens
    act = act_per_token * seq * batch
    return {
        "states": states / 1e9,
        "frozen": frozen / 1e9,
        "act_per_token_mb": act_per_token / 1e6,
        "act": act / 1e9,
        "replicated": (states + frozen + act) / 1e9,
        "sharded": (states / gpus + frozen + act) / 1e9,
    }


@dataclass
class PlanInputs:
    samples: int = 600_000
    mean_tokens: float = 1200
    gpus: int = 8
    epochs: float = 1.0
    seq: int = 2048
    global_batch: int = 16
    ttt_steps: int = 7
    loss_fraction: float = 1.0
    prefill_efficiency: float = ASSUMED_PREFILL_EFFICIENCY
    prefill_source: str = "ASSUMED"  # or MEASURED (...) / GIVEN (--prefill-efficiency)
    target_gb: float = K25.target_gb
    engine_reserve_gb: float = 6.0
    extract_parallel: str = "tp"  # "tp": tensor parallel over all GPUs (all-reduces); "pp": pipeline stages
    usable_mem_fraction: float = 0.92
    disk_write_gbps: float = 5.0  # ASSUMED sequential write of the shard storage (a few NVMe drives striped)
    disk_read_gbps: float = 10.0  # ASSUMED read of the same
    extract_batch: int = 8  # samples per shard (`train extract --batch-size`)
    shuffle_window: int = 64  # shards per shuffle window (streaming)
    spool_gb: float = 2000.0  # the streaming spool's budget (`--spool-bytes`)


def plan(inp: PlanInputs, gpu: GPUSpec, cal: Calibration) -> dict:
    if inp.global_batch % inp.gpus:
        raise PlanError(f"--global-batch {inp.global_batch} is not a multiple of --gpus {inp.gpus}")
    n = inp.gpus
    tokens = inp.samples * inp.mean_tokens
    # extraction: prefill compute + tensor-parallel all-reduces (2 per layer, bf16 hidden)
    f_tok = prefill_flops_per_token(inp.mean_tokens)
    t_ext_compute = tokens * f_tok / (n * gpu.bf16_dense_tflops * 1e12 * inp.prefill_efficiency)
    if inp.extract_parallel == "tp":  # 2 all-reduces of the bf16 hidden state per layer, not overlapped
        comm_bytes_per_token = K25.layers * 2 * K25.hidden * 2
        t_ext_comm = allreduce_s(tokens * comm_bytes_per_token, n, gpu.allreduce_gbps)
    elif inp.extract_parallel == "pp":  # one bf16 hidden state per stage boundary, boundaries in parallel
        comm_bytes_per_token = K25.hidden * 2
        t_ext_comm = 0.0 if n == 1 else tokens * comm_bytes_per_token / (gpu.allreduce_gbps * 1e9)
    else:
        raise PlanError(f"--extract-parallel must be tp or pp, not {inp.extract_parallel!r}")
    t_ext = t_ext_compute + t_ext_comm
    storage_tb = tokens * K25.bytes_per_token_offline / 1e12
    # training
    st = seq_time(cal, gpu, inp.seq, 1, inp.ttt_steps, inp.loss_fraction)
    micro = inp.global_batch // n
    ost = optimizer_step_time(cal, gpu, st["t"], micro, n, gpu.allreduce_gbps)
    sequences = tokens / inp.seq
    opt_steps = math.ceil(sequences * inp.epochs / inp.global_batch)
    t_train = opt_steps * ost["t"]
    # memory
    mem = trainer_memory_gb(cal, inp.seq, 1, n)
    usable = gpu.mem_gb * inp.usable_mem_fraction
    target_per_gpu = inp.target_gb / n
    free_online = usable - target_per_gpu - inp.engine_reserve_gb
    # I/O, not overlapped with compute (the pipeline writes, hashes and reads in its loops)
    data_bytes = tokens * K25.bytes_per_token_offline
    rd, wr = inp.disk_read_gbps * 1e9, inp.disk_write_gbps * 1e9
    io = {
        "data_bytes": data_bytes,
        "t_write": data_bytes / wr,  # extraction writes each shard
        "t_hash": data_bytes / rd,  # ... and reads it back for its sha256 (conservative: may hit the page cache)
        "t_verify": data_bytes / rd,  # training checks each shard's sha256 once
        "t_read_epoch": data_bytes / rd,  # training reads each sample's own bytes once per epoch
    }
    passes = math.ceil(inp.epochs)
    t_ext_io = t_ext + io["t_write"] + io["t_hash"]  # one extraction pass with its I/O
    t_train_io = t_train + io["t_verify"] + inp.epochs * io["t_read_epoch"]
    offline_s = t_ext_io + t_train_io
    # streaming: each epoch re-extracts (new shards, each verified once); disk = the spool
    shard_bytes = inp.extract_batch * inp.mean_tokens * K25.bytes_per_token_offline
    min_spool = (2 * inp.shuffle_window + 1) * shard_bytes  # two windows + the shard being written
    spool_bytes = max(inp.spool_gb * 1e9, min_spool)
    s_ext = passes * t_ext_io
    s_train = t_train + passes * io["t_verify"] + inp.epochs * io["t_read_epoch"]
    together = mem["replicated"] <= free_online  # the trainer is DDP (replicated states): no sharding
    one_host = s_ext + s_train  # the halves share the GPUs: no overlap assumed
    two_hosts = max(s_ext, s_train)  # extraction here, training on a second such machine

    def verdict(seconds: float) -> str:
        return "hours" if seconds / 3600 < HOURS_VS_DAYS_H else "days"

    modes = {
        "offline": {"t": offline_s, "disk_bytes": data_bytes, "verdict": verdict(offline_s)},
        "streaming_one_host": (
            {"t": one_host, "disk_bytes": spool_bytes, "verdict": verdict(one_host)}
            if together
            else {
                "t": None,
                "disk_bytes": spool_bytes,
                "verdict": None,
                "why_not": "target + trainer do not fit the GPUs together",
            }
        ),
        "streaming_two_hosts": {"t": two_hosts, "disk_bytes": spool_bytes, "verdict": verdict(two_hosts)},
        "online": {"verdict": None, "why_not": "not implemented"},
    }
    total_h = offline_s / 3600
    return {
        "gpu": gpu,
        "gpus": n,
        "tokens": tokens,
        "extraction": {
            "flops_per_token": f_tok,
            "t_compute": t_ext_compute,
            "parallel": inp.extract_parallel,
            "comm_bytes_per_token": comm_bytes_per_token,
            "t_comm": t_ext_comm,
            "t": t_ext,
        },
        "storage_tb": storage_tb,
        "memory": {
            **mem,
            "usable_per_gpu": usable,
            "target_per_gpu": target_per_gpu,
            "free_online": free_online,
            "trainer_fits": mem["replicated"] <= usable,
            "online_replicated": mem["replicated"] <= free_online,
            "online_sharded": mem["sharded"] <= free_online,
            "target_fits": target_per_gpu + inp.engine_reserve_gb <= usable,
        },
        "seq": st,
        "step": {**ost, "micro": micro},
        "training": {"sequences": sequences, "opt_steps": opt_steps, "t": t_train},
        "io": io,
        "streaming": {
            "passes": passes,
            "shard_bytes": shard_bytes,
            "min_spool_bytes": min_spool,
            "spool_bytes": spool_bytes,
            "t_extract": s_ext,
            "t_train": s_train,
        },
        "modes": modes,
        "total_h": total_h,  # offline, the default mode
        "verdict": modes["offline"]["verdict"],
    }


# ----------------------------------------------------------------------------- output


def _h(seconds: float) -> str:
    h = seconds / 3600
    return f"{h:.1f} h" if h < 48 else f"{h:.1f} h ({h / 24:.1f} days)"


def render_text(inp: PlanInputs, cal: Calibration, results: list[dict]) -> str:
    L = [
        f"Hero-run plan: {inp.samples:,} samples x {inp.mean_tokens:,.0f} mean tokens = {results[0]['tokens']:.4g} "
        f"tokens, {inp.epochs:g} epoch(s); seq {inp.seq}, global batch {inp.global_batch} sequences, "
        f"{inp.ttt_steps} TTT steps, loss on {inp.loss_fraction:.0%} of tokens",
        f"Measured: {cal.gpu}, {cal.date} UTC ({cal.path}): [{cal.batch} x {cal.seq}] step {cal.step_s * 1e3:.1f} ms, "
        f"{cal.flops_per_step / 1e12:.1f} TFLOP model work, matmul {cal.matmul_tflops:.0f} TFLOP/s measured "
        f"(MFU {cal.mfu:.1%}); rest of step {cal.rest_s_per_token * 1e6:.2f} us/token",
    ]
    for r in results:
        g, e, m, s, st, tr = r["gpu"], r["extraction"], r["memory"], r["seq"], r["step"], r["training"]
        io, sm, one, two = r["io"], r["streaming"], r["modes"]["streaming_one_host"], r["modes"]["streaming_two_hosts"]
        n = r["gpus"]
        L += [
            "",
            f"== {n} x {g.name} ==",
            f"  specs: bf16 dense {g.bf16_dense_tflops:g} TFLOP/s, memory {g.mem_bw_tbs:g} TB/s, {g.mem_gb:g} GB, "
            f"all-reduce busbw {g.allreduce_gbps:g} GB/s ({g.interconnect})",
            f"  extraction  {_h(e['t'])} = compute {r['tokens']:.4g} tok x {e['flops_per_token'] / 1e9:.1f} GFLOP/tok "
            f"/ ({n} x {g.bf16_dense_tflops:g} TFLOP/s x {inp.prefill_efficiency:.0%} prefill efficiency, "
            f"{inp.prefill_source}) "
            f"[{_h(e['t_compute'])}] + "
            + (
                f"TP all-reduce {r['tokens']:.4g} tok x {e['comm_bytes_per_token']:,} B x 2({n}-1)/{n} "
                if e["parallel"] == "tp"
                else f"PP hand-over {r['tokens']:.4g} tok x {e['comm_bytes_per_token']:,} B "
            )
            + f"/ {g.allreduce_gbps:g} GB/s [{_h(e['t_comm'])}]",
            f"  storage     {r['storage_tb']:.1f} TB for offline mode = {r['tokens']:.4g} tok x "
            f"{K25.bytes_per_token_offline:,} B (3 aux + final states, bf16)",
            f"  memory      trainer {m['replicated']:.1f} GB/GPU replicated (DDP) or {m['sharded']:.1f} GB sharded "
            f"(= states {m['states']:.1f} [/ {n}] + frozen {m['frozen']:.1f} + activations {m['act']:.1f}); "
            f"target {inp.target_gb:g} GB / {n} = {m['target_per_gpu']:.1f} GB/GPU + {inp.engine_reserve_gb:g} GB "
            f"engine reserve, of {m['usable_per_gpu']:.1f} usable -> {m['free_online']:.1f} GB left beside the target",
            "              -> "
            + (
                "target + trainer fit together (streaming on one host is possible)"
                if m["online_replicated"]
                else (
                    "target + trainer fit together only with sharded optimizer states, which the trainer "
                    "does not do (DDP): stream across two hosts or run offline"
                    if m["online_sharded"]
                    else "target + trainer do NOT fit together: offline, or streaming across two hosts"
                )
            )
            + ("" if m["trainer_fits"] else "; trainer alone does NOT fit one GPU at this seq"),
            f"  training    {_h(tr['t'])} = {tr['opt_steps']:,} optimizer steps x {st['t']:.3f} s; step = "
            f"{st['micro']} micro-batch(es) x {s['t']:.3f} s + optimizer {st['t_optimizer']:.3f} s "
            f"({cal.optimizer_s * 1e3:.1f} ms measured x {GPUS[H200_KEY].mem_bw_tbs:g}/{g.mem_bw_tbs:g} TB/s) "
            f"+ exposed all-reduce {st['t_exposed']:.3f} s "
            f"(fp32 grads {st['grad_bytes'] / 1e9:.2f} GB: {st['t_allreduce']:.3f} s, overlapped with the backward)",
            f"              micro-batch {s['t']:.3f} s = {s['flops'] / 1e12:.1f} TFLOP / ({cal.matmul_tflops:.0f} "
            f"TFLOP/s measured x {g.bf16_dense_tflops:g}/{GPUS[H200_KEY].bf16_dense_tflops:g} bf16 dense) "
            f"[{s['t_matmul']:.3f} s] + rest {cal.rest_s_per_token * 1e6:.2f} us/tok x {inp.seq} x "
            f"{GPUS[H200_KEY].mem_bw_tbs:g}/{g.mem_bw_tbs:g} TB/s [{s['t_rest']:.3f} s]",
            f"  I/O         ASSUMED disk {inp.disk_write_gbps:g} GB/s write, {inp.disk_read_gbps:g} GB/s read, "
            f"not overlapped: extraction writes {io['data_bytes'] / 1e12:.1f} TB [{_h(io['t_write'])}] and reads it "
            f"back for sha256 [{_h(io['t_hash'])}]; training verifies each shard once [{_h(io['t_verify'])}] and "
            f"reads each sample once per epoch [{_h(io['t_read_epoch'])}/epoch]",
            f"  offline     {_h(r['modes']['offline']['t'])} = extraction + its I/O + training + its I/O; disk "
            f"{io['data_bytes'] / 1e12:.1f} TB (multi-epoch keeps the shards: more reads, no more disk) "
            f"-> {r['modes']['offline']['verdict'].upper()}",
            f"  streaming   spool {sm['spool_bytes'] / 1e12:.2f} TB "
            f"(>= {sm['min_spool_bytes'] / 1e9:.0f} GB: 2 windows of "
            f"{inp.shuffle_window} shards x {sm['shard_bytes'] / 1e9:.2f} GB + 1); {sm['passes']} extraction pass(es) "
            f"(multi-epoch re-extracts: extraction time x epochs, disk stays the spool) [{_h(sm['t_extract'])}], "
            f"training + I/O [{_h(sm['t_train'])}]",
            "              one host: "
            + (
                f"{_h(one['t'])} (the halves share the GPUs: sum) -> {one['verdict'].upper()}"
                if one["verdict"]
                else f"no verdict: {one['why_not']}"
            )
            + f"; two hosts sharing the spool: {_h(two['t'])} (the slower half) -> {two['verdict'].upper()}",
            "  online      no verdict: not implemented "
            "(the trainer reads shards; nothing feeds it from a serving engine)",
        ]
    return "\n".join(L)


def render_markdown(inp: PlanInputs, cal: Calibration, results: list[dict]) -> str:
    rows = [
        "| machine | extraction | training | I/O | offline: disk, total | streaming, one host | "
        "streaming, two hosts | online |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        io, md = r["io"], r["modes"]
        off, one, two = md["offline"], md["streaming_one_host"], md["streaming_two_hosts"]
        spool_tb = md["streaming_two_hosts"]["disk_bytes"] / 1e12
        io_h = (io["t_write"] + io["t_hash"] + io["t_verify"] + inp.epochs * io["t_read_epoch"]) / 3600
        one_txt = f"{one['t'] / 3600:.1f} h, **{one['verdict']}**" if one["verdict"] else f"- ({one['why_not']})"
        rows.append(
            f"| {r['gpus']}x {r['gpu'].name} | {r['extraction']['t'] / 3600:.1f} h | {r['training']['t'] / 3600:.1f} h"
            f" | {io_h:.1f} h | {off['disk_bytes'] / 1e12:.0f} TB, {off['t'] / 3600:.1f} h, **{off['verdict']}** | "
            f"{one_txt} | {two['t'] / 3600:.1f} h, **{two['verdict']}** ({spool_tb:g} TB spool) | not implemented |"
        )
    return "\n".join(rows)


def _json_default(o):
    if isinstance(o, GPUSpec):
        return asdict(o)
    raise TypeError(type(o))


# ----------------------------------------------------------------------------- CLI


def _pos_int(flag):
    def conv(s):
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be a positive integer, got {s!r}") from None
        if v <= 0:
            raise argparse.ArgumentTypeError(f"{flag} must be a positive integer, got {s!r}")
        return v

    return conv


def _pos_float(flag, upper=None):
    def conv(s):
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be a positive number, got {s!r}") from None
        if not (v > 0 and math.isfinite(v)) or (upper is not None and v > upper):
            rng = f"in (0, {upper:g}]" if upper is not None else "positive"
            raise argparse.ArgumentTypeError(f"{flag} must be {rng}, got {s!r}")
        return v

    return conv


SPEC_FLAGS = {
    "bf16_tflops": "bf16_dense_tflops",
    "mem_bw_tbs": "mem_bw_tbs",
    "mem_gb": "mem_gb",
    "interconnect_gbps": "allreduce_gbps",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = PlanInputs()
    p.add_argument("--samples", type=_pos_int("--samples"), default=d.samples, help="training samples")
    p.add_argument("--mean-tokens", type=_pos_float("--mean-tokens"), default=d.mean_tokens, help="tokens/sample")
    p.add_argument(
        "--hardware",
        default="all",
        choices=[*GPUS, "custom", "all"],
        help="a preset, 'custom' (give the four spec flags), or 'all' presets",
    )
    p.add_argument("--gpus", type=_pos_int("--gpus"), default=d.gpus, help="GPUs in the machine")
    p.add_argument("--epochs", type=_pos_float("--epochs"), default=d.epochs)
    p.add_argument("--seq", type=_pos_int("--seq"), default=d.seq, help="training sequence length (packed)")
    p.add_argument("--global-batch", type=_pos_int("--global-batch"), default=d.global_batch, help="sequences/step")
    p.add_argument("--ttt-steps", type=_pos_int("--ttt-steps"), default=d.ttt_steps)
    p.add_argument("--loss-fraction", type=_pos_float("--loss-fraction", 1.0), default=d.loss_fraction)
    p.add_argument(
        "--prefill-efficiency",
        type=_pos_float("--prefill-efficiency", 1.0),
        help="fraction of bf16 dense peak the target's prefill reaches during extraction (default: from the "
        f"prefill measurement, else {ASSUMED_PREFILL_EFFICIENCY * 100:.0f}%% ASSUMED)",  # %%: argparse formats help
    )
    p.add_argument("--prefill-calibration", help=f"prefill results JSON (default {DEFAULT_PREFILL}, if present)")
    p.add_argument("--target-gb", type=_pos_float("--target-gb"), default=d.target_gb, help="target weights, GB")
    p.add_argument("--engine-reserve-gb", type=_pos_float("--engine-reserve-gb"), default=d.engine_reserve_gb)
    p.add_argument(
        "--extract-parallel",
        choices=["tp", "pp"],
        default=d.extract_parallel,
        help="target layout during extraction: tensor parallel (all-reduces per layer) or pipeline stages",
    )
    p.add_argument(
        "--disk-write-gbps",
        type=_pos_float("--disk-write-gbps"),
        default=d.disk_write_gbps,
        help="ASSUMED write bandwidth of the shard storage, GB/s",
    )
    p.add_argument(
        "--disk-read-gbps",
        type=_pos_float("--disk-read-gbps"),
        default=d.disk_read_gbps,
        help="ASSUMED read bandwidth of the shard storage, GB/s",
    )
    p.add_argument(
        "--extract-batch",
        type=_pos_int("--extract-batch"),
        default=d.extract_batch,
        help="samples per shard (train extract --batch-size)",
    )
    p.add_argument(
        "--shuffle-window",
        type=_pos_int("--shuffle-window"),
        default=d.shuffle_window,
        help="streaming: shards per shuffle window",
    )
    p.add_argument(
        "--spool-gb",
        type=_pos_float("--spool-gb"),
        default=d.spool_gb,
        help="streaming: spool budget, GB (raised to the minimum the window needs)",
    )
    p.add_argument("--bf16-tflops", type=_pos_float("--bf16-tflops"), help="custom/override: bf16 dense TFLOP/s")
    p.add_argument("--mem-bw-tbs", type=_pos_float("--mem-bw-tbs"), help="custom/override: memory TB/s")
    p.add_argument("--mem-gb", type=_pos_float("--mem-gb"), help="custom/override: memory per GPU, GB")
    p.add_argument(
        "--interconnect-gbps", type=_pos_float("--interconnect-gbps"), help="custom/override: all-reduce busbw GB/s"
    )
    p.add_argument("--calibration", help=f"measured results JSON (default {DEFAULT_CALIBRATION})")
    p.add_argument("--format", default="text", choices=["text", "markdown", "json"])
    p.add_argument("--json", dest="format", action="store_const", const="json", help="same as --format json")
    p.add_argument(
        "--predict-step",
        action="store_true",
        help="only predict one GPU's training step for --seq/--batch (the planner check)",
    )
    p.add_argument("--batch", type=_pos_int("--batch"), default=1, help="with --predict-step: sequences per GPU")


def _gpus_from_args(a) -> list[GPUSpec]:
    overrides = {field: getattr(a, flag) for flag, field in SPEC_FLAGS.items() if getattr(a, flag) is not None}
    if a.hardware == "custom":
        missing = [f"--{flag.replace('_', '-')}" for flag in SPEC_FLAGS if getattr(a, flag) is None]
        if missing:
            raise PlanError(f"--hardware custom needs {', '.join(missing)}")
        return [GPUSpec("custom", "custom GPU", source="command line", interconnect="custom", **overrides)]
    keys = list(GPUS) if a.hardware == "all" else [a.hardware]
    return [replace(GPUS[k], **overrides) for k in keys]


def _prefill(a) -> dict:
    if a.prefill_efficiency is not None:
        return {"prefill_efficiency": a.prefill_efficiency, "prefill_source": "GIVEN (--prefill-efficiency)"}
    eff, label = load_prefill_calibration(a.prefill_calibration)
    return {"prefill_efficiency": eff, "prefill_source": label}


def run_plan(a) -> str:
    """What ``vllm-k2 train plan`` prints, for parsed arguments."""
    cal = load_calibration(a.calibration)
    gpus = _gpus_from_args(a)
    if a.predict_step:
        out = []
        for g in gpus:
            s = seq_time(cal, g, a.seq, a.batch, a.ttt_steps, a.loss_fraction)
            t_opt = optimizer_time(cal, g)
            t = s["t"] + t_opt
            out.append(
                f"{g.name}: [{a.batch} x {a.seq}] step {t * 1e3:.1f} ms = {s['flops'] / 1e12:.2f} TFLOP / "
                f"{s['rate'] / 1e12:.0f} TFLOP/s [{s['t_matmul'] * 1e3:.1f} ms] + rest "
                f"{cal.rest_s_per_token * 1e6:.2f} us/tok x {a.batch * a.seq} tok x "
                f"{GPUS[H200_KEY].mem_bw_tbs:g}/{g.mem_bw_tbs:g} [{s['t_rest'] * 1e3:.1f} ms] + optimizer "
                f"[{t_opt * 1e3:.1f} ms] -> {a.batch * a.seq / t:.0f} tok/s/GPU "
                f"(calibration: {cal.path}, {cal.date})"
            )
        return "\n".join(out)
    inp = PlanInputs(
        samples=a.samples,
        mean_tokens=a.mean_tokens,
        gpus=a.gpus,
        epochs=a.epochs,
        seq=a.seq,
        global_batch=a.global_batch,
        ttt_steps=a.ttt_steps,
        loss_fraction=a.loss_fraction,
        **_prefill(a),
        target_gb=a.target_gb,
        engine_reserve_gb=a.engine_reserve_gb,
        extract_parallel=a.extract_parallel,
        disk_write_gbps=a.disk_write_gbps,
        disk_read_gbps=a.disk_read_gbps,
        extract_batch=a.extract_batch,
        shuffle_window=a.shuffle_window,
        spool_gb=a.spool_gb,
    )
    results = [plan(inp, g, cal) for g in gpus]
    if a.format == "json":
        return json.dumps({"inputs": asdict(inp), "calibration": asdict(cal), "plans": results}, default=_json_default)
    if a.format == "markdown":
        return render_markdown(inp, cal, results)
    return render_text(inp, cal, results)


def cmd_plan(a) -> int:
    try:
        print(run_plan(a))
    except PlanError as e:
        print(f"vllm-k2 train plan: error: {e}", file=sys.stderr)
        return 2
    return 0


def register_cli(subparsers) -> argparse.ArgumentParser:
    """Add ``plan`` to a ``vllm-k2 train`` subparsers object; dispatch with ``args.func(args)``."""
    p = subparsers.add_parser(
        "plan",
        help="hours or days: extraction, storage, memory and training time of a hero run",
        description=__doc__.split("\n\n")[0],
    )
    add_arguments(p)
    p.set_defaults(func=cmd_plan)
    return p


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="vllm-k2 train")
    sub = ap.add_subparsers(dest="verb", required=True)
    register_cli(sub)
    a = ap.parse_args(["plan", *(sys.argv[1:] if argv is None else argv)])
    return a.func(a)


if __name__ == "__main__":
    sys.exit(main())
