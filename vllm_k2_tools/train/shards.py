"""Hidden-state shards: checksummed safetensors, one per extraction batch.

    extract_dir/
      manifest.json            {"metadata": {...}, "shards": [{"file", "sha256", "samples", "tokens", "bytes",
                                "pass"}], "complete": true once extraction wrote every shard}
      shard-00000.safetensors  input_ids [N], loss_mask [N], aux [N, A*H], final [N, H], offsets [n+1],
                               sample_index [n]   (N tokens of n samples, concatenated)

A shard is written to a temp file and renamed, then the manifest (also atomic) lists it
with its sha256; a shard not in the manifest does not exist. Readers verify the sha256
before use, so a corrupted or truncated shard is an error naming the file, never
garbage in training. The same directory is the streaming spool (``spool.py``): one
manifest format for offline and streaming runs. (speculators_compat/dataset.py writes speculators' own .pt format
for its tooling; this is ours: no pickle, digests, partial reads.)
"""

from __future__ import annotations

import os

import torch

from vllm_k2_plugin import fileio

MANIFEST = "manifest.json"


class ShardError(ValueError):
    pass


def load_manifest(out_dir: str) -> dict:
    path = os.path.join(out_dir, MANIFEST)
    if not os.path.exists(path):
        return {"metadata": None, "shards": []}
    return fileio.read_json(path)


def write_shard(out_dir: str, manifest: dict, samples: list[dict], make_room=None, **entry_extra) -> dict:
    """samples: {"index", "input_ids" [T], "loss_mask" [T], "aux" [T, A*H], "final" [T, H]}.
    The shard is serialised in memory first, so its exact size is known before a byte
    lands on disk: ``make_room(nbytes)`` (a spool's budget) may wait until it fits."""
    from safetensors.torch import save

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
    blob = save(tensors)
    if make_room is not None:
        make_room(len(blob))
    path = os.path.join(out_dir, name)

    def _w(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(blob)

    fileio.write_file(path, _w)
    entry = {
        "file": name,
        "sha256": fileio.sha256(path),
        "samples": [s["index"] for s in samples],
        "tokens": sum(lengths),
        "bytes": len(blob),
        **entry_extra,
    }
    manifest["shards"].append(entry)
    fileio.write_json(os.path.join(out_dir, MANIFEST), manifest)
    return entry


#: Beside the manifest: shards whose sha256 was checked, with the size and mtime they had
#: then. A shard still matching them is not hashed again (41 TB at hero scale per restart).
VERIFIED = "verified.json"


class ShardReader:
    """Samples of an extraction directory. A sample read touches only that sample's rows
    (safetensors ``safe_open`` slices of the memory-mapped shard). Each shard's sha256 is
    checked once, at first use, and recorded in ``verified.json``; a later reader trusts
    the record while the file keeps its size and mtime (anything that rewrites it changes
    them), else hashes again."""

    def __init__(self, extract_dir: str, verify: bool = True, open_shards: int = 8, streaming: bool = False):
        self.dir = extract_dir
        self.manifest = load_manifest(extract_dir)
        if not self.manifest["shards"] and not streaming:
            raise ShardError(f"{extract_dir}: no {MANIFEST} with shards; run `vllm-k2 train extract` first")
        self._verify = verify
        self._open: dict[str, tuple] = {}  # path -> (safe_open handle, offsets, sample_index), LRU
        self._max_open = open_shards
        self.bytes_read = 0  # sample bytes materialised (what a read costs, for tests and logs)
        self.index: list[tuple[int, int]] = []  # (shard number, position in shard)
        self._indexed = 0  # shards in self.index
        self._index_shards()

    def _index_shards(self) -> None:
        for s in range(self._indexed, len(self.manifest["shards"])):
            self.index.extend((s, j) for j in range(len(self.manifest["shards"][s]["samples"])))
        self._indexed = len(self.manifest["shards"])

    @property
    def metadata(self) -> dict | None:
        return self.manifest["metadata"]

    def refresh(self) -> None:
        """Re-read the manifest (a streaming spool grows while training reads it)."""
        self.manifest = load_manifest(self.dir)
        self._index_shards()

    def close(self, files: list[str], forget_digests: bool = False) -> None:
        """Drop open handles (and, by the one process that writes it, the digest records) of
        shards about to be deleted: an open memory map keeps a deleted file's blocks allocated."""
        for name in files:
            self._open.pop(os.path.join(self.dir, name), None)
        if not forget_digests:
            return
        if any(name in self._verified() for name in files):
            fileio.update_json(
                os.path.join(self.dir, VERIFIED), lambda r: {k: v for k, v in r.items() if k not in files}
            )

    def __len__(self) -> int:
        return len(self.index)

    def verify_all(self) -> None:
        for entry in self.manifest["shards"]:
            self._check(entry)

    def _verified(self) -> dict:
        path = os.path.join(self.dir, VERIFIED)
        return fileio.read_json(path) if os.path.exists(path) else {}

    def _check(self, entry: dict) -> str:
        path = os.path.join(self.dir, entry["file"])
        if not os.path.exists(path):
            raise ShardError(f"{path}: listed in {MANIFEST} but missing")
        if not self._verify:
            return path
        st = os.stat(path)
        seen = {"sha256": entry["sha256"], "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        record = self._verified()
        if record.get(entry["file"]) == seen:
            return path
        got = fileio.sha256(path)
        if got != entry["sha256"]:
            raise ShardError(f"{path}: sha256 {got} != {entry['sha256']} in {MANIFEST}: the shard is corrupted")
        fileio.update_json(os.path.join(self.dir, VERIFIED), lambda r: {**r, entry["file"]: seen})
        return path

    def _handle(self, entry: dict) -> tuple:
        from safetensors import safe_open

        path = os.path.join(self.dir, entry["file"])
        if path in self._open:
            self._open[path] = self._open.pop(path)  # most recent last
            return self._open[path]
        self._check(entry)
        h = safe_open(path, framework="pt")
        self._open[path] = (h, h.get_tensor("offsets").tolist(), h.get_tensor("sample_index").tolist())
        while len(self._open) > self._max_open:
            self._open.pop(next(iter(self._open)))
        return self._open[path]

    def sample(self, i: int) -> dict:
        return self.row(*self.index[i])

    def row(self, s: int, j: int) -> dict:
        """Sample j of shard number s."""
        h, offsets, sample_index = self._handle(self.manifest["shards"][s])
        a, b = offsets[j], offsets[j + 1]
        rows = {k: h.get_slice(k)[a:b] for k in ("input_ids", "loss_mask", "aux", "final")}
        self.bytes_read += sum(t.numel() * t.element_size() for t in rows.values())
        return {"index": sample_index[j], **rows}
