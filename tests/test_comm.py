"""Patch ``tp-pcie-oneshot-allreduce`` on the CPU engines: the patch against vLLM's real
communicator classes (it applies, stock refuses > 2 PCIe ranks, our gate admits exactly
the sizes the start-up check chose), the choice per size, the sizes an engine measures,
and the switch. The kernels and the start-up check across ranks ran on the H200
(benchmarks/comm_shared_gpu.py; results checked in test_comm_results.py).
"""

from __future__ import annotations

import importlib
import importlib.util

import pytest

from vllm_k2_plugin.comm.selection import NCCL, Measurement, choose
from vllm_k2_plugin.comm.sizes import message_sizes, token_counts

CA_MODULE = "vllm.distributed.device_communicators.custom_all_reduce"
ONESHOT = "oneshot"


def _m(cand, nbytes, ok=True, us=None, why=""):
    return Measurement(cand, nbytes, ok, us, why)


@pytest.mark.vllm_independent
def test_choice_takes_a_correct_candidate_only_where_it_beats_nccl():
    sel = choose(
        8,
        [
            _m(NCCL, 14336, us=50.0),
            _m(ONESHOT, 14336, us=12.0),  # wins
            _m(NCCL, 57344, us=50.0),
            _m(ONESHOT, 57344, us=48.5),  # within the 5 % margin
            _m(NCCL, 114688, us=50.0),
            _m(ONESHOT, 114688, ok=False, why="x"),  # wrong: refused however fast
            _m(NCCL, 229376, us=50.0),
            _m(ONESHOT, 229376, us=90.0),  # slower
        ],
    )
    assert sel.chosen == {14336: ONESHOT, 57344: NCCL, 114688: NCCL, 229376: NCCL}
    assert sel.path_for(16) == ONESHOT and sel.path_for(14336) == ONESHOT
    assert sel.path_for(14337) == NCCL  # the next measured size's choice
    assert sel.path_for(229377) == NCCL  # above every measured size
    assert "x" in sel.table() and "oneshot 12.0" in sel.table()


@pytest.mark.vllm_independent
def test_a_broken_or_untimed_nccl_leaves_stock_behaviour():
    wrong_nccl = choose(4, [_m(NCCL, 14336, ok=False, why="?"), _m(ONESHOT, 14336, us=1.0)])
    untimed = choose(4, [_m(NCCL, 14336, us=None), _m(ONESHOT, 14336, us=1.0)])
    assert wrong_nccl.chosen == {14336: NCCL} and untimed.chosen == {14336: NCCL}
    assert not wrong_nccl.uses(ONESHOT)


@pytest.mark.vllm_independent
def test_k25_sizes_stay_under_the_one_stage_limit():
    # decode batches 1..8 and their k=3 verify batches (4..32 tokens) of 7168 bf16; 256 KiB at 8 ranks
    assert token_counts(8, 3) == [1, 2, 4, 8, 16, 32]
    assert message_sizes(8, 7168, 2, token_counts(8, 3)) == [14336, 28672, 57344, 114688, 229376]
    assert max(message_sizes(4, 7168, 2, token_counts(64, 3))) < 512 * 1024
    assert len(message_sizes(4, 512, 2, list(range(1, 200)))) == 8  # thinned, ends kept
    assert message_sizes(4, 512, 2, list(range(1, 200)))[0] == 1024


def test_sizes_without_an_engine_config_follow_the_hidden_size_given():
    """Out of an engine's config context (doctor; FlashInfer's set-up at kernel warm-up, which
    knows the hidden size): K2.5's token counts at the hidden size given, said in the note."""
    from vllm_k2_plugin.comm.sizes import engine_message_sizes

    sizes, note = engine_message_sizes(8, hidden=4096)
    assert sizes == [8192, 16384, 32768, 65536] and "no engine config: hidden 4096" in note
    assert engine_message_sizes(8)[0] == [14336, 28672, 57344, 114688]


@pytest.fixture(autouse=True)
def _opted_in(monkeypatch):
    """The patch is opt-in; these tests drive it as a user who switched it on would."""
    monkeypatch.setenv("VLLM_K2_PCIE_ALLREDUCE", "1")


