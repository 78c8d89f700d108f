from setuptools import find_packages, setup

setup(
    name="vllm-k2-plugin",
    version="0.1.0",
    description="Serve Kimi-K2.5 with EAGLE-3 speculative decoding on vLLM 0.16 and later",
    long_description=open("README.md").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["vllm_k2_plugin", "vllm_k2_plugin.*"]),
    # The tiny trained target (weights + tokenizer + recipe), for demos and acceptance tests.
    package_data={"vllm_k2_plugin.fixtures": ["data/tiny-trained/*"]},
    python_requires=">=3.10",
    # No vLLM pin: vLLM brings its own torch. Supported vLLM: >=0.16 (see
    # vllm_k2_plugin/patching/versions.py: SUPPORTED), tested on 0.16.0 and 0.32.0.
    install_requires=["packaging", "safetensors", "tokenizers"],
    extras_require={
        "train": ["tqdm", "matplotlib", "datasets"],
        "gguf": ["gguf>=0.17"],
        "dev": ["pytest", "ruff", "pre-commit"],
    },
    entry_points={
        "vllm.general_plugins": ["vllm_k2_plugin = vllm_k2_plugin:register"],
        "console_scripts": ["vllm-k2 = vllm_k2_plugin.cli:main"],
    },
)
