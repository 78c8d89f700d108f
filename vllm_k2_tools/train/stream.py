"""Training's side of a streaming spool (``spool.py``): wait until the shards a step reads
are listed, delete what no later step needs once a checkpoint covers it, and take an
extra checkpoint when extraction is blocked on a full spool (a checkpoint changes no
weights; it only lets shards go). Under DDP, rank 0 decides and every rank follows.
"""

from __future__ import annotations

import time

import torch

from . import spool
from .order import SampleOrder
from .shards import ShardReader


class SpoolDeadlock(spool.SpoolError):
    pass


class StreamFeed:
    def __init__(self, reader: ShardReader, order: SampleOrder, poll_s: float, rank: int, world: int, log=print):
        self.reader, self.order, self.poll_s = reader, order, poll_s
        self.rank, self.world, self.log = rank, world, log
        if rank == 0:  # a training killed between recording a release and deleting its files
            spool.finish(reader.dir)  # left them counted against the budget, yet never free again

    def _refresh(self) -> None:
        self.reader.refresh()
        self.order.update(self.reader.manifest)

    def _ready(self, start: int, end: int) -> bool:
        return all(self.order.locate(g) is not None for g in range(start, end))

    def _decide(self, flags: list[int]) -> list[int]:
        """Rank 0's view, for every rank (so all of them checkpoint, wait or stop together)."""
        if self.world == 1:
            return flags
        t = torch.tensor(flags, dtype=torch.int64)
        torch.distributed.broadcast(t, 0)
        return t.tolist()

    def release_consumed(self, position: int) -> None:
        """Delete the shards every read of which lies before `position` (a checkpoint's)."""
        listed = self.reader.manifest["shards"]
        files = [listed[s]["file"] for s in self.order.consumed(position)]
        self.reader.close(files, forget_digests=self.rank == 0)
        if self.rank == 0:
            spool.release(self.reader.dir, files)

    def wait_for(self, start: int, end: int, consumed: int, checkpoint) -> None:
        """Block until global positions [start, end) are readable. `consumed`: the position the
        state before this step has consumed; `checkpoint()` saves that state."""
        if self.world == 1:  # the common case, without a poll (under DDP every rank follows rank 0's view)
            self._refresh()
            if self._ready(start, end):
                return
        said = stuck = 0
        beat = None
        while True:
            self._refresh()
            ready = int(self._ready(start, end))
            marker = spool.producer_waiting(self.reader.dir)
            blocked = int(marker is not None)
            # alive: its marker's beat moved since the last poll (a killed extractor's marker stays still)
            alive = int(marker is not None and beat is not None and marker["beat"] != beat)
            beat = marker["beat"] if marker else None
            listed = self.reader.manifest["shards"]
            done = spool.released(self.reader.dir)
            free = int(any(listed[s]["file"] not in done for s in self.order.consumed(consumed)))
            ready, blocked, free, alive = self._decide([ready, blocked, free, alive])
            if ready:
                if self.rank != 0:  # rank 0 saw the shards listed; wait until this rank does too
                    while not self._ready(start, end):
                        time.sleep(self.poll_s)
                        self._refresh()
                return
            if blocked and free:
                self.log(f"train: extraction waits for room; checkpoint at position {consumed} to free shards")
                checkpoint()
                self.release_consumed(consumed)
                stuck = 0
            elif alive:
                stuck += 1
                if stuck >= 5:  # a live extractor cannot write, training cannot free: no one can move
                    raise SpoolDeadlock(
                        f"{self.reader.dir}: the spool budget cannot hold the shards one step reads "
                        f"(positions {start}..{end - 1} need shards not yet written, and nothing written "
                        "before them is free to delete): raise the spool budget or lower --shuffle-window"
                    )
            if not said:
                self.log(f"train: waiting for shards (positions {start}..{end - 1})")
                said = 1
            time.sleep(self.poll_s)

    def drain(self) -> None:
        """After the last step: delete shards as extraction finishes writing them, until the
        manifest says extraction is complete (the spool ends empty)."""
        if self.rank != 0:
            return
        while True:
            self._refresh()
            complete = bool(self.reader.manifest.get("complete"))
            files = [e["file"] for e in self.reader.manifest["shards"]]
            self.reader.close(files, forget_digests=True)
            spool.release(self.reader.dir, files)
            if complete:
                return
            time.sleep(self.poll_s)
