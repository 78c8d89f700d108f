"""``vllm-k2 train plan``: arithmetic against hand-computed values, CLI output, bad inputs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from vllm_k2_tools.train import plan as P
from vllm_k2_tools.train.hardware import GPUS, K25_DRAFT

pytestmark = pytest.mark.vllm_independent

# Hand-derived for the K2.5 draft (H=7168, 3 aux, 64x128 heads, I=18432, V=32000), T=2048, B=1, 7 TTT steps,
# loss on every position: step k trains on 2046-k positions, sum = 7*2046-21 = 14301.
P_LAYER = 2 * 7168 * 192 * 128 + 64 * 128 * 7168 + 3 * 7168 * 18432  # 807,403,520
HAND = {
    "fc": 4 * 2048 * 3 * 7168 * 7168,
    "layer": 7 * 6 * 2048 * P_LAYER,
    "attention": 12 * 64 * 128 * (7 * 2048 * 2049 / 2 + 21 * 2048),
    "lm_head": 6 * 14301 * 7168 * 32000,
    "verifier": 2 * 14301 * 7168 * 32000,
}
HAND_TOTAL = sum(HAND.values())  # ~9.84e13, i.e. 48.0 GFLOP/token


def write_cal(tmp_path, **over):
    single = {
        "seq": 2048,
        "batch": 1,
        "ttt_steps": 7,
        "step_s": 0.25,
        "backward_s": 0.15,
        "optimizer_s": 0.05,
        "model_flops_per_step": 1.0e14,
        "peak_mem_gib": 40.0,
    }
    single.update(over)
    doc = {
        "calibration_run": "cal",
        "ddp_run": "ddp",
        "runs": {
            "cal": {
                "date_utc": "2026-11-30 01:30",
                "gpu": "NVIDIA H200",
                "matmul_bf16_tflops_measured": 800.0,
                "copy_gbps_measured": 4300.0,
                "single": single,
            },
            "ddp": {"allreduce_busbw_gbps": 300.0, "ddp": {"world": 2, "step_s_slowest_rank": 0.26}},
        },
    }
    p = tmp_path / "cal.json"
    p.write_text(json.dumps(doc))
    return p


def test_flops_match_hand_count():
    got = P.draft_step_flops(2048, 1, 7, 1.0)
    assert P_LAYER == 807_403_520 and got["matmul_params_per_layer"] == P_LAYER
    for k, v in HAND.items():
        assert got[k] == pytest.approx(v, rel=1e-12), k
    assert got["total"] == pytest.approx(HAND_TOTAL, rel=1e-12)
    assert got["total"] / 2048 / 1e9 == pytest.approx(48.05, abs=0.01)


def test_draft_dims_match_draft_config():
    torch = pytest.importorskip("torch")
    from vllm_k2_tools.train.draft_model import DraftConfig, Eagle3Draft

    cfg = DraftConfig.kimi_k25(draft_vocab_size=32000)
    d = K25_DRAFT
    assert (cfg.hidden_size, cfg.target_hidden_size, cfg.num_aux, cfg.num_attention_heads) == (
        d.hidden,
        d.target_hidden,
        d.num_aux,
        d.heads,
    )
    assert (cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size) == (d.kv_heads, d.head_dim, d.intermediate)
    assert (cfg.draft_vocab_size, cfg.vocab_size) == (d.draft_vocab, d.target_vocab)
    with torch.device("meta"):
        m = Eagle3Draft(
            cfg,
            torch.empty(cfg.vocab_size, cfg.hidden_size),
            torch.zeros(cfg.draft_vocab_size, dtype=torch.long),
            torch.zeros(cfg.vocab_size, dtype=torch.bool),
        )
    assert sum(p.numel() for p in m.parameters()) == d.trainable_params == 1_190_948_864


def test_prefill_and_extraction_hand_values(tmp_path):
    cal = P.load_calibration(write_cal(tmp_path))
    gpu = P.GPUSpec("x", "X", 494.5, 2.4, 80, 10.0, "test", "test")
    assert P.prefill_flops_per_token(1000) == pytest.approx(64e9 + 2 * 61 * 64 * 320 * 500)
    inp = P.PlanInputs(samples=1000, mean_tokens=1000, gpus=2, global_batch=4, prefill_efficiency=0.5)
    r = P.plan(inp, gpu, cal)
    assert r["tokens"] == 1e6
    assert r["extraction"]["t_compute"] == pytest.approx(1e6 * 65.24928e9 / (2 * 494.5e12 * 0.5))
    assert r["extraction"]["comm_bytes_per_token"] == 61 * 2 * 7168 * 2 == 1_748_992
    assert r["extraction"]["t_comm"] == pytest.approx(1e6 * 1_748_992 * (2 * 1 / 2) / 10e9)  # 174.9 s
    assert r["storage_tb"] == pytest.approx(1e6 * 57_344 / 1e12)
    pp = P.plan(P.PlanInputs(**{**inp.__dict__, "extract_parallel": "pp"}), gpu, cal)
    assert pp["extraction"]["t_comm"] == pytest.approx(1e6 * 7168 * 2 / 10e9)  # one hand-over per boundary


def test_training_time_hand_values(tmp_path):
    cal = P.load_calibration(write_cal(tmp_path))
    assert cal.matmul_s == pytest.approx(1e14 / 800e12)  # 0.125 s
    assert cal.rest_s_per_token == pytest.approx((0.25 - 0.05 - 0.125) / 2048)
    assert cal.mfu == pytest.approx(0.5)
    # half the H200's bf16 dense rate and half its bandwidth
    gpu = P.GPUSpec("x", "X", 989.0 / 2, 4.8 / 2, 80, 10.0, "test", "test")
    t_seq = HAND_TOTAL / (800e12 / 2) + 0.075 * 2  # matmul part at half rate + rest at half bandwidth
    s = P.seq_time(cal, gpu, 2048)
    assert s["t"] == pytest.approx(t_seq, rel=1e-9)
    inp = P.PlanInputs(samples=1000, mean_tokens=2048, gpus=2, global_batch=4, epochs=2)
    r = P.plan(inp, gpu, cal)
    grad_bytes = 4 * 1_190_948_864
    t_ar = 2 * 1 / 2 * grad_bytes / 10e9
    exposed = max(0.0, t_ar - 0.15 / 0.2 * t_seq)  # backward share of the measured forward + backward
    t_opt = 0.05 * 2  # optimizer is memory-bound: half the bandwidth
    assert r["step"]["t_allreduce"] == pytest.approx(t_ar)
    assert r["step"]["t"] == pytest.approx(2 * t_seq + t_opt + exposed)
    assert r["training"]["opt_steps"] == 500  # 1000 sequences x 2 epochs / 4
    assert r["training"]["t"] == pytest.approx(500 * (2 * t_seq + t_opt + exposed))
    io = r["io"]  # offline: extraction + training, each with its I/O (default ASSUMED 5 GB/s write, 10 read)
    data = 1000 * 2048 * 57_344
    assert (io["t_write"], io["t_hash"], io["t_verify"], io["t_read_epoch"]) == pytest.approx(
        (data / 5e9, data / 10e9, data / 10e9, data / 10e9)
    )
    total_h = (r["extraction"]["t"] + r["training"]["t"] + data / 5e9 + data / 10e9 * (1 + 1 + 2)) / 3600
    assert r["total_h"] == pytest.approx(total_h)
    assert r["verdict"] == ("hours" if total_h < 24 else "days")


def test_io_and_modes_hand_values(tmp_path):
    cal = P.load_calibration(write_cal(tmp_path))
    gpu = P.GPUSpec("x", "X", 494.5, 2.4, 80, 10.0, "test", "test")
    inp = P.PlanInputs(
        samples=1000,
        mean_tokens=1000,
        gpus=2,
        global_batch=4,
        epochs=2,
        disk_write_gbps=2,
        disk_read_gbps=4,
        extract_batch=10,
        shuffle_window=3,
        spool_gb=0.001,
    )
    r = P.plan(inp, gpu, cal)
    data = 1e6 * 57_344
    ext, train = r["extraction"]["t"], r["training"]["t"]
    w, rd = data / 2e9, data / 4e9
    off = r["modes"]["offline"]  # extract once (write + sha256 read-back), verify once, read twice
    assert off["t"] == pytest.approx(ext + w + rd + train + rd + 2 * rd) and off["disk_bytes"] == pytest.approx(data)
    shard = 10 * 1000 * 57_344
    st = r["streaming"]  # each epoch re-extracts; the spool holds 2 windows + 1 shard at least
    assert st["min_spool_bytes"] == pytest.approx(7 * shard) and st["spool_bytes"] == pytest.approx(7 * shard)
    assert st["t_extract"] == pytest.approx(2 * (ext + w + rd))
    assert st["t_train"] == pytest.approx(train + 2 * rd + 2 * rd)
    two = r["modes"]["streaming_two_hosts"]
    assert two["t"] == pytest.approx(max(st["t_extract"], st["t_train"])) and two["disk_bytes"] == st["spool_bytes"]
    one = r["modes"]["streaming_one_host"]  # 595 GB of target on 2 x 80 GB: no room for the trainer
    assert one["verdict"] is None and "do not fit" in one["why_not"]
    assert r["modes"]["online"] == {"verdict": None, "why_not": "not implemented"}
    b200 = P.plan(P.PlanInputs(), GPUS["b200"], cal)["modes"]
    s = P.plan(P.PlanInputs(), GPUS["b200"], cal)["streaming"]
    assert b200["streaming_one_host"]["t"] == pytest.approx(s["t_extract"] + s["t_train"])  # GPUs shared: a sum


def test_memory_hand_values(tmp_path):
    cal = P.load_calibration(write_cal(tmp_path))
    states = 18 * 1_190_948_864
    frozen = 2 * 163_840 * 7168 + 2 * 32_000 * 7168
    act_tok = (40 * 2**30 - states - frozen) / 2048
    m = P.trainer_memory_gb(cal, 4096, 1, 8)
    assert m["replicated"] == pytest.approx((states + frozen + 4096 * act_tok) / 1e9)
    assert m["sharded"] == pytest.approx((states / 8 + frozen + 4096 * act_tok) / 1e9)
    r = P.plan(P.PlanInputs(), GPUS["rtx-pro-6000"], cal)
    assert r["memory"]["target_per_gpu"] == pytest.approx(595 / 8)
    assert r["memory"]["free_online"] == pytest.approx(96 * 0.92 - 595 / 8 - 6)


def run_cli(capsys, *args):
    code = P.main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def write_prefill(tmp_path, **over):
    doc = {
        "seq": 1000,
        "ms_per_token_per_layer": 0.01,
        "gpu": "NVIDIA H200",
        "date": "2026-12-04T01:00:00+00:00",
        "command": "python benchmarks/prefill_throughput.py ...",
        **over,
    }
    p = tmp_path / "prefill.json"
    p.write_text(json.dumps(doc))
    return p


def test_measured_prefill_reproduces_the_measured_time(tmp_path):
    """8 H200s at the measured seq: extraction compute = tokens x 61 layers x the measured time
    per token per layer (the efficiency is only the planner's currency for it)."""
    cal = P.load_calibration(write_cal(tmp_path))
    eff, label = P.load_prefill_calibration(write_prefill(tmp_path))
    assert label.startswith("MEASURED (NVIDIA H200, 2026-12-04T01:00:00+00:00: 0.01 ms/token/layer at seq 1000")
    inp = P.PlanInputs(samples=1000, mean_tokens=1000, gpus=8, global_batch=16, prefill_efficiency=eff)
    r = P.plan(inp, GPUS["h200"], cal)
    assert r["extraction"]["t_compute"] == pytest.approx(1e6 * 61 * 0.01e-3)
    faster = P.GPUSpec("x", "X", 2 * GPUS["h200"].bf16_dense_tflops, 4.8, 141, 360.0, "test", "test")
    assert P.plan(inp, faster, cal)["extraction"]["t_compute"] == pytest.approx(1e6 * 61 * 0.01e-3 / 2)


def test_prefill_calibration_errors_name_the_file(tmp_path, monkeypatch):
    with pytest.raises(P.PlanError, match="prefill.json is not a prefill_throughput results file"):
        P.load_prefill_calibration(write_prefill(tmp_path, seq="long"))
    with pytest.raises(P.PlanError, match="ms_per_token_per_layer must be > 0"):
        P.load_prefill_calibration(write_prefill(tmp_path, ms_per_token_per_layer=0))
    with pytest.raises(P.PlanError, match="--prefill-calibration: no file at"):
        P.load_prefill_calibration(tmp_path / "missing.json")
    monkeypatch.setattr(P, "DEFAULT_PREFILL", tmp_path / "never-measured.json")
    assert P.load_prefill_calibration() == (
        0.30,
        f"ASSUMED (no prefill measurement at {tmp_path / 'never-measured.json'})",
    )


def test_cli_prefill_sources(tmp_path, capsys):
    cal = str(write_cal(tmp_path))
    code, out, _ = run_cli(
        capsys, "--hardware", "h200", "--calibration", cal, "--prefill-calibration", str(write_prefill(tmp_path))
    )
    assert code == 0 and "prefill efficiency, MEASURED (NVIDIA H200" in out
    code, out, _ = run_cli(capsys, "--hardware", "h200", "--calibration", cal, "--prefill-efficiency", "0.5")
    assert code == 0 and "50% prefill efficiency, GIVEN (--prefill-efficiency)" in out


def test_cli_text_output(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(P, "DEFAULT_PREFILL", tmp_path / "never-measured.json")
    code, out, _ = run_cli(capsys, "--hardware", "rtx-pro-6000", "--calibration", str(write_cal(tmp_path)))
    assert code == 0
    for s in (
        "8 x NVIDIA RTX PRO 6000",
        "extraction",
        "57,344 B",
        "503.8 TFLOP/s",
        "30% prefill efficiency, ASSUMED",
        "verdict:",
    ):
        assert s in out, s
    assert "2026-11-30 01:30" in out and "cal.json" in out  # measured inputs carry date and source
    assert "ASSUMED disk 5 GB/s write, 10 GB/s read" in out and "online      no verdict: not implemented" in out
    assert "one host: no verdict" in out  # 96 GB cards: the target leaves no room for the trainer


def test_cli_all_markdown_and_json(tmp_path, capsys):
    cal = str(write_cal(tmp_path))
    code, out, _ = run_cli(capsys, "--format", "markdown", "--calibration", cal)
    assert code == 0 and out.count("\n| ") == len(GPUS) + 1
    code, out, _ = run_cli(capsys, "--format", "json", "--hardware", "b300", "--calibration", cal)
    doc = json.loads(out)
    assert doc["plans"][0]["gpu"]["key"] == "b300" and doc["plans"][0]["verdict"] in ("hours", "days")


def test_cli_custom_and_predict_step(tmp_path, capsys):
    cal = str(write_cal(tmp_path))
    code, out, _ = run_cli(
        capsys,
        *("--hardware", "custom", "--bf16-tflops", "494.5", "--mem-bw-tbs", "2.4", "--mem-gb", "80"),
        *("--interconnect-gbps", "10", "--gpus", "2", "--global-batch", "4", "--calibration", cal),
    )
    assert code == 0 and "2 x custom GPU" in out
    code, out, _ = run_cli(capsys, "--predict-step", "--hardware", "h200", "--seq", "2048", "--calibration", cal)
    ms = (HAND_TOTAL / 800e12 + 0.075 + 0.05) * 1e3  # analytic FLOPs at the measured rate + rest + optimizer
    assert code == 0 and f"step {ms:.1f} ms" in out


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--samples", "-5"], "--samples"),
        (["--samples", "many"], "--samples"),
        (["--mean-tokens", "0"], "--mean-tokens"),
        (["--loss-fraction", "1.5"], "--loss-fraction"),
        (["--prefill-efficiency", "nan"], "--prefill-efficiency"),
        (["--gpus", "0"], "--gpus"),
        (["--hardware", "a100"], "--hardware"),
        (["--extract-parallel", "ep"], "--extract-parallel"),
        (["--disk-read-gbps", "0"], "--disk-read-gbps"),
        (["--spool-gb", "-1"], "--spool-gb"),
    ],
)
def test_bad_flag_values_name_the_flag(args, flag, capsys):
    with pytest.raises(SystemExit) as e:
        P.main(args)
    assert e.value.code == 2
    assert flag in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--hardware", "custom", "--bf16-tflops", "100"], "--mem-bw-tbs"),
        (["--global-batch", "12"], "--global-batch"),
        (["--calibration", "/nonexistent/x.json"], "--calibration"),
    ],
)
def test_bad_combinations_name_the_flag(args, flag, tmp_path, capsys):
    if "--calibration" not in args:
        args = [*args, "--calibration", str(write_cal(tmp_path))]
    code, _, err = run_cli(capsys, *args)
    assert code == 2 and flag in err and "error" in err


