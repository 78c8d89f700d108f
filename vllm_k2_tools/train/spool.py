"""The streaming spool: an extraction directory (``shards.py``'s format, one manifest for
offline and streaming runs) that extraction fills under a byte budget while training
drains it. The two sides may be separate processes on separate hosts sharing the
directory; they talk only through files, each written atomically by one side:

    manifest.json          extraction: metadata, then one entry per shard written (durable "written")
    shard-NNNNN.safetensors
    extract.waiting.json   extraction, while it waits for room: {"pid", "need", "budget", "beat"}
                           (rewritten every poll: a marker whose beat stops is a dead extractor's)
    released.json          training: {"files": [...]}: shards no later step needs (durable "consumed")

Budget: the bytes of shard files (and shard temporaries) on disk; the JSON files are KBs
and not counted. Extraction serialises a shard in memory, then waits until the shards on
disk plus it fit, then writes it. Training lists a shard in ``released.json`` first and
deletes it second, so a kill between the two is finished by the next start (``finish``),
and a shard is released only once a checkpoint no longer needs it (a restart resumes from
the checkpoint: nothing it needs is gone, nothing it already used is read again).
"""

from __future__ import annotations

import contextlib
import os
import time

from vllm_k2_plugin import fileio

WAITING = "extract.waiting.json"
RELEASED = "released.json"


class SpoolError(RuntimeError):
    pass


def _is_shard(name: str) -> bool:
    # shard files and write_file's temporaries of them (".tmp-XXXXXXXXshard-NNNNN.safetensors")
    return name.endswith(".safetensors") and (name.startswith("shard-") or name.startswith(".tmp-"))


def usage_bytes(spool_dir: str) -> int:
    """Bytes of shard files on disk now (what the budget bounds)."""
    total = 0
    with os.scandir(spool_dir) as it:
        for e in it:
            if _is_shard(e.name):
                with contextlib.suppress(FileNotFoundError):  # deleted by training meanwhile
                    total += e.stat().st_size
    return total


def clean_unlisted(spool_dir: str, manifest: dict) -> list[str]:
    """Extraction's start: shard files the manifest does not list (a kill between a shard's
    rename and the manifest update, or a temporary) are rewritten anyway; delete them so they
    do not count twice against the budget."""
    listed = {e["file"] for e in manifest["shards"]}
    gone = [n for n in os.listdir(spool_dir) if _is_shard(n) and n not in listed]
    for n in gone:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(spool_dir, n))
    return gone


class Budget:
    """Extraction's side: ``make_room(nbytes)`` returns once a shard of nbytes fits."""

    def __init__(self, spool_dir: str, budget_bytes: int, poll_s: float = 0.5, log=print):
        if budget_bytes <= 0:
            raise SpoolError(f"spool budget must be positive, got {budget_bytes}")
        self.dir, self.budget, self.poll_s, self.log = spool_dir, int(budget_bytes), poll_s, log
        self.high_water = 0  # the most shard bytes on disk this process saw after a write
        with contextlib.suppress(FileNotFoundError):  # a killed extraction's marker: it waits no more
            os.unlink(os.path.join(spool_dir, WAITING))

    def make_room(self, nbytes: int) -> None:
        if nbytes > self.budget:
            raise SpoolError(
                f"{self.dir}: one shard needs {nbytes} B, more than the spool budget of {self.budget} B: "
                "raise the budget (--spool-bytes / [stream] spool_bytes) or extract smaller batches"
            )
        marker = os.path.join(self.dir, WAITING)
        beat = 0
        while usage_bytes(self.dir) + nbytes > self.budget:
            fileio.write_json(marker, {"pid": os.getpid(), "need": nbytes, "budget": self.budget, "beat": beat})
            if not beat:
                self.log(f"extract: spool full ({usage_bytes(self.dir)} + {nbytes} B > {self.budget} B), waiting")
            beat += 1
            time.sleep(self.poll_s)
        if beat:  # gone before the shard is written: a marker never outlives the wait
            with contextlib.suppress(FileNotFoundError):
                os.unlink(marker)
        self.high_water = max(self.high_water, usage_bytes(self.dir) + nbytes)


def producer_waiting(spool_dir: str) -> dict | None:
    """The waiting marker, when extraction cannot write its next shard for lack of room."""
    path = os.path.join(spool_dir, WAITING)
    try:
        marker = fileio.read_json(path)
    except (FileNotFoundError, ValueError):  # ValueError: never half-written, but be safe
        return None
    return marker if usage_bytes(spool_dir) + marker["need"] > marker["budget"] else None


def released(spool_dir: str) -> set[str]:
    path = os.path.join(spool_dir, RELEASED)
    return set(fileio.read_json(path)["files"]) if os.path.exists(path) else set()


def release(spool_dir: str, files: list[str]) -> None:
    """Record, then delete: the record is what makes "consumed" durable."""
    done = released(spool_dir)
    new = [f for f in files if f not in done]
    if new:
        fileio.write_json(os.path.join(spool_dir, RELEASED), {"files": sorted(done | set(new))})
    for name in new:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(spool_dir, name))


def finish(spool_dir: str) -> None:
    """Delete every released shard still on disk (a kill between record and delete)."""
    for name in released(spool_dir):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(spool_dir, name))
