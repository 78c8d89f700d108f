"""A spool producer without an engine, for the streaming tests that kill and restart it
many times: it replays the shards of a finished extraction into a spool through the same
code extraction uses (``shards.write_shard`` with ``spool.Budget``), resuming from the
spool's manifest. (The engine-backed producer is ``vllm-k2 train extract --spool-bytes``.)

    python spool_replay_job.py SOURCE_DIR SPOOL_DIR BUDGET_BYTES
"""

import os
import sys

from vllm_k2_plugin import fileio
from vllm_k2_tools.train import shards, spool


def main(source: str, spool_dir: str, budget_bytes: int) -> None:
    src = shards.ShardReader(source)
    os.makedirs(spool_dir, exist_ok=True)
    manifest = shards.load_manifest(spool_dir)
    manifest["metadata"] = {**src.metadata, "num_samples": len(src), "passes": 1}
    spool.clean_unlisted(spool_dir, manifest)
    budget = spool.Budget(spool_dir, budget_bytes, poll_s=0.05)
    fileio.write_json(os.path.join(spool_dir, shards.MANIFEST), manifest)
    for s in range(len(manifest["shards"]), len(src.manifest["shards"])):
        rows = [src.row(s, j) for j in range(len(src.manifest["shards"][s]["samples"]))]
        shards.write_shard(spool_dir, manifest, rows, budget.make_room, **{"pass": 0})
    manifest["complete"] = True
    fileio.write_json(os.path.join(spool_dir, shards.MANIFEST), manifest)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
