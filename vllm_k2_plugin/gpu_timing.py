"""GPU time of a callable, measured the one way our start-up choices and benchmarks measure it.

Eager calls between CUDA events time the host's launches as much as the kernels (on the H200 an
eager check saw 241 vs 268 µs for kernels of ~38 vs ~95 µs), so the call is captured once in a
CUDA graph and its replays are timed.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable


def graph_replay_us(fn: Callable[[], object], replays: int = 20, batches: int = 3, calls_per_fn: int = 1) -> float:
    """Median GPU µs of one call (see ``graph_replay_times_us``)."""
    return statistics.median(graph_replay_times_us(fn, replays, batches, calls_per_fn))


def graph_replay_times_us(
    fn: Callable[[], object], replays: int = 20, batches: int = 3, calls_per_fn: int = 1
) -> list[float]:
    """GPU µs of one call per batch: ``fn`` warmed on a side stream (compiles outside the capture),
    captured once, then ``batches`` x ``replays`` back-to-back replays timed with CUDA events.
    ``calls_per_fn``: how many calls ``fn`` makes (the result is per call)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    # thread_local: an engine's other threads may touch CUDA while this captures
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(batches):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        per_call.append(1000 * start.elapsed_time(end) / (replays * calls_per_fn))
    del graph
    return per_call