def test_bad_calibration_file(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    code, _, err = run_cli(capsys, "--calibration", str(bad))
    assert code == 2 and "--calibration" in err and "not a train_step results file" in err


def test_register_cli_adds_plan():
    ap = argparse.ArgumentParser(prog="vllm-k2 train")
    sub = ap.add_subparsers(dest="verb")
    P.register_cli(sub)
    a = ap.parse_args(["plan", "--hardware", "b200", "--samples", "10"])
    assert a.func is P.cmd_plan and a.samples == 10 and a.hardware == "b200"


def test_committed_results_calibrate_the_planner():
    """The committed H200 results (package data: always there): the planner reproduces its
    calibration run. The other runs' checks are recomputed from the raw runs by
    tests/test_train_step_results.py."""
    cal = P.load_calibration()
    h200 = GPUS["h200"]
    s = P.seq_time(cal, h200, cal.seq, cal.batch, cal.ttt_steps)
    assert s["t"] + P.optimizer_time(cal, h200) == pytest.approx(cal.step_s, rel=1e-9)


def test_plan_help_renders(capsys):
    """argparse formats help strings with %: a literal percent sign there crashes --help."""
    ap = argparse.ArgumentParser(prog="vllm-k2 train")
    P.register_cli(ap.add_subparsers(dest="verb"))
    with pytest.raises(SystemExit) as e:
        ap.parse_args(["plan", "--help"])
    assert e.value.code == 0
    assert "30% ASSUMED" in capsys.readouterr().out


def test_docs_hero_run_table_is_the_planners_output(capsys):
    """docs/eagle3-training.md's hero-run table: the planner's markdown rows with the committed
    calibrations (training step and prefill), for the recipe it states."""
    docs = (Path(__file__).resolve().parent.parent / "docs" / "eagle3-training.md").read_text()
    code, out, _ = run_cli(
        capsys, "--samples", "600000", "--mean-tokens", "1200", "--hardware", "all", "--format", "markdown"
    )
    rows = [line for line in out.splitlines() if line.startswith("| 8x ")]
    assert code == 0 and len(rows) == len(GPUS)
    for row in rows:
        assert row in docs, row
    code, out, _ = run_cli(
        capsys,
        "--samples",
        "600000",
        "--mean-tokens",
        "1200",
        "--hardware",
        "rtx-pro-6000",
        "--extract-parallel",
        "pp",
        "--format",
        "markdown",
    )
    pp = next(line for line in out.splitlines() if line.startswith("| 8x "))
    assert pp.split(" | ", 1)[1] in docs  # the docs name that row "same, extraction as 8 pipeline stages"
