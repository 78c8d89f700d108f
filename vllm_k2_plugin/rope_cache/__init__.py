"""Rotary embeddings on CUDA without re-converting the whole cos/sin cache on every call
(vLLM's CUDA rotary op turns a bf16 cache into float32 per call: ~100 µs on an H200 for
262,144 positions, once per EAGLE-3 draft pass)."""
