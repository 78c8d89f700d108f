"""Model-side features: Kimi-K2.5 / DeepSeek-V3 targets and the EAGLE-3 speculator."""
