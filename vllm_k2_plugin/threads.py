"""Our CPU torch work stays on the calling thread, so the process stays safe to fork.

Why: a torch op large enough to run in parallel starts GNU OpenMP's worker threads, and a
process forked after that deadlocks in its first parallel region (the workers do not exist in
the child). vLLM forks its engine core from the API server / ``LLM`` process on CUDA machines,
and that core fills large CPU buffers at start-up (the GPU model runner's input batch is
max_num_seqs x max_model_len). Seen twice: a script that built a test fixture before
``LLM(...)`` never got an engine, and vLLM 0.16 engines hung building their input batch after
the plugin's start-up checks had run in the parent (benchmarks/results/spec_guard_gpu/).
With one intra-op thread torch never enters an OpenMP parallel region.
"""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def caller_thread_only():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)  # sets a count only: no thread starts until a parallel region
