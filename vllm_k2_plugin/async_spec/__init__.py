"""Async scheduling with EAGLE on vLLM 0.16 without the wait at the start of each step.

0.16's model runner waits, before it prepares a step's inputs, for the previous step's count
of accepted tokens; the host's preparation then runs while the GPU idles. Here the step is
prepared as if every draft had been accepted, and the GPU corrects positions, sequence lengths
and KV slots from the count it already holds; the host's own books are corrected once the
forward is on its way (vLLM >= 0.18 does the same upstream: vllm-project/vllm#32951).
"""