@pytest.mark.vllm_independent
def test_switch_is_off_by_default_and_names_its_bad_values(monkeypatch):
    from vllm_k2_plugin.comm.patch import _not_wanted

    monkeypatch.delenv("VLLM_K2_PCIE_ALLREDUCE")
    assert _not_wanted() == "off by default (VLLM_K2_PCIE_ALLREDUCE=1 turns it on)"
    monkeypatch.setenv("VLLM_K2_PCIE_ALLREDUCE", "0")
    assert _not_wanted() == "off by default (VLLM_K2_PCIE_ALLREDUCE=1 turns it on)"
    monkeypatch.setenv("VLLM_K2_PCIE_ALLREDUCE", "maybe")
    with pytest.raises(ValueError, match="VLLM_K2_PCIE_ALLREDUCE='maybe'"):
        _not_wanted()
    monkeypatch.setenv("VLLM_K2_PCIE_ALLREDUCE", "1")
    assert _not_wanted() is None


def test_stock_vllm_keeps_pcie_ranks_on_nccl_and_the_patch_applies():
    """The retire probe on this engine's real class says "not upstream", and the patch
    wraps the three places it names (both engines: 0.16 and latest)."""
    from vllm_k2_plugin.comm.patch import _upstream_takes_pcie_ranks
    from vllm_k2_plugin.patching import REGISTRY, PatchState

    assert _upstream_takes_pcie_ranks() is False
    patch = REGISTRY["tp-pcie-oneshot-allreduce"]
    REGISTRY._apply_one(patch, frozenset()) if patch.state is PatchState.PENDING else None
    assert patch.state is PatchState.APPLIED, patch.reason
    cls = importlib.import_module(CA_MODULE).CustomAllreduce
    assert cls.should_custom_ar.__name__ == "should_custom_ar" and hasattr(cls.should_custom_ar, "__wrapped__")
    assert hasattr(cls.__init__, "__wrapped__")


def _bare_ca(world, fully_connected, state=None, disabled=False):
    cls = importlib.import_module(CA_MODULE).CustomAllreduce
    ca = cls.__new__(cls)
    ca.__dict__.update(
        disabled=disabled,
        world_size=world,
        rank=0,
        fully_connected=fully_connected,
        max_size=8 * 1024 * 1024,
        batch_invariant=False,
        _IS_CAPTURING=False,
        _ptr=0,
    )
    if state is not None:
        from vllm_k2_plugin.comm.patch import STATE

        ca.__dict__[STATE] = state
    return ca


def test_the_gate_admits_exactly_the_chosen_sizes():
    torch = pytest.importorskip("torch")
    from vllm_k2_plugin.comm.patch import PcieState
    from vllm_k2_plugin.patching import REGISTRY, PatchState

    patch = REGISTRY["tp-pcie-oneshot-allreduce"]
    REGISTRY._apply_one(patch, frozenset()) if patch.state is PatchState.PENDING else None
    sel = choose(
        8,
        [_m(NCCL, 14336, us=50.0), _m(ONESHOT, 14336, us=12.0), _m(NCCL, 57344, us=50.0), _m(ONESHOT, 57344, us=60.0)],
    )
    ours = _bare_ca(8, False, PcieState(selection=sel))
    token = torch.empty(7168, dtype=torch.bfloat16)
    assert ours.should_custom_ar(token) is True
    assert ours.should_custom_ar(torch.empty(4 * 7168, dtype=torch.bfloat16)) is False  # NCCL measured faster
    assert ours.should_custom_ar(torch.empty(64 * 7168, dtype=torch.bfloat16)) is False  # above every size
    assert ours.should_custom_ar(torch.empty(7168, dtype=torch.int32)) is False  # the kernel's dtypes only
    assert ours.should_custom_ar(torch.empty(7168 * 2, dtype=torch.bfloat16)[::2]) is False  # strided
    assert _bare_ca(8, False, PcieState()).should_custom_ar(token) is False  # not measured yet
    assert _bare_ca(8, False, PcieState(selection=sel), disabled=True).should_custom_ar(token) is False
    # instances the patch did not touch answer as stock vLLM does
    assert _bare_ca(8, False).should_custom_ar(token) is False
    assert _bare_ca(2, False).should_custom_ar(token) is True
    assert _bare_ca(8, True).should_custom_ar(token) is True


