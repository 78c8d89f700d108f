"""What a stretch of steps without drafting does to the drafts after it, with and without the
guard skipping the drafter there (patch ``spec-guard-drafter-off``).

While the guard holds k at 0 the plugin skips the EAGLE drafter's pass, so the drafter's KV
cache has no entries for those tokens; stock vLLM runs the pass to keep it complete. This
serves the same requests twice on a real engine (the latest CPU engine, in one process), the
guard's k forced to a schedule (3, then 0, then 3: ``benchmarks/guard_forced_k.py``), once with
the drafter skipped at k = 0 and once with it run, and compares acceptance per draft position
before and after the stretch. All requests start together and generate the same number of
tokens, so a scheduler step is the same step of every request.

    python benchmarks/drafter_off_holes.py TARGET DRAFTER PROMPTS.json --out DIR

TARGET: a model directory, or ``fixture:NAME`` for one of vllm_k2_tools' fixtures (built here).

Writes DIR/drafter_off_holes.md and .json (command and date inside).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCHEDULE = [(3, 16), (0, 48), (3, 10_000)]  # (k, scheduler steps)
MODES = {"drafter skipped at k = 0 (the plugin)": "", "drafter run at k = 0 (stock vLLM)": "spec-guard-drafter-off"}


def _serve(target: str, drafter: str, prompts: list[str], max_tokens: int, disable: str, work: Path) -> dict:
    log = work / "steps.jsonl"
    log.unlink(missing_ok=True)
    job = {
        "model": target,
        "prompts": prompts,
        "max_tokens": max_tokens,
        "logprobs": None,
        "sampling": [{"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True} for _ in prompts],
        "llm_kwargs": {
            "dtype": "float32",
            "max_model_len": 2048,
            "max_num_seqs": len(prompts),
            "enforce_eager": True,
            "trust_remote_code": True,
            "attention_backend": "CPU_MLA",
            "speculative_config": {"method": "eagle3", "model": drafter, "num_speculative_tokens": 3},
        },
    }
    (work / "job.json").write_text(json.dumps({"batch": {"run": job}}))
    env = dict(
        os.environ,
        VLLM_K2_SPEC_GUARD="1",
        VLLM_K2_EXTRA_PATCH_MODULES="benchmarks.guard_forced_k",
        FORCED_K_SCHEDULE=",".join(f"{k}:{n}" for k, n in SCHEDULE),
        FORCED_K_LOG=str(log),
        VLLM_MLA_DISABLE="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    if disable:
        env["VLLM_K2_DISABLE_PATCHES"] = disable
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "engine_job.py"), str(work / "job.json"), str(work / "r.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    result = json.loads((work / "r.json").read_text())["run"] if (work / "r.json").exists() else {"ok": False}
    if not result.get("ok"):
        raise RuntimeError(f"engine failed ({disable or 'default'}): {(proc.stdout + proc.stderr)[-3000:]}")
    steps = [json.loads(line) for line in log.read_text().splitlines()]
    return {"outputs": [o["token_ids"] for o in result["outputs"]], "steps": steps}


def _phase(step: int) -> str:
    before = SCHEDULE[0][1]
    return "before" if step <= before else "after" if step > before + SCHEDULE[1][1] else "during"


def acceptance(steps: list[dict], phase: str) -> list[float]:
    drafted = [0, 0, 0]
    accepted = [0, 0, 0]
    for s in steps:
        if _phase(s["step"]) != phase:
            continue
        for i in range(3):
            drafted[i] += s["drafted"][i]
            accepted[i] += s["accepted"][i]
    return [round(a / d, 3) if d else 0.0 for a, d in zip(accepted, drafted, strict=True)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target")
    ap.add_argument("drafter")
    ap.add_argument("prompts")
    ap.add_argument("--out", required=True)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=192)
    a = ap.parse_args()
    prompts = json.loads(Path(a.prompts).read_text())[: a.requests]
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        if a.target.startswith("fixture:"):
            from vllm_k2_tools.fixtures import build_fixture

            a.target = build_fixture(a.target.split(":", 1)[1], str(Path(tmp) / "target"))
        for name, disable in MODES.items():
            work = Path(tmp) / (disable or "default")
            work.mkdir()
            runs[name] = _serve(a.target, a.drafter, prompts, a.max_tokens, disable, work)
    import vllm

    first = next(iter(runs.values()))["outputs"]
    report = {
        "command": " ".join(["python", "benchmarks/drafter_off_holes.py", *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "vllm": vllm.__version__,
        "schedule": SCHEDULE,
        "requests": len(prompts),
        "same_outputs": all(r["outputs"] == first for r in runs.values()),
        "modes": {
            name: {phase: acceptance(r["steps"], phase) for phase in ("before", "after")} | {"steps": r["steps"]}
            for name, r in runs.items()
        },
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    from vllm_k2_plugin import fileio

    fileio.write_json(str(out / "drafter_off_holes.json"), report)
    lines = [
        "# Drafts after a stretch without drafting: drafter skipped vs run at k = 0",
        "",
        f"Command: `{report['command']}`  ",
        f"Date: {report['date']}; vLLM {report['vllm']} (CPU engine, float32, in one process)",
        "",
        f"{len(prompts)} greedy requests started together, {a.max_tokens} tokens each; the guard's k forced to "
        f"{SCHEDULE[0][0]} for {SCHEDULE[0][1]} scheduler steps, 0 for the next {SCHEDULE[1][1]}, then "
        f"{SCHEDULE[2][0]}. Acceptance per draft position (accepted through it / drafted), before and "
        f"after the stretch. Outputs identical across the modes: {report['same_outputs']}.",
        "",
        "| mode | before: pos 1 / 2 / 3 | after: pos 1 / 2 / 3 |",
        "|---|---|---|",
    ]
    for name, m in report["modes"].items():
        lines.append(f"| {name} | {' / '.join(map(str, m['before']))} | {' / '.join(map(str, m['after']))} |")
    fileio.write_text(str(out / "drafter_off_holes.md"), "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
