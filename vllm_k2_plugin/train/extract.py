"""Stage 2, ``extract``: the target's aux hidden states (+ its post-norm final state)
for every prepared sample, through a real vLLM engine, into checksummed shards.

Engine path: speculators 0.3.0's ``VllmHiddenStatesGenerator`` with this plugin's shim
(vLLM 0.16; the shim captures through the model's own SupportsEagle3 path, so the ids
follow vLLM's convention: id i = the residual stream entering layer i, N = after the
last layer). The storage the run needs is printed before it starts, and the run refuses
to start when the disk does not have it. Resumable: samples already in a shard listed
by the manifest are skipped.
"""

from __future__ import annotations

import os
import shutil

from tqdm import tqdm

from ..hf_config import default_aux_layer_ids, read_text_config
from . import shards
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
    log=print,
) -> dict:
    import torch

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
    }
    if manifest["metadata"] not in (None, metadata):
        raise ValueError(f"{out_dir}/{shards.MANIFEST} was written with other settings: {manifest['metadata']}")
    manifest["metadata"] = metadata
    done = {i for s in manifest["shards"] for i in s["samples"]}
    todo = [i for i in range(len(samples)) if i not in done]
    tokens_left = sum(len(samples[i]["input_ids"]) for i in todo)
    need = storage_bytes(tokens_left, hidden, len(layer_ids))
    log(
        f"extract: {len(todo)} of {len(samples)} samples, {tokens_left} tokens, aux layers {layer_ids} + final "
        f"-> {human(need)} ({(len(layer_ids) + 1) * hidden * BYTES_PER_VALUE} B/token)"
    )
    check_space(out_dir, need)
    if not todo:
        return manifest

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
        for start in tqdm(range(0, len(todo), batch_size), desc="extract", unit="batch"):
            if stop_after_shards is not None and written >= stop_after_shards:
                break
            idx = todo[start : start + batch_size]
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
            shards.write_shard(out_dir, manifest, batch)
            written += 1
    finally:
        gen.executor.shutdown()
    return manifest
