"""The start-up check, on every tensor-parallel rank together: each candidate all-reduce
at each message size, first for correctness (against a float32 sum every rank computes
from the same seeded inputs, and bitwise agreement between ranks), then for time inside
a CUDA graph. Ranks exchange their verdicts over the CPU group before every launch, so
a rank that failed never leaves its peers spinning in a kernel that waits for it.
"""

from __future__ import annotations

import contextlib
import dataclasses

from .selection import FLASHINFER_PCIE_IPC, NCCL, Measurement

#: All-reduces captured in one graph, and timed replays of it.
GRAPH_REPS = 16
TIMED_REPLAYS = 5


class Candidate:
    """One all-reduce path. ``run``: eager (a copy into the path's own buffers where it
    needs one); ``graph_run``: the call made while a CUDA graph captures;
    ``after_capture``: what the path must do, on all ranks, once a graph is captured;
    ``capturing``: a context held around the capture; ``supports``: whether the path can
    take a message of this size at all (sizes it cannot take are not measured)."""

    name = ""

    def run(self, inp):
        raise NotImplementedError

    def graph_run(self, inp):
        return self.run(inp)

    def after_capture(self) -> None:
        pass

    def capturing(self):
        return contextlib.nullcontext()

    def supports(self, nbytes: int) -> bool:
        return True


class Nccl(Candidate):
    name = NCCL

    def __init__(self, pynccl_comm):
        self.comm = pynccl_comm

    def run(self, inp):
        return self.comm.all_reduce(inp)


class OneShot(Candidate):
    """vLLM's custom all-reduce (its one-stage kernel at these sizes) on IPC buffers."""

    name = "oneshot"

    def __init__(self, ca):
        self.ca = ca

    def run(self, inp):
        return self.ca.all_reduce(inp, registered=False)

    def graph_run(self, inp):
        return self.ca.all_reduce(inp, registered=True)

    def after_capture(self) -> None:
        self.ca.register_graph_buffers()  # collective: every rank's graph inputs opened by its peers


