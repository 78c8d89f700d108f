"""Patch ``tp-pcie-oneshot-allreduce`` on the CPU engines: the patch against vLLM's real
communicator classes (it applies, stock refuses > 2 PCIe ranks, our gate admits exactly
the sizes the start-up check chose), the choice per size, the sizes an engine measures,
and the switch. The kernels and the start-up check across ranks ran on the H200
(benchmarks/comm_shared_gpu.py; results checked in test_comm_results.py).
"""

from __future__ import annotations

import importlib

import pytest

from vllm_k2_plugin.comm.selection import NCCL, Measurement, choose
from vllm_k2_plugin.comm.sizes import message_sizes, token_counts

CA_MODULE = "vllm.distributed.device_communicators.custom_all_reduce"
ONESHOT = "oneshot"


def _m(cand, nbytes, ok=True, us=None, why=""):
    return Measurement(cand, nbytes, ok, us, why)


@pytest.mark.vllm_independent
def test_choice_takes_a_correct_candidate_only_where_it_beats_nccl():
    sel = choose(8, [
        _m(NCCL, 14336, us=50.0), _m(ONESHOT, 14336, us=12.0),            # wins
        _m(NCCL, 57344, us=50.0), _m(ONESHOT, 57344, us=48.5),            # within the 5 % margin
        _m(NCCL, 114688, us=50.0), _m(ONESHOT, 114688, ok=False, why="x"),  # wrong: refused however fast
        _m(NCCL, 229376, us=50.0), _m(ONESHOT, 229376, us=90.0),          # slower
    ])  # fmt: skip
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


@pytest.mark.vllm_independent
def test_switch_and_its_bad_values(monkeypatch):
    from vllm_k2_plugin.comm.patch import _not_wanted

    monkeypatch.setenv("VLLM_K2_PCIE_ALLREDUCE", "0")
    assert _not_wanted() == "VLLM_K2_PCIE_ALLREDUCE=0"
    monkeypatch.setenv("VLLM_K2_PCIE_ALLREDUCE", "maybe")
    with pytest.raises(ValueError, match="VLLM_K2_PCIE_ALLREDUCE='maybe'"):
        _not_wanted()
    monkeypatch.delenv("VLLM_K2_PCIE_ALLREDUCE")
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
    ca.__dict__.update(disabled=disabled, world_size=world, rank=0, fully_connected=fully_connected,
                       max_size=8 * 1024 * 1024, batch_invariant=False, _IS_CAPTURING=False, _ptr=0)  # fmt: skip
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
    sel = choose(8, [_m(NCCL, 14336, us=50.0), _m(ONESHOT, 14336, us=12.0),
                     _m(NCCL, 57344, us=50.0), _m(ONESHOT, 57344, us=60.0)])  # fmt: skip
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
    assert main(["doctor", "--comm"]) == 0
    out = capsys.readouterr().out
    assert "NCCL_P2P_LEVEL=SYS NCCL_PROTO=LL" in out and "none recorded" in out
    assert "not measured" in out and "need two GPUs or more" in out
    write_record(choose(8, [_m(NCCL, 14336, us=50.0), _m(ONESHOT, 14336, us=12.0)]), "0.16.0", ["RTX"] * 8)
    monkeypatch.setenv("NCCL_PROTO", "LL")
    assert main(["doctor", "--comm", "--tp", "8"]) == 0
    out = capsys.readouterr().out
    assert "14 KiB -> oneshot" in out and "NCCL_PROTO=LL" in out and "TP 8 asked" in out
