"""Which number of speculative tokens k (0 = no speculation) to schedule next.

Per batch-size bucket (1, 2-3, 4-7, ...): the median of the last ``cost_window`` measured
step times at each k (a median: one slow step, such as the first at a new k or a host
hiccup, must not outweigh a whole probe), and a moving window of vLLM's acceptance counts
per draft position (shared by all buckets: acceptance depends on the text, not on the batch). The expected
tokens per request-step at k are 1 + sum of the first k positions' acceptance rates
(a position counts as accepted only when every earlier one was), so the throughput at k
is that over the step time. The guard moves to the best k only when it beats the current
one by ``margin`` at ``patience`` consecutive steps (hysteresis), or at ``fast_patience``
steps when it beats it by ``fast_margin`` (a gap that wide cannot flap). A k whose step time
was never measured is costed by linear interpolation between measured ones; short probes
(``probe_len`` steps, the first after ``warmup`` steps, then at doubling intervals from 32
up to ``probe_every``) keep the estimates of the k not in use fresh: at full k, k = 0 for
its step time (rarely: it forgoes accepted tokens); below full k, full k for the
acceptance of the positions not drafted (at most ``probe_every_off`` steps apart), or
only k = 1 while even an optimistic bound says no k can pay: position i is never accepted
more often than position 1, so k drafts give at most 1 + k * (position 1's rate) tokens.

Pure Python, no vLLM: the scheduler patch feeds it and reads its table.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from statistics import median


def bucket_of(batch: int) -> int:
    """1 -> 0, 2-3 -> 1, 4-7 -> 2, ..."""
    return max(1, batch).bit_length() - 1


@dataclass
class Decision:
    bucket: int
    old_k: int
    new_k: int
    tokens_per_ms: dict[int, float]


@dataclass
class _Bucket:
    k: int
    samples: dict[int, deque[float]] = field(default_factory=dict)
    steps: int = 0
    probe_left: int = 0
    probe_k: int = 0
    next_probe: int = 0
    interval: int = 0
    candidate: int | None = None
    streak: int = 0


class SpecGuard:
    def __init__(
        self,
        max_k: int,
        window: int = 64,
        margin: float = 0.05,
        patience: int = 16,
        cost_window: int = 9,
        probe_every: int = 256,
        probe_every_off: int = 128,
        probe_len: int = 3,
        warmup: int = 8,
        fast_margin: float = 0.25,
        fast_patience: int = 3,
    ):
        if max_k < 1:
            raise ValueError(f"max_k must be >= 1, got {max_k}")
        self.max_k = max_k
        self.margin, self.cost_window, self.patience = margin, cost_window, patience
        self.probe_every, self.probe_len, self.warmup = probe_every, probe_len, warmup
        self.probe_every_off = probe_every_off
        self.fast_margin, self.fast_patience = fast_margin, fast_patience
        #: (drafted, accepted) per position of the last ``window`` steps that drafted
        self._accept: deque[tuple[list[int], list[int]]] = deque(maxlen=window)
        # their sums per position, kept as steps enter and leave the window: acceptance() is
        # read several times per engine step (a k = 0 step's host time is what the guard saves)
        self._drafted_sum, self._accepted_sum = [0] * max_k, [0] * max_k
        self._buckets: dict[int, _Bucket] = {}
        self.decisions: list[Decision] = []

    # -- what the scheduler asks -------------------------------------------------
    def k_for(self, batch: int) -> int:
        """k for the next step of a batch of this size (a probe when one is due)."""
        b = self._bucket(batch)
        return b.probe_k if b.probe_left > 0 else b.k

    # -- what the scheduler tells ------------------------------------------------
    def observe_step(self, batch: int, k: int, step_ms: float) -> Decision | None:
        """One decode step of ``batch`` requests scheduled with ``k`` took ``step_ms``."""
        b = self._bucket(batch)
        b.samples.setdefault(k, deque(maxlen=self.cost_window)).append(step_ms)
        b.steps += 1
        if b.probe_left > 0:
            b.probe_left -= 1
            return None
        if b.steps >= b.next_probe:
            # at full k, probe k = 0 (its step time); below it, probe full k (the acceptance
            # of the positions not drafted). Probing k = 0 forgoes accepted tokens: rarer.
            b.probe_k = 0 if b.k == self.max_k else self._probe_below_full_k(b)
            b.probe_left = self.probe_len
            cap = self.probe_every if b.probe_k == 0 else self.probe_every_off
            b.interval = min(cap, max(32, 2 * b.interval))
            b.next_probe = b.steps + self.probe_len + b.interval
            return None
        return self._decide(bucket_of(batch), b)

    def observe_drafts(self, drafted_per_position: list[int], accepted_per_position: list[int]) -> None:
        """vLLM's acceptance counts of one step: for each draft position, how many requests
        drafted it and how many had it (and every earlier one) accepted."""
        if any(drafted_per_position):
            if len(self._accept) == self._accept.maxlen:
                self._add(*self._accept[0], sign=-1)
            entry = (list(drafted_per_position), list(accepted_per_position))
            self._accept.append(entry)
            self._add(*entry, sign=1)

    def _add(self, drafted: list[int], accepted: list[int], sign: int) -> None:
        for i in range(min(self.max_k, len(drafted))):
            self._drafted_sum[i] += sign * drafted[i]
            self._accepted_sum[i] += sign * accepted[i]

    # -- the model -----------------------------------------------------------------
    def acceptance(self) -> list[float]:
        """Per position over the window: accepted through it / drafted (0 if never drafted)."""
        return [a / d if d else 0.0 for a, d in zip(self._accepted_sum, self._drafted_sum, strict=True)]

    def expected_tokens(self, k: int) -> float:
        return 1.0 + sum(self.acceptance()[:k])

    def step_ms(self, batch: int) -> dict[int, float]:
        """Estimated step time by measured k for a batch of this size."""
        return {k: median(v) for k, v in self._bucket(batch).samples.items()}

    def _cost(self, measured: dict[int, float], k: int) -> float | None:
        if k in measured:
            return measured[k]
        lo = max((j for j in measured if j < k), default=None)
        hi = min((j for j in measured if j > k), default=None)
        if lo is None or hi is None:
            return None
        return measured[lo] + (measured[hi] - measured[lo]) * (k - lo) / (hi - lo)

    def _rates(self, b: _Bucket, tokens) -> dict[int, float]:
        """Tokens per ms by k (``tokens(k)`` per request-step) where a step cost is known.
        A step that drafts k tokens does all a step with fewer does, and more: where a smaller k
        measured dearer than a larger one, the measurements disagree, and the cheaper one counts
        for both. Step-time noise only adds (stalls, captures, a first step at a new k), so the
        dearer median is the suspect one: on a GPU under load k = 0 steps once measured slower
        than k = 3 steps (the guard then drafted with nothing accepted), and later one slow k = 1
        median, lifted onto k = 2 and 3, turned off drafts that paid."""
        measured = {k: median(v) for k, v in b.samples.items()}
        ceiling = float("inf")
        for k in sorted(measured, reverse=True):
            ceiling = measured[k] = min(ceiling, measured[k])
        rate = {}
        for k in range(self.max_k + 1):
            cost = self._cost(measured, k)
            if cost is not None and cost > 0:
                rate[k] = tokens(k) / cost
        return rate

    def _probe_below_full_k(self, b: _Bucket) -> int:
        """Full k, unless position 1's acceptance bounds every k below the current one's
        rate (then k = 1: the cheapest probe that refreshes that bound)."""
        if self.max_k == 1 or not self._drafted_sum[0]:
            return self.max_k
        first = self.acceptance()[0]
        bound = self._rates(b, lambda k: 1.0 + k * first)
        current = self._rates(b, self.expected_tokens).get(b.k)
        if current is None or any(r > (1 + self.margin) * current for k, r in bound.items() if k != b.k):
            return self.max_k
        return 1

    def _decide(self, bucket: int, b: _Bucket) -> Decision | None:
        rate = self._rates(b, self.expected_tokens)
        if b.k not in rate or not rate:
            return None
        best = max(rate, key=lambda k: (rate[k], -k))
        if best == b.k or rate[best] <= (1 + self.margin) * rate[b.k]:
            b.candidate, b.streak = None, 0
            return None
        b.streak = b.streak + 1 if b.candidate == best else 1
        b.candidate = best
        needed = self.fast_patience if rate[best] > (1 + self.fast_margin) * rate[b.k] else self.patience
        if b.streak < needed:
            return None
        decision = Decision(bucket, b.k, best, rate)
        b.k, b.candidate, b.streak = best, None, 0
        self.decisions.append(decision)
        return decision

    def _bucket(self, batch: int) -> _Bucket:
        key = bucket_of(batch)
        if key not in self._buckets:
            self._buckets[key] = _Bucket(k=self.max_k, next_probe=self.warmup)
        return self._buckets[key]
