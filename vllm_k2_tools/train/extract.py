"""Stage 2, ``extract``: the target's aux hidden states (+ its post-norm final state)
for every prepared sample, through a real vLLM engine, into checksummed shards.

Engine path: speculators 0.3.0's ``VllmHiddenStatesGenerator`` with this plugin's shim
(vLLM 0.16; the shim captures through the model's own SupportsEagle3 path, so the ids
follow vLLM's convention: id i = the residual stream entering layer i, N = after the
last layer). The storage the run needs is printed before it starts, and the run refuses
to start when the disk does not have it. Resumable: the shards are a fixed sequence
(``passes`` x the samples in batches, in order), and the manifest lists those written.

Streaming (``spool_bytes``): the output directory is a spool (``spool.py``) that training
drains; a shard is written only when it fits the budget, so the disk holds at most
``spool_bytes`` of shards. ``passes`` > 1 re-extracts every sample once per epoch.
"""

from __future__ import annotations

import os
import shutil

from tqdm import tqdm

from vllm_k2_plugin import fileio
from vllm_k2_plugin.hf_config import default_aux_layer_ids, read_text_config

from . import shards, spool
from .prepare import read_samples

BYTES_PER_VALUE = 2  # stored as bf16, as a K2.5 engine produces them


def storage_bytes(tokens: int, hidden: int, num_aux: int) -> int:
    """aux states + the final state per token: K2.5 -> (3 + 1) * 7168 * 2 = 57,344 B/token."""
    return tokens * (num_aux + 1) * hidden * BYTES_PER_VALUE


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"


class NotEnoughSpace(RuntimeError):
    pass


def check_space(out_dir: str, need: int) -> None:
    probe = out_dir
    while not os.path.exists(probe):
        probe = os.path.dirname(probe) or "."
    free = shutil.disk_usage(probe).free
    if free < need * 1.05:
        raise NotEnoughSpace(
            f"extract needs {human(need)} (+5 %) under {out_dir}, only {human(free)} free: "
            "free space, pick another --out, or extract fewer samples"
        )


def extract(
    model: str,
    prepared_dir: str,
    out_dir: str,
    layer_ids: list[int] | None = None,
    batch_size: int = 8,
    max_model_len: int = 2048,
    tensor_parallel_size: int = 1,
    dtype: str = "auto",
    stop_after_shards: int | None = None,
    spool_bytes: int | None = None,
    passes: int = 1,
    poll_s: float = 0.5,
    log=print,
) -> dict:
    import torch

    if passes < 1:
        raise ValueError(f"extract: passes must be >= 1, got {passes}")
    if passes > 1 and not spool_bytes:
        raise ValueError("extract: passes > 1 re-extracts per epoch, which only streaming needs (give spool_bytes)")
    samples = read_samples(prepared_dir)
    text = read_text_config(model)
    n_layers, hidden = int(text["num_hidden_layers"]), int(text["hidden_size"])
    layer_ids = list(layer_ids) if layer_ids else default_aux_layer_ids(n_layers)
    longest = max(len(s["input_ids"]) for s in samples)
    if longest >= max_model_len:
        raise ValueError(f"{prepared_dir}: a sample has {longest} tokens, max_model_len is {max_model_len}")
    os.makedirs(out_dir, exist_ok=True)
    manifest = shards.load_manifest(out_dir)
    metadata = {
        "model": os.path.abspath(model),
        "prepared": os.path.abspath(prepared_dir),
        "layer_ids": layer_ids,
        "convention": "vllm-eagle3: id i = residual stream entering target layer i (N = after the last layer)",
        "final": "post-norm (the target LM head's input)",
        "hidden_size": hidden,
        "num_hidden_layers": n_layers,
        "num_samples": len(samples),
        "dtype": "bfloat16",
        "batch_size": batch_size,  # the shard sequence depends on it: a resume must keep it
        "passes": passes,
    }
    if manifest["metadata"] not in (None, metadata):
        raise ValueError(f"{out_dir}/{shards.MANIFEST} was written with other settings: {manifest['metadata']}")
    manifest["metadata"] = metadata
    plan = [
        (p, list(range(len(samples)))[i : i + batch_size])
        for p in range(passes)
        for i in range(0, len(samples), batch_size)
    ]
    todo = plan[len(manifest["shards"]) :]
    tokens_left = sum(len(samples[i]["input_ids"]) for _, idx in todo for i in idx)
    need = storage_bytes(tokens_left, hidden, len(layer_ids))
    log(
        f"extract: {len(todo)} of {len(plan)} shards, {tokens_left} tokens, aux layers {layer_ids} + final "
        f"-> {human(need)} ({(len(layer_ids) + 1) * hidden * BYTES_PER_VALUE} B/token)"
        + (f"; streaming into a spool of at most {human(spool_bytes)}" if spool_bytes else "")
    )
    check_space(out_dir, min(need, spool_bytes) if spool_bytes else need)
    budget = None
    if spool_bytes:
        spool.clean_unlisted(out_dir, manifest)
        budget = spool.Budget(out_dir, spool_bytes, poll_s, log)
    if not todo:
        manifest["complete"] = True
        fileio.write_json(os.path.join(out_dir, shards.MANIFEST), manifest)
        return manifest
    fileio.write_json(os.path.join(out_dir, shards.MANIFEST), manifest)  # training can read the metadata now

    from speculators.data_generation.vllm_hidden_states_generator import VllmHiddenStatesGenerator

    from vllm_k2_plugin.speculators_compat import enable

    enable()  # the shim on vLLM 0.16

    gen = VllmHiddenStatesGenerator(
        model,
        layer_ids=layer_ids,
        max_model_len=max_model_len,
        tensor_parallel_size=tensor_parallel_size,
        dtype=dtype,
    )
    try:
        written = 0
        for pass_no, idx in tqdm(todo, desc="extract", unit="shard"):
            if stop_after_shards is not None and written >= stop_after_shards:
                break
            rows = gen.generate([samples[i]["input_ids"] for i in idx])
            batch = []
            for i, row in zip(idx, rows, strict=True):
                states = row["hidden_states"]
                if len(states) != len(layer_ids) + 1:
                    raise RuntimeError(f"sample {i}: {len(states)} captured states, expected {len(layer_ids) + 1}")
                batch.append(
                    {
                        "index": i,
                        "input_ids": samples[i]["input_ids"],
                        "loss_mask": samples[i]["loss_mask"],
                        "aux": torch.cat([s.float() for s in states[:-1]], dim=-1).to(torch.bfloat16),
                        "final": states[-1].to(torch.bfloat16),
                    }
                )
            shards.write_shard(out_dir, manifest, batch, budget.make_room if budget else None, **{"pass": pass_no})
            written += 1
        else:
            manifest["complete"] = True
            fileio.write_json(os.path.join(out_dir, shards.MANIFEST), manifest)
    finally:
        gen.executor.shutdown()
    return manifest
