"""GGUF-quantized routed experts at verify-batch sizes: each touched expert's weights read once."""
