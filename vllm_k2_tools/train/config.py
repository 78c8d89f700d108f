"""The training settings (torch-free: the CLI and the recipe read them without loading the
trainer) and the strict value parsing the CLI uses for them."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
#: the layouts an export can be written in, per draft attention; the first is the default
EXPORT_LAYOUTS_BY_ATTENTION = {"llama": ("speculators", "legacy"), "mla": ("mla",)}
EXPORT_LAYOUTS = tuple(x for layouts in EXPORT_LAYOUTS_BY_ATTENTION.values() for x in layouts)


def parse_bool(text: str) -> bool:
    """on/off, true/false, yes/no, 1/0; anything else is an error (never silently False)."""
    v = text.strip().lower()
    if v in TRUE:
        return True
    if v in FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected one of {TRUE + FALSE}, got {text!r}")


_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


def parse_bytes(text) -> int:
    """A byte count: 6000000, 6e6, "6 MB", "1.5GB", "2 TB" (decimal units, as disks are sold)."""
    v = str(text).strip().upper().replace(" ", "")
    num = v.rstrip("KMGTB")
    try:
        n = float(num) * _UNITS[v[len(num) :]]
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(f"expected a byte count such as 6e6 or '3 GB', got {text!r}") from None
    if not n > 0:
        raise argparse.ArgumentTypeError(f"a byte count must be positive, got {text!r}")
    return int(n)


@dataclass
class TrainConfig:
    epochs: float = 1.0
    steps: int | None = None  # overrides epochs
    batch_size: int = 4  # samples per micro-batch per rank
    grad_accum: int = 1
    lr: float = 1e-4
    schedule: str = "cosine"  # or "linear"
    warmup_ratio: float = 0.01
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.0
    max_grad_norm: float = 0.5
    ttt_steps: int = 7
    step_decay: float = 0.8
    max_len: int = 2048
    save_every: int = 100
    keep_checkpoints: int = 2
    seed: int = 0
    shuffle_window: int = 0  # shards shuffled together (train/order.py); 0 = a whole epoch (offline only)
    bf16: bool = True  # autocast on CUDA; CPU runs in float32

    def __post_init__(self):
        if self.schedule not in ("cosine", "linear"):
            raise ValueError(f"TrainConfig.schedule must be 'cosine' or 'linear', not {self.schedule!r}")
        for name in ("batch_size", "grad_accum", "ttt_steps", "save_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be >= 1")
        if self.shuffle_window < 0:
            raise ValueError("TrainConfig.shuffle_window must be >= 0 (0: shuffle a whole epoch)")
