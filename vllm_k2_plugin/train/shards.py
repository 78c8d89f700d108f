"""Hidden-state shards: checksummed safetensors, one per extraction batch.

    extract_dir/
      manifest.json            {"metadata": {...}, "shards": [{"file", "sha256", "samples", "tokens"}]}
      shard-00000.safetensors  input_ids [N], loss_mask [N], aux [N, A*H], final [N, H], offsets [n+1],
                               sample_index [n]   (N tokens of n samples, concatenated)

A shard is written to a temp file and renamed, then the manifest (also atomic) lists it
with its sha256; a shard not in the manifest does not exist. Readers verify the sha256
before use, so a corrupted or truncated shard is an error naming the file, never
garbage in training. (speculators_compat/dataset.py writes speculators' own .pt format
for its tooling; this is ours: no pickle, digests, partial reads.)
"""

from __future__ import annotations

import os

import torch

from .. import fileio

MANIFEST = "manifest.json"


class ShardError(ValueError):
    pass


def load_manifest(out_dir: str) -> dict:
    path = os.path.join(out_dir, MANIFEST)
    if not os.path.exists(path):
        return {"metadata": None, "shards": []}
    return fileio.read_json(path)


def write_shard(out_dir: str, manifest: dict, samples: list[dict]) -> dict:
    """samples: {"index", "input_ids" [T], "loss_mask" [T], "aux" [T, A*H], "final" [T, H]}."""
    from safetensors.torch import save_file

    name = f"shard-{len(manifest['shards']):05d}.safetensors"
    lengths = [len(s["input_ids"]) for s in samples]
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64)
    tensors = {
        "input_ids": torch.cat([torch.as_tensor(s["input_ids"], dtype=torch.int64) for s in samples]),
        "loss_mask": torch.cat([torch.as_tensor(s["loss_mask"], dtype=torch.uint8) for s in samples]),
        "aux": torch.cat([s["aux"] for s in samples]).contiguous(),
        "final": torch.cat([s["final"] for s in samples]).contiguous(),
        "offsets": offsets,
        "sample_index": torch.tensor([s["index"] for s in samples], dtype=torch.int64),
    }
    path = os.path.join(out_dir, name)
    fileio.write_file(path, lambda tmp: save_file(tensors, tmp))
    entry = {
        "file": name,
        "sha256": fileio.sha256(path),
        "samples": [s["index"] for s in samples],
        "tokens": sum(lengths),
    }
    manifest["shards"].append(entry)
    fileio.write_json(os.path.join(out_dir, MANIFEST), manifest)
    return entry


class ShardReader:
    """Samples of an extraction directory, checksums verified on first access."""

    def __init__(self, extract_dir: str, verify: bool = True):
        self.dir = extract_dir
        self.manifest = load_manifest(extract_dir)
        if not self.manifest["shards"]:
            raise ShardError(f"{extract_dir}: no {MANIFEST} with shards; run `vllm-k2 train extract` first")
        self.metadata = self.manifest["metadata"]
        self._verify = verify
        self._verified: set[str] = set()
        self._cache: tuple[str, dict] | None = None
        self.index: list[tuple[int, int]] = []  # (shard number, position in shard)
        for s, entry in enumerate(self.manifest["shards"]):
            self.index.extend((s, j) for j in range(len(entry["samples"])))

    def __len__(self) -> int:
        return len(self.index)

    def verify_all(self) -> None:
        for entry in self.manifest["shards"]:
            self._load(entry)

    def _load(self, entry: dict) -> dict:
        from safetensors.torch import load_file

        path = os.path.join(self.dir, entry["file"])
        if self._cache and self._cache[0] == path:
            return self._cache[1]
        if not os.path.exists(path):
            raise ShardError(f"{path}: listed in {MANIFEST} but missing")
        if self._verify and path not in self._verified:
            got = fileio.sha256(path)
            if got != entry["sha256"]:
                raise ShardError(f"{path}: sha256 {got} != {entry['sha256']} in {MANIFEST}: the shard is corrupted")
            self._verified.add(path)
        tensors = load_file(path)
        self._cache = (path, tensors)
        return tensors

    def sample(self, i: int) -> dict:
        s, j = self.index[i]
        t = self._load(self.manifest["shards"][s])
        a, b = int(t["offsets"][j]), int(t["offsets"][j + 1])
        return {
            "index": int(t["sample_index"][j]),
            "input_ids": t["input_ids"][a:b],
            "loss_mask": t["loss_mask"][a:b],
            "aux": t["aux"][a:b],
            "final": t["final"][a:b],
        }
