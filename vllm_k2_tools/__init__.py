"""vllm-k2-plugin-tools: what the runtime plugin does not need in a vLLM process.

The EAGLE-3 training pipeline (``train``), the benchmark harness (``bench``, ``mla_bench``)
and the demo's tiny models with their committed weights (``fixtures``). Installed as the
second distribution built from this repository (``tools/setup.py``); it adds
``vllm-k2 train``, ``vllm-k2 bench`` and ``vllm-k2 fixture`` to the runtime's command.
Nothing in ``vllm_k2_plugin`` imports it (tests/test_runtime_split.py).
"""
