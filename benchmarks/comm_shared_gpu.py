"""The PCIe all-reduce patch's kernels and start-up check with several tensor-parallel
ranks sharing one GPU (the lent H200): vLLM's own CustomAllreduce built through our
patched constructor, its IPC buffers opened by every rank, the one-shot kernel eager and
replayed in CUDA graphs, the start-up check, the selection, and vLLM's
``custom_all_reduce`` entry behind our ``should_custom_ar``.

NCCL refuses two ranks on one device, so the check's "nccl" column here is a stand-in:
the same one-shot kernel through a second, unfaulted CustomAllreduce. Ranks time-slice
the GPU, so times measure nothing about speed; what this proves is correctness (against
a float32 sum, all ranks bitwise equal) at 2, 4 and 8 ranks, inside graphs, and that a
wrong or slow candidate is refused (COMM_FAULT through tests/comm_faults.py).

    python3 benchmarks/comm_shared_gpu.py --out DIR 2 4 8 4:wrong 4:slow
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
K25_TOKEN = 7168 * 2  # bytes of one Kimi-K2.5 token's hidden state, bf16


def sizes_for(world: int) -> list[int]:
    from vllm_k2_plugin.comm.sizes import message_sizes

    return message_sizes(world, 7168, 2, [1, 2, 4, 8, 16, 32])


def worker(rank: int, world: int, port: int, result_path: str, fault: str) -> None:
    os.environ["VLLM_K2_EXTRA_PATCH_MODULES"] = "tests.comm_shared_gpu" + (",tests.comm_faults" if fault else "")
    # the patch is opt-in, and these ranks serve no model for its model gate to ask about
    os.environ["VLLM_K2_PCIE_ALLREDUCE"] = os.environ["VLLM_K2_ANY_MODEL"] = "1"
    if fault:
        os.environ["COMM_FAULT"] = fault
    import torch
    import torch.distributed as dist

    import vllm_k2_plugin
    from vllm_k2_plugin.patching import REGISTRY

    vllm_k2_plugin.register()
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    from vllm.distributed.device_communicators.custom_all_reduce import CustomAllreduce

    from vllm_k2_plugin.comm.measure import Candidate, OneShot, Ranks, measure
    from vllm_k2_plugin.comm.patch import ONESHOT, STATE
    from vllm_k2_plugin.comm.selection import NCCL, choose

    device = torch.device("cuda:0")
    ca = CustomAllreduce(group=dist.group.WORLD, device=device)
    reference = CustomAllreduce(group=dist.group.WORLD, device=device)

    class StandIn(Candidate):  # the "nccl" column: an unfaulted one-shot (see the docstring)
        name = NCCL

        def run(self, inp):
            return reference.all_reduce(inp, registered=False)

        def graph_run(self, inp):
            return reference.all_reduce(inp, registered=True)

        def after_capture(self):
            reference.register_graph_buffers()

    state = ca.__dict__.get(STATE)
    result = {
        "rank": rank,
        "world": world,
        "fault": fault,
        "patch": REGISTRY["tp-pcie-oneshot-allreduce"].state.value,
        "gate_lifted": state is not None,
        "disabled_before_check": ca.disabled,
        "python_fully_connected": ca.fully_connected,
    }
    ranks = Ranks(dist.group.WORLD, rank, world, device)
    sizes = sizes_for(world)
    t0 = time.time()
    with torch.inference_mode():
        measurements = measure(ranks, [StandIn(), OneShot(ca)], sizes, reps=4, replays=2)
    selection = choose(world, measurements)
    result["check_s"] = round(time.time() - t0, 1)
    result["selection"] = selection.to_json()
    result["table"] = selection.table()
    # vLLM's own entry point behind our should_custom_ar, as serving calls it
    if state is not None:
        state.selection = selection
        ca.disabled = not selection.uses(ONESHOT)
    entry = {}
    with torch.inference_mode():
        for nbytes in sizes:
            x = torch.full((nbytes // 2,), float(rank + 1), dtype=torch.bfloat16, device=device)
            reduced = ca.custom_all_reduce(x)
            want = world * (world + 1) / 2
            entry[nbytes] = None if reduced is None else bool((reduced.float() == want).all().item())
    torch.cuda.synchronize()
    result["custom_all_reduce"] = entry  # size -> None (NCCL's turn) or "equals the sum"
    dist.barrier()
    if rank == 0:
        Path(result_path).write_text(json.dumps(result, indent=1))
    dist.destroy_process_group()


def run(world: int, fault: str, out_dir: Path) -> dict:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = out_dir / f"tp{world}{'-' + fault if fault else ''}.json"
    t0 = time.time()
    try:
        mp.spawn(worker, args=(world, port, str(out), fault), nprocs=world, join=True)
        res = json.loads(out.read_text())
    except Exception as e:  # noqa: BLE001 - recorded: a run that broke is a result too
        res = {"world": world, "fault": fault, "error": f"{type(e).__name__}: {e}"[-2000:]}
    res["wall_s"] = round(time.time() - t0, 1)
    out.write_text(json.dumps(res, indent=1))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("runs", nargs="+", help="WORLD or WORLD:FAULT (wrong|slow)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(REPO))
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    summary = {"command": " ".join(["python3", *sys.argv]), "date": date, "runs": []}
    for spec in a.runs:
        world, _, fault = spec.partition(":")
        res = run(int(world), fault, a.out)
        summary["runs"].append(res)
        name = f"tp{world}{':' + fault if fault else ''}"
        entry, lifted = res.get("custom_all_reduce"), res.get("gate_lifted")
        print(
            f"RUN {name}: {res.get('table') or res.get('error')} entry={entry} gate_lifted={lifted} {res['wall_s']} s"
        )
    (a.out / "summary.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
