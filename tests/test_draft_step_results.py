"""The committed draft-step results (benchmarks/results/draft_step_h200) are what
draft_step_report.py makes of the raw case files: regenerated here, they must match."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "draft_step_h200"
sys.path.insert(0, str(REPO / "benchmarks"))

import draft_step_report  # noqa: E402


def test_committed_results_are_the_reports_output(tmp_path):
    draft_step_report.report(RESULTS / "raw", tmp_path, "python benchmarks/draft_step_report.py")
    assert json.loads((tmp_path / "summary.json").read_text()) == json.loads((RESULTS / "summary.json").read_text())
    committed = (RESULTS / "README.md").read_text()
    assert "Report command: `python benchmarks/draft_step_report.py" in committed
    assert (tmp_path / "README.md").read_text().split("Report command:")[0] == committed.split("Report command:")[0]


def test_raw_cases_name_their_command_and_date():
    for p in (RESULTS / "raw").rglob("*.json"):
        r = json.loads(p.read_text())
        assert r["command"].startswith("gpu_engine_e2e.py case") and r["date"].startswith("20"), p.name
        assert p.stem == r["case"]["name"]


def test_depth_fit_on_known_numbers():
    """GPU busy = fixed + layers x per-layer: 1 ms fixed + 0.1 ms per layer (plain) and 2 ms +
    0.12 ms (EAGLE-3), off-GPU 0.5 / 1 ms at 12 layers -> the values at 61 layers."""

    def case(busy, wall):
        return {
            "wall_ms_per_step": wall,
            "profile": {"gpu_busy_ms_per_step": busy, "kernels_per_step": 1.0},
            "contexts": {"4096": {"step_ms": wall}},
        }

    runs = {}
    for layers in (6, 12):
        plain, spec = 1 + 0.1 * layers, 2 + 0.12 * layers
        runs[draft_step_report.DEPTH_PROF[layers]["plain"]] = case(plain, plain + 0.5)
        runs[draft_step_report.DEPTH_PROF[layers]["eagle3"]] = case(spec, spec + 1)
        runs[draft_step_report.DEPTH_STEPS[layers]["plain"]] = case(plain, plain)
        runs[draft_step_report.DEPTH_STEPS[layers]["eagle3"]] = case(spec, spec)
    d = draft_step_report.depth_fit(runs)
    assert d["fit"]["plain"] == {
        "per_layer_ms": 0.1,
        "fixed_ms": 1.0,
        "off_gpu_ms_at_12": 0.5,
        "gpu_busy_ms_at_61": 7.1,
        "step_ms_at_61": 7.6,
    }
    assert d["fit"]["eagle3"]["gpu_busy_ms_at_61"] == round(2 + 0.12 * 61, 3)
    assert d["spec_over_plain"]["step_61_modelled"] == round((2 + 0.12 * 61 + 1) / 7.6, 2)


def test_deep_ratios_are_over_the_same_calls_plain_case():
    """Each device call's EAGLE-3 rows read against that call's own plain case (never another
    call's), and the depth fit is evaluated at 24 layers."""

    def steps(name, ms, rounds=(1.0, 0.5, 0.5, 0.55)):
        return {
            "case": {"name": name, "task": "steps", "model": "s24"},
            "date": "2026-12-02T00:00",
            "contexts": {"4096": {"step_ms": ms, "request_s": {"1": [0.1] * 4, "129": list(rounds)}}},
        }

    def prof(name, wall, busy, spec=False, ctx=4096):
        profile = {"gpu_busy_ms_per_step": busy, "kernels_per_step": 1.0}
        case = {"name": name, "task": "hostprof", "model": "s24", "contexts": [ctx]} | ({"spec": {}} if spec else {})
        return {"case": case, "date": "2026-12-02T00:00", "wall_ms_per_step": wall, "profile": profile}

    r = draft_step_report
    leases = {
        "lease1": {
            r.DEEP_PLAIN: steps(r.DEEP_PLAIN, 4.0),
            "e3": steps("e3", 6.0),
            r.DEEP_PROF_PLAIN: prof(r.DEEP_PROF_PLAIN, 4.0, 2.0),
            "p3": prof("p3", 5.0, 3.0, spec=True),
            "p3-32k": prof("p3-32k", 9.0, 6.0, spec=True, ctx=32768),
        },
        "lease2": {
            r.DEEP_PLAIN: steps(r.DEEP_PLAIN, 2.0),
            "e3": steps("e3", 3.0, rounds=(1.0, 0.5, 0.7, 0.5)),
            "p32k": prof("p32k", 6.0, 4.0, ctx=32768),
            "p3-32k": prof("p3-32k", 7.0, 5.0, spec=True, ctx=32768),
        },
    }
    fit = {"plain": {"fixed_ms": 0.1, "per_layer_ms": 0.1}, "eagle3": {"fixed_ms": 1.0, "per_layer_ms": 0.2}}
    d = r.deep_summary(leases, fit)
    assert d["lease1"]["steps"]["e3"]["4096"]["over_plain"] == 1.5
    assert d["lease2"]["steps"]["e3"]["4096"]["over_plain"] == 1.5
    assert d["lease1"]["profiled"]["p3"] | {} == {
        "context": 4096,
        "wall_ms_per_step": 5.0,
        "gpu_busy_ms_per_step": 3.0,
        "kernels_per_step": 1.0,
        "wall_over_plain": 1.25,
        "busy_over_plain": 1.5,
        "attention_ms": dict.fromkeys(r.ATTENTION_KERNELS),
    }
    # a profile reads against the same call's plain profile at its own context, or none
    assert "busy_over_plain" not in d["lease1"]["profiled"]["p3-32k"]
    assert d["lease2"]["profiled"]["p3-32k"]["busy_over_plain"] == 1.25
    assert d["fit_at_24"] == {"plain": 2.5, "eagle3": 5.8}
    # the first round (graph capture) never counts; 0.7 / 0.5 does
    assert [(n["lease"], n["case"]) for n in d["noisy_rounds"]] == [("lease2", "e3")]


def test_idle_gaps_and_host_waits_on_known_events():
    """Kernels at [0,10] [5,50] [20,30] [100,110] [200,205] [217,220] µs: gaps of 50 µs (after the
    kernel that ended last, not the one that started last) and 90 µs; 12 µs is below the floor.
    Host waits: only the CUDA sync calls count."""
    from types import SimpleNamespace

    import gpu_engine_e2e as e2e

    def ev(name, a, b):
        return SimpleNamespace(name=name, time_range=SimpleNamespace(start=a, end=b))

    kernels = [
        ev("k1", 0, 10),
        ev("k2", 5, 50),
        ev("k2b", 20, 30),
        ev("k3", 100, 110),
        ev("k4", 200, 205),
        ev("k5", 217, 220),
    ]
    g = e2e._idle_gaps(kernels, steps=2)
    assert g["ms_per_step"] == 0.07 and g["gaps_per_step"] == 1.0
    assert [(x["before"], x["after"], x["ms"]) for x in g["by_neighbours"]] == [
        ("k3", "k4", 0.045),
        ("k2", "k3", 0.025),
    ]
    prof = SimpleNamespace(
        events=lambda: [
            ev("cudaEventSynchronize", 0, 30),
            ev("cudaLaunchKernel", 0, 500),
            ev("cudaMemcpy", 40, 50),
            ev("cudaEventSynchronize", 60, 70),
        ]
    )
    w = e2e._host_waits(prof, steps=2)
    assert w["ms_per_step"] == 0.025
    assert w["by_call"] == [
        {"call": "cudaEventSynchronize", "calls": 1.0, "ms": 0.02},
        {"call": "cudaMemcpy", "calls": 0.5, "ms": 0.005},
    ]


def test_stock_against_ours_reads_each_call_and_sorts_kernels_by_role(tmp_path):
    """dg24stock: ratios and speed-ups within one call, kernels summed by role (a kernel of no
    role counts nowhere), and which side of the step waits follows the profile."""
    r = draft_step_report

    def steps(name, ms):
        ctx = {"4096": {"step_ms": ms, "request_s": {"1": [0.1] * 3, "129": [1.0, 0.5, 0.6]}}}
        return {"case": {"name": name}, "date": "2026-12-03T00:00", "contexts": ctx}

    def prof(name, wall, busy, idle, wait, kernels):
        profile = {
            "gpu_busy_ms_per_step": busy,
            "gpu_idle": {"ms_per_step": idle},
            "host_waits": {"ms_per_step": wait},
            "kernels_per_step": 10.0,
            "kernels_full_names": [{"kernel": k, "ms": ms} for k, ms in kernels],
        }
        return {"case": {"name": name}, "date": "2026-12-03T00:01", "wall_ms_per_step": wall, "profile": profile}

    ms = {("ours", "plain"): 2.0, ("ours", "eagle3"): 3.0, ("stock", "plain"): 8.0, ("stock", "eagle3"): 24.0}
    call = tmp_path / r.STOCK24_DIR / "call"
    call.mkdir(parents=True)
    for key, n in r.STOCK24.items():
        (call / f"dg24s-{n}.json").write_text(json.dumps(steps(f"dg24s-{n}", ms[key])))
        kernels = [
            ("fused_moe_kernel", 1.0),
            ("mla_decode_split", 0.25),
            ("mla_decode_reduce", 0.5),
            ("_fwd_grouped_kernel_stage1", 2.0),
            ("kernel_unified_attention", 0.125),
            ("nvjet_gemm", 4.0),
        ]
        idle, wait = (5.0, 0.0) if key[0] == "stock" else (0.0, 1.0)
        (call / f"dg24sprof-{n}.json").write_text(
            json.dumps(prof(f"dg24sprof-{n}", 2 * ms[key], ms[key], idle, wait, kernels))
        )
    s = r.stock24_summary(tmp_path)
    x = s["calls"][0]["contexts"]["4096"]
    assert (x["ours_ratio"], x["stock_ratio"], x["speedup_plain"], x["speedup_eagle3"]) == (1.5, 3.0, 4.0, 8.0)
    assert x["ours_plain_spread"] == 1.2
    roles = s["profiled"]["ours_eagle3"]["roles"]
    assert roles == {
        "MoE experts": 1.0,
        "target attention, decode kernels": 2.75,
        "target attention, prefill path (verify)": 0.0,
        "drafter attention": 0.125,
    }
    text = "\n".join(r.stock24_markdown(s))
    assert "stock the GPU waits for the host" in text and "ours the host waits for the GPU" in text