def test_doctor_comm_says_what_it_cannot_measure_here(capsys, monkeypatch, tmp_path):
    """No GPU (CI): the report still names the NCCL settings and what to change, and says
    that latency needs two GPUs; with a recorded start-up selection it shows it."""
    from vllm_k2_plugin.cli import main
    from vllm_k2_plugin.comm.selection import write_record

    monkeypatch.setenv("VLLM_K2_CACHE", str(tmp_path))
    for var in ("NCCL_P2P_LEVEL", "NCCL_PROTO", "NCCL_GRAPH_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("VLLM_K2_PCIE_ALLREDUCE")
    assert main(["doctor", "--comm"]) == 0
    out = capsys.readouterr().out
    assert "NCCL_P2P_LEVEL=SYS NCCL_PROTO=LL" in out and "none recorded" in out
    # when to switch the opt-in path on, and that it has not run on PCIe GPUs yet
    assert "VLLM_K2_PCIE_ALLREDUCE: off (default)" in out and "not yet been run on PCIe GPUs" in out
    assert "more than 2 GPUs without NVLink" in out
    assert "not measured" in out and "need two GPUs or more" in out
    # neither CI engine has FlashInfer installed (0.16 has no such path at all): said, not measured
    assert "FlashInfer PCIe-IPC all-reduce (vLLM >= 0.30, FlashInfer >= 0.7): not here" in out
    write_record(choose(8, [_m(NCCL, 14336, us=50.0), _m(ONESHOT, 14336, us=12.0)]), "0.16.0", ["RTX"] * 8)
    monkeypatch.setenv("NCCL_PROTO", "LL")
    assert main(["doctor", "--comm", "--tp", "8"]) == 0
    out = capsys.readouterr().out
    assert "14 KiB -> oneshot" in out and "NCCL_PROTO=LL" in out and "TP 8 asked" in out


FI_MODULE = "vllm.distributed.device_communicators.flashinfer_pcie_ipc_all_reduce"
FLASHINFER = "flashinfer_pcie_ipc"


class _Workspace:
    """FlashInfer's PcieIpcAllReduceWorkspace cannot exist without GPUs and FlashInfer 0.7:
    this answers its one capability question (tokens up to ``max_tokens``)."""

    def __init__(self, max_tokens=8):
        self.max_tokens = max_tokens

    def supports(self, inp):
        return inp.shape[0] <= self.max_tokens


def _applied_patch():
    from vllm_k2_plugin.patching import REGISTRY, PatchState

    patch = REGISTRY["tp-pcie-oneshot-allreduce"]
    REGISTRY._apply_one(patch, frozenset()) if patch.state is PatchState.PENDING else None
    assert patch.state is PatchState.APPLIED, patch.reason
    return patch


def _bare_fi(**attrs):
    """vLLM's own FlashInferPcieIpcAllReduce as its kernel warm-up leaves it: set up."""
    import torch

    cls = importlib.import_module(FI_MODULE).FlashInferPcieIpcAllReduce
    fi = cls.__new__(cls)
    fi.__dict__.update(
        disabled=False,
        workspace=_Workspace(),
        hidden_dim=7168,
        dtype=torch.bfloat16,
        device=torch.device("cpu"),
        world_size=8,
        rank=0,
    )
    fi.__dict__.update(attrs)
    return fi


@pytest.mark.vllm_latest
def test_flashinfer_pcie_ipc_joins_the_selection_where_vllm_offers_it():
    """vLLM >= 0.30: an engine's FlashInfer PCIe-IPC all-reduce is tied to the measured
    selection (its class wrapped once, recorded, undone with the patch); its gate admits
    exactly the sizes where it won, the one-shot gate leaves them to it, and before the
    check with it has run it takes nothing."""
    import types

    import torch

    from vllm_k2_plugin.comm.patch import STATE, PcieState, _wrap_fi_should_use, join_flashinfer
    from vllm_k2_plugin.patching.patch import PatchContext

    patch = _applied_patch()
    cls = importlib.import_module(FI_MODULE).FlashInferPcieIpcAllReduce
    ctx = PatchContext(patch, "latest")
    fi, state = _bare_fi(), PcieState()
    comm = types.SimpleNamespace(fi_pcie_ipc_ar_comm=fi)
    assert join_flashinfer(ctx, comm, state) is True
    assert fi.__dict__[STATE] is state and state.comm is comm
    assert hasattr(cls.should_use, "__wrapped__") and hasattr(cls.setup, "__wrapped__")
    assert join_flashinfer(ctx, comm, state) is True  # a second engine in the process: no double wrap
    assert cls.should_use.__wrapped__.__module__ == FI_MODULE
    assert {(owner, attr) for kind, owner, attr, *_ in patch.replaced if owner is cls} == {
        (cls, "setup"),
        (cls, "should_use"),
    }
    # vLLM's own answer needs CUDA tensors; our gate is checked around a stand-in "yes"
    gate = _wrap_fi_should_use(lambda self, inp: True)
    token = torch.empty(1, 7168, dtype=torch.bfloat16)
    assert gate(fi, token) is False  # not measured yet: vLLM's other paths serve
    state.selection = choose(
        8,
        [
            _m(NCCL, 14336, us=50.0),
            _m(ONESHOT, 14336, us=20.0),
            _m(FLASHINFER, 14336, us=12.0),
            _m(NCCL, 57344, us=50.0),
            _m(ONESHOT, 57344, us=30.0),
            _m(FLASHINFER, 57344, us=40.0),
            _m(NCCL, 114688, us=50.0),
            _m(FLASHINFER, 114688, ok=False, why="off the sum"),
        ],
    )
    assert gate(fi, token) is True
    assert gate(fi, torch.empty(4, 7168, dtype=torch.bfloat16)) is False  # the one-shot path won 56 KiB
    assert gate(fi, torch.empty(8, 7168, dtype=torch.bfloat16)) is False  # wrong at 112 KiB: NCCL
    assert gate(_bare_fi(**{STATE: state, "workspace": None}), token) is False  # not set up
    assert _wrap_fi_should_use(lambda self, inp: "stock")(_bare_fi(), token) == "stock"  # untied: vLLM's answer
    ca = _bare_ca(8, False, PcieState(selection=state.selection))
    assert ca.should_custom_ar(token.view(-1)) is False  # FlashInfer's size
    assert ca.should_custom_ar(torch.empty(4 * 7168, dtype=torch.bfloat16)) is True


@pytest.mark.vllm_latest
def test_a_failing_check_with_flashinfer_turns_it_off_and_keeps_the_start_up_choice(caplog):
    """After vLLM's own set-up our check runs again with FlashInfer PCIe-IPC; where it
    fails (here: no process group to agree over), FlashInfer is switched off for vLLM's
    dispatch, the earlier choice stands, and one warning says so."""
    import logging
    import types

    import torch

    from vllm_k2_plugin.comm.patch import STATE, PcieState, join_flashinfer
    from vllm_k2_plugin.patching.patch import PatchContext

    patch = _applied_patch()
    before = choose(8, [_m(NCCL, 14336, us=50.0), _m(ONESHOT, 14336, us=20.0)])
    state = PcieState(selection=before)
    fi = _bare_fi()
    ca = _bare_ca(8, False, state)
    comm = types.SimpleNamespace(
        fi_pcie_ipc_ar_comm=fi,
        ca_comm=ca,
        pynccl_comm=object(),
        cpu_group=None,
        rank_in_group=0,
        world_size=8,
        device=torch.device("cpu"),
    )
    assert join_flashinfer(PatchContext(patch, "latest"), comm, state)
    with caplog.at_level(logging.WARNING, logger="vllm.k2_plugin.comm"):
        fi.setup(hidden_dim=7168, dtype=torch.bfloat16, capture_sizes=[1, 2, 4, 8], tune_cache="unused")
    assert fi.disabled is True and fi.__dict__[STATE].selection is before
    warned = [r.getMessage() for r in caplog.records if "FlashInfer PCIe-IPC" in r.getMessage()]
    assert len(warned) == 1 and "FlashInfer PCIe-IPC off, the start-up choice stands" in warned[0], warned
    untied = _bare_fi(disabled=True, workspace=None)
    untied.setup(hidden_dim=7168, dtype=torch.bfloat16, capture_sizes=[1], tune_cache="unused")  # stock: no-op
    assert untied.disabled is True and STATE not in untied.__dict__


def test_flashinfer_pcie_ipc_joins_nothing_where_vllm_has_no_such_path():
    """vLLM < 0.30 (0.16) has no FlashInfer PCIe-IPC all-reduce; nor does a communicator
    where the user did not enable it or vLLM switched it off: nothing is wrapped."""
    import sys
    import types

    from vllm_k2_plugin.comm.patch import PcieState, join_flashinfer
    from vllm_k2_plugin.patching.patch import PatchContext

    patch = _applied_patch()
    ctx = PatchContext(patch, "any")
    assert join_flashinfer(ctx, types.SimpleNamespace(fi_pcie_ipc_ar_comm=None), PcieState()) is False
    if importlib.util.find_spec(FI_MODULE) is None:  # 0.16
        assert FI_MODULE not in sys.modules
        return
    off = _bare_fi(disabled=True)
    assert join_flashinfer(ctx, types.SimpleNamespace(fi_pcie_ipc_ar_comm=off), PcieState()) is False


@pytest.mark.vllm_latest
def test_the_flashinfer_candidate_measures_only_what_its_workspace_takes():
    import torch

    from vllm_k2_plugin.comm.measure import FlashInferPcieIpc

    cand = FlashInferPcieIpc(_bare_fi())
    assert cand.name == FLASHINFER
    assert [cand.supports(n) for n in (14336, 4 * 14336, 8 * 14336, 16 * 14336, 14336 + 16)] == [
        True,
        True,
        True,
        False,
        False,
    ]
    assert FlashInferPcieIpc(_bare_fi(dtype=torch.float16)).supports(14336) is False  # the check sends bf16
