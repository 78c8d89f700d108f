"""``vllm-k2 doctor --comm [--tp N]``: can this node's GPUs all-reduce fast for tensor
parallelism? Per GPU pair the P2P status and link (NVML), each GPU's NUMA node, the NCCL
settings in effect with what to change, the last engine's start-up selection, and,
with two GPUs or more, the start-up check itself run across N local GPUs through vLLM's
own distributed init (so the row it prints is the one an engine would choose).
"""

from __future__ import annotations

import os

#: NCCL variables that decide small all-reduces over PCIe (../shared/research/pcie-allreduce.md).
NCCL_VARS = (
    "NCCL_P2P_LEVEL",
    "NCCL_PROTO",
    "NCCL_ALGO",
    "NCCL_GRAPH_FILE",
    "NCCL_P2P_DISABLE",
    "NCCL_SHM_DISABLE",
    "NCCL_NVLS_ENABLE",
    "NCCL_IB_DISABLE",
)
ADVICE = (
    "untuned NCCL over PCIe was published at ~45-56 us for 4-16 KiB on 8 GPUs and ~20-26 us tuned: "
    "try NCCL_P2P_LEVEL=SYS NCCL_PROTO=LL (or an NCCL_GRAPH_FILE for your topology), then compare the rows below"
)


def topology() -> dict:
    """NVML: GPUs, their NUMA nodes, and per pair the P2P read status and common ancestor."""
    try:
        import pynvml
    except ImportError:
        from vllm.third_party import pynvml  # the copy vLLM ships

    pynvml.nvmlInit()
    try:
        n = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        gpus = []
        for i, h in enumerate(handles):
            bus = pynvml.nvmlDeviceGetPciInfo(h).busId
            bus = bus.decode() if isinstance(bus, bytes) else bus
            gpus.append({"index": i, "name": pynvml.nvmlDeviceGetName(h), "bus": bus, "numa": _numa_node(bus)})
        levels = {v: k for k, v in vars(pynvml).items() if k.startswith("NVML_TOPOLOGY_")}
        pairs = []
        for i in range(n):
            for j in range(i + 1, n):
                p2p = pynvml.nvmlDeviceGetP2PStatus(handles[i], handles[j], pynvml.NVML_P2P_CAPS_INDEX_READ)
                link = pynvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
                nvlink = pynvml.nvmlDeviceGetP2PStatus(handles[i], handles[j], pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
                pairs.append(
                    {
                        "pair": (i, j),
                        "p2p_read": p2p == pynvml.NVML_P2P_STATUS_OK,
                        "nvlink": nvlink == pynvml.NVML_P2P_STATUS_OK,
                        "link": levels.get(link, str(link)).removeprefix("NVML_TOPOLOGY_"),
                    }
                )
        return {"gpus": gpus, "pairs": pairs}
    finally:
        pynvml.nvmlShutdown()


def _numa_node(bus_id: str) -> int | None:
    path = f"/sys/bus/pci/devices/{bus_id.lower()[-12:]}/numa_node"
    try:
        with open(path) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def _measure_worker(rank: int, world: int, port: int, queue) -> None:
    """One TP rank through vLLM's own init: CudaCommunicator runs the patched start-up check."""
    import torch

    import vllm_k2_plugin

    vllm_k2_plugin.register()
    torch.cuda.set_device(rank)
    from vllm.distributed.parallel_state import (
        get_tp_group,
        init_distributed_environment,
        initialize_model_parallel,
    )

    init_distributed_environment(world, rank, f"tcp://127.0.0.1:{port}", rank, "nccl")
    initialize_model_parallel(tensor_model_parallel_size=world)
    from .patch import STATE

    comm = get_tp_group().device_communicator
    ca = comm.ca_comm
    state = ca.__dict__.get(STATE) if ca is not None else None
    fi = getattr(comm, "fi_pcie_ipc_ar_comm", None)
    if state is not None and fi is not None and not fi.disabled:
        set_up_flashinfer(fi, world)  # as vLLM's kernel warm-up does; the check runs again with it
    if rank == 0:
        if state is None:
            queue.put("vLLM's own choice stands (2 ranks, NVLink, or its custom all-reduce refused these GPUs)")
        elif state.selection is None:
            queue.put(f"stays on NCCL: {state.refused}")
        else:
            queue.put(state.selection.table())


def flashinfer_pcie_ipc_available() -> bool:
    """vLLM has the FlashInfer PCIe-IPC wrapper (>= 0.30) and FlashInfer is installed
    (found, not imported: importing it starts CUDA in this process)."""
    import importlib.util

    from .patch import FI_MODULE

    try:
        return importlib.util.find_spec(FI_MODULE) is not None and importlib.util.find_spec("flashinfer") is not None
    except ModuleNotFoundError:
        return False


def set_up_flashinfer(fi, world: int) -> None:
    """vLLM's own set-up of its FlashInfer PCIe-IPC all-reduce for K2.5's decode shapes
    (tuning cached next to our records)."""
    from pathlib import Path

    import torch

    from ..settings import cache_dir
    from .sizes import DEFAULT_HIDDEN, DEFAULT_TOKENS

    tune_cache = Path(cache_dir()) / f"flashinfer-pcie-ipc-tune-tp{world}.json"
    fi.setup(hidden_dim=DEFAULT_HIDDEN, dtype=torch.bfloat16, capture_sizes=list(DEFAULT_TOKENS), tune_cache=tune_cache)


def measure(tp: int) -> str:
    import socket

    import torch.multiprocessing as mp

    from ..settings import ENV_ANY_MODEL, ENV_PCIE_ALLREDUCE

    # the measuring workers run the start-up check whatever the user's switch says, and with
    # no engine (no model) for the model gate to ask about
    os.environ[ENV_PCIE_ALLREDUCE], os.environ[ENV_ANY_MODEL] = "1", "1"

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if flashinfer_pcie_ipc_available():  # measured beside the others (vLLM's opt-in, for these workers)
        os.environ.setdefault("VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC", "1")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    mp.start_processes(_measure_worker, args=(tp, port, queue), nprocs=tp, join=True, start_method="spawn")
    return queue.get(timeout=5)


def switch_advice(topo: dict | None, tp: int) -> list[str]:
    """Whether VLLM_K2_PCIE_ALLREDUCE (off by default) is worth switching on for this node."""
    from ..settings import ENV_PCIE_ALLREDUCE, pcie_allreduce_enabled

    state = "on" if pcie_allreduce_enabled() else "off (default)"
    lines = [
        f"{ENV_PCIE_ALLREDUCE}: {state}. The one-shot PCIe all-reduce has not yet been run on PCIe GPUs (only on "
        "ranks sharing one H200), so it is opt-in.",
        f"  Switch it on ({ENV_PCIE_ALLREDUCE}=1) only for tensor parallelism over more than 2 GPUs without "
        "NVLink, every pair with P2P read, and where the rows measured below show one-shot faster than NCCL; "
        "then compare greedy outputs with it off and throughput at your concurrency (published PCIe hazards: a "
        "fused all-reduce without an end barrier corrupted speculative hidden states; one-shot forced on large "
        "messages lost 38 % at 32 concurrent requests).",
    ]
    if topo is not None and topo["pairs"]:
        if all(p["nvlink"] for p in topo["pairs"]):
            lines.append("  here: every pair has NVLink; vLLM's own custom all-reduce serves, leave it off")
        elif any(not p["p2p_read"] for p in topo["pairs"]):
            lines.append("  here: a pair without P2P read; leave it off")
        elif tp <= 2:
            lines.append("  here: TP 2 or less; vLLM's own 2-rank path serves, leave it off")
        else:
            lines.append(f"  here: TP {tp} over PCIe with P2P: a candidate; switch it on if the rows below win")
    return lines


def report(tp: int | None) -> str:
    from .selection import read_record

    lines = ["vllm-k2 doctor --comm", ""]
    try:
        topo = topology()
    except Exception as e:  # noqa: BLE001 - no NVML (no NVIDIA driver): say so, go on
        topo = None
        lines.append(f"NVML: unavailable ({type(e).__name__}: {e})")
    if topo is not None:
        for g in topo["gpus"]:
            lines.append(f"GPU {g['index']}: {g['name']} bus {g['bus']} NUMA node {g['numa']}")
        for p in topo["pairs"]:
            i, j = p["pair"]
            lines.append(
                f"  {i}<->{j}: P2P read {'yes' if p['p2p_read'] else 'NO'}, "
                f"NVLink {'yes' if p['nvlink'] else 'no'}, common ancestor {p['link']}"
            )
        if any(not p["p2p_read"] for p in topo["pairs"]):
            lines.append("  a pair without P2P: the one-shot all-reduce cannot run; engines stay on NCCL")
    lines.append("")
    lines.append(
        "NCCL settings: " + (", ".join(f"{v}={os.environ[v]}" for v in NCCL_VARS if v in os.environ) or "none set")
    )
    if not any(v in os.environ for v in ("NCCL_P2P_LEVEL", "NCCL_PROTO", "NCCL_GRAPH_FILE")):
        lines.append(f"  {ADVICE}")
    lines.append(
        "FlashInfer PCIe-IPC all-reduce (vLLM >= 0.30, FlashInfer >= 0.7): "
        + (
            "installed: measured beside NCCL and the one-shot path below; engines use it only with "
            "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=1"
            if flashinfer_pcie_ipc_available()
            else "not here (this vLLM has no such path, or FlashInfer is not installed)"
        )
    )
    record = read_record()
    lines.append("")
    lines.append(
        f"last engine start-up selection ({record['date']}, vLLM {record['vllm']}): "
        + ", ".join(f"{int(k) // 1024} KiB -> {v}" for k, v in record["chosen"].items())
        if record
        else "last engine start-up selection: none recorded (no TP > 2 engine on GPUs without NVLink has started here)"
    )
    gpus = len(topo["gpus"]) if topo else 0
    want = tp or gpus
    lines += ["", *switch_advice(topo, want)]
    if want < 2 or gpus < want:
        lines.append(
            f"all-reduce latency: not measured ({gpus} GPU(s) visible, TP {want} asked): "
            "NCCL, P2P and the one-shot kernel need two GPUs or more"
        )
    else:
        lines.append(
            f"all-reduce at K2.5's sizes across {want} GPUs, start-up check as an engine runs it "
            f"(µs per all-reduce in a CUDA graph, slowest rank): {measure(want)}"
        )
    return "\n".join(lines)
