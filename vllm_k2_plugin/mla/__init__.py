"""Our Triton MLA decode kernel and the TRITON_MLA backend built on it (issue #5).

Why: on sm_120 (RTX PRO 6000, GB10) vLLM 0.16 auto-selects TRITON_MLA, whose decode
path runs 4 thread blocks at batch 1, sends every EAGLE-3 verify step through prefill,
has no full CUDA graphs and no fp8 KV cache (research vllm-0.16-internals.md §5).

Modules: ``kernel`` (the two Triton kernels), ``configs`` (block sizes, stages, split
count; shared-memory fit), ``launcher`` (torch entry point, workspaces), ``reference``
(float64), ``aot`` (compile every launcher config for sm_120 / sm_90), ``backend``
(the vLLM 0.16 subclass), ``vllm_adapter`` (where those vLLM pieces live, per version)
and ``patch`` (the registry declaration). The benchmark (``vllm-k2 bench mla``, with vLLM
0.16's stock kernel and the memory roofline) is in the tools: ``vllm_k2_tools.mla_bench``.

Importing this package imports neither torch, triton nor vLLM.
"""
