"""The choice per message size, from measurements every rank agrees on.

A candidate serves a size only if it was correct on every rank and faster than NCCL
by ``MARGIN``; a message uses the choice of the smallest measured size that holds it,
and NCCL above the largest. Pure logic: no torch, no vLLM.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os

NCCL = "nccl"
#: vLLM's FlashInfer PCIe-IPC all-reduce (vLLM >= 0.30 with FlashInfer >= 0.7, opt-in).
FLASHINFER_PCIE_IPC = "flashinfer_pcie_ipc"
#: A candidate must beat NCCL by this fraction: within noise, NCCL stays.
MARGIN = 0.05


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One candidate at one size, agreed by all ranks: ``ok`` is the AND over ranks,
    ``us`` the slowest rank's mean time per all-reduce (None: not timed)."""

    candidate: str
    nbytes: int
    ok: bool
    us: float | None
    why: str = ""


@dataclasses.dataclass
class Selection:
    world_size: int
    sizes: list[int]  # measured message sizes in bytes, ascending
    chosen: dict[int, str]  # size -> candidate name (NCCL included)
    measurements: list[Measurement]

    def path_for(self, nbytes: int) -> str:
        for size in self.sizes:
            if nbytes <= size:
                return self.chosen[size]
        return NCCL

    def uses(self, candidate: str) -> bool:
        return candidate in self.chosen.values()

    def table(self) -> str:
        """One line: size -> chosen (each candidate's µs, x = refused as wrong)."""
        parts = []
        for size in self.sizes:
            cells = []
            for m in self.measurements:
                if m.nbytes == size:
                    cells.append(f"{m.candidate} {'x' if not m.ok else (f'{m.us:.1f}' if m.us is not None else '-')}")
            parts.append(f"{_kb(size)}: {self.chosen[size]} [{', '.join(cells)}]")
        return f"TP {self.world_size}: " + "; ".join(parts)

    def to_json(self) -> dict:
        return {
            "world_size": self.world_size,
            "sizes": self.sizes,
            "chosen": {str(k): v for k, v in self.chosen.items()},
            "measurements": [dataclasses.asdict(m) for m in self.measurements],
        }


def _kb(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n % 1024 else f"{n // 1024} KiB"


def choose(world_size: int, measurements: list[Measurement], margin: float = MARGIN) -> Selection:
    """Per size: the fastest candidate that was correct on every rank and beats NCCL by
    ``margin``; NCCL where NCCL was not timed, where nothing beats it, or where NCCL
    itself was wrong (a broken reference leaves stock behaviour alone)."""
    sizes = sorted({m.nbytes for m in measurements})
    chosen = {}
    for size in sizes:
        here = {m.candidate: m for m in measurements if m.nbytes == size}
        nccl = here.get(NCCL)
        best = NCCL
        if nccl is not None and nccl.ok and nccl.us is not None:
            bar = nccl.us * (1 - margin)
            fast = [m for m in here.values() if m.candidate != NCCL and m.ok and m.us is not None and m.us < bar]
            if fast:
                best = min(fast, key=lambda m: m.us).candidate
        chosen[size] = best
    return Selection(world_size, sizes, chosen, measurements)


def record_path() -> str:
    from ..settings import cache_dir

    return os.path.join(cache_dir(), "comm-selection.json")


def write_record(selection: Selection, vllm_version: str, device_names: list[str]) -> str:
    """The last start-up choice, for ``vllm-k2 doctor`` (atomic; rank 0 writes it)."""
    from ..fileio import write_json

    path = record_path()
    write_json(
        path,
        {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "vllm": vllm_version,
            "devices": device_names,
            **selection.to_json(),
        },
    )
    return path


def read_record() -> dict | None:
    try:
        with open(record_path()) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
