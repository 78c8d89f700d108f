"""Open GGUF files safely: shard discovery, truncation checks, streaming dequant."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np

_SHARD = re.compile(r"^(?P<stem>.*)-(?P<idx>\d{5})-of-(?P<total>\d{5})\.gguf$")

#: Types vLLM 0.16's GGUF kernels run (layers/quantization/gguf.py); others must be
#: force-dequantized. F32/F16/BF16 are unquantized.
UNQUANTIZED = {"F32", "F16", "BF16"}
KERNEL_TYPES = {
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q8_0",
    "Q8_1",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
    "IQ1_M",
    "IQ1_S",
    "IQ2_XXS",
    "IQ2_XS",
    "IQ2_S",
    "IQ3_XXS",
    "IQ3_S",
    "IQ4_XS",
    "IQ4_NL",
}


class GGUFLoadError(RuntimeError):
    """A GGUF that cannot be loaded faithfully; names file, tensor or offset."""


def discover_shards(path: str) -> list[str]:
    """All shards of a split GGUF given any one of them (or [path] if unsplit)."""
    name = os.path.basename(path)
    m = _SHARD.match(name)
    if not m:
        if not os.path.isfile(path):
            raise GGUFLoadError(f"{path}: GGUF file not found")
        return [path]
    total = int(m.group("total"))
    folder = os.path.dirname(path)
    shards = [os.path.join(folder, f"{m.group('stem')}-{i:05d}-of-{total:05d}.gguf") for i in range(1, total + 1)]
    missing = [s for s in shards if not os.path.isfile(s)]
    if missing:
        raise GGUFLoadError(f"{path}: split GGUF is missing shard(s) {missing} of {total}")
    return shards


@dataclass
class Tensor:
    name: str
    qtype: str
    shape: tuple[int, ...]
    file: str
    reader_tensor: object


def open_shards(shards: list[str]) -> dict[str, Tensor]:
    """name -> Tensor across shards; checks every tensor lies inside its file."""
    import gguf

    out: dict[str, Tensor] = {}
    for path in shards:
        size = os.path.getsize(path)
        try:
            reader = gguf.GGUFReader(path)
        except Exception as e:  # noqa: BLE001 - gguf-py raises many kinds on bad files
            raise GGUFLoadError(f"{path}: not a readable GGUF ({type(e).__name__}: {e}); truncated or corrupt?") from e
        for t in reader.tensors:
            end = int(t.data_offset) + int(t.n_bytes)
            if end > size:
                raise GGUFLoadError(
                    f"{path}: tensor '{t.name}' needs bytes {t.data_offset}..{end} but the file ends at "
                    f"offset {size}: truncated"
                )
            if t.name in out:
                raise GGUFLoadError(f"{path}: tensor '{t.name}' also appears in {out[t.name].file}")
            shape = tuple(int(d) for d in reversed(t.shape))  # GGUF stores dims innermost-first
            out[t.name] = Tensor(t.name, t.tensor_type.name, shape, path, t)
    return out


#: raw bytes dequantized per step: bounds the transient memory of a load
CHUNK_BYTES = 512 << 10


def dequantize(t: Tensor, dtype, index: int | None = None) -> torch.Tensor:  # noqa: F821
    """One tensor (or, with index, one slice along its first dim, e.g. one expert of a
    merged expert tensor) to a dense torch tensor in `dtype`, written chunk by chunk
    into its final buffer; each chunk's file pages are released once read, so a load
    holds the output plus ~CHUNK_BYTES, never the whole file mapped."""
    import gguf
    import torch

    raw = t.reader_tensor
    data = raw.data if index is None else raw.data[index]
    shape = t.shape if index is None else t.shape[1:]
    rows = data.reshape(-1, data.shape[-1])  # (rows, bytes or columns): a view
    out = torch.empty(shape, dtype=dtype)
    flat = out.view(rows.shape[0], -1)
    base_offset = int(raw.data_offset) + (0 if index is None else index * (int(raw.n_bytes) // t.shape[0]))
    row_bytes = rows.shape[1] * rows.itemsize
    step = max(1, CHUNK_BYTES // max(row_bytes, 1))
    for r0 in range(0, rows.shape[0], step):
        chunk = rows[r0 : r0 + step]
        if t.qtype in ("F32", "F16"):
            values = np.array(chunk, dtype=np.float32)
        else:
            values = gguf.quants.dequantize(chunk, raw.tensor_type)
        flat[r0 : r0 + chunk.shape[0]].copy_(torch.from_numpy(values))
        release_range(raw, base_offset + r0 * row_bytes, chunk.shape[0] * row_bytes)
    return out


def _mmap_of(raw):
    base = raw.data
    while base is not None:
        mm = getattr(base, "_mmap", None)
        if mm is not None:
            return mm
        base = getattr(base, "base", None)
    return None


def release_range(raw, first: int, size: int) -> None:
    """Drop file pages [first, first+size) from our address space (best effort: the
    data stays in the page cache and on disk)."""
    import mmap

    mm = _mmap_of(raw)
    if mm is None or not hasattr(mm, "madvise") or size <= 0:
        return
    page = mmap.PAGESIZE
    start = first // page * page
    end = (first + size) // page * page  # partial pages may hold the next chunk
    if end > start:
        try:
            mm.madvise(mmap.MADV_DONTNEED, start, end - start)
        except (OSError, ValueError):
            pass