class FlashInferPcieIpc(Candidate):
    """vLLM's FlashInfer PCIe-IPC all-reduce (vLLM >= 0.30, FlashInfer >= 0.7), once vLLM
    has set it up (tuned workspace, prepared [tokens, hidden] shapes). It takes whole
    [tokens, hidden] tensors of its dtype that its workspace supports; one workspace
    serves one stream, so captures go through its ``capture()``."""

    name = FLASHINFER_PCIE_IPC

    def __init__(self, fi):
        self.fi = fi

    def _shaped(self, inp):
        return inp.view(-1, self.fi.hidden_dim)

    def run(self, inp):
        return self.fi.all_reduce(self._shaped(inp)).view(-1)

    def capturing(self):
        return self.fi.capture()

    def supports(self, nbytes: int) -> bool:
        import torch

        fi = self.fi
        elements = nbytes // 2  # the check's bf16 messages
        if fi.dtype != torch.bfloat16 or not fi.hidden_dim or elements % fi.hidden_dim:
            return False
        probe = torch.empty((elements // fi.hidden_dim, fi.hidden_dim), dtype=fi.dtype, device=fi.device)
        return bool(fi.workspace.supports(probe))


@dataclasses.dataclass
class Ranks:
    """What the check needs of the group: a CPU (gloo) group for verdicts, this rank."""

    cpu_group: object
    rank: int
    world_size: int
    device: object

    def gather(self, obj) -> list:
        import torch.distributed as dist

        out = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.cpu_group)
        return out

    def all_ok(self, ok: bool, why: str = "") -> tuple[bool, str]:
        votes = self.gather((bool(ok), why))
        bad = [f"rank {r}: {w}" for r, (o, w) in enumerate(votes) if not o]
        return not bad, "; ".join(bad)


def _inputs(ranks: Ranks, nbytes: int):
    """This rank's bf16 input and the float32 sum of all ranks' inputs (each rank makes
    every rank's input from the same seeds), plus sum |x_r| for the tolerance."""
    import torch

    n = nbytes // 2
    mine, total, magnitude = None, torch.zeros(n, device=ranks.device), torch.zeros(n, device=ranks.device)
    for r in range(ranks.world_size):
        gen = torch.Generator(device=ranks.device).manual_seed(7919 * nbytes + r)
        x = torch.randn(n, generator=gen, device=ranks.device).to(torch.bfloat16)
        total += x.float()
        magnitude += x.float().abs()
        if r == ranks.rank:
            mine = x
    return mine, total, magnitude


def _digest(t) -> int:
    import torch

    bits = t.contiguous().view(torch.int16).long()
    weights = torch.arange(bits.numel(), device=bits.device) % 9973 + 1
    return int((bits * weights).sum().item())


def check_correct(ranks: Ranks, cand: Candidate, nbytes: int) -> tuple[bool, str]:
    """Eager run: within bf16 rounding of the float32 sum, same bits on every rank."""
    import torch

    try:  # every rank reaches the verdict exchange below, whatever fails here
        mine, total, magnitude = _inputs(ranks, nbytes)
        out = cand.run(mine.clone())
        torch.cuda.synchronize(ranks.device)
        bad = _off_the_sum(out, total, magnitude)
        mine_ok, why = bad == 0, f"{bad} of {out.numel()} values off the float32 sum" if bad else ""
        digest = _digest(out)
    except Exception as e:  # noqa: BLE001 - a path that raises is refused, by name
        mine_ok, why, digest = False, f"{type(e).__name__}: {e}", None
    ok, why = ranks.all_ok(mine_ok, why)
    if ok and len(set(ranks.gather(digest))) != 1:
        ok, why = False, "ranks disagree on the result"
    return ok, why


def _off_the_sum(out, total, magnitude) -> int:
    """Values further from the float32 sum than bf16 rounding allows (2^-7 of sum |x_r|:
    the roundings of a ring's partial sums fit, a wrong element does not)."""
    return int(((out.float() - total).abs() > magnitude * 2**-7 + 1e-6).sum().item())


def time_in_graph(
    ranks: Ranks, cand: Candidate, nbytes: int, reps: int = GRAPH_REPS, replays: int = TIMED_REPLAYS
) -> tuple[float | None, str]:
    """Mean µs per all-reduce over ``reps`` captured back to back, slowest rank; the
    replayed graph's last result must still be the sum (correct inside graphs too)."""
    import torch

    graph, why, out = None, "", None
    try:
        mine, total, magnitude = _inputs(ranks, nbytes)
        cand.run(mine.clone())  # warm the path (lazy communicator set-up) outside the graph
        torch.cuda.synchronize(ranks.device)
        stream = torch.cuda.Stream(device=ranks.device)
        graph = torch.cuda.CUDAGraph()
        with cand.capturing(), torch.cuda.graph(graph, stream=stream):
            for _ in range(reps):
                out = cand.graph_run(mine)
    except Exception as e:  # noqa: BLE001
        graph, why = None, f"capture failed: {type(e).__name__}: {e}"
    ok, why = ranks.all_ok(graph is not None, why)
    if not ok:
        return None, why
    cand.after_capture()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    torch.cuda.synchronize(ranks.device)
    ranks.gather(None)  # barrier: replays start together
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize(ranks.device)
    us = start.elapsed_time(end) * 1000 / (replays * reps)
    bad = _off_the_sum(out, total, magnitude)
    ok, why = ranks.all_ok(bad == 0, f"graph replay: {bad} of {out.numel()} values off the float32 sum")
    slowest = max(ranks.gather(us))
    return (slowest if ok else None), why


def _supported_everywhere(ranks: Ranks, cand: Candidate, nbytes: int) -> bool:
    """A size is skipped on every rank if one rank's path cannot take it: a path whose
    ranks disagree on a launch waits for a peer that never comes."""
    try:
        mine = bool(cand.supports(nbytes))
    except Exception:  # noqa: BLE001 - a path that cannot answer does not take the size
        mine = False
    return ranks.all_ok(mine)[0]


def measure(ranks: Ranks, candidates: list[Candidate], sizes: list[int], **timing) -> list[Measurement]:
    """Every candidate at every size all ranks say it supports: correct (eager), then
    timed in a graph (``timing``: reps / replays of time_in_graph)."""
    out = []
    for nbytes in sizes:
        for cand in candidates:
            if not _supported_everywhere(ranks, cand, nbytes):
                continue
            ok, why = check_correct(ranks, cand, nbytes)
            us = None
            if ok:
                us, why = time_in_graph(ranks, cand, nbytes, **timing)
                ok = us is not None
            out.append(Measurement(cand.name, nbytes, ok, us, why))
    return out
