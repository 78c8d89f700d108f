"""Tensor-parallel all-reduce for GPUs without NVLink: vLLM's own one-shot custom
all-reduce for small messages on more than two PCIe GPUs (where stock vLLM uses NCCL
only), chosen per message size by a correctness and speed check at engine start-up.

patch.py: the patch on vLLM's communicators. sizes.py: the messages an engine
all-reduces. measure.py: the start-up check (all ranks together). selection.py: the
choice per size, its log line and the record ``vllm-k2 doctor`` shows. doctor.py:
``vllm-k2 doctor --comm``.
"""
