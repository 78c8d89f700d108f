"""GGUF for Kimi-K2.5 / DeepSeek MLA models on vLLM's in-tree GGUF loader (<= 0.23):
force-dequant option, attn_k_b/attn_v_b -> kv_b_proj reassembly, kimi model types,
multi-shard files, streaming, strict audit."""
