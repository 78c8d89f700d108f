"""Stand-ins for a machine that has one GPU: several tensor-parallel ranks share it
(benchmarks/comm_shared_gpu.py). Loaded through VLLM_K2_EXTRA_PATCH_MODULES.

vLLM's P2P check asks ``torch.cuda.can_device_access_peer(rank, i)`` with the rank as a
device index, which does not exist here; IPC between processes on one device needs no
peer access, so the check is answered yes. The platform reports the ranks as not fully
connected, as NVML does for the users' PCIe GPUs. Nothing else of vLLM is replaced.
"""

from vllm_k2_plugin.patching import REGISTRY

MODULE = "vllm.distributed.device_communicators.custom_all_reduce"


def _inject(ctx):
    import importlib

    from vllm.platforms import current_platform

    ctx.replace(importlib.import_module(MODULE), "_can_p2p", lambda rank, world_size: True)
    ctx.replace(type(current_platform), "is_fully_connected", classmethod(lambda cls, ids: False))


REGISTRY.patch(
    name="test-comm-shared-gpu",
    feature="tests",
    target=f"{MODULE}:_can_p2p",
    applies_to=">=0.1",
    upstream="n/a (test fixture)",
    why="several TP ranks on the one lent H200: no peer devices to check",
    remove_when="never (test only)",
)(_inject)
