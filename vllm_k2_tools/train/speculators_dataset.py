"""Run a hidden-states generator over many samples into resumable, atomic shards.

out_dir/
  manifest.json        {"metadata": ..., "shards": [{"file", "indices"}...]}  (rewritten atomically)
  shard-00000.pt       speculators' v1 rows + "index" (each written to a temp file, then renamed)

An interrupted run leaves only complete shards listed in the manifest; a rerun skips
the samples those shards hold, so no sample is missing or duplicated.

Why not train/shards.py's format: this one is for speculators' own tooling, which reads
its v1 ``.pt`` rows (pickled dicts); our trainer reads checksummed safetensors shards.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import torch
from tqdm import tqdm

from vllm_k2_plugin import fileio


def load_manifest(out_dir: str) -> dict:
    path = os.path.join(out_dir, "manifest.json")
    if not os.path.exists(path):
        return {"metadata": None, "shards": []}
    with open(path) as f:
        return json.load(f)


def generate_dataset(
    generator,
    samples: Sequence[Sequence[int]],
    out_dir: str,
    batch_size: int = 8,
    stop_after_shards: int | None = None,
) -> dict:
    """Write hidden states for `samples` (token id lists) into shards of one batch each.
    Returns the manifest. `stop_after_shards` ends early (as an interruption would)."""
    os.makedirs(out_dir, exist_ok=True)
    manifest = load_manifest(out_dir)
    metadata = dict(getattr(generator, "capture_metadata", {}), num_samples=len(samples))
    if manifest["metadata"] not in (None, metadata):
        raise ValueError(f"{out_dir}/manifest.json was written with other settings: {manifest['metadata']}")
    manifest["metadata"] = metadata
    done = {i for shard in manifest["shards"] for i in shard["indices"]}
    todo = [i for i in range(len(samples)) if i not in done]
    written = 0
    for start in tqdm(range(0, len(todo), batch_size), desc="hidden states", unit="batch"):
        if stop_after_shards is not None and written >= stop_after_shards:
            break
        indices = todo[start : start + batch_size]
        rows = generator.generate([list(samples[i]) for i in indices])
        for i, row in zip(indices, rows, strict=True):
            row["index"] = i
        name = f"shard-{len(manifest['shards']):05d}.pt"
        fileio.write_file(os.path.join(out_dir, name), lambda p, rows=rows: torch.save(rows, p))
        manifest["shards"].append({"file": name, "indices": indices})
        fileio.write_file(
            os.path.join(out_dir, "manifest.json"),
            lambda p: open(p, "w").write(json.dumps(manifest, indent=1)),
        )
        written += 1
    return manifest
