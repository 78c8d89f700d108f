"""Patch ``tp-pcie-oneshot-allreduce``: vLLM's own custom all-reduce (one-shot at small
sizes) for tensor parallelism over more than two GPUs without NVLink, per message size
where the start-up check measured it correct and faster than NCCL.

Why: on such nodes vLLM keeps every all-reduce on NCCL. ``CustomAllreduce.__init__``
returns early for ``world_size > 2`` unless NVML reports full NVLink, and
``should_custom_ar`` passes only for 2 ranks or fully connected ones; the C++ dispatch
launches nothing for > 2 ranks that are not "fully connected". Our users' TP-8 step on
8 PCIe GPUs spends 51.5 % in all-reduce (~50 µs each for 14 KiB); a one-shot P2P
all-reduce of 14 KiB was measured at ~12 µs on that hardware class
(../shared/research/pcie-allreduce.md, published numbers).

How: during ``CustomAllreduce.__init__`` of a > 2-rank group the platform reports the
GPUs as connected, so vLLM runs its own P2P check, builds its IPC buffers and hands its
C++ side "fully connected" (the dispatch then runs the one-stage kernel below 256 KiB
at 8 ranks). The Python object keeps ``fully_connected = False`` and stays disabled
until ``CudaCommunicator.__init__`` has run the start-up check (measure.py) on every
rank; ``should_custom_ar`` then admits exactly the sizes the check chose. Nothing
changes for 2 ranks, NVLink nodes, or where NCCL measured faster.

FlashInfer's PCIe-IPC all-reduce (vLLM >= 0.30, opt-in ``VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=1``,
FlashInfer >= 0.7) joins the same selection: vLLM sets it up in kernel warm-up, after the
check above, so once its ``setup`` has run the check runs again with three candidates,
side by side, and its ``should_use`` admits exactly the sizes it won. Its module imports
FlashInfer, which starts CUDA: it is wrapped only once vLLM itself has imported it, in a
worker (never at register time).
"""

from __future__ import annotations

import dataclasses

from ..log import get_logger
from ..patching import REGISTRY, PatchContext, scope
from ..settings import ENV_PCIE_ALLREDUCE, pcie_allreduce_enabled
from .selection import FLASHINFER_PCIE_IPC

CA_MODULE = "vllm.distributed.device_communicators.custom_all_reduce"
COMM_MODULE = "vllm.distributed.device_communicators.cuda_communicator"
FI_MODULE = "vllm.distributed.device_communicators.flashinfer_pcie_ipc_all_reduce"
#: Set on a CustomAllreduce whose PCIe gate we lifted; its selection once measured.
STATE = "_vllm_k2_pcie"
PATCH_NAME = "tp-pcie-oneshot-allreduce"
ONESHOT = "oneshot"


@dataclasses.dataclass
class PcieState:
    selection: object = None  # selection.Selection once the start-up check ran
    refused: str = ""  # why the check left everything on NCCL
    comm: object = None  # the CudaCommunicator, where FlashInfer PCIe-IPC is to join later


def logger():
    return get_logger("comm")


def _group_of(args, kwargs):
    return kwargs["group"] if "group" in kwargs else args[0]


def _wrap_ca_init(original):
    def __init__(self, *args, **kwargs):
        import torch.distributed as dist
        from vllm.platforms import current_platform

        group = _group_of(args, kwargs)
        # vLLM's own 2-rank path, unchanged; vLLM's current config (the worker's, at device
        # init) says which model the group serves
        if dist.get_world_size(group=group) <= 2 or not scope.acts(PATCH_NAME, None):
            return original(self, *args, **kwargs)
        seen = {}
        stock = current_platform.is_fully_connected

        def report_connected(ids, *a, **kw):
            seen["nvlink"] = stock(ids, *a, **kw)
            return True

        current_platform.is_fully_connected = report_connected  # this call only
        try:
            original(self, *args, **kwargs)
        finally:
            del current_platform.is_fully_connected  # the class's method again
        if seen.get("nvlink") is False and not self.disabled:
            self.fully_connected = False  # every Python gate of vLLM sees the truth
            self.disabled = True  # until the start-up check has chosen sizes
            self.__dict__[STATE] = PcieState()

    return __init__


