"""The order training reads samples in: a pure function of the seed and the shard sequence,
so a resumed run, a streaming run and an offline run over the same shards read the same
samples at the same global positions (optimizer step s reads positions [s*G, (s+1)*G)).

A *pass* is one read of every sample: offline, epoch e re-reads the same shards (keep);
streaming, extraction writes each pass's shards anew (re-extract; ``pass`` in the manifest
entry). Each pass is cut into windows of ``window`` consecutive shards, and the samples of
a window are permuted with a seed derived from (seed, pass, window): shuffling within a
bounded window, which is what lets a spool hold a few windows instead of the dataset.
``window = 0`` is one window per pass (a global shuffle; offline only), seeded ``seed + pass``
as the trainer always did.
"""

from __future__ import annotations

import bisect
import hashlib

import torch


class OrderError(ValueError):
    pass


def window_seed(seed: int, pass_no: int, window_no: int) -> int:
    digest = hashlib.sha256(f"eagle3-window:{seed}:{pass_no}:{window_no}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


class SampleOrder:
    def __init__(self, manifest: dict, seed: int, window: int = 0, streaming: bool = False):
        if window < 0:
            raise OrderError(f"shuffle window must be >= 0 shards, got {window}")
        if streaming and window == 0:
            raise OrderError("streaming needs a bounded shuffle window (--shuffle-window N shards, N >= 1)")
        self.seed, self.window, self.streaming = seed, window, streaming
        self._windows: dict[int, tuple[list[int], list[list[tuple[int, int]]]]] = {}  # pass -> (starts, rows)
        self.last_use: dict[int, int] = {}  # shard number -> last global position reading it (streaming)
        self.update(manifest)

    def update(self, manifest: dict) -> None:
        """A newer manifest (more shards listed)."""
        self.manifest = manifest
        shards = manifest["shards"]
        if self.streaming:
            meta = manifest["metadata"] or {}
            if "num_samples" not in meta:
                raise OrderError("the spool's manifest has no metadata.num_samples: not written by `train extract`")
            self.per_pass = int(meta["num_samples"])
            self.passes = int(meta.get("passes", 1))
        else:
            self.per_pass = sum(len(e["samples"]) for e in shards)
            self.passes = None  # offline: any number of epochs over the same shards
        self._pass_shards: dict[int, list[int]] = {}
        for s, e in enumerate(shards):
            self._pass_shards.setdefault(int(e.get("pass", 0)) if self.streaming else 0, []).append(s)

    def _shards_of(self, p: int) -> tuple[list[int], bool]:
        """(shard numbers of pass p listed so far, whether the pass is complete)."""
        if not self.streaming:
            return self._pass_shards.get(0, []), True
        listed = self._pass_shards.get(p, [])
        count = sum(len(self.manifest["shards"][s]["samples"]) for s in listed)
        return listed, count == self.per_pass

    def _extend(self, p: int) -> tuple[list[int], list[list[tuple[int, int]]]]:
        starts, rows = self._windows.setdefault(p, ([], []))
        listed, complete = self._shards_of(p)
        width = self.window or max(len(listed), 1)
        while True:
            k = len(rows)
            chunk = listed[k * width : (k + 1) * width]
            if not chunk or (len(chunk) < width and not complete) or (self.window == 0 and not complete):
                return starts, rows
            cells = [(s, j) for s in chunk for j in range(len(self.manifest["shards"][s]["samples"]))]
            sd = self.seed + p if self.window == 0 else window_seed(self.seed, p, k)
            perm = torch.randperm(len(cells), generator=torch.Generator().manual_seed(sd)).tolist()
            start = starts[-1] + len(rows[-1]) if rows else 0
            ordered = [cells[i] for i in perm]
            starts.append(start)
            rows.append(ordered)
            if self.streaming:
                base = p * self.per_pass + start
                for i, (s, _) in enumerate(ordered):
                    self.last_use[s] = max(self.last_use.get(s, -1), base + i)

    def locate(self, g: int) -> tuple[int, int] | None:
        """(shard number, row) read at global position g; None while its window is not all listed."""
        if self.per_pass == 0:
            raise OrderError("no samples")
        p, r = divmod(g, self.per_pass)
        if self.passes is not None and p >= self.passes:
            raise OrderError(f"position {g} is past the {self.passes} extraction pass(es) of the spool")
        starts, rows = self._windows.get(p) or ([], [])
        if not rows or r >= starts[-1] + len(rows[-1]):
            starts, rows = self._extend(p)
            if not rows or r >= starts[-1] + len(rows[-1]):
                return None
        k = bisect.bisect_right(starts, r) - 1
        return rows[k][r - starts[k]]

    def consumed(self, position: int) -> list[int]:
        """Shards every read of which lies before `position` (streaming)."""
        return sorted(s for s, last in self.last_use.items() if last < position)
