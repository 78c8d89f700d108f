"""EAGLE-3 training pipeline for Kimi-K2.5: prepare -> extract -> vocab -> train -> export -> eval.

Each stage is a module with one entry function and a CLI verb (``vllm-k2 train <stage>``);
``vllm-k2 train run recipe.toml`` chains them and resumes where a previous run stopped.
"""
