"""Record what the bench drafter was trained on and what it became (issue #17).

Reads a finished `vllm-k2 train run` of `write_bench_recipe` (its directory holds
recipe.toml, train.jsonl, eval.jsonl and work/) and writes digests.json: the sha256 of the
recipe and its chat files, the corpus they were cut from, each stage's identity (stage.json,
which chains its inputs' settings), the regenerated data, the extracted shards' manifest,
the draft vocabulary, the exported drafter's files, training's summary and the eval stage's
tau. With --copy-export DIR the exported drafter (config.json + model.safetensors) is
copied there too, so the bench can be re-run without training.

    python benchmarks/bench_drafter_digests.py /tmp/drafter17/bench \\
        --out benchmarks/results/bench_ab_tiny_bench_drafter_cpu/digests.json \\
        --copy-export benchmarks/results/bench_ab_tiny_bench_drafter_cpu/drafter
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time

from vllm_k2_plugin import fileio
from vllm_k2_tools.fixtures.trained_target import BENCH_DRAFTER, corpus_digest, stdlib_files

STAGES = ("prepare", "prepare_eval", "extract", "extract_eval", "vocab", "train", "export", "eval")
EXPORT_FILES = ("config.json", "model.safetensors")


def digests(run_dir: str) -> dict:
    work = os.path.join(run_dir, "work")

    def sha(*parts: str) -> str:
        return fileio.sha256(os.path.join(*parts))

    def load(*parts: str):
        with open(os.path.join(*parts)) as f:
            return json.load(f)

    train = load(work, "train", "train.json")
    metrics = [json.loads(line) for line in open(os.path.join(work, "train", "metrics.jsonl"))]
    last = metrics[-50:]
    return {
        "settings": BENCH_DRAFTER,
        "python": platform.python_version(),
        "corpus_sha256": corpus_digest(stdlib_files()),
        "files_sha256": {name: sha(run_dir, name) for name in ("recipe.toml", "train.jsonl", "eval.jsonl")},
        "stages": {s: load(work, s, "stage.json") for s in STAGES},
        "prepared": {
            "prepare.json": load(work, "prepare", "prepare.json"),
            "sha256": {name: sha(work, "prepare", name) for name in ("chats.jsonl", "samples.jsonl")},
        },
        "extract_manifest_sha256": sha(work, "extract", "manifest.json"),
        "vocab": {"vocab.json": load(work, "vocab", "vocab.json"), "sha256": sha(work, "vocab", "vocab.safetensors")},
        "train": {
            "steps": train["steps"],
            "samples": train["samples"],
            "global_batch": train["global_batch"],
            "draft": train["draft"],
            "loss_last_50": sum(m["loss"] for m in last) / len(last),
            "acc_0_last_50": sum(m["acc_0"] for m in last) / len(last),
            "step_seconds_total": round(sum(m["seconds"] for m in metrics), 1),
        },
        "export_sha256": {name: sha(work, "export", name) for name in EXPORT_FILES},
        "eval": load(work, "eval", "eval.json"),
        "written": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(["python", *sys.argv]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", help="the directory write_bench_recipe wrote (recipe.toml, work/)")
    ap.add_argument("--out", required=True, help="digests.json to write")
    ap.add_argument("--copy-export", help="copy the exported drafter's files into this directory")
    a = ap.parse_args()
    d = digests(a.run_dir)
    if a.copy_export:
        os.makedirs(a.copy_export, exist_ok=True)
        for name in EXPORT_FILES:
            shutil.copy(os.path.join(a.run_dir, "work", "export", name), os.path.join(a.copy_export, name))
            if fileio.sha256(os.path.join(a.copy_export, name)) != d["export_sha256"][name]:
                raise SystemExit(f"{name}: the copy's sha256 differs from the export's")
    fileio.write_json(a.out, d)
    print(json.dumps({k: d[k] for k in ("files_sha256", "export_sha256")}, indent=1))
    print("tau", json.dumps(d["eval"]["tau"]), "served k=3", json.dumps(d["eval"]["served"]["3"]))


if __name__ == "__main__":
    main()
