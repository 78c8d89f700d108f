"""`vllm-k2 bench ab`: does speculation pay on my model, hardware and prompts?"""
