"""Fixes for vLLM's CPU platform: what our CPU test engines (and CPU users) need
for vLLM to compute DeepSeek/Kimi models the way the reference does."""
