"""`vllm-k2 bench mla`: the MLA decode microbenchmark (``bench``), vLLM 0.16's stock kernel
loaded from its wheel (``stock``) and the memory roofline it is measured against (``roofline``)."""
