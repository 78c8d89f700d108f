"""Whether preparing steps without the wait pays on this runner, measured on its own first
speculative steps: how long the host blocks in 0.16's wait (the GPU still verifying: time the
host could have used) against what the correction costs the host. A host-bound engine (a tiny
model: the wait is short) keeps vLLM's wait; a GPU-bound one (K2.5) skips it."""

from __future__ import annotations

import statistics

#: steps measured each way before the choice (they run as they would anyway, so nothing is lost)
STEPS = 32


class WaitOrCorrect:
    def __init__(self, steps: int = STEPS) -> None:
        self.steps = steps
        self.waits: list[float] = []  # seconds the host blocked in vLLM's wait, per step
        self.costs: list[float] = []  # seconds of host work the correction added, per step
        self.skip_wait: bool | None = None  # None: still measuring

    def measuring_waits(self) -> bool:
        return self.skip_wait is None and len(self.waits) < self.steps

    def add_wait(self, seconds: float) -> None:
        self.waits.append(seconds)

    def add_cost(self, seconds: float) -> bool:
        """Record a trial step's cost; True when this completes the choice."""
        if self.skip_wait is not None:
            return False
        self.costs.append(seconds)
        if len(self.costs) < self.steps:
            return False
        self.skip_wait = statistics.median(self.waits) > statistics.median(self.costs)
        return True

    def verdict(self) -> str:
        wait_us, cost_us = (1e6 * statistics.median(x) for x in (self.waits, self.costs))
        keep = "skipped" if self.skip_wait else "kept (the host, not the GPU, bounds these steps)"
        return (
            f"median over {self.steps} steps each: the host waits {wait_us:.0f} us for the accepted count, "
            f"the correction costs it {cost_us:.0f} us: the wait is {keep}"
        )
