"""The drafter's pass over the verified tokens, run by TRITON_ATTN's split-KV decode kernel
(one query row per pseudo-sequence) instead of its one-program-per-head prefill kernel."""
