"""Stage 3, ``vocab``: the draft vocabulary, the N most frequent target tokens among
the trained (loss-masked) tokens, as EAGLE-3's ``d2t`` / ``t2d`` maps.

Same rule as speculators and SpecForge: take the top N by (-count, id), pad with the
lowest unseen ids if fewer were seen, sort ascending; ``d2t[i] = kept[i] - i`` (offsets:
target id = draft id + d2t[draft id], what vLLM's ``compute_logits`` adds) and
``t2d[id] = True`` for kept ids (vLLM skips t2d; trainers use it).
"""

from __future__ import annotations

import os
from collections import Counter

import torch

from vllm_k2_plugin import fileio

from .prepare import read_samples

VOCAB_FILE = "vocab.safetensors"


def token_counts(samples: list[dict]) -> Counter:
    counts: Counter = Counter()
    for s in samples:
        counts.update(t for t, m in zip(s["input_ids"], s["loss_mask"], strict=True) if m)
    return counts


def build_maps(counts: Counter, draft_vocab_size: int, target_vocab_size: int) -> dict:
    if draft_vocab_size > target_vocab_size:
        raise ValueError(f"draft vocab {draft_vocab_size} is larger than the target's {target_vocab_size}")
    bad = [t for t in counts if not 0 <= t < target_vocab_size]
    if bad:
        raise ValueError(f"token ids {bad[:5]} are outside the target vocabulary (size {target_vocab_size})")
    ranked = sorted(counts, key=lambda t: (-counts[t], t))[:draft_vocab_size]
    if len(ranked) < draft_vocab_size:
        seen = set(ranked)
        ranked += [t for t in range(target_vocab_size) if t not in seen][: draft_vocab_size - len(ranked)]
    kept = torch.tensor(sorted(ranked), dtype=torch.int64)
    d2t = kept - torch.arange(draft_vocab_size, dtype=torch.int64)
    t2d = torch.zeros(target_vocab_size, dtype=torch.bool)
    t2d[kept] = True
    total = sum(counts.values())
    covered = sum(counts[int(t)] for t in kept)
    return {"d2t": d2t, "t2d": t2d, "coverage": covered / total if total else 0.0, "masked_tokens": total}


def build_vocab(prepared_dir: str, out_dir: str, draft_vocab_size: int, target_vocab_size: int) -> dict:
    from safetensors.torch import save_file

    counts = token_counts(read_samples(prepared_dir))
    maps = build_maps(counts, draft_vocab_size, target_vocab_size)
    freq = torch.zeros(target_vocab_size, dtype=torch.int64)
    for t, c in counts.items():
        freq[t] = c
    os.makedirs(out_dir, exist_ok=True)
    fileio.write_file(
        os.path.join(out_dir, VOCAB_FILE),
        lambda tmp: save_file({"d2t": maps["d2t"], "t2d": maps["t2d"], "token_freq": freq}, tmp),
    )
    report = {
        "draft_vocab_size": draft_vocab_size,
        "target_vocab_size": target_vocab_size,
        "distinct_tokens_seen": len(counts),
        "masked_tokens": maps["masked_tokens"],
        "coverage": maps["coverage"],
    }
    fileio.write_json(os.path.join(out_dir, "vocab.json"), report)
    return report


def load_vocab(vocab_dir: str) -> tuple[torch.Tensor, torch.Tensor]:
    from safetensors.torch import load_file

    path = os.path.join(vocab_dir, VOCAB_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} does not exist: run `vllm-k2 train vocab` first")
    t = load_file(path)
    d2t, t2d = t["d2t"], t["t2d"]
    kept = d2t + torch.arange(len(d2t))
    if int(t2d.sum()) != len(d2t) or not bool(t2d[kept].all()):
        raise ValueError(f"{path}: d2t and t2d disagree (t2d has {int(t2d.sum())} ids, d2t {len(d2t)})")
    return d2t, t2d
