"""MoE at speculative-verify sizes: a step's tokens that share an expert share its weight
reads (vLLM's Triton fused_moe gives every (token, expert) pair its own block below ~12 tokens)."""
