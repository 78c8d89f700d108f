"""Speculation that turns itself down when it would lose: per batch-size bucket, the
number of speculative tokens per step (0 = off) from vLLM's acceptance counters and the
measured step times (``controller``), applied through vLLM's scheduler (``patch``)."""