def _wrap_should_custom_ar(original):
    def should_custom_ar(self, inp):
        state = self.__dict__.get(STATE)
        if state is None:
            return original(self, inp)
        if self.disabled or state.selection is None:
            return False
        import importlib

        import torch

        nbytes = inp.numel() * inp.element_size()
        return (
            inp.dtype in (torch.bfloat16, torch.float16, torch.float32)
            and nbytes % 16 == 0
            and nbytes < self.max_size
            and importlib.import_module(CA_MODULE).is_weak_contiguous(inp)
            and state.selection.path_for(nbytes) == ONESHOT
        )

    return should_custom_ar


def _wrap_fi_should_use(original):
    def should_use(self, inp):
        state = self.__dict__.get(STATE)
        if state is None:
            return original(self, inp)
        selection = state.selection
        if selection is None or not self.initialized:
            return False
        return selection.path_for(inp.numel() * inp.element_size()) == FLASHINFER_PCIE_IPC and original(self, inp)

    return should_use


def _wrap_fi_setup(original):
    def setup(self, *args, **kwargs):
        original(self, *args, **kwargs)
        state = self.__dict__.get(STATE)
        if state is None or not self.initialized:
            return
        try:
            choose_paths(state.comm, state.comm.ca_comm, state, fi=self)
        except Exception as e:  # noqa: BLE001 - never take the engine down: the earlier choice serves
            self.disabled = True  # vLLM's dispatch skips it: one-shot / NCCL as chosen before
            logger().warning(
                "vllm-k2: tp-pcie-oneshot-allreduce: the check with FlashInfer PCIe-IPC failed (%s: %s); "
                "FlashInfer PCIe-IPC off, the start-up choice stands",
                type(e).__name__,
                e,
            )

    return setup


def join_flashinfer(ctx: PatchContext, comm, state: PcieState) -> bool:
    """Let vLLM's FlashInfer PCIe-IPC all-reduce of ``comm`` (if the user enabled it and
    vLLM kept it) join the selection: its class wrapped (once per process: vLLM has
    imported its module by now), this instance tied to ``state``."""
    import sys

    fi = getattr(comm, "fi_pcie_ipc_ar_comm", None)
    module = sys.modules.get(FI_MODULE)
    if fi is None or fi.disabled or module is None:
        return False
    cls = module.FlashInferPcieIpcAllReduce
    ctx.wrap(cls, "setup", _wrap_fi_setup)
    ctx.wrap(cls, "should_use", _wrap_fi_should_use)
    state.comm = comm
    fi.__dict__[STATE] = state
    return True


def choose_paths(comm, ca, state: PcieState, fi=None) -> None:
    """The start-up check on every rank of ``comm``'s group; enables ``ca`` for the sizes
    it chose (and ``fi``, FlashInfer's PCIe-IPC path once set up, where it won). Every
    outcome but a measured win leaves vLLM on NCCL, said in one line."""
    import torch
    from vllm import __version__ as vllm_version

    from .measure import FlashInferPcieIpc, Nccl, OneShot, Ranks, measure
    from .selection import choose, write_record
    from .sizes import engine_message_sizes

    log = logger()
    pynccl = getattr(comm, "pynccl_comm", None)
    if pynccl is None or getattr(pynccl, "disabled", False):
        state.refused = "no NCCL communicator to measure against"
        log.warning("vllm-k2: tp-pcie-oneshot-allreduce: %s; all-reduce stays on NCCL", state.refused)
        return
    ranks = Ranks(comm.cpu_group, comm.rank_in_group, comm.world_size, comm.device)
    # at kernel warm-up the engine config may be out of context: FlashInfer knows the hidden size
    sizes, note = engine_message_sizes(comm.world_size, hidden=fi.hidden_dim if fi is not None else None)
    candidates = [Nccl(pynccl), OneShot(ca)] + ([FlashInferPcieIpc(fi)] if fi is not None else [])
    with torch.inference_mode():
        measurements = measure(ranks, candidates, sizes)
    selection = choose(comm.world_size, measurements)
    state.selection = selection
    ca.disabled = not selection.uses(ONESHOT)
    if ranks.rank == 0:
        refused = [f"{m.candidate} {m.nbytes} B: {m.why}" for m in measurements if not m.ok]
        log.info(
            "vllm-k2: TP all-reduce over PCIe, measured at start-up (%s; µs per all-reduce in a CUDA graph, "
            "slowest rank): %s%s",
            note,
            selection.table(),
            f"; refused: {'; '.join(refused)}" if refused else "",
        )
        try:
            names = [torch.cuda.get_device_name(comm.device)] * comm.world_size
            write_record(selection, vllm_version, names)
        except OSError as e:  # the record is for doctor only: serving goes on
            log.warning("vllm-k2: could not write the all-reduce selection record: %s", e)


def _wrap_comm_init(ctx: PatchContext):
    def make(original):
        def __init__(self, *args, **kwargs):
            original(self, *args, **kwargs)
            ca = getattr(self, "ca_comm", None)
            state = ca.__dict__.get(STATE) if ca is not None else None
            if state is None:
                return
            try:
                choose_paths(self, ca, state)
            except Exception as e:  # noqa: BLE001 - never take the engine down: NCCL serves
                ca.disabled = True
                state.selection, state.refused = None, f"{type(e).__name__}: {e}"
                logger().warning(
                    "vllm-k2: tp-pcie-oneshot-allreduce: start-up check failed (%s); all-reduce stays on NCCL",
                    state.refused,
                )
            try:
                join_flashinfer(ctx, self, state)
            except Exception as e:  # noqa: BLE001 - FlashInfer PCIe-IPC then serves as vLLM would have it
                logger().warning(
                    "vllm-k2: tp-pcie-oneshot-allreduce: FlashInfer PCIe-IPC cannot join the measured selection "
                    "(%s: %s); vLLM's own dispatch decides its sizes",
                    type(e).__name__,
                    e,
                )

        return __init__

    return make


def _not_wanted() -> str | None:
    return None if pcie_allreduce_enabled() else f"off by default ({ENV_PCIE_ALLREDUCE}=1 turns it on)"


def _upstream_takes_pcie_ranks() -> bool:
    """Ask stock ``should_custom_ar`` for one K2.5 token (14 KiB bf16) on 8 ranks of one
    node that are not fully connected: upstream routes it off NCCL if it says yes.
    ``mnnvl_only=False`` (all ranks on one node): vLLM 0.34's gate reads it, 0.32's does not.
    ``pcie_max_size``: what the staged patch file (patches/vllm-0.34.0/0004-...) sets once its
    start-up check passed, from its opt-in ``VLLM_CUSTOM_ALLREDUCE_PCIE_MAX_SIZE`` (0 where
    vLLM has no such setting or it is unset: the twin stays)."""
    import importlib

    import torch
    import vllm.envs as envs

    cls = importlib.import_module(CA_MODULE).CustomAllreduce
    probe = cls.__new__(cls)
    probe.__dict__.update(
        disabled=False,
        world_size=8,
        rank=0,
        fully_connected=False,
        mnnvl_only=False,
        max_size=8 * 1024 * 1024,
        batch_invariant=False,
        _IS_CAPTURING=False,
        _ptr=0,  # _ptr: its __del__ frees nothing
        pcie_max_size=getattr(envs, "VLLM_CUSTOM_ALLREDUCE_PCIE_MAX_SIZE", 0),
    )
    return bool(cls.should_custom_ar(probe, torch.empty(7168, dtype=torch.bfloat16)))


@REGISTRY.patch(
    name=PATCH_NAME,
    feature="comm",
    target=f"{CA_MODULE}:CustomAllreduce.should_custom_ar",
    applies_to=">=0.16,<0.35",
    only_if=_not_wanted,
    already_upstream=_upstream_takes_pcie_ranks,
    upstream="none merged (vllm PRs #22392, #39040, #39633 tried; tracked in vllm issue #37113)",
    why="vLLM keeps every TP all-reduce on NCCL for > 2 GPUs without NVLink (~50 µs each at 14 KiB on the users' rig)",
    remove_when=(
        "stock should_custom_ar routes a 14 KiB all-reduce of 8 PCIe ranks off NCCL (the probe sees it), "
        "or vLLM's own FlashInfer PCIe-IPC path (>= 0.30, opt-in) is measured faster on the users' rig"
    ),
)
def _apply(ctx: PatchContext) -> None:
    import importlib

    ctx.target()
    ca_cls = importlib.import_module(CA_MODULE).CustomAllreduce
    comm_cls = importlib.import_module(COMM_MODULE).CudaCommunicator
    ctx.wrap(ca_cls, "__init__", _wrap_ca_init)
    ctx.wrap(ca_cls, "should_custom_ar", _wrap_should_custom_ar)
    ctx.wrap(comm_cls, "__init__", _wrap_comm_init(ctx))
